"""Replay fidelity and reset cost on the GPU: replay time / in-app time per recorded instance, and the
per-iteration reset time against (bytes written / device-to-device bandwidth).

Each example is first recorded here at a timing size (`mneme record`, default settings: the in-app median
comes from the recorded launch and its 10 warm reruns): vecadd 2^24, stencil2d 4096 4096 2, matmul 1024,
reduce 2^24. Every instance is then replayed by ReplayPipeline at its recorded launch and default<O3>
(the baseline configuration), verified against its epilogue and timed; fidelity = median replay time /
median in-app time. The goal is 1 +- 3 % for instances of at least 20 us (shorter ones are shown but
launch jitter dominates them). Each example replays in its own process, so a fault stays in its rows.

Resets: before every timed iteration replay restores the bytes the kernel writes (the epilogue diff),
device to device from a copy of the prologue. In the same pipeline, `ReplayState.reset_written` is called
in a loop (each call enqueues the copies and waits): `reset` is the median host-observed time per call,
`net` the same minus an empty reset plan's call (the fixed cost of a call and its synchronization). The
device-to-device bandwidth is measured the same way, in the same run: every device blob of the largest
prologue restored whole (net time, hundreds of MiB); it is quoted as bytes copied per second and as
read+write bytes per second (2x, the convention of CUDA's bandwidthTest, which the anchor of about
4.3 TB/s on an H200 follows). The ideal reset time of an instance is its bytes written / bytes copied per
second; the ratio is net / ideal, meaningful where the kernel writes megabytes.

Usage: python bench/bench_replay.py [--quick] [--iterations N] [--only vecadd,matmul] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

NAME = "replay"
BIN = benchlib.ROOT / "examples" / "bin"
EXAMPLES: Dict[str, List[str]] = {
    "vecadd": ["vecadd", str(1 << 24)],
    "stencil2d": ["stencil2d", "4096", "4096", "2"],
    "matmul": ["matmul", "1024"],
    "reduce": ["reduce", str(1 << 24)],
}
MIN_TIMED_NS = 20_000
GOAL = 0.03
#: published device-to-device copy bandwidth of an H200 (read + write bytes per second)
D2D_ANCHOR = 4.3e12
LINE = "BENCH "

FID_COLUMNS = [
    ["example", "example"], ["kernel", "kernel"], ["instance", "instance"], ["grid", "grid"], ["block", "block"],
    ["in_app_us", "in-app us", ".2f"], ["replay_us", "replay us", ".2f"], ["fidelity", "replay / in-app", ".3f"],
    ["timed", ">= 20 us"], ["status", "status"],
]
RESET_COLUMNS = [
    ["example", "example"], ["kernel", "kernel"], ["instance", "instance"], ["copies", "copies", "d"],
    ["bytes", "bytes written", ",d"], ["reset_us", "reset us", ".2f"], ["empty_us", "empty call us", ".2f"],
    ["net_us", "net us", ".2f"], ["ideal_us", "ideal us", ".2f"], ["net_vs_ideal", "net / ideal", ".2f"],
]
D2D_COLUMNS = [
    ["example", "example"], ["copies", "copies", "d"], ["bytes", "bytes", ",d"], ["net_us", "net us", ".1f"],
    ["copy_gb_s", "copied GB/s", ".0f"], ["rw_gb_s", "read+write GB/s", ".0f"], ["vs_anchor", "/ 4.3 TB/s", ".3f"],
]


# ---- the worker: one example's record directory, on the GPU ------------------------------------------

def per_call(fn: Callable[[], None], reps: int, warm: int = 3) -> float:
    """Median seconds of one synchronous call."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return benchlib.median(times)


def reset_timing(pipe, code_hash: str, reps: int) -> Dict[str, Any]:
    """The pipeline's own reset plan, timed; then every device blob restored whole (the D2D bandwidth)."""
    from mneme.snapshot import Space

    state, written, mod = pipe._state, pipe._written, pipe._modules.get(code_hash)
    if state is None or written is None:
        raise RuntimeError("ReplayPipeline no longer exposes _state/_written: update bench_replay.reset_timing")
    copies, nbytes = state.plan_resets(written, mod)
    reset = per_call(lambda: state.reset_written(None, mod), reps)
    state.plan_resets([], None)
    empty = per_call(lambda: state.reset_written(None, None), reps)
    blobs = [(b.addr, b.size) for b in pipe._prologue.blobs if Space(b.space) == Space.DEVICE and b.size]
    d2d: Dict[str, Any] = {}
    if blobs:
        all_copies, all_bytes = state.plan_resets(blobs, None, merge_gap=0)
        whole = per_call(lambda: state.reset_written(None, None), max(10, reps // 4))
        d2d = {"copies": all_copies, "bytes": all_bytes, "seconds": whole, "empty_seconds": empty}
    state.plan_resets(written, mod)
    return {"copies": copies, "bytes": nbytes, "reset_s": reset, "empty_s": empty, "d2d": d2d}


def replay_instance(db: str, rid: str, settings, reps: int) -> Dict[str, Any]:
    from mneme.replay.pipeline import ReplayPipeline

    with ReplayPipeline(db, rid, device_id=0, settings=settings) as pipe:
        inst = pipe.instance
        r = pipe.execute(pipe.baseline_config())
        row = {"grid": str(inst.grid_dim), "block": str(inst.block_dim), "in_app_ns": inst.in_app_time_ns,
               "replay_ns": r.median_ns(), "fidelity": r.fidelity or None, "status": r.status,
               "replay_min_ns": min(r.exec_time) if r.exec_time else None,
               "replay_max_ns": max(r.exec_time) if r.exec_time else None}
        if r.status != "verified":
            row["error"] = f"{r.status}: {r.error}"
            return row
        try:
            row.update(reset_timing(pipe, r.code_hash, reps))
        except Exception as e:  # noqa: BLE001 - the fidelity stands without the reset numbers
            row["reset_error"] = benchlib.error_row({}, e)["error"]
    return row


def worker(db_dir: str, iterations: int, warmup: int, reps: int, verbose: bool) -> int:
    """Prints one `BENCH {json}` line per instance of every record DB in `db_dir`."""
    from mneme.config import MeasurementSettings
    from mneme.record.db import RecordedExecution, find_dbs

    settings = MeasurementSettings(iterations=iterations, warmup=warmup, timeout=60)
    for db in find_dbs(db_dir):
        try:
            rec = RecordedExecution.from_json(db)
            kernel, rids = rec.demangled_name.split("(")[0], sorted(rec)
        except Exception as e:  # noqa: BLE001
            print(LINE + json.dumps(benchlib.error_row({"kernel": Path(db).name, "instance": "?"}, e, verbose)), flush=True)
            continue
        for rid in rids:
            ident = {"kernel": kernel, "instance": rid}
            row = benchlib.guarded(ident, lambda: replay_instance(db, rid, settings, reps), verbose)
            print(LINE + json.dumps(row, default=str), flush=True)
    return 0


# ---- the driver: record, run the workers, assemble ----------------------------------------------------

def record(name: str, argv: List[str], root: Path) -> Path:
    out = root / name
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "record", "-rdb", str(out), "--quiet", "--",
                        str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"mneme record {' '.join(argv)} exited {p.returncode}: {(p.stderr or p.stdout)[-600:]}")
    return out


def parse_worker(stdout: str) -> List[Dict[str, Any]]:
    return [json.loads(line[len(LINE):]) for line in stdout.splitlines() if line.startswith(LINE)]


def run_worker(db_dir: Path, args) -> List[Dict[str, Any]]:
    cmd = [sys.executable, __file__, "--worker", str(db_dir), "--iterations", str(args.iterations),
           "--warmup", str(args.warmup), "--reset-reps", str(args.reset_reps)] + (["--verbose"] if args.verbose else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.worker_timeout)
    rows = parse_worker(p.stdout)
    if args.verbose and p.stderr:
        print(p.stderr, file=sys.stderr)
    if p.returncode != 0 or not rows:
        rows.append({"kernel": "*", "instance": "*",
                     "error": f"replay worker exited {p.returncode}: {(p.stderr or p.stdout)[-600:] or 'no output'}"})
    return rows


def fidelity_row(r: Dict[str, Any]) -> Dict[str, Any]:
    ident = {k: r.get(k) for k in ("example", "kernel")}
    ident["instance"] = str(r.get("instance", ""))[:8]
    if "error" in r and r.get("replay_ns") is None:
        return {**ident, "error": r["error"]}
    in_app = r.get("in_app_ns")
    return {**ident, "grid": r.get("grid"), "block": r.get("block"),
            "in_app_us": in_app / 1e3 if in_app else None,
            "replay_us": r["replay_ns"] / 1e3 if r.get("replay_ns") else None,
            "fidelity": r.get("fidelity"), "timed": "yes" if in_app and in_app >= MIN_TIMED_NS else "no",
            "status": r.get("status")}


def best_d2d(rows: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The bandwidth measurement that moved the most bytes, with its rates."""
    cands = [dict(r["d2d"], example=r.get("example")) for r in rows if r.get("d2d") and r["d2d"].get("bytes")]
    if not cands:
        return None
    d = max(cands, key=lambda c: c["bytes"])
    net = d["seconds"] - d.get("empty_seconds", 0.0)
    rate = benchlib.ratio(d["bytes"], net)
    return {"example": d["example"], "copies": d["copies"], "bytes": d["bytes"], "net_us": net * 1e6,
            "copy_b_s": rate, "copy_gb_s": rate / 1e9 if rate else None, "rw_gb_s": 2 * rate / 1e9 if rate else None,
            "vs_anchor": benchlib.ratio(2 * rate, D2D_ANCHOR) if rate else None}


def reset_row(r: Dict[str, Any], copy_b_s: Optional[float]) -> Dict[str, Any]:
    ident = {"example": r.get("example"), "kernel": r.get("kernel"), "instance": str(r.get("instance", ""))[:8]}
    if r.get("reset_s") is None:
        return {**ident, "error": r.get("reset_error") or r.get("error") or "not measured"}
    net = r["reset_s"] - r["empty_s"]
    ideal = benchlib.ratio(r["bytes"], copy_b_s)
    return {**ident, "copies": r["copies"], "bytes": r["bytes"], "reset_us": r["reset_s"] * 1e6,
            "empty_us": r["empty_s"] * 1e6, "net_us": net * 1e6, "ideal_us": ideal * 1e6 if ideal is not None else None,
            "net_vs_ideal": benchlib.ratio(net, ideal) if ideal else None}


def summarize(fid: List[Dict[str, Any]], resets: List[Dict[str, Any]], d2d: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    timed = [r for r in fid if "error" not in r and r.get("timed") == "yes" and r.get("fidelity")]
    worst = max(timed, key=lambda r: abs(r["fidelity"] - 1.0), default=None)
    med = benchlib.median(r["fidelity"] for r in timed)
    big = max((r for r in resets if "error" not in r and r.get("net_vs_ideal") is not None),
              key=lambda r: r["bytes"], default=None)
    return {
        "instances": len(fid), "timed": len(timed), "failed": sum(1 for r in fid if "error" in r),
        "fidelity_median": med,
        "fidelity_worst": worst["fidelity"] if worst else None,
        "fidelity_worst_kernel": f"{worst['example']}/{worst['kernel']}" if worst else None,
        "within_goal": sum(1 for r in timed if abs(r["fidelity"] - 1.0) <= GOAL),
        "goal_met": med is not None and abs(med - 1.0) <= GOAL,
        "reset_largest": {k: big[k] for k in ("example", "kernel", "bytes", "net_us", "ideal_us", "net_vs_ideal")} if big else None,
        "d2d_rw_gb_s": d2d["rw_gb_s"] if d2d else None,
        "d2d_vs_anchor": d2d["vs_anchor"] if d2d else None,
    }


def ratio_line(s: Dict[str, Any]) -> str:
    f = benchlib.fmt
    if s["fidelity_median"] is None:
        head = f"replay / in-app: no verified instance of >= {MIN_TIMED_NS // 1000} us (see the errors above)"
    else:
        head = (f"replay / in-app median fidelity {s['fidelity_median']:.3f} over {s['timed']} instances >= "
                f"{MIN_TIMED_NS // 1000} us (worst {s['fidelity_worst']:.3f}, {s['fidelity_worst_kernel']}; "
                f"{s['within_goal']}/{s['timed']} within +-{GOAL:.0%}; goal median within +-{GOAL:.0%}: "
                f"{'met' if s['goal_met'] else 'NOT met'})")
    big = s.get("reset_largest")
    tail = (f"; reset net / ideal {f(big['net_vs_ideal'], '.2f')} at {big['bytes'] / 2**20:.1f} MiB written ({big['kernel']})"
            if big else "; reset: not measured")
    return head + tail + f"; D2D {f(s['d2d_rw_gb_s'], '.0f')} GB/s read+write = {f(s['d2d_vs_anchor'], '.2f')} of 4.3 TB/s"


def main(argv: List[str] = None) -> int:
    ap = benchlib.arguments(NAME, __doc__)
    ap.add_argument("--only", default=None, help=f"comma list of examples (default {','.join(EXAMPLES)})")
    ap.add_argument("--iterations", type=int, default=None, help="timed replay iterations (default 100; --quick 20)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reset-reps", type=int, default=None, help="timed reset calls (default 200; --quick 50)")
    ap.add_argument("--worker-timeout", type=float, default=None, help="seconds per example's replay (default 240; --quick 90)")
    ap.add_argument("--tmp", type=Path, default=None, help="where the recordings go (default a temporary directory)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.iterations = args.iterations or (20 if args.quick else 100)
    args.reset_reps = args.reset_reps or (50 if args.quick else 200)
    args.worker_timeout = args.worker_timeout or (90 if args.quick else 240)
    if args.worker:
        return worker(args.worker, args.iterations, args.warmup, args.reset_reps, args.verbose)

    names = args.only.split(",") if args.only else list(EXAMPLES)
    run = benchlib.Run(NAME, __doc__, args.quick)
    raw: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mneme-bench-replay-", dir=args.tmp) as tmp:
        for name in names:
            try:
                if name not in EXAMPLES:
                    raise ValueError(f"unknown example {name!r}; choose from {', '.join(EXAMPLES)}")
                rows = run_worker(record(name, EXAMPLES[name], Path(tmp)), args)
            except Exception as e:  # noqa: BLE001 - one example's failure is its row
                rows = [benchlib.error_row({"kernel": "*", "instance": "*"}, e, args.verbose)]
            raw += [{"example": name, **r} for r in rows]
            print(f"  {name}: {len(rows)} instance(s)", file=sys.stderr, flush=True)
    fid = [fidelity_row(r) for r in raw]
    d2d = best_d2d(raw)
    resets = [reset_row(r, d2d["copy_b_s"] if d2d else None) for r in raw]
    run.add(benchlib.table(f"Replay fidelity (default<O3>, median of {args.iterations} vs the in-app median)",
                           FID_COLUMNS, fid, ident=3))
    run.add(benchlib.table(f"Per-iteration reset (median of {args.reset_reps} calls)", RESET_COLUMNS, resets, ident=3))
    run.add(benchlib.table("Device-to-device bandwidth (every device blob of the largest prologue)", D2D_COLUMNS,
                           [d2d] if d2d else [{"example": "-", "error": "not measured"}]))
    run.summary = summarize(fid, resets, d2d)
    run.summary["raw"] = raw
    run.anchor("device-to-device copy (read+write)", d2d["rw_gb_s"] * 1e9 if d2d and d2d["rw_gb_s"] else None,
               D2D_ANCHOR, "B/s", "H200 anchor of the Evidence issue")
    run.ratio = ratio_line(run.summary)
    return run.finish(args.out)


if __name__ == "__main__":
    sys.exit(main())
