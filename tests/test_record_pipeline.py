"""`mneme record` without a GPU: librecord.so preloaded into a real app built with `mneme cc` (it sees
the runtime find no driver, leaves the app's results alone, flushes on fatal signals, a full disk, an unwritable
directory), and the post-processing of raw logs with real snapshot files and the app's real IR into a
record DB that RecordedExecution reads back, merges, and marks incomplete or not replayable."""

from __future__ import annotations

import json
import os
import resource
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from mneme.errors import RecordError
from mneme.record.db import RecordedExecution, find_dbs, median
from mneme.record.hashing import dynamic_hash, static_hash_without_ir
from mneme.record.kerneltable import IRIndex, compile_selector, table_text
from mneme.record.postprocess import postprocess
from mneme.snapshot import Snapshot, SnapshotType, Writer

ROOT = Path(__file__).resolve().parent.parent

APP_SOURCE = r"""
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
struct P { float s; double d; int n; };                  // padding after s and after n
__device__ int g_val = 3;
__device__ int *g_ptr = &g_val;
__constant__ float c_w[4];
__device__ float helper(float v) { return v * 2.0f + *g_ptr; }
__global__ void scale(float *x, P p) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) x[i] = helper(x[i]) * p.s + c_w[0];
}
__global__ void other(float *x, int n) { int i = threadIdx.x; if (i < n) x[i] = 0; }
__global__ void texread(cudaTextureObject_t t, float *out, int n) {
  int i = threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<float>(t, i);
}
int main(int argc, char **argv) {
  float *x = nullptr;
  cudaError_t e = cudaMalloc(&x, 1024);
  printf("malloc %d\n", (int)e);
  fflush(stdout);
  const char *mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "segv")) raise(SIGSEGV);
  if (!strcmp(mode, "term")) raise(SIGTERM);
  if (!strcmp(mode, "abort")) abort();
  if (e == cudaSuccess) {
    P p{2.f, 1.0, 256};
    scale<<<1, 256>>>(x, p);
    other<<<1, 32>>>(x, 32);
    cudaDeviceSynchronize();
  }
  printf("done\n");
  return 0;
}
"""

SCALE = "_Z5scalePf1P"
OTHER = "_Z5otherPfi"
TEXREAD = "_Z7texreadyPfi"
BASE = 0x153940000000


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("app")
    (d / "app.cu").write_text(APP_SOURCE)
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "cc", "-O2", "-o", str(d / "app"), str(d / "app.cu")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return d / "app"


@pytest.fixture(scope="module")
def librecord() -> Path:
    from mneme.record.runner import find_librecord

    return find_librecord()


@pytest.fixture(scope="module")
def index(app) -> IRIndex:
    idx = IRIndex()
    assert idx.add_file(app) == 1
    return idx


def cuda_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MNEME_") and k not in ("LD_PRELOAD", "OMPI_COMM_WORLD_RANK", "FLUX_TASK_RANK",
                                                        "PMI_RANK", "SLURM_PROCID", "PMIX_RANK")}
    env["LD_LIBRARY_PATH"] = "/usr/local/cuda/lib64:" + env.get("LD_LIBRARY_PATH", "")
    env.update(extra or {})
    return env


def events(path: Path) -> List[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# ---- the IR side -----------------------------------------------------------------------------------


def test_ir_index_knows_the_apps_kernels_and_their_argument_masks(index):
    assert index.kernels() == sorted([SCALE, OTHER, TEXREAD])
    scale = index.closure(SCALE)
    assert scale.demangled == "scale(float*, P)"
    assert scale.arg_names == ["x", "p"] and scale.arg_kinds == ["ptr", "struct"]
    # the pointer, and struct P {float s; double d; int n;}'s padding: 4 bytes after s, 4 after n
    assert scale.masked == [(0, 0, 8), (1, 4, 4), (1, 20, 4)]
    assert set(scale.variables) >= {"g_val", "g_ptr", "c_w"}, "helper's and the kernel's globals, and g_ptr's target"
    assert not scale.uses_textures and index.closure(TEXREAD).uses_textures
    assert index.closure(OTHER).variables == []


def test_kernel_table_selects_with_python_regex(index):
    text = table_text(index, compile_selector(r"^scale\("))
    lines = {ln.split("\t")[1]: ln.split("\t") for ln in text.splitlines() if ln.startswith("K\t")}
    assert lines[SCALE][2] == "1" and lines[OTHER][2] == "0" and lines[TEXREAD][2] == "0"
    assert lines[SCALE][3] == "2" and "0:0:8" in lines[SCALE][4] and "g_ptr" in lines[SCALE][5]
    with pytest.raises(RecordError):
        compile_selector("(")


# ---- librecord preloaded into a real app, on a machine without a driver -------------------------------


def run_app(app: Path, librecord: Path, raw: Optional[Path], *args: str, env: Optional[Dict[str, str]] = None,
            preexec=None) -> subprocess.CompletedProcess:
    extra = {"LD_PRELOAD": str(librecord)}
    if raw is not None:
        extra["MNEME_RECORD_DIR"] = str(raw)
    extra.update(env or {})
    return subprocess.run([str(app), *args], env=cuda_env(extra), capture_output=True, text=True, timeout=60,
                          preexec_fn=preexec)


def test_the_app_behaves_the_same_under_the_recorder(app, librecord, tmp_path):
    plain = subprocess.run([str(app)], env=cuda_env(), capture_output=True, text=True, timeout=60)
    raw = tmp_path / "raw"
    raw.mkdir()
    rec = run_app(app, librecord, raw)
    assert (rec.returncode, rec.stdout) == (plain.returncode, plain.stdout)
    assert "malloc 35" in rec.stdout, "no driver here: cudaMalloc reports cudaErrorInsufficientDriver"
    assert "libcuda.so.1 cannot be loaded" in rec.stderr
    (log,) = raw.glob("r0-p*.jsonl")
    ev = events(log)
    assert ev[0]["ev"] == "start" and ev[0]["v"] == 1 and ev[0]["exe"] == str(app.resolve())
    # kernels and variables are seen at the driver (cuLibraryGetKernel, cuLibraryGetGlobal): none without one
    assert not [e for e in ev if e["ev"] in ("kernel", "var", "inst")]
    (err,) = [e for e in ev if e["ev"] == "error"]
    assert "no CUDA driver" in err["what"] and "no NVIDIA driver" in err["detail"]
    assert ev[-1]["ev"] == "exit" and ev[-1]["how"] == "exit"


def test_without_a_record_dir_the_library_does_nothing(app, librecord, tmp_path):
    rec = run_app(app, librecord, None, env={"HOME": str(tmp_path)})
    assert rec.returncode == 0 and rec.stderr == "" and rec.stdout.endswith("done\n")
    assert list(tmp_path.iterdir()) == []


def test_only_selected_ranks_record(app, librecord, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    run_app(app, librecord, raw, env={"OMPI_COMM_WORLD_RANK": "1", "MNEME_RECORD_RANKS": "0"})
    assert list(raw.iterdir()) == []
    run_app(app, librecord, raw, env={"OMPI_COMM_WORLD_RANK": "3", "MNEME_RECORD_RANKS": "0,2-3"})
    (log,) = raw.glob("*.jsonl")
    assert log.name.startswith("r3-p") and events(log)[0]["rank"] == 3


@pytest.mark.parametrize("mode, sig", [("segv", signal.SIGSEGV), ("term", signal.SIGTERM), ("abort", signal.SIGABRT)])
def test_a_fatal_signal_flushes_the_log_and_still_kills_the_app(app, librecord, tmp_path, mode, sig):
    raw = tmp_path / "raw"
    raw.mkdir()
    rec = run_app(app, librecord, raw, mode)
    assert rec.returncode == -sig, "the signal is re-raised: the app dies as it would have"
    (log,) = raw.glob("*.jsonl")
    last = events(log)[-1]
    assert last["ev"] == "exit" and last["how"] == "signal" and last["signal"] == sig


def test_a_full_disk_leaves_the_app_running_and_the_record_incomplete(app, librecord, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))  # less than the start and error events

    rec = run_app(app, librecord, raw, preexec=small_files)
    assert rec.returncode == 0 and rec.stdout.endswith("done\n")
    assert "the record will be incomplete" in rec.stderr
    (log,) = raw.glob("*.jsonl")
    assert log.stat().st_size == 200
    out = postprocess(raw, tmp_path / "db", keep_raw=True)
    assert not out.complete


def test_an_unwritable_record_dir_leaves_the_app_running(app, librecord, tmp_path):
    rec = run_app(app, librecord, tmp_path / "missing" / "dir")
    assert rec.returncode == 0 and rec.stdout.endswith("done\n")
    assert "cannot write the record log" in rec.stderr


def test_record_without_driver_check_reports_the_missing_driver(app, tmp_path):
    from mneme.record.runner import RecordSettings, record

    settings = RecordSettings(db_dir=tmp_path / "db", keep_raw=True, kernels="scale|other")
    with pytest.raises(RecordError, match="no NVIDIA driver"):
        record([str(app)], settings, out=open(os.devnull, "w"), check=False, show_progress=False)
    (raw,) = (tmp_path / "db").glob(".raw-*")
    table = (raw / "kernels.tsv").read_text()
    assert f"K\t{SCALE}\t1" in table and f"K\t{TEXREAD}\t0" in table
    (log,) = raw.glob("*.jsonl")
    assert events(log)[0]["kernel_table"] == 3, "the recorder read the kernel table"


# ---- post-processing: synthetic raw logs, real snapshots, the app's real IR ----------------------------


class RawRun:
    """Writes what librecord writes: a JSON-lines log and snapshot files (through the real writer)."""

    def __init__(self, raw: Path, app: Optional[Path], pid: int = 4242, rank: int = -1, base: int = BASE):
        self.raw = raw
        raw.mkdir(parents=True, exist_ok=True)
        self.pid, self.rank = pid, rank
        self.log = raw / f"r{max(rank, 0)}-p{pid}.jsonl"
        self.kernels: Dict[str, int] = {}
        self.n = 0
        self.emit(ev="start", v=1, run=raw.name, pid=pid, rank=rank, host="testhost", time_ns=1_700_000_000_000_000_000,
                  exe=str(app or "/bin/true"), va_base=hex(base), va_bytes=4 << 30, host_base="0x100000000000",
                  host_bytes=1 << 30, max_recordings=10, skip=0, kernel_table=0)
        self.emit(ev="arena", base=hex(base), bytes=4 << 30, chunk=64 << 20, granted=hex(base), device=0)
        self.emit(ev="device", device=0, gpu="NVIDIA H200", sm="sm_90", sms=132, uuid="00" * 16, driver=13000, runtime=13000)
        if app is not None:
            self.emit(ev="object", path=str(app))

    def emit(self, **ev) -> None:
        with open(self.log, "a") as fh:
            fh.write(json.dumps(ev) + "\n")

    def kid(self, name: str) -> int:
        if name not in self.kernels:
            self.kernels[name] = len(self.kernels)
            self.emit(ev="kernel", k=self.kernels[name], name=name)
        return self.kernels[name]

    def instance(self, name: str, args: bytes, params: List[Tuple[int, int]], masked: List[Tuple[int, int]],
                 before: bytes, after: bytes, grid=(1, 1, 1), block=(256, 1, 1), t_ns: int = 9000,
                 foreign=None, tex=None, addr: int = BASE, recorder_time: Optional[Dict[str, int]] = None,
                 extra: Optional[Dict[str, object]] = None, snapshots=None,
                 event: Optional[Dict[str, object]] = None) -> int:
        """`snapshots(prologue_writer, epilogue_writer)` adds records (texture objects, arrays) to both files;
        `extra` and `event` add fields to the instance event."""
        k, i = self.kid(name), self.n
        self.n += 1
        pro, epi = f"r0-p{self.pid}-i{i}.prologue", f"r0-p{self.pid}-i{i}.epilogue"
        w = Writer(self.raw / pro, SnapshotType.PROLOGUE)
        w.blob(addr, before)
        w.variable("g_val", 0x7f0000001000, struct.pack("<i", 3))
        w.variable("g_ptr", 0x7f0000001008, struct.pack("<Q", 0x7f0000001000), relocs=[(0, "g_val", 0)])
        w.args(raw=args, offsets=[o for o, _ in params], sizes=[s for _, s in params])
        e = Writer(self.raw / epi, SnapshotType.EPILOGUE)
        e.blob_epilogue(addr, after, before)
        if snapshots:
            snapshots(w, e)
        w.close()
        e.close()
        ev = dict(ev="inst", k=k, i=i, api="cuLaunchKernel", grid=list(grid), block=list(block), shmem=0,
                  params=[list(p) for p in params], args=args.hex(), ptr=[list(m) for m in masked], ptr_src="ir",
                  pro=pro, epi=epi, t_ns=t_ns, blobs=1, blob_bytes=len(before), vars=2, pro_bytes=1, epi_bytes=1)
        if foreign:
            ev["foreign"] = foreign
        if tex:
            ev["tex"] = tex
        ev.update(recorder_time or {})
        ev.update(extra or {})
        ev.update(event or {})
        self.emit(**ev)
        return i

    def occ(self, i: int, n: int, times: List[int]) -> None:
        self.emit(ev="occ", i=i, n=n, t=times)

    def kstat(self, name: str, launches: int, recorded: int, instances: int, skips: Optional[Dict[str, int]] = None):
        self.emit(ev="kstat", k=self.kid(name), launches=launches, recorded_launches=recorded, instances=instances,
                  skips=skips or {})

    def exit(self) -> None:
        self.emit(ev="exit", how="exit", incomplete=0, stored_bytes=0)


def scale_args(ptr: int, n: int, s: float = 2.0) -> Tuple[bytes, List[Tuple[int, int]], List[Tuple[int, int]]]:
    """scale's argument buffer as the recorder logs it: the pointer, then P with garbage in its padding."""
    p = struct.pack("<f4sdi4s", s, os.urandom(4), 1.0, n, os.urandom(4))
    return struct.pack("<Q", ptr) + p, [(0, 8), (8, 24)], [(0, 8), (12, 4), (28, 4)]


def only_db(db_dir: Path) -> RecordedExecution:
    (path,) = find_dbs(str(db_dir))
    return RecordedExecution.from_json(path)


def test_postprocess_writes_a_db_that_reads_back(app, index, tmp_path):
    raw, dbdir = tmp_path / ".raw-1", tmp_path / "db"
    run = RawRun(raw, app)
    before, after = bytes(range(256)) * 4, bytes(range(256)) * 3 + b"\xff" * 256
    a1, params, masked = scale_args(BASE, 256)
    a2, _, _ = scale_args(BASE, 512)
    i1 = run.instance(SCALE, a1, params, masked, before, after, t_ns=10_000)
    i2 = run.instance(SCALE, a2, params, masked, before, after, grid=(2, 1, 1), t_ns=20_000)
    run.occ(i2, 4, [5000, 7000, 6000])
    run.kstat(SCALE, 5, 5, 2)
    run.exit()

    out = postprocess(raw, dbdir, index=index)
    assert out.complete and out.processes == 1 and not raw.exists(), "the raw dir is consumed"
    (summary,) = out.kernels
    assert summary.replayable and summary.has_ir and summary.instances == 2 and summary.new_instances == 2
    assert "scale(float*, P)" in summary.line()

    static = index.closure(SCALE).static_hash
    db = only_db(dbdir)
    assert Path(db.path).name == f"{static}.json" and db.static_hash == static
    assert db.kernel_name == SCALE and db.demangled_name == "scale(float*, P)"
    assert db.arg_names == ["x", "p"] and db.arg_kinds == ["ptr", "struct"] and db.specializations == [False, False]
    assert db.vaddr == BASE and db.va_size == 4 << 30 and db.replayable and db.complete
    assert db.provenance["gpu"] == "NVIDIA H200" and db.provenance["sm"] == "sm_90"
    assert db.provenance["runs"][0]["host"] == "testhost"
    build = db.extra["BuildSettings"]  # how the app's build compiled the kernel (mneme cc -O2)
    assert build["compiler"] == "cc" and build["opt_level"] == "2" and build["prec_div"] is True

    (ir,) = db.llvm_files
    from mneme.ir.module import module_kernels, parse_module

    assert Path(ir).name == f"RecordedIR_{static}.bc" and module_kernels(parse_module(ir)) == [SCALE]
    assert "helper" in str(parse_module(ir)), "the closure holds the kernel's device functions"

    h1 = dynamic_hash(static, (1, 1, 1), (256, 1, 1), 0, a1, masked)
    h2 = dynamic_hash(static, (2, 1, 1), (256, 1, 1), 0, a2, masked)
    assert set(db) == {h1, h2}
    assert db[h1].occ == 1 and db[h2].occ == 4
    assert db[h2].in_app_times_ns == [20_000, 5000, 7000, 6000] and db[h2].in_app_time_ns == 6500
    assert db[h1].args == [a1[:8].hex(), a1[8:].hex()]
    text = Path(db.path).read_text()
    assert f'"snapshots/{static}-{h1}.prologue"' in text and str(tmp_path) not in text, "paths are relative"
    with Snapshot.read(db[h1].prologue_fn) as pro, Snapshot.read(db[h1].epilogue_fn) as epi:
        assert bytes(pro.find_blob(BASE).contents) == before
        assert pro.find_variable("g_ptr").relocs[0].target == "g_val"
        assert bytes(epi.apply(pro).find_blob(BASE).contents) == after


def test_the_recorders_own_time_is_kept_per_instance_and_summed_for_the_run(app, index, tmp_path):
    raw, dbdir = tmp_path / ".raw-1", tmp_path / "db"
    run = RawRun(raw, app)
    before, after = bytes(256), bytes(255) + b"\x01"
    a1, params, masked = scale_args(BASE, 256)
    a2, _, _ = scale_args(BASE, 512)
    spent = [dict(t_copy=2_000_000, copy_bytes=4_000_000, t_diff=500_000, t_write=1_000_000, t_retime=3_000_000,
                  t_record=7_000_000),
             dict(t_copy=1_000_000, copy_bytes=1_000_000, t_diff=250_000, t_write=0, t_retime=0, t_record=1_500_000,
                  t_other=1_000_000, t_hidden=2_000_000, t_wait=3_000_000)]
    run.instance(SCALE, a1, params, masked, before, after, recorder_time=spent[0])
    run.instance(SCALE, a2, params, masked, before, after, grid=(2, 1, 1), recorder_time=spent[1])
    run.exit()
    out = postprocess(raw, dbdir, index=index)
    assert out.recorded_instances == 2 and out.recorder_time["copy_ns"] == 3_000_000
    assert out.recorder_time_line() == ("recorder time 0.009 s for 2 instance(s): copy 0.003 s (1.67 GB/s over "
                                        "0.005 GB), hash/diff 0.001 s, write 0.001 s, retime 0.003 s, other 0.001 s, "
                                        "hidden 0.002 s (prologue hash/write on its thread, not waited for), "
                                        "waited 0.003 s")
    db = only_db(dbdir)
    kept = sorted(a["RecorderTime"]["record_ns"] for a in db.extra["InstanceAttributes"].values())
    assert kept == [1_500_000, 7_000_000]


def test_context_limits_are_kept_per_instance_by_name(app, index, tmp_path):
    """The recorder logs [CUlimit, value] pairs (heap size, device-runtime pending launches ...); the DB keeps
    them by name for replay to set again."""
    raw, dbdir = tmp_path / ".raw-1", tmp_path / "db"
    run = RawRun(raw, app)
    a1, params, masked = scale_args(BASE, 256)
    run.instance(SCALE, a1, params, masked, bytes(256), bytes(255) + b"\x01",
                 recorder_time={"limits": [[2, 48 << 20], [4, 4096], [9, 1]]})
    run.exit()
    postprocess(raw, dbdir, index=index)
    db = only_db(dbdir)
    (attrs,) = db.extra["InstanceAttributes"].values()
    assert attrs["ContextLimits"] == {"malloc_heap_size": 48 << 20, "dev_runtime_pending_launch_count": 4096,
                                      "limit_9": 1}
    assert db.extra["DeviceState"] == []  # the test app's kernel neither allocates, prints nor launches


def test_recording_again_adds_to_the_db(app, index, tmp_path):
    dbdir = tmp_path / "db"
    before, after = bytes(512), b"\x01" * 512
    a1, params, masked = scale_args(BASE, 256)
    run = RawRun(tmp_path / ".raw-1", app)
    i = run.instance(SCALE, a1, params, masked, before, after, t_ns=100)
    run.occ(i, 2, [300])
    run.exit()
    postprocess(run.raw, dbdir, index=index)
    first = only_db(dbdir)
    (h1,) = list(first)
    kept = Path(first[h1].prologue_fn).read_bytes()

    run = RawRun(tmp_path / ".raw-2", app, pid=777)
    moved, _, _ = scale_args(BASE + 0x4000, 256)  # same scalars, another pointer: the same instance
    i = run.instance(SCALE, moved, params, masked, before, after, t_ns=200)
    run.occ(i, 3, [400, 500])
    a3, _, _ = scale_args(BASE, 1024)
    run.instance(SCALE, a3, params, masked, before, after, t_ns=50)
    run.exit()
    out = postprocess(run.raw, dbdir, index=index)
    assert out.kernels[0].new_instances == 1 and out.kernels[0].instances == 2

    db = only_db(dbdir)
    assert len(db) == 2 and db[h1].occ == 5
    assert db[h1].in_app_times_ns == [100, 300, 200, 400, 500] and db[h1].in_app_time_ns == median([100, 300, 200, 400, 500])
    assert Path(db[h1].prologue_fn).read_bytes() == kept, "the first recording's snapshots stay"
    assert len(list((dbdir / "snapshots").iterdir())) == 4
    assert [r["pid"] for r in db.provenance["runs"]] == [4242, 777]


def test_a_truncated_log_marks_the_record_incomplete(app, index, tmp_path):
    a1, params, masked = scale_args(BASE, 256)
    run = RawRun(tmp_path / ".raw-1", app)
    run.instance(SCALE, a1, params, masked, bytes(64), bytes(64))
    with open(run.log, "a") as fh:
        fh.write('{"ev":"occ","i":0,"n"')  # the disk filled up mid-line
    out = postprocess(run.raw, tmp_path / "db", index=index)
    assert not out.complete
    db = only_db(tmp_path / "db")
    assert len(db) == 1 and not db.complete


def test_a_lost_snapshot_drops_the_instance_and_marks_incomplete(app, index, tmp_path):
    a1, params, masked = scale_args(BASE, 256)
    run = RawRun(tmp_path / ".raw-1", app)
    run.instance(SCALE, a1, params, masked, bytes(64), bytes(64))
    run.exit()
    next(run.raw.glob("*.epilogue")).unlink()
    out = postprocess(run.raw, tmp_path / "db", index=index)
    assert not out.complete and any("lost its snapshot" in w for w in out.warnings)
    assert len(only_db(tmp_path / "db")) == 0


def test_kernels_without_ir_are_recorded_and_named(tmp_path):
    name = "_Z5nvccKPf"
    run = RawRun(tmp_path / ".raw-1", None)  # the app carries no IR
    run.instance(name, struct.pack("<Q", BASE), [(0, 8)], [(0, 8)], bytes(16), bytes(16))
    run.exit()
    out = postprocess(run.raw, tmp_path / "db")
    assert out.kernels_without_ir == ["nvccK(float*)"]
    db = only_db(tmp_path / "db")
    assert db.static_hash == static_hash_without_ir(name) and db.llvm_files == []
    assert not db.replayable and db.not_replayable_reason.startswith("no IR")
    assert db.arg_names == ["arg0"] and len(db) == 1


def test_a_kernel_only_launched_in_graphs_is_reported(app, index, tmp_path):
    run = RawRun(tmp_path / ".raw-1", app)
    run.emit(ev="unsupported", k=run.kid(OTHER), why="graph_capture")
    run.kstat(OTHER, 3, 0, 0, {"graph_capture": 3})
    run.exit()
    out = postprocess(run.raw, tmp_path / "db", index=index)
    (s,) = out.kernels
    assert s.instances == 0 and not s.replayable and "CUDA graph" in s.line()
    db = only_db(tmp_path / "db")
    assert len(db) == 0 and not db.replayable and "3 launched inside a CUDA graph capture" in db.not_replayable_reason
    assert db.extra["UnsupportedLaunches"] == {"graph_capture": 3}


def test_pointers_into_unplaceable_memory_and_textures_make_a_kernel_not_replayable(app, index, tmp_path):
    run = RawRun(tmp_path / ".raw-1", app)
    a1, params, masked = scale_args(0x7F0000000000, 256)
    run.instance(SCALE, a1, params, masked, bytes(16), bytes(16), foreign=[[0, 0]])
    targs = struct.pack("<QQi", 1, BASE, 32)
    run.instance(TEXREAD, targs, [(0, 8), (8, 8), (16, 4)], [(8, 8)], bytes(16), bytes(16), tex=[0])
    run.exit()
    postprocess(run.raw, tmp_path / "db", index=index)
    dbs = {RecordedExecution.from_json(p).kernel_name: RecordedExecution.from_json(p) for p in find_dbs(str(tmp_path / "db"))}
    assert not dbs[SCALE].replayable and "argument 0 points into managed memory" in dbs[SCALE].not_replayable_reason
    assert not dbs[TEXREAD].replayable and "texture" in dbs[TEXREAD].not_replayable_reason


def test_managed_and_registered_host_memory_is_snapshotted_not_foreign(app, index, tmp_path):
    """Pointers into managed memory and app-registered host memory no longer make a kernel unreplayable:
    the recorder snapshots them and says so in the inst event; the DB keeps it per instance (schema v3)
    and `mneme show` names it."""
    from mneme.record.housekeeping import show
    from mneme.record.schema import SCHEMA_VERSION

    managed = 0x7F0000200000
    run = RawRun(tmp_path / ".raw-1", app)
    a1, params, masked = scale_args(managed, 256)
    named = [[managed, 65536], [managed + 65536, 512]]
    run.instance(SCALE, a1, params, masked, bytes(16), bytes(16),
                 extra={"managed": named, "managed_n": 40, "managed_bytes": 1 << 20,
                        "registered": [[0x55D000001010, 4000]], "registered_n": 1, "registered_bytes": 4000})
    run.exit()
    out = postprocess(run.raw, tmp_path / "db", index=index)
    (s,) = out.kernels
    assert s.replayable, s.reason
    db = only_db(tmp_path / "db")
    assert db.replayable and not db.not_replayable_reason
    (dh,) = list(db)
    mem = db.extra["InstanceAttributes"][dh]["SnapshottedMemory"]
    assert mem["managed"]["Ranges"] == 40 and mem["managed"]["Bytes"] == 1 << 20, "totals cover every range"
    assert mem["managed"]["Named"] == [{"Address": hex(managed), "Bytes": 65536},
                                       {"Address": hex(managed + 65536), "Bytes": 512}]
    assert mem["host_registered"] == {"Ranges": 1, "Bytes": 4000, "Named": [{"Address": "0x55d000001010", "Bytes": 4000}]}
    assert json.loads(Path(db.path).read_text())["SchemaVersion"] == SCHEMA_VERSION == 3
    text = show([str(tmp_path / "db")])
    assert "(+ managed memory 1.0 MiB in 40 range(s), registered host memory 3.9 KiB in 1 range(s))" in text, text
    assert "NOT replayable" not in text


def test_a_registered_range_the_device_sees_elsewhere_is_still_reported(app, index, tmp_path):
    run = RawRun(tmp_path / ".raw-1", app)
    a1, params, masked = scale_args(0x55D000001010, 256)
    run.instance(SCALE, a1, params, masked, bytes(16), bytes(16), foreign=[[0, 1]])
    run.exit()
    postprocess(run.raw, tmp_path / "db", index=index)
    db = only_db(tmp_path / "db")
    assert not db.replayable and "argument 0 points into host memory the app registered itself" in db.not_replayable_reason
    assert "sees at another address" in db.not_replayable_reason


def test_merging_refuses_another_arena_base(app, index, tmp_path):
    a1, params, masked = scale_args(BASE, 256)
    run = RawRun(tmp_path / ".raw-1", app)
    run.instance(SCALE, a1, params, masked, bytes(16), bytes(16))
    run.exit()
    postprocess(run.raw, tmp_path / "db", index=index)
    run = RawRun(tmp_path / ".raw-2", app, base=0x200000000000)
    run.instance(SCALE, a1, params, masked, bytes(16), bytes(16), addr=0x200000000000)
    run.exit()
    with pytest.raises(RecordError, match="MNEME_VA_BASE"):
        postprocess(run.raw, tmp_path / "db", index=index)


def test_the_wall_split_says_where_mneme_records_time_went(tmp_path):
    from mneme.record.postprocess import RecordOutcome

    out = RecordOutcome(db_dir=tmp_path, kernels=[], complete=True, processes=1)
    assert out.wall_line() is None, "no split before runner.record fills it"
    out.wall_split = {"prepare_s": 0.25, "app_s": 2.0, "postprocess_s": 0.5}
    out.recorder_time, out.recorded_instances = {"record_ns": 750_000_000}, 2
    line = out.wall_line()
    assert line.startswith("wall 2.750 s: prepare 0.250 s") and "app 2.000 s (recorder 0.750 s of it)" in line
    assert line.endswith("post-processing 0.500 s")


def test_the_kernel_table_from_the_reference_graph_equals_the_closures(app):
    """IRIndex.table_entry walks one reference graph per module; each kernel's entry must be what its
    pruned closure says: parameter count, masked bytes (pointers, struct padding), reachable variables."""
    fast, slow = IRIndex(), IRIndex()
    fast.add_file(app)
    slow.add_file(app)
    for k in (SCALE, OTHER, TEXREAD):
        info = slow.closure(k)
        assert fast.table_entry(k) == (len(info.arg_kinds), info.masked, info.variables, info.state), k
    n, masked, variables, state = fast.table_entry(SCALE)
    assert n == 2 and {"g_val", "g_ptr", "c_w"} <= set(variables), "helper's variables, through g_ptr too"
    assert any(p == 1 for p, _, _ in masked), "P's padding is masked"
    assert fast.table_entry(OTHER)[2] == [] and state == [], "other reaches no variable; scale no device state"


def test_symbol_references_split_a_module_at_its_top_level_definitions():
    from mneme.ir.module import reachable_symbols, symbol_references

    text = ('@g = addrspace(1) global i32 0\n@tab = addrspace(1) global [1 x ptr] [ptr @f]\n'
            '@"q.x" = internal constant i32 1\n%struct.S = type { i32 }\n'
            'define void @f(ptr %p) {\n  %v = load i32, ptr addrspace(1) @g\n  ret void\n}\n'
            'define ptx_kernel void @k() {\n  call void @f(ptr null)\n  %x = load i32, ptr @"q.x"\n  ret void\n}\n'
            'declare void @ext()\nattributes #0 = { nounwind }\n!0 = !{ptr @k, !"kernel", i32 1}\n')
    refs = symbol_references(text)
    assert refs == {"g": set(), "tab": {"f"}, "q.x": set(), "f": {"g"}, "k": {"f", "q.x"}}
    assert reachable_symbols(refs, "k") == {"k", "f", "g", "q.x"}
    assert reachable_symbols(refs, "tab") == {"tab", "f", "g"}, "an initializer's function pointer is followed"


@pytest.mark.parametrize("ir_arch", ["", "sm_90"], ids=["first-arch-ir", "MNEME_IR_ARCH"])
def test_ir_of_another_architecture_than_the_app_ran_is_a_warning_naming_the_fix(tmp_path, ir_arch):
    """A build for sm_75 and sm_90 embeds sm_75's IR by default; the app ran sm_90's code on the H200, and
    code that tests __CUDA_ARCH__ differs (radixSortThrust's CUB kernel: 256 vs 384 threads)."""
    (tmp_path / "app.cu").write_text(APP_SOURCE)
    env = dict(os.environ, MNEME_IR_ARCH=ir_arch) if ir_arch else {k: v for k, v in os.environ.items()
                                                                    if k != "MNEME_IR_ARCH"}
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "cc", "-O2", "--cuda-gpu-arch=sm_75",
                        "--cuda-gpu-arch=sm_90", "-o", str(tmp_path / "app"), str(tmp_path / "app.cu")],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    idx = IRIndex()
    assert idx.add_file(tmp_path / "app") == 1
    raw = tmp_path / ".raw-1"
    run = RawRun(raw, tmp_path / "app")
    a1, params, masked = scale_args(BASE, 256)
    run.instance(SCALE, a1, params, masked, bytes(1024), bytes(1024), t_ns=10_000)
    run.kstat(SCALE, 1, 1, 1)
    run.exit()
    out = postprocess(raw, tmp_path / "db", index=idx)
    said = [w for w in out.warnings if "MNEME_IR_ARCH" in w]
    if ir_arch:
        assert not said, out.warnings
        assert only_db(tmp_path / "db").extra["BuildSettings"]["arch"] == "sm_90"
    else:
        (w,) = said
        assert "its IR was compiled for sm_75, but the app ran sm_90's code of its build (sm_75, sm_90)" in w, w
        assert w.endswith("Rebuild with MNEME_IR_ARCH=sm_90 and record again"), w
