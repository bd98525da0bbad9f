"""Record overhead on the many-launch example: app wall time plain vs under the recorder, and stored
snapshot bytes vs raw prologue+epilogue bytes.

examples/bin/manylaunch launches one kernel `repeats` times for each of `sizes` problem sizes (default 4 x
200 launches, base 2^20 elements: 4 instances, 800 launches, 2 x 32 MiB of device memory). Side by side in
one run (after one untimed run of the app), each mode repeated and its median app wall time taken (process
start to exit, context creation included, as a user sees it):

- `plain`: the app alone;
- `preload`: librecord preloaded and its arena serving every allocation, but no kernel selected (the cost
  of interposition alone);
- `recorded, retime 0`: every instance recorded (prologue, timed launch, epilogue), no extra timing runs;
  later launches of a recorded instance are counted and timed;
- `recorded, retime 10`: the default, with 10 warm timing reruns per new instance;
- `mneme record (CLI)`: the whole command, Python start and post-processing (IR closure, DB) included.

The recorded modes run the app with exactly the environment `mneme record` gives it (mneme.record.runner)
and post-process the raw output into a record DB; post-processing is timed apart.

Snapshot bytes: per instance the recorder reports the device state it captured (StateBytes: the live
arena allocations) and what it stored (SnapshotBytes: prologue + epilogue files); raw prologue+epilogue
bytes are 2 x StateBytes (both full). Snapshot throughput is derived: the bytes the recorder copies to the
host (2 x StateBytes per instance) over the extra wall time of `recorded, retime 0` against `preload`
(so it includes writing the files: a lower bound of the copy bandwidth), held against the host-device
bandwidth measured in the same run through mneme's core (pinned-staged copies into pageable memory, as
the recorder's cudaMemcpy does).

The ratio line: app wall time recorded (retime 0) / plain, and stored / raw snapshot bytes.

Usage: python bench/bench_record.py [--quick] [--sizes 4 --repeats 200 --base 1048576] [--runs N] [--out FILE]
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

NAME = "record"
APP = benchlib.ROOT / "examples" / "bin" / "manylaunch"
CHECKSUM = re.compile(r"checksum=(\S+)")
#: a kernel-name regex that selects nothing: interposition without recording
NOTHING = "^$"

MODE_COLUMNS = [
    ["mode", "mode"], ["runs", "runs", "d"], ["app_s", "app wall s", ".3f"], ["vs_plain", "/ plain", ".2fx"],
    ["post_s", "post-process s", ".2f"], ["instances", "instances", "d"], ["launches", "launches", "d"],
    ["checksum_same", "checksum same"],
]
SNAP_COLUMNS = [
    ["instance", "instance"], ["grid", "grid"], ["occurrences", "launches", "d"], ["state_bytes", "state B", ",d"],
    ["raw_bytes", "raw pro+epi B", ",d"], ["stored_bytes", "stored B", ",d"], ["on_disk", "files B", ",d"],
    ["stored_vs_raw", "stored / raw", ".3f"],
]
BW_COLUMNS = [["what", "what"], ["bytes", "bytes", ",d"], ["seconds", "s", ".4f"], ["gb_s", "GB/s", ".2f"],
              ["vs_d2h", "/ D2H", ".2f"]]


# ---- running the app ------------------------------------------------------------------------------

def checksum(stdout: str) -> Optional[str]:
    m = CHECKSUM.search(stdout or "")
    return m.group(1) if m else None


def run_app(argv: List[str], env: Optional[Dict[str, str]] = None, timeout: float = 300) -> Dict[str, Any]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {(p.stderr or p.stdout)[-500:]}")
    return {"wall": wall, "checksum": checksum(p.stdout)}


def recorded_run(argv: List[str], db_dir: Path, retime: int, kernels: Optional[str], va_size: float) -> Dict[str, Any]:
    """The app under librecord with `mneme record`'s environment, then post-processed into `db_dir`."""
    from mneme.record.kerneltable import IRIndex, compile_selector, write_table
    from mneme.record.postprocess import postprocess
    from mneme.record.runner import RecordSettings, check_driver, find_librecord, recorder_env

    settings = RecordSettings(db_dir=db_dir, kernels=kernels, retime=retime, va_size_gib=va_size)
    settings.validate()
    check_driver()
    index = IRIndex()
    index.add_file(argv[0])
    raw = db_dir / f".raw-bench-{time.monotonic_ns()}"
    raw.mkdir(parents=True)
    table = write_table(index, compile_selector(kernels), raw / "kernels.tsv")
    env = recorder_env(settings, find_librecord(build=False), raw, table)
    out = run_app(argv, env)
    t0 = time.perf_counter()
    outcome = postprocess(raw, db_dir, index=index)
    out["post"] = time.perf_counter() - t0
    recorded = [k for k in outcome.kernels if k.db_path is not None]
    out["instances"] = sum(k.instances for k in recorded)
    out["launches"] = sum(k.launches for k in outcome.kernels)
    out["db"] = str(recorded[0].db_path) if recorded else None
    for e in outcome.errors:
        print(f"  recorder: {e}", file=sys.stderr)
    if kernels is None and not out["instances"]:
        raise RuntimeError("nothing was recorded: " + ("; ".join(outcome.errors[:3]) or "no instance in the DB"))
    return out


def cli_run(argv: List[str], db_dir: Path, retime: int) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", "mneme.cli", "record", "-rdb", str(db_dir), "--retime", str(retime), "--quiet", "--",
           *argv]
    return run_app(cmd)


def mode_row(mode: str, runs: List[Dict[str, Any]], plain_s: Optional[float], plain_sum: Optional[str]) -> Dict[str, Any]:
    """One mode's row from its runs: median wall, median post-processing, instances of the last run."""
    app_s = benchlib.median(r["wall"] for r in runs)
    sums = {r.get("checksum") for r in runs}
    return {
        "mode": mode, "runs": len(runs), "app_s": app_s, "vs_plain": benchlib.ratio(app_s, plain_s),
        "post_s": benchlib.median(r["post"] for r in runs if "post" in r),
        "instances": runs[-1].get("instances"), "launches": runs[-1].get("launches"),
        "checksum_same": None if plain_sum is None or None in sums else ("yes" if sums == {plain_sum} else "NO"),
    }


# ---- snapshot bytes -------------------------------------------------------------------------------

def snapshot_rows(db_path: str) -> List[Dict[str, Any]]:
    """Per instance: captured state, raw pro+epi (2 x state), stored bytes and the files' sizes."""
    from mneme.record.db import RecordedExecution

    rec = RecordedExecution.from_json(db_path, check_files=False)
    attrs = rec.extra.get("InstanceAttributes") or {}
    rows = []
    for dh, inst in sorted(rec.items(), key=lambda kv: kv[1].grid_dim.total()):
        a = attrs.get(dh, {})
        state = a.get("StateBytes")
        stored = a.get("SnapshotBytes")
        files = sum(Path(p).stat().st_size for p in (inst.prologue_fn, inst.epilogue_fn) if Path(p).is_file())
        rows.append(snapshot_row(dh, str(inst.grid_dim), inst.occ, state, stored, files))
    return rows


def snapshot_row(instance: str, grid: str, occ: Optional[int], state: Optional[int], stored: Optional[int],
                 files: Optional[int]) -> Dict[str, Any]:
    raw = 2 * state if state is not None else None
    return {"instance": instance, "grid": grid, "occurrences": occ, "state_bytes": state, "raw_bytes": raw,
            "stored_bytes": stored, "on_disk": files, "stored_vs_raw": benchlib.ratio(stored, raw)}


def total_row(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    ok = [r for r in rows if "error" not in r and r["state_bytes"] is not None and r["stored_bytes"] is not None]
    if not ok:
        return snapshot_row("total", "", None, None, None, None)
    state = sum(r["state_bytes"] for r in ok)
    stored = sum(r["stored_bytes"] for r in ok)
    return snapshot_row("total", "", sum(r["occurrences"] for r in ok), state, stored, sum(r["on_disk"] for r in ok))


# ---- bandwidth ------------------------------------------------------------------------------------

def host_device_bandwidth(nbytes: int, reps: int) -> Dict[str, float]:
    """Seconds per copy of `nbytes` device -> pageable host and back, through mneme's core (best of reps)."""
    from mneme.device import Device, DeviceAllocation
    from mneme.device.errors import check, lib

    ffi, native = lib()
    with Device(0):
        buf = ffi.new("uint8_t[]", nbytes)
        with DeviceAllocation(nbytes) as mem:
            check(native.mnc_memcpy_htod(mem.addr, buf, nbytes))  # warm: staging buffers, page faults
            check(native.mnc_memcpy_dtoh(buf, mem.addr, nbytes))
            d2h, h2d = [], []
            for _ in range(reps):
                d2h.append(benchlib.timed(lambda: check(native.mnc_memcpy_dtoh(buf, mem.addr, nbytes))))
                h2d.append(benchlib.timed(lambda: check(native.mnc_memcpy_htod(mem.addr, buf, nbytes))))
    return {"d2h": min(d2h), "h2d": min(h2d)}


def bandwidth_rows(snap_bytes: Optional[int], snap_s: Optional[float], copy_bytes: int,
                   copies: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Derived snapshot throughput and the measured copies (`copies`: seconds per copy, or an error row)."""
    d2h, h2d = copies.get("d2h"), copies.get("h2d")
    d2h_rate = benchlib.ratio(copy_bytes, d2h)

    def row(what: str, nbytes: Optional[int], seconds: Optional[float]) -> Dict[str, Any]:
        rate = benchlib.ratio(nbytes, seconds)
        return {"what": what, "bytes": nbytes, "seconds": seconds, "gb_s": rate / 1e9 if rate else None,
                "vs_d2h": benchlib.ratio(rate, d2h_rate)}

    snap = row("snapshots (derived: recorded - preload)", snap_bytes, snap_s)
    if "error" in copies:
        return [snap, copies]
    return [snap, row("device -> host (mneme core)", copy_bytes, d2h), row("host -> device (mneme core)", copy_bytes, h2d)]


def ratio_line(modes: Dict[str, Dict[str, Any]], total: Dict[str, Any], bw: List[Dict[str, Any]]) -> str:
    rec = modes.get("recorded, retime 0", {})
    snap = bw[0] if bw else {}
    return (f"app wall recorded (retime 0) / plain = {benchlib.fmt(rec.get('vs_plain'), '.2fx')} "
            f"({benchlib.fmt(rec.get('app_s'), '.3f')} s vs {benchlib.fmt(modes.get('plain', {}).get('app_s'), '.3f')} s, "
            f"{benchlib.fmt(rec.get('launches'), 'd')} launches, {benchlib.fmt(rec.get('instances'), 'd')} instances); "
            f"stored / raw snapshot bytes = {benchlib.fmt(total.get('stored_vs_raw'), '.3f')}; "
            f"snapshot throughput / D2H = {benchlib.fmt(snap.get('vs_d2h'), '.2f')}")


# ---- main -----------------------------------------------------------------------------------------

def main(argv: List[str] = None) -> int:
    ap = benchlib.arguments(NAME, __doc__)
    ap.add_argument("--app", type=Path, default=APP, help="the many-launch app (default examples/bin/manylaunch)")
    ap.add_argument("--sizes", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--base", type=int, default=1 << 20)
    ap.add_argument("--runs", type=int, default=None, help="runs per mode (default 5; --quick 3)")
    ap.add_argument("--va-size", type=float, default=4.0, help="recorder arena GiB (default 4)")
    ap.add_argument("--copy-mib", type=int, default=256, help="MiB per host-device bandwidth copy (default 256)")
    ap.add_argument("--tmp", type=Path, default=None, help="where the record DBs go (default a temporary directory)")
    args = ap.parse_args(argv)
    runs = args.runs or (3 if args.quick else 5)
    app = [str(args.app), str(args.sizes), str(args.repeats), str(args.base)]
    run = benchlib.Run(NAME, __doc__, args.quick)
    run.summary.update({"app": app[1:], "runs": runs})

    modes: Dict[str, Dict[str, Any]] = {}
    snaps: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mneme-bench-record-", dir=args.tmp) as tmp:
        root = Path(tmp)
        plan = [
            ("plain", runs, lambda d: run_app(app)),
            ("preload", max(2, runs - 1), lambda d: recorded_run(app, d, 0, NOTHING, args.va_size)),
            ("recorded, retime 0", runs, lambda d: recorded_run(app, d, 0, None, args.va_size)),
            ("recorded, retime 10", 1 if args.quick else 2, lambda d: recorded_run(app, d, 10, None, args.va_size)),
            ("mneme record (CLI)", 1, lambda d: cli_run(app, d, 0)),
        ]
        plain: Dict[str, Any] = {}
        try:
            run_app(app)  # untimed: the first context creation on a fresh machine is slow
        except Exception:  # noqa: BLE001 - the plain row reports it
            pass
        for mode, n, fn in plan:
            try:
                results = [fn(root / f"run{i}") for i in range(n)]
                modes[mode] = mode_row(mode, results, plain.get("app_s"), plain.get("checksum"))
                if mode == "plain":
                    plain = {"app_s": modes[mode]["app_s"], "checksum": results[0]["checksum"]}
            except Exception as e:  # noqa: BLE001 - one mode's failure is its row
                results = []
                modes[mode] = benchlib.error_row({"mode": mode}, e, args.verbose)
            if mode == "recorded, retime 0":
                try:
                    if not results or not results[0].get("db"):
                        raise RuntimeError("nothing was recorded (see the `recorded, retime 0` row)")
                    snaps = snapshot_rows(results[0]["db"])
                except Exception as e:  # noqa: BLE001
                    snaps = [benchlib.error_row({"instance": "?"}, e, args.verbose)]
            for d in root.iterdir():  # a few hundred MiB of snapshots per run
                shutil.rmtree(d, ignore_errors=True)
            print(f"  {mode}: {benchlib.fmt(modes[mode].get('app_s'), '.3f')} s", file=sys.stderr, flush=True)

    total = total_row(snaps)
    rec0, pre = modes.get("recorded, retime 0", {}), modes.get("preload", {})
    extra_s = (rec0["app_s"] - pre["app_s"]) if rec0.get("app_s") and pre.get("app_s") else None
    snap_bytes = 2 * total["state_bytes"] if total["state_bytes"] else None
    copy_bytes = args.copy_mib << 20
    try:
        copies = host_device_bandwidth(copy_bytes, 3 if args.quick else 10)
    except Exception as e:  # noqa: BLE001
        copies = benchlib.error_row({"what": "host <-> device (mneme core)"}, e, args.verbose)
    bw = bandwidth_rows(snap_bytes, extra_s if extra_s and extra_s > 0 else None, copy_bytes, copies)

    run.add(benchlib.table(f"App wall time, manylaunch {' '.join(app[1:])} (median of the runs)", MODE_COLUMNS,
                           list(modes.values())))
    run.add(benchlib.table("Snapshot bytes per instance (recorded, retime 0)", SNAP_COLUMNS, snaps + [total]))
    run.add(benchlib.table("Snapshot throughput vs host-device bandwidth", BW_COLUMNS, bw))
    run.summary.update({
        "recorded_vs_plain": rec0.get("vs_plain"), "retime10_vs_plain": modes.get("recorded, retime 10", {}).get("vs_plain"),
        "preload_vs_plain": pre.get("vs_plain"), "stored_vs_raw": total["stored_vs_raw"],
        "snapshot_gb_s": bw[0]["gb_s"], "snapshot_vs_d2h": bw[0].get("vs_d2h"),
    })
    run.ratio = ratio_line(modes, total, bw)
    return run.finish(args.out)


if __name__ == "__main__":
    sys.exit(main())
