"""The replay core's memory state through a stand-in driver (tests/data/corecuda/fake_libcuda.c: device memory
is host memory, and a copy must lie inside one allocation at each end, as the driver checks it). devcounter's
case from the H200: two written __device__ variables that the driver placed 256 bytes apart, each its own
allocation; the plan once merged their resets into one copy over both, which the driver refused
(cuMemcpyDtoDAsync(reset of written bytes): CUDA_ERROR_INVALID_VALUE)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mnemetest import ROOT, cc

DATA = Path(__file__).resolve().parent / "data" / "corecuda"

#: runs in a fresh process: the core loads its driver once per process
SCRIPT = textwrap.dedent("""
    import struct, sys
    from mneme.device import Arena, Device, DeviceModule, ReplayState, read, write
    from mneme.snapshot import Snapshot, SnapshotType, Writer

    tmp = sys.argv[1]
    dev = Device(0)
    arena = Arena(dev, 0x200000000000, 4 << 20)
    out = 0x200000000000 + 4096
    with Writer(tmp + "/p.prologue", SnapshotType.PROLOGUE) as w:
        w.blob(out, bytes(range(256)) * 4)
        w.variable("g_count", 0x7F0000000000, struct.pack("<Q", 1000))
        w.variable("g_launches", 0x7F0000000100, struct.pack("<I", 7))
        w.args([struct.pack("<Q", out)])
    pro = Snapshot.read(tmp + "/p.prologue")
    state = ReplayState(dev, pro)
    mod = DeviceModule.from_cubin(b"stand-in module", dev)
    mod.load_variables(pro)
    (c_addr, _), (l_addr, _) = mod.global_address("g_count"), mod.global_address("g_launches")
    print("layout", l_addr - c_addr)
    # what the kernel wrote: g_count's low bytes, g_launches' first byte, two ranges of the blob
    written = [(0x7F0000000000, 3), (0x7F0000000100, 1), (out + 10, 4), (out + 600, 8)]
    copies, nbytes = state.plan_resets(written, mod)
    print("plan", copies, nbytes)
    write(c_addr, struct.pack("<Q", 0xFFFFFFFFFFFF))
    write(l_addr, struct.pack("<I", 0xABCD))
    write(out + 10, b"\\xee" * 598)  # between and inside the written ranges
    state.reset_written(None, mod)
    print("g_count", struct.unpack("<Q", read(c_addr, 8))[0])
    print("g_launches", hex(struct.unpack("<I", read(l_addr, 4))[0]))
    print("blob", read(out, 1024) == bytes(range(256)) * 4)
""")


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corecuda")
    cc("-fPIC", "-shared", "-o", str(d / "libcuda.so.1"), str(DATA / "fake_libcuda.c"))
    return d / "libcuda.so.1"


def run_script(script: str, standin: Path, tmp_path: Path, fake_globals: str) -> dict:
    """Runs a script in a fresh process on the stand-in driver; its output lines as {first word: rest}."""
    env = dict(os.environ, MNEME_LIBCUDA=str(standin), FAKE_GLOBALS=fake_globals)
    p = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return dict(line.split(" ", 1) for line in p.stdout.splitlines())


def test_resets_of_two_neighbouring_variables_are_two_copies_and_restore_both(standin, tmp_path):
    lines = run_script(SCRIPT, standin, tmp_path, "g_count:8,g_launches:4")
    assert lines["layout"] == "256", "the stand-in places the variables as the driver did on the H200"
    # one copy per variable, one for the blob (its two ranges are closer than the merge gap): 3 + 1 + 598 bytes
    assert lines["plan"] == "3 602", lines
    assert lines["g_count"] == str(0x0000FFFFFF0003E8)  # its three written bytes came back from the prologue
    assert lines["g_launches"] == hex(0xAB07)  # only the written byte comes back from the prologue
    assert lines["blob"] == "True"


MANAGED = textwrap.dedent("""
    import sys
    from mneme.device import AddressNotGranted, Device, ReplayState, read, write
    from mneme.device.placement import AddressHold
    from mneme.snapshot import Snapshot, SnapshotType, Space, Writer

    sys.path.insert(0, "tests")
    from mnemetest import free_range

    tmp, window = sys.argv[1], free_range(64 << 20, 64 << 20)
    addr = window + (6 << 20)  # a span inside a 64 MB window, not at its start
    print("window", hex(window))
    with Writer(tmp + "/m.prologue", SnapshotType.PROLOGUE) as w:
        w.blob(addr + 64, b"\\x01" * 256, Space.MANAGED)
        w.blob(addr + (2 << 20) + 8, b"\\x02" * 64, Space.MANAGED)  # the next granule: one span with the first
        w.args([])
    pro = Snapshot.read(tmp + "/m.prologue")
    dev = Device(0)
    state = ReplayState(dev, pro)
    (a,) = state.managed
    print("placed", hex(a.base), a.size, a.window and (hex(a.window[0]), a.window[1]))
    write(addr + 64, b"\\x05" * 4)
    print("rw", read(addr + 64, 8).hex(), read(addr + (2 << 20) + 8, 2).hex())
    state.close()
    squatter = AddressHold(addr, 2 << 20)  # stands in for a library the process mapped there
    try:
        ReplayState(dev, pro)
    except AddressNotGranted as e:
        print("refused", str(e).split(": the app's managed memory")[1])
""")


@pytest.mark.parametrize("pooled", [False, True], ids=["hint-granted", "small-reservations-pooled"])
def test_managed_memory_is_placed_at_its_recorded_address_and_a_taken_range_names_the_mapping(standin, tmp_path,
                                                                                              pooled):
    env = dict(os.environ, MNEME_LIBCUDA=str(standin))
    if pooled:  # the H200's driver: a 2 MB reservation lands elsewhere, a 64 MB one where asked
        env["FAKE_RESERVE_HINT_MIN"] = str(32 << 20)
    p = subprocess.run([sys.executable, "-c", MANAGED, str(tmp_path)], cwd=ROOT, capture_output=True, env=env,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    window = int(lines["window"], 0)
    addr = window + (6 << 20)
    want_window = (hex(window), 64 << 20) if pooled else None
    assert lines["placed"] == f"{hex(addr)} {4 << 20} {want_window}", p.stdout
    assert lines["rw"] == "0505050501010101 0202", "the blobs' memory is backed and written where recorded"
    refused = lines["refused"]
    assert f"2 span(s) from {hex(addr)}" not in refused and f"1 span(s) from {hex(addr)}" in refused, refused
    assert "exact spans: " in refused and "64 MB windows: " in refused and "1024 MB windows: " in refused, refused
    assert "this process maps there: " in refused and f"{addr:x}-{addr + (2 << 20):x} ---p" in refused, refused


CODEMAP = textwrap.dedent("""
    import struct, sys
    from mneme.device import Device, DeviceModule, read, write
    from mneme.errors import MnemeError
    from mneme.snapshot import Snapshot, SnapshotType, Writer

    tmp = sys.argv[1]
    dev = Device(0)
    with Writer(tmp + "/c.prologue", SnapshotType.PROLOGUE) as w:
        w.variable("d_table", 0x7F0000000000, struct.pack("<3Q", 0xA1, 0xA2, 0xA5))
        w.args([struct.pack("<Q", 0x7000), struct.pack("<Q", 0xA2)])
    pro = Snapshot.read(tmp + "/c.prologue")
    mod = DeviceModule.from_cubin(b"stand-in module", dev)
    print("fresh", mod.read_global("d_table").hex(), mod.read_global("nothere"))
    mod.set_code_map({0xA1: 0xB1, 0xA2: 0xB2})
    mod.load_variables(pro)
    addr, _ = mod.global_address("d_table")
    print("loaded", [hex(x) for x in struct.unpack("<3Q", read(addr, 24))])
    # what ReplayPipeline does per module: the pairs from the module's own table words, the arguments relocated
    from mneme.replay import codemap
    other = DeviceModule.from_cubin(b"stand-in module", dev)
    write(other.global_address("d_table")[0], struct.pack("<3Q", 0xC1, 0xC2, 0))  # this module's own addresses
    cmap = codemap.attach(other, {"d_table": [(0, "twice"), (8, "plusOne")]}, pro, pro.args, [1], ["v", "f"])
    other.load_variables(pro)
    print("attached", sorted((hex(a), hex(b)) for a, b in cmap.pairs.items()),
          hex(struct.unpack("<2Q", bytes(other.replay_args.raw))[1]))
    try:
        mod.set_code_map({})
    except MnemeError as e:
        print("late", e)
""")


def test_variables_are_written_with_the_modules_code_addresses(standin, tmp_path):
    lines = run_script(CODEMAP, standin, tmp_path, "d_table:24")
    assert lines["fresh"] == "00" * 24 + " None", "the stand-in's module starts zeroed; a missing variable is None"
    # both app code addresses became the module's; 0xA5 is no function's address and stays
    assert lines["loaded"] == "['0xb1', '0xb2', '0xa5']"
    assert "before the variables are loaded" in lines["late"]
    # a second module: its table words name its own addresses; f (0xA2, the app's plusOne) becomes 0xC2
    assert lines["attached"] == "[('0xa1', '0xc1'), ('0xa2', '0xc2')] 0xc2"
