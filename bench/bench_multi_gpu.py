"""Multi-GPU scaling of the tuning executor: configurations per second with one GPU and with every visible GPU.

vecAdd (examples/bin/vecadd, 2^24 elements, recorded here) is fed the same N configurations drawn from a preset
(seeded) by one AsyncReplayExecutor with one GPU worker, then by one with a worker on each visible GPU (default
0,1), same compile jobs, each row after its workers are up (the baseline is evaluated first and not counted).
Every configuration is compiled (or found in the cubin cache), verified and timed; `per GPU` counts the results
that name each GPU. The goal (issue 7) is at least 1.7x the one-GPU rate on two GPUs, measured in one run.

Usage: python bench/bench_multi_gpu.py [--configs N] [--presets launch,compiler] [--jobs J] [--devices 0,1]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from bench_tune_throughput import executor_row, record_vecadd  # noqa: E402

NAME = "multi_gpu"
GOAL = 1.7
COLUMNS = [
    ["preset", "preset"], ["gpus", "GPUs", "d"], ["jobs", "jobs", "d"], ["configs", "configs", "d"],
    ["wall_s", "wall s", ".2f"], ["per_s", "configs/s", ".1f"], ["per_gpu", "per GPU"], ["scaling", "x one GPU", ".2f"],
]


def main(argv=None) -> int:
    ap = benchlib.arguments(NAME, __doc__)
    ap.add_argument("--configs", type=int, default=None, help="configurations per row (default 600; --quick 200)")
    ap.add_argument("--presets", default="launch,compiler")
    ap.add_argument("--jobs", type=int, default=16, help="compile processes (default 16)")
    ap.add_argument("--devices", default="0,1", help="the GPUs of the multi-GPU rows (default 0,1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    n = args.configs or (200 if args.quick else 600)
    devices = [int(d) for d in args.devices.split(",") if d.strip()]
    run = benchlib.Run(NAME, __doc__, args.quick)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mneme-bench-multi-") as tmp:
        db = record_vecadd(Path(tmp), 1 << 24)
        for preset in args.presets.split(","):
            one = benchlib.guarded({"preset": preset, "gpus": 1}, lambda: executor_row(
                db, preset, args.jobs, n, [devices[0]], args.seed, 10), args.verbose)
            many = benchlib.guarded({"preset": preset, "gpus": len(devices)}, lambda: executor_row(
                db, preset, args.jobs, n, devices, args.seed, 10), args.verbose)
            if one.get("per_s") and many.get("per_s"):
                many["scaling"] = many["per_s"] / one["per_s"]
            for r in (one, many):
                r["gpus"] = len(r.get("devices") or []) or r["gpus"]
                r["per_gpu"] = ", ".join(f"GPU {g}: {c}" for g, c in sorted((r.get("per_gpu") or {}).items()))
            rows += [one, many]
    run.add(benchlib.table(f"Configurations per second, one GPU vs GPUs {args.devices} (vecAdd 2^24, {n} configurations)",
                           COLUMNS, rows, ident=2))
    scaled = [r for r in rows if r.get("scaling")]
    run.summary = {"scaling": {r["preset"]: r["scaling"] for r in scaled}}
    run.ratio = "; ".join(
        f"{r['preset']}: {len(devices)} GPUs / one GPU = {r['scaling']:.2f}x (goal >= {GOAL}: "
        f"{'met' if r['scaling'] >= GOAL else 'NOT met'})" for r in scaled) or "multi-GPU scaling: not measured (see the errors above)"
    return run.finish(args.out)


if __name__ == "__main__":
    sys.exit(main())
