"""What tracking costs a search: `python -m mneme.track.overhead [--trials N] [--rate R] [--uri URI]`.

Replays a search loop of N trials arriving at R trials per second (each trial a realistic
ExperimentResult: 10 timed iterations, compile metrics, PTX and cubin artifacts) with tracking off and on,
and prints, for tracking on: what the search's thread spent per trial, how long after the last trial the
writer needed to finish (the drain), and the writer's own rate. The search loses configurations per
second only through the first two; `mneme tune --no-track` against `mneme tune` measures the same end to
end (bench/ uses both).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any, Dict, Optional

from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings, dim3
from mneme.track.sweep import SweepRun
from mneme.track.tracker import Tracker


def _trial(i: int):
    config = ExperimentConfiguration(grid=dim3(1 << 14 // (1 + i % 5)), block=dim3(32 * (1 + i % 8)))
    result = ExperimentResult(
        exec_time=[10_000 + 13 * ((i * 7 + k) % 11) for k in range(10)], executed=True, verified=True,
        status="verified", reg_usage=16 + i % 16, obj_size=6000, opt_time=0.01, ptx_time=0.005, cubin_time=0.03,
        occupancy=0.75, fidelity=0.98, code_hash=f"{i:064x}", gpu_name="synthetic",
    )
    return config, result


def _loop(trials: int, rate: float, sweep: Optional[SweepRun]) -> Dict[str, float]:
    """Trials at `rate` per second; returns the seconds the loop itself spent on tracking."""
    period = 1.0 / rate if rate > 0 else 0.0
    spent = 0.0
    start = time.perf_counter()
    ptx, cubin = "// ptx\n" * 400, b"\x7fELF" + bytes(8000)
    for i in range(trials):
        due = start + i * period
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        config, result = _trial(i)
        if sweep is not None:
            t = time.perf_counter()
            sweep.trial(i, config, MeasurementSettings(), result, baseline_ns=10_000.0, kernel="synthetic",
                        artifacts={"kernel.ptx": ptx, "kernel.cubin": cubin})
            spent += time.perf_counter() - t
    return {"loop_s": time.perf_counter() - start, "tracking_s": spent}


def measure(trials: int = 300, rate: float = 100.0, uri: Optional[str] = None, writer: str = "process",
            writers: int = 0) -> Dict[str, Any]:
    off = _loop(trials, rate, None)
    with tempfile.TemporaryDirectory(prefix="mneme-overhead-") as tmp:
        tracker = Tracker(uri or f"sqlite:///{tmp}/mlflow.db", "overhead", writer=writer, writers=writers).open()
        sweep = SweepRun.start(tracker, "overhead")
        on = _loop(trials, rate, sweep)
        t = time.perf_counter()
        sweep.finish(summarize=False)
        tracker.close()
        drain = time.perf_counter() - t
    return {
        "trials": trials,
        "rate": rate,
        "writer": writer,
        "writers": tracker.writers,
        "configs_per_s_off": trials / off["loop_s"],
        "configs_per_s_on": trials / on["loop_s"],
        "configs_per_s_on_with_drain": trials / (on["loop_s"] + drain),
        "tracking_us_per_trial": 1e6 * on["tracking_s"] / trials,
        "drain_s": drain,
        "writer_trials_per_s": trials / (on["loop_s"] + drain) if drain > 0 else float("inf"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mneme.track.overhead", description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--rate", type=float, default=100.0, help="trials per second the search produces (0: as fast as possible)")
    ap.add_argument("--uri", default=None, help="MLflow store (default: a fresh SQLite store in a temp dir)")
    ap.add_argument("--writer", default="process", choices=("process", "thread"))
    ap.add_argument("--writers", type=int, default=0, help="writer processes (0: auto)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = measure(args.trials, args.rate, args.uri, args.writer, args.writers)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        for k, v in r.items():
            print(f"{k:30} {v:.3f}" if isinstance(v, float) else f"{k:30} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
