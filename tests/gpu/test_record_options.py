"""`mneme record`'s options and hard cases on a real GPU: kernel selection, --skip and --max-recordings,
recording twice into one directory, MPI rank selection, epilogue formats, an app that crashes, a disk
that fills up, a VA range that cannot be granted, and an nvcc-built app with the shared and the static
runtime (no IR; pitched, stream-ordered and pinned allocations, a graph capture)."""

from __future__ import annotations

import os
import re
import resource
import shutil
import struct
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Dict, List

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "examples" / "bin"
MNEME = [sys.executable, "-m", "mneme.cli"]
RANK_VARS = ("FLUX_TASK_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "PMIX_RANK")


def record(db: Path, app: List[str], *options: str, env: Dict[str, str] = None, preexec=None):
    e = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    e.update(env or {})
    return subprocess.run([*MNEME, "record", "-rdb", str(db), *options, "--", *app], capture_output=True, text=True,
                          timeout=300, env=e, preexec_fn=preexec)


def plain(app: List[str]) -> subprocess.CompletedProcess:
    return subprocess.run(app, capture_output=True, text=True, timeout=120)


def checksum(text: str) -> str:
    m = re.search(r"checksum[= ](\S+)", text)
    assert m, text
    return m.group(1)


def dbs(d: Path):
    from mneme.record.db import RecordedExecution, find_dbs

    return {RecordedExecution.from_json(p).demangled_name.split("(")[0]: RecordedExecution.from_json(p)
            for p in find_dbs(str(d))} if d.is_dir() else {}


def raw_story(db: Path, kernel: str) -> str:
    """What a --keep-raw recording's raw logs say about `kernel` (a name's prefix) and the graphs: its kernel
    stats (launches, skips), its instance events (API, arguments), every graph, error and warning event."""
    import json

    out: List[str] = []
    for path in sorted(db.glob(".raw-*/r*.jsonl")):
        events = [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]
        ids = {e["k"] for e in events if e.get("ev") == "kernel" and kernel in e.get("name", "")}
        for e in events:
            ev = e.get("ev")
            if ev in ("graph", "error", "warning") or (ev in ("kstat", "unsupported") and e.get("k") in ids):
                out.append(json.dumps(e))
            elif ev == "inst" and e.get("k") in ids:
                out.append(json.dumps({f: e.get(f) for f in ("ev", "i", "api", "grid", "block", "args", "ptr")}))
    return f"raw log of {db}:\n" + "\n".join(out)[-6000:]


def test_kernel_selection_skip_and_max_recordings(tmp_path):
    app = [str(BIN / "manylaunch")]
    r = record(tmp_path / "a", app, "--kernels", "^scaleAdd", "--skip", "1", "--max-recordings", "2")
    assert r.returncode == 0, r.stderr
    db = dbs(tmp_path / "a")["scaleAdd"]
    # launches: s0 s1 s2 five times; the first is skipped, s1 and s2 recorded, s0 never again
    assert len(db) == 2 and sorted(i.grid_dim.x for i in db.values()) == [8, 16]
    assert sorted(i.occ for i in db.values()) == [5, 5]
    assert "1 within --skip" in r.stdout and "4 beyond --max-recordings" in r.stdout
    r = record(tmp_path / "b", app, "--kernels", "noSuchKernel")
    assert r.returncode == 0 and dbs(tmp_path / "b") == {} and "no kernel launch was recorded" in r.stdout


def test_recording_twice_adds_occurrences(tmp_path):
    app = [str(BIN / "vecadd")]
    for _ in range(2):
        r = record(tmp_path, app)
        assert r.returncode == 0, r.stderr
    db = dbs(tmp_path)["vecAdd"]
    (inst,) = db.values()
    assert inst.occ == 2 and len(db.provenance["runs"]) == 2
    assert len(inst.in_app_times_ns) == 2 * (1 + 10), "each run: the recorded launch and 10 reruns (--retime)"
    assert len(list((tmp_path / "snapshots").iterdir())) == 2, "the second run's duplicate snapshots are dropped"


def test_only_the_selected_ranks_record(tmp_path):
    app = [str(BIN / "vecadd")]
    r = record(tmp_path / "r0", app, env={"OMPI_COMM_WORLD_RANK": "1"})
    assert r.returncode == 0 and dbs(tmp_path / "r0") == {}
    r = record(tmp_path / "r1", app, "--record-ranks", "0-1", "--keep-raw", env={"OMPI_COMM_WORLD_RANK": "1"})
    assert r.returncode == 0 and "vecAdd" in dbs(tmp_path / "r1")
    (raw,) = (tmp_path / "r1").glob(".raw-*")
    assert [p.name[:3] for p in raw.glob("*.jsonl")] == ["r1-"]
    db = dbs(tmp_path / "r1")["vecAdd"]
    assert db.provenance["runs"][0]["rank"] == 1


def test_epilogue_formats(tmp_path):
    from mneme.snapshot import Encoding, Snapshot

    app = [str(BIN / "vecadd")]
    sizes = {}
    for fmt in ("diff", "bytes", "best"):
        assert record(tmp_path / fmt, app, "--epilogue-format", fmt).returncode == 0
        (inst,) = dbs(tmp_path / fmt)["vecAdd"].values()
        with Snapshot.read(inst.epilogue_fn) as epi:
            encodings = {b.encoding for b in epi.blobs}
        sizes[fmt] = Path(inst.epilogue_fn).stat().st_size
        if fmt == "bytes":
            assert encodings == {Encoding.BYTES}
        if fmt == "diff":
            assert encodings == {Encoding.DIFF}
    assert sizes["diff"] < sizes["bytes"] and sizes["best"] <= sizes["diff"]


def test_a_crashing_app_leaves_the_launches_that_finished(tmp_path, smoke):
    r = record(tmp_path, [str(smoke), "crash"])
    assert r.returncode == 128 + 11, r.stderr
    assert "crashing" in r.stdout
    found = dbs(tmp_path)
    axpy = found["axpy"]
    assert sorted(i.occ for i in axpy.values()) == [1, 2, 5], "counts written by the signal handler"
    assert axpy.provenance["runs"][0]["app_exit"] == "signal 11"
    assert "bump" in found and "readPinned" in found


def test_a_full_disk_leaves_the_app_running_and_marks_the_record_incomplete(tmp_path):
    app = [str(BIN / "vecadd")]

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (100 << 10, 100 << 10))  # vecadd's prologue needs 192 KiB

    r = record(tmp_path, app, preexec=limit)
    assert r.returncode == 3, r.stdout + r.stderr
    assert checksum(r.stdout) == checksum(plain(app).stdout), "the app finished normally"
    assert "INCOMPLETE" in r.stderr and "cannot write a prologue" in r.stderr


def test_a_va_range_that_cannot_be_granted_is_a_clear_error(tmp_path):
    app = [str(BIN / "vecadd")]
    r = record(tmp_path, app, "--va-size", "120000")  # more than the process's address space above the base
    assert r.returncode == 2
    assert "--va-size" in r.stderr and "not granted" in r.stderr
    assert checksum(r.stdout) == checksum(plain(app).stdout), "the app still ran, unrecorded"


def build_smoke(tmp_path_factory, *flags: str, cudart: str = "shared") -> Path:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        pytest.skip("nvcc is not available")
    out = tmp_path_factory.mktemp("smoke") / f"record_smoke_{cudart}"
    src = Path(__file__).resolve().parent / "data" / "record_smoke.cu"
    p = subprocess.run([nvcc, "-arch=sm_90", "-cudart", cudart, *flags, "-o", str(out), str(src), "-ldl"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return out


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    return build_smoke(tmp_path_factory)


@pytest.fixture(scope="module")
def smoke_per_thread(tmp_path_factory) -> Path:
    """The same app with the per-thread default stream: every call goes through the *_ptsz entry points."""
    return build_smoke(tmp_path_factory, "--default-stream", "per-thread")


@pytest.fixture(scope="module")
def smoke_static(tmp_path_factory) -> Path:
    """The same app with nvcc's default, the static runtime: seen through the driver just the same."""
    return build_smoke(tmp_path_factory, cudart="static")


@pytest.mark.parametrize("variant", ["smoke", "smoke_per_thread", "smoke_static"])
def test_an_nvcc_built_app_is_recorded_without_ir(tmp_path, request, variant):
    smoke = request.getfixturevalue(variant)
    base = plain([str(smoke)])
    assert base.returncode == 0, base.stdout
    r = record(tmp_path, [str(smoke)], "--keep-raw")
    assert r.returncode == 0, r.stdout + r.stderr
    assert checksum(r.stdout) == checksum(base.stdout)
    # the arena's pitches are the driver's own (the plain run's)
    pattern = r"pitch width=(\d+) ours=(\d+) real=\d+ arena=(\d)"
    pitches, real = re.findall(pattern, r.stdout), re.findall(pattern, base.stdout)
    assert len(pitches) == 7 and all(a == "1" for _, _, a in pitches), r.stdout
    assert [p[:2] for p in pitches] == [p[:2] for p in real], (r.stdout, base.stdout)
    assert "malloc3d pitch=512" in r.stdout and re.search(r"malloc3d .* arena=1", r.stdout)
    assert "arena malloc=1 async=1" in r.stdout and "pinned=0x100000000000" in r.stdout
    assert "no IR for 3 kernel(s)" in r.stdout

    found = dbs(tmp_path)
    axpy = found["axpy"]
    # the captured axpy (a=0.5) is recorded when its graph is launched (once); if not, the raw log says
    # how its launches were counted (kstat skips) and what the recorder made of the graph
    story = raw_story(tmp_path, "axpy") + "\n" + r.stderr[-3000:]
    assert not axpy.extra.get("UnsupportedLaunches"), (axpy.extra.get("UnsupportedLaunches"), story)
    assert sorted(i.occ for i in axpy.values()) == [1, 1, 2, 5], story
    assert not axpy.replayable and axpy.not_replayable_reason.startswith("no IR")
    attrs = next(iter(axpy.extra["InstanceAttributes"].values()))
    assert attrs["Api"].startswith("cuLaunchKernel") and attrs["MaskSource"] == "value"
    scalars = sorted(struct.unpack("<f", bytes.fromhex(i.args[2]))[0] for i in axpy.values())
    assert scalars == [0.5, 1.0, 2.0, 3.0]

    from mneme.snapshot import Snapshot

    # A kernel without IR is never rerun (retimed): the variables it reaches are unknown at the driver API,
    # where a module's variables appear only when the app asks for them (here cudaMemcpyFromSymbol after
    # the launch), so its __device__ state could not be written back; the checksum above shows the app's
    # result is untouched. Pointer-global relocations are checked on the IR-built ptrglobal example.
    (bump,) = found["bump"].values()
    with Snapshot.read(bump.prologue_fn) as pro:
        assert pro.find_variable("g_where") is None
        assert any(b.addr == 0x100000000000 for b in pro.blobs), "the pinned buffer is a host blob"


def test_retime_zero_keeps_only_the_recorded_launch_and_reruns_leave_the_result_alone(tmp_path):
    app = [str(BIN / "reduce")]
    expected = checksum(plain(app).stdout)
    r = record(tmp_path / "none", app, "--retime", "0")
    assert r.returncode == 0, r.stderr
    (inst,) = dbs(tmp_path / "none")["reduceSum"].values()
    assert len(inst.in_app_times_ns) == 1
    r = record(tmp_path / "many", app, "--retime", "20")
    assert r.returncode == 0, r.stderr
    (inst,) = dbs(tmp_path / "many")["reduceSum"].values()
    assert len(inst.in_app_times_ns) == 21
    # the reruns accumulate into the same atomic output; the prologue is written back after each
    assert checksum(r.stdout) == expected


def test_retime_is_bounded_in_time_and_the_recorders_time_is_reported(tmp_path):
    app = [str(BIN / "stencil2d"), "4096", "4096", "2"]  # each launch well over 100 us
    r = record(tmp_path / "tight", app, "--retime", "64", "--retime-budget", "0.0001")
    assert r.returncode == 0, r.stderr
    db = dbs(tmp_path / "tight")["stencil2d"]
    for inst in db.values():
        # the first rerun always runs; the 100 us budget is spent by then: the recorded launch, 1 rerun, the app's
        assert len(inst.in_app_times_ns) <= 1 + 1 + inst.occ, len(inst.in_app_times_ns)
    m = re.search(r"recorder time ([0-9.]+) s for (\d+) instance\(s\): copy ([0-9.]+) s \(([0-9.]+) GB/s over ([0-9.]+) GB\), "
                  r"hash/diff ([0-9.]+) s, write ([0-9.]+) s, retime ([0-9.]+) s", r.stdout)
    assert m, r.stdout
    total, n, copy, rate, gb, diff, write, rt = (float(x) for x in m.groups())
    assert n == len(db) and gb > 0.1, "two 64 MiB grids per snapshot"
    # diff and write count the prologue thread's work too; what the app did not wait for is "hidden", and the
    # wait for the thread is inside the total: copy + diff + write + retime + other + kernel - hidden = total + waited
    hidden = float(re.search(r"hidden ([0-9.]+) s", r.stdout).group(1)) if "hidden " in r.stdout else 0.0
    waited = float(re.search(r"waited ([0-9.]+) s", r.stdout).group(1)) if "waited " in r.stdout else 0.0
    assert copy + diff + write + rt - hidden <= (total + waited) * 1.01 + 0.002, r.stdout
    # for the report (issue #16 asks >= 0.5 of pinned D2H): shows in pytest's warnings summary
    warnings.warn(f"recorder: {r.stdout[m.start():m.end()]}")
    attrs = next(iter(db.extra["InstanceAttributes"].values()))
    assert attrs["RecorderTime"]["copy_bytes"] > 0 and attrs["RecorderTime"]["record_ns"] > 0