"""`mneme record` on every example (recorded once per session by tests/gpu/conftest.py): the apps'
checksums are unchanged, the DBs hold the expected kernels, instances, occurrences and provenance, the
epilogue differs from the prologue exactly where the kernel writes, an app's own driver-API launch is
recorded, and the launch paths mneme cannot replay are reported."""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

pytestmark = pytest.mark.gpu

BIN = Path(__file__).resolve().parents[2] / "examples" / "bin"

#: demangled-name prefixes of the kernels each example launches
KERNELS: Dict[str, List[str]] = {
    "vecadd": ["vecAdd"],
    "stencil2d": ["stencil2d"],
    "matmul": ["matmulDynamic", "matmulPanel", "matmulStatic"],
    "reduce": ["reduceSum"],
    "rdc": ["rdcApply"],
    "structarg": ["structArg"],
    "manylaunch": ["scaleAdd"],
    "ptrglobal": ["ptrGlobal"],
    "pinned": ["readPinned", "scaleMapped"],
    "launchex": ["exScale"],
    "cooperative": ["coopSum"],
    "shlib": ["shlibOffset", "shlibScale"],
    "driverapi": ["driverScale"],
    "consttable": ["tableMap"],
    "devcounter": ["countAbove"],
    "halo": ["haloSmooth"],
    "managed": ["managedRows", "managedUpdate"],
    "zerocopy": ["zeroCopyRead", "zeroCopyWrite"],
    "streamalloc": ["pitchScale", "poolAxpy", "volumeAdd"],
    "graph": ["graphStep"],
    "graphupdate": ["graphScale", "graphShift"],
}


def checksum(text: str) -> str:
    m = re.search(r"checksum=(\S+)", text)
    assert m, f"no checksum in:\n{text}"
    return m.group(1)


def plain(argv: List[str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=120)


def dbs_of(rec) -> Dict[str, object]:
    from mneme.record.db import RecordedExecution

    out = {}
    for p in rec.dbs():
        db = RecordedExecution.from_json(str(p))
        out[plain_kernel_name(db.demangled_name)] = db
    return out


def plain_kernel_name(demangled: str) -> str:
    """'void haloSmooth<16>(float const*, ...)' -> 'haloSmooth': a template instance's demangled name
    carries its return type and template arguments."""
    name = demangled.split("(")[0]
    name = re.sub(r"<.*>$", "", name)
    return name.split(" ")[-1]


def read_pair(inst):
    from mneme.snapshot import Snapshot

    return Snapshot.read(inst.prologue_fn), Snapshot.read(inst.epilogue_fn)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_recording_leaves_the_apps_result_unchanged(small_recordings, name):
    rec = small_recordings[name]
    assert rec.returncode == 0, rec.stdout + rec.stderr
    assert checksum(rec.stdout) == checksum(plain(rec.argv).stdout)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_no_timed_launch_stays_held_until_the_watchdog(small_recordings, name):
    # native/hold: functions are loaded before the first held launch, so the driver never waits for the held
    # stream inside a launch and the watchdog (MNEME_RECORD_HOLD_MS) never has to release a hold
    rec = small_recordings[name]
    assert "hold_broken" not in rec.stderr and "hold watchdog" not in rec.stderr, rec.stderr


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_each_example_records_its_kernels_with_ir_and_provenance(small_recordings, name):
    rec = small_recordings[name]
    dbs = dbs_of(rec)
    assert sorted(dbs) == KERNELS[name], rec.stdout
    for kname, db in dbs.items():
        assert db.replayable and db.complete, (kname, db.not_replayable_reason)
        assert len(db) >= 1 and all(i.occ >= 1 and i.in_app_time_ns > 0 for i in db.values())
        (ir,) = db.llvm_files
        assert Path(ir).is_file() and Path(ir).name == f"RecordedIR_{db.static_hash}.bc"
        assert db.vaddr == 0x153940000000 and db.va_size == 4 << 30
        prov = db.provenance
        assert "H200" in prov["gpu"] and prov["sm"] == "sm_90"
        assert prov["driver"] >= 13000 and prov["runtime"] >= 13000
        assert prov["runs"][0]["app_exit"] == "exited"
        assert kname in rec.stdout, "the summary names every kernel"


def test_a_kernel_reading_before_the_first_allocation_records(small_recordings):
    """Rodinia's srad faulted under the recorder (illegal address) and recorded nothing: its top row reads
    a row before its first buffer, which sat at the arena's first byte. The arena now keeps a mapped
    guard of MN_ARENA_GUARD (2 MiB) below its first allocation."""
    rec = small_recordings["halo"]
    assert rec.returncode == 0, rec.stdout + rec.stderr
    assert "illegal" not in (rec.stdout + rec.stderr).lower()
    db = dbs_of(rec)["haloSmooth"]
    (inst,) = db.values()
    addr = int(re.search(r"in=(0x[0-9a-f]+)", rec.stdout).group(1), 16)
    assert addr - db.vaddr == 2 << 20, "the app's first allocation sits right above the guard"
    assert "launched while" not in rec.stdout, "neither a context error nor a capture elsewhere"


def test_manylaunch_has_three_instances_of_five_launches(small_recordings):
    db = dbs_of(small_recordings["manylaunch"])["scaleAdd"]
    assert len(db) == 3
    assert sorted(i.occ for i in db.values()) == [5, 5, 5]
    assert sorted(i.grid_dim.x for i in db.values()) == [4, 8, 16]
    # every launch is timed, plus the default 10 warm reruns of each new instance (--retime)
    assert all(len(i.in_app_times_ns) == 5 + 10 for i in db.values()), [len(i.in_app_times_ns) for i in db.values()]
    scalars = sorted(struct.unpack("<f", bytes.fromhex(i.args[2]))[0] for i in db.values())
    assert scalars == [0.5, 1.0, 1.5]


def test_vecadd_epilogue_is_the_prologue_plus_exactly_the_sum(small_recordings):
    db = dbs_of(small_recordings["vecadd"])["vecAdd"]
    (inst,) = db.values()
    pro, epi = read_pair(inst)
    changed = {blob.addr: blob.ranges for blob in epi.blobs}  # before apply(), which rewrites epi to BYTES
    full = epi.apply(pro)
    a, b, c = (struct.unpack("<Q", bytes.fromhex(inst.args[i]))[0] for i in range(3))
    n = struct.unpack("<i", bytes.fromhex(inst.args[3]))[0]
    A, B = (struct.unpack(f"<{n}f", bytes(pro.find_blob(x).contents)[: 4 * n]) for x in (a, b))
    C = struct.unpack(f"<{n}f", bytes(full.find_blob(c).contents)[: 4 * n])
    assert all(struct.pack("<f", x + y) == struct.pack("<f", z) for x, y, z in zip(A, B, C))
    assert changed[a] == [] and changed[b] == [], "inputs are not written"
    assert sum(n_ for _, n_ in changed[c]) <= 4 * n and changed[c], "only the output changes"
    # the runtime's own cuMemAlloc calls (if any) come from the arena too, so more blobs may be there
    assert {a, b, c} <= {blob.addr for blob in pro.blobs}


def test_ptrglobal_records_the_pointer_globals_with_relocations(small_recordings):
    db = dbs_of(small_recordings["ptrglobal"])["ptrGlobal"]
    (inst,) = db.values()
    pro, epi = read_pair(inst)
    g_ptr = pro.find_variable("g_ptr")
    assert g_ptr is not None and [(r.offset, r.target, r.target_offset) for r in g_ptr.relocs] == [(0, "g_value", 0)]
    target = pro.find_variable("g_value")
    assert struct.unpack("<Q", bytes(g_ptr.contents))[0] == target.addr
    full = epi.apply(pro)
    assert bytes(full.find_variable("g_value").contents) != bytes(target.contents), "the kernel writes g_value"


def test_pinned_host_memory_is_recorded_as_host_blobs(small_recordings):
    from mneme.snapshot import Space

    db = dbs_of(small_recordings["pinned"])["readPinned"]
    (inst,) = db.values()
    pro, _ = read_pair(inst)
    host = [b for b in pro.blobs if b.space == Space.HOST_PINNED]
    assert host and all(b.addr >= 0x100000000000 and b.addr < 0x100000000000 + (1 << 30) for b in host)


def test_launch_attributes_are_kept(small_recordings):
    coop = dbs_of(small_recordings["cooperative"])["coopSum"]
    (dh,) = list(coop)
    assert coop.extra["InstanceAttributes"][dh]["Cooperative"] is True
    ex = dbs_of(small_recordings["launchex"])["exScale"]
    (dh,) = list(ex)
    assert ex.extra["InstanceAttributes"][dh]["Api"] == "cuLaunchKernelEx", "seen at the driver"


def test_the_apps_own_driver_api_launch_is_recorded(small_recordings):
    db = dbs_of(small_recordings["driverapi"])["driverScale"]
    (dh,) = list(db)
    assert db.extra["InstanceAttributes"][dh]["Api"] == "cuLaunchKernel"
    assert not db.extra.get("UnsupportedLaunches"), db.extra.get("UnsupportedLaunches")


def test_struct_padding_and_pointers_are_masked_from_the_instance_key(small_recordings):
    db = dbs_of(small_recordings["structarg"])["structArg"]
    (dh,) = list(db)
    attrs = db.extra["InstanceAttributes"][dh]
    assert attrs["MaskSource"] == "ir" and [20, 4] in attrs["MaskedBytes"], "float3 is followed by 4 padding bytes"


def scalar(inst, index: int) -> float:
    return struct.unpack("<f", bytes.fromhex(inst.args[index]))[0]


def test_kernel_nodes_of_graphs_are_recorded_as_instances(small_recordings):
    # graph.cu: one direct launch (a=0.5), then a captured graph of two launches (a=0.25, a=2.0) launched 3 times
    step = dbs_of(small_recordings["graph"])["graphStep"]
    assert sorted((scalar(i, 1), i.occ) for i in step.values()) == [(0.25, 3), (0.5, 1), (2.0, 3)]
    assert not step.extra.get("UnsupportedLaunches"), step.extra.get("UnsupportedLaunches")
    # graphupdate.cu: scale -> memcpy -> shift(b=1) launched 4 times, shift's b set to -2 in the exec, 4 more
    dbs = dbs_of(small_recordings["graphupdate"])
    (scale,) = dbs["graphScale"].values()
    assert scale.occ == 8 and scalar(scale, 1) == 0.75, "the graph's copy of the arguments, not the app's later a"
    assert sorted((scalar(i, 2), i.occ) for i in dbs["graphShift"].values()) == [(-2.0, 4), (1.0, 4)]
    for db in dbs.values():
        assert not db.extra.get("UnsupportedLaunches") and db.replayable


def test_unsupported_launch_paths_are_reported(unsupported_recordings):
    graph = unsupported_recordings["graphmem"]
    assert graph.returncode == 0 and checksum(graph.stdout) == checksum(plain(graph.argv).stdout)
    for kernel in ("graphFill", "graphAccum"):
        db = dbs_of(graph)[kernel]
        assert db.extra["UnsupportedLaunches"] == {"graph_opaque": 2}, db.extra["UnsupportedLaunches"]
    assert "a CUDA graph (4 nodes) is launched whole, not node by node: the graph has a memory allocation node" in graph.stderr, graph.stderr

