"""Where the recorder's hash/diff and write time goes: the native snapshot writer on synthetic buffers,
the base commit's writer and this tree's side by side in one run (CPU only).

Per recorded instance the recorder writes a prologue (every live blob in full) and an epilogue (each
blob diffed against the prologue copy; `mneme record`'s default epilogue format is `diff`). This drives
the same calls through cffi on one blob shaped like a corpus buffer: 64-512 MiB of random bytes, of which
the kernel changed 0 % (an input), 1 % in one block, 1 % as scattered 4-byte words (every 100th word)
or 100 % (an output). Three writers are compared in the same process on the same buffers:

- `base`: native/snapshot.c of the base commit (default: the merge base with main), compiled with
  `cc -O2` like the recorder; it fsyncs every file and calls mn_writer_blob_epilogue;
- `new, fsync`: this tree's snapshot.c with fsync left on, calling what the recorder calls now
  (mn_writer_blob_epilogue_sum with the prologue's checksum);
- `new`: the same without fsync, as librecord writes by default now (MNEME_SNAPSHOT_FSYNC=0);
- `new, thread`: `new` with the prologue written on a second thread while the epilogue is written, as
  librecord does now (MNEME_SNAPSHOT_THREAD=1); both start together here, so the epilogue cannot take
  the prologue's checksum yet and hashes its blob itself (the recorder's worst case).

`instance s` is what the app waits for: prologue + epilogue, or the wall time of both together on
two threads.

Each file starts from a clean page cache (os.sync() before it, not timed), so a writer without
fsync is not charged the writeback of the rows before it. For each file: wall time, the part inside write/fsync/close (mn_snapshot_io_ns: `write` in the
recorder's split) and the rest (checksums, diff, encoding: `hash/diff`). Bytes hashed per file are
counted from the code paths (the prologue hashes every blob twice: its content checksum and the record
checksum over the same bytes; the epilogue hashes the blob's new contents for its content checksum,
unless it did not change, and the record checksum over what it stores). Component throughputs: XXH64
(mn_checksum), the base and new diff loops and libc memcmp over equal buffers, all in GB/s on one core.

The ratio line: new / base hash/diff and write time per instance (prologue + epilogue), and the time
the app waits for (instance s), summed over the scenarios of the largest size.

Usage: python bench/bench_snapshot_write.py [--quick] [--sizes 64,256,512] [--reps 3] [--base REV] [--dir DIR]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import cffi
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

NAME = "snapshot_write"
MIB = 1 << 20
PRO, EPI, DIFF = 1, 2, 0
GAP = 16  # MN_MERGE_GAP of the recorder

#: the snapshot API's declarations (one source: native/snapshot.cdef; the base writer has the same calls
#: but for the ones this tree added, which are only used on the new writers) and libc's memcmp
CDEF = (benchlib.ROOT / "native" / "snapshot.cdef").read_text() + "\nint memcmp(const void *a, const void *b, size_t n);\n"

FILE_COLUMNS = [
    ["size_mib", "MiB", "d"], ["change", "changed"], ["impl", "writer"],
    ["pro_s", "prologue s", ".3f"], ["pro_hash_s", "hash", ".3f"], ["pro_write_s", "write", ".3f"],
    ["epi_s", "epilogue s", ".3f"], ["epi_hash_s", "hash/diff", ".3f"], ["epi_write_s", "write", ".3f"],
    ["hashed_mib", "MiB hashed", ",d"], ["epi_mib", "epilogue MiB", ".1f"], ["instance_s", "instance s", ".3f"],
    ["vs_base", "instance / base", ".2fx"],
]
COMPONENT_COLUMNS = [["what", "loop"], ["impl", "writer"], ["gbps", "GB/s", ".2f"]]


def compile_lib(src_dir: Path, out: Path) -> Path:
    subprocess.run(["cc", "-std=gnu11", "-O2", "-fPIC", "-shared", "-I", str(src_dir), "-o", str(out),
                    str(src_dir / "snapshot.c")], check=True)
    return out


def base_sources(rev: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("snapshot.c", "snapshot.h"):
        text = subprocess.run(["git", "show", f"{rev}:native/{name}"], cwd=benchlib.ROOT, check=True,
                              capture_output=True).stdout
        (dest / name).write_bytes(text)
    return dest


class Writer:
    """One compiled snapshot.c: the recorder's prologue and epilogue calls for one blob."""

    def __init__(self, name: str, path: Path, new_api: bool, fsync: bool, threaded: bool = False):
        self.name = name
        self.threaded = threaded
        self.ffi = cffi.FFI()
        self.ffi.cdef(CDEF)
        self.lib = self.ffi.dlopen(str(path))
        self.new_api = new_api
        if new_api:
            self.lib.mn_snapshot_set_fsync(1 if fsync else 0)

    def _check(self, rc: int) -> None:
        if rc:
            raise RuntimeError(self.ffi.string(self.lib.mn_last_error()).decode())

    def prologue(self, path: Path, data: np.ndarray, sync: bool = True) -> Dict[str, float]:
        lib, ffi = self.lib, self.ffi
        if sync:
            os.sync()  # every file starts from a clean page cache: no writeback left over from the row before
        io0, t0 = lib.mn_snapshot_io_ns(), time.perf_counter()
        w = lib.mn_writer_open(os.fsencode(path), PRO)
        if w == ffi.NULL:
            self._check(-1)
        self._check(lib.mn_writer_blob(w, 0x1000, data.nbytes, 0, ffi.from_buffer(data)))
        self.sum = lib.mn_writer_last_checksum(w) if self.new_api else None
        self._check(lib.mn_writer_close(w))
        return {"s": time.perf_counter() - t0, "io": (lib.mn_snapshot_io_ns() - io0) / 1e9}

    def epilogue(self, path: Path, before: np.ndarray, after: np.ndarray, sync: bool = True) -> Dict[str, float]:
        lib, ffi = self.lib, self.ffi
        if sync:
            os.sync()
        io0, t0 = lib.mn_snapshot_io_ns(), time.perf_counter()
        w = lib.mn_writer_open(os.fsencode(path), EPI)
        if w == ffi.NULL:
            self._check(-1)
        b, a = ffi.from_buffer(before), ffi.from_buffer(after)
        if self.new_api and self.sum is not None:
            self._check(lib.mn_writer_blob_epilogue_sum(w, 0x1000, after.nbytes, 0, b, self.sum, a, DIFF, GAP))
        else:
            self._check(lib.mn_writer_blob_epilogue(w, 0x1000, after.nbytes, 0, b, a, DIFF, GAP))
        self._check(lib.mn_writer_close(w))
        return {"s": time.perf_counter() - t0, "io": (lib.mn_snapshot_io_ns() - io0) / 1e9,
                "bytes": path.stat().st_size}

    def diff_gbps(self, a: np.ndarray, b: np.ndarray) -> float:
        out = self.ffi.new("mn_range **")
        t0 = time.perf_counter()
        n = self.lib.mn_diff_ranges(self.ffi.from_buffer(a), self.ffi.from_buffer(b), a.nbytes, GAP, out)
        dt = time.perf_counter() - t0
        if n < 0:
            self._check(-1)
        self.lib.mn_free(out[0])
        return a.nbytes / dt / 1e9


def changed(before: np.ndarray, how: str) -> np.ndarray:
    after = before.copy()
    n = after.nbytes
    if how == "1% block":
        after[n // 2:n // 2 + n // 100] ^= 0x5A
    elif how == "1% words":
        words = after.view(np.uint32)
        words[::100] += 1
    elif how == "100%":
        after ^= 0xA5
    return after


def hashed_mib(size: int, how: str, epi_bytes: int, new_api: bool) -> int:
    """Bytes run through XXH64 for one instance (prologue + epilogue), from the code paths."""
    pro = 2 * size
    unchanged = how == "0%"
    epi_content = 0 if (new_api and unchanged) else size
    return (pro + epi_content + epi_bytes) // MIB


def both_at_once(w: Writer, tmp: Path, before: np.ndarray, after: np.ndarray, reps: int) -> Dict[str, Any]:
    """The prologue on a second thread while this one writes the epilogue (cffi lets the GIL go)."""
    runs = []
    for _ in range(reps):
        got: Dict[str, Dict[str, float]] = {}
        w.sum = None
        os.sync()
        t = threading.Thread(target=lambda: got.__setitem__("p", w.prologue(tmp / "t.prologue", before, sync=False)))
        t0 = time.perf_counter()
        t.start()
        e = w.epilogue(tmp / "t.epilogue", before, after, sync=False)
        t.join()
        wall = time.perf_counter() - t0
        p = got["p"]
        runs.append({"instance_s": wall, "pro_s": p["s"], "pro_hash_s": p["s"] - p["io"], "pro_write_s": p["io"],
                     "epi_s": e["s"], "epi_hash_s": e["s"] - e["io"], "epi_write_s": e["io"],
                     "epi_mib": e["bytes"] / MIB, "hashed_mib": hashed_mib(before.nbytes, "100%", int(e["bytes"]), True)})
    row = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    row["hashed_mib"] = int(row["hashed_mib"])
    return row


def median_of(fn, reps: int) -> Dict[str, float]:
    runs = [fn() for _ in range(reps)]
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


def main(argv: List[str] = None) -> int:
    ap = benchlib.arguments(NAME, __doc__)
    ap.add_argument("--sizes", default=None, help="blob sizes in MiB (default 64,256,512; --quick 64,256)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per file, median (default 3; --quick 1)")
    ap.add_argument("--base", default=None, help="git revision of the base writer (default: merge base with main)")
    ap.add_argument("--dir", type=Path, default=None, help="where the files go (default a temporary directory)")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in (args.sizes or ("64,256" if args.quick else "64,256,512")).split(",")]
    reps = args.reps or (1 if args.quick else 3)
    base = args.base or subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=benchlib.ROOT, check=True,
                                       capture_output=True, text=True).stdout.strip()
    run = benchlib.Run(NAME, __doc__, args.quick)
    run.header["base"] = base[:12]
    tmp = Path(tempfile.mkdtemp(prefix="mneme-snapbench-", dir=args.dir))
    try:
        base_lib = compile_lib(base_sources(base, tmp / "base"), tmp / "base.so")
        new_lib = compile_lib(benchlib.ROOT / "native", tmp / "new.so")
        shutil.copy(new_lib, tmp / "new_fsync.so")  # dlopen of the same path would share its fsync switch
        writers = [Writer("base", base_lib, False, True), Writer("new, fsync", tmp / "new_fsync.so", True, True),
                   Writer("new", new_lib, True, False), Writer("new, thread", new_lib, True, False, threaded=True)]
        rows: List[Dict[str, Any]] = []
        comps: List[Dict[str, Any]] = []
        rng = np.random.default_rng(16)
        for size in sizes:
            before = rng.integers(0, 256, size * MIB, dtype=np.uint8)
            for how in ("0%", "1% block", "1% words", "100%"):
                after = changed(before, how)
                base_total = None
                for w in writers:
                    ident = {"size_mib": size, "change": how, "impl": w.name}

                    def one(w=w, after=after):
                        if w.threaded:
                            return both_at_once(w, tmp, before, after, reps)
                        p = median_of(lambda: w.prologue(tmp / "x.prologue", before), reps)
                        e = median_of(lambda: w.epilogue(tmp / "x.epilogue", before, after), reps)
                        return {"instance_s": p["s"] + e["s"], "pro_s": p["s"], "pro_hash_s": p["s"] - p["io"], "pro_write_s": p["io"],
                                "epi_s": e["s"], "epi_hash_s": e["s"] - e["io"], "epi_write_s": e["io"],
                                "epi_mib": e["bytes"] / MIB,
                                "hashed_mib": hashed_mib(size * MIB, how, int(e["bytes"]), w.new_api)}
                    row = benchlib.guarded(ident, one, args.verbose)
                    if "error" not in row:
                        total = row["instance_s"]
                        base_total = total if w.name == "base" else base_total
                        row["vs_base"] = benchlib.ratio(total, base_total)
                    rows.append(row)
                print(f"  {size} MiB, {how} changed: done", file=sys.stderr, flush=True)
            if size == sizes[-1]:
                n = before.nbytes
                same = before.copy()
                lib, ffi = writers[2].lib, writers[2].ffi
                t0 = time.perf_counter()
                lib.mn_checksum(ffi.from_buffer(before), n, 0)
                comps.append({"what": f"XXH64 (mn_checksum), {size} MiB", "impl": "new",
                              "gbps": n / (time.perf_counter() - t0) / 1e9})
                for w in (writers[0], writers[2]):
                    comps.append({"what": f"mn_diff_ranges, equal {size} MiB", "impl": w.name,
                                  "gbps": w.diff_gbps(before, same)})
                    comps.append({"what": f"mn_diff_ranges, 100% changed {size} MiB", "impl": w.name,
                                  "gbps": w.diff_gbps(before, changed(before, "100%"))})
                t0 = time.perf_counter()
                lib.memcmp(ffi.from_buffer(before), ffi.from_buffer(same), n)
                comps.append({"what": f"libc memcmp, equal {size} MiB", "impl": "-",
                              "gbps": n / (time.perf_counter() - t0) / 1e9})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    run.add(benchlib.table(f"One blob per instance: prologue + epilogue (diff format), median of {reps}, "
                           f"{benchlib.cpu_model()}", FILE_COLUMNS, rows, ident=3))
    run.add(benchlib.table("Component loops on one core", COMPONENT_COLUMNS, comps, ident=2))
    big = [r for r in rows if r["size_mib"] == sizes[-1] and "error" not in r]

    def total(impl: str, key: str) -> float:
        return sum(r[f"pro_{key}_s"] + r[f"epi_{key}_s"] for r in big if r["impl"] == impl)

    impls = [w.name for w in writers]
    run.summary = {f"{impl}_{key}_s": total(impl, key) for impl in impls for key in ("hash", "write")}
    run.summary.update({f"{impl}_instance_s": sum(r["instance_s"] for r in big if r["impl"] == impl) for impl in impls})
    run.summary["size_mib"] = sizes[-1]
    sm = run.summary
    hb, hn, wb, wn = sm["base_hash_s"], sm["new_hash_s"], sm["base_write_s"], sm["new_write_s"]
    ib, i_new, it = sm["base_instance_s"], sm["new_instance_s"], sm["new, thread_instance_s"]
    run.ratio = (f"{sizes[-1]} MiB blob, 4 change scenarios: hash/diff {hn:.3f} s vs {hb:.3f} s base "
                 f"({benchlib.fmt(benchlib.ratio(hn, hb), '.2fx')}), write {wn:.3f} s vs {wb:.3f} s base "
                 f"({benchlib.fmt(benchlib.ratio(wn, wb), '.2fx')}; new with fsync: {sm['new, fsync_write_s']:.3f} s); "
                 f"what the app waits for: {i_new:.3f} s, {it:.3f} s with the prologue thread, vs {ib:.3f} s base "
                 f"({benchlib.fmt(benchlib.ratio(it, ib), '.2fx')})")
    return run.finish(args.out)


if __name__ == "__main__":
    sys.exit(main())
