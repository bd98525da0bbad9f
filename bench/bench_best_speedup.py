"""Best speedup found over the recorded baseline, per example: what a short `mneme tune` finds.

Each example is recorded here at the timing sizes of bench_replay.py (vecadd 2^24, stencil2d 4096 4096 2,
matmul 1024, reduce 2^24), then every recorded instance is tuned by `mneme tune` over the `standard` preset
(launch shape, pipelines, codegen level, specialization, launch bounds; `compiler` for a kernel where no trial of
`standard` verifies, such as one that hard-codes its tile) with the TPE sampler, a fixed seed
and N trials (default 60), tracking off. The baseline is the recorded configuration at default<O3>, timed
in the same run; the speedup is baseline median / best verified median (10 timed iterations each), and only a
configuration that verifies against the app's epilogue can be the best. The spread is the best's (max-min)/
median over its iterations. The ratio line gives the geometric mean of the best speedups.

Usage: python bench/bench_best_speedup.py [--quick] [--trials N] [--only vecadd,matmul] [--out FILE]
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from bench_replay import EXAMPLES, record  # noqa: E402

NAME = "best_speedup"
COLUMNS = [
    ["example", "example"], ["kernel", "kernel"], ["space", "space"], ["trials", "trials", "d"], ["verified", "verified", "d"],
    ["baseline_us", "baseline us", ".2f"], ["best_us", "best us", ".2f"], ["speedup", "best speedup", ".3f"],
    ["spread", "best spread", ".1%"], ["best", "best configuration"], ["tune_s", "tune s", ".1f"],
]


def tune(db: str, trials: int, seed: int, tmp: Path, timeout: float) -> Dict[str, Any]:
    """The `standard` preset, or `compiler` where no launch shape but the recorded one computes the right answer
    (a kernel that hard-codes its tile: every `standard` trial then fails verification)."""
    try:
        return tune_space(db, "standard", trials, seed, tmp, timeout)
    except NoVerifiedTrial:
        return tune_space(db, "compiler", trials, seed, tmp, timeout)


class NoVerifiedTrial(RuntimeError):
    pass


def tune_space(db: str, space: str, trials: int, seed: int, tmp: Path, timeout: float) -> Dict[str, Any]:
    out = tmp / f"tune-{Path(db).stem[:12]}-{space}"
    argv = [sys.executable, "-m", "mneme.cli", "tune", "-rdb", db, "--space", space, "--sampler", "tpe",
            "--trials", str(trials), "--seed", str(seed), "--devices", "0", "--storage",
            f"journal:{out}.journal", "--no-track", "--quiet", "--json", "-o", str(out)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if not p.stdout.strip().startswith("{"):
        raise RuntimeError(f"mneme tune exited {p.returncode}: {(p.stderr or p.stdout)[-600:]}")
    s = json.loads(p.stdout)
    best, base = s.get("best") or {}, s.get("baseline") or {}
    if not best:
        raise NoVerifiedTrial(f"no verified trial in the {space} space (exit {s.get('exit_code')}: {s.get('message')})")
    t = best.get("times") or {}  # min/p25/median/p75/max/mean/std of its timed iterations
    spread = (t["max"] - t["min"]) / t["median"] if t.get("median") else None
    return {
        "kernel": s.get("kernel", ""), "space": space, "trials": s["trials"]["counted"],
        "verified": s["trials"]["by_status"].get("verified", 0),
        "baseline_us": (base.get("metric_ns") or 0) / 1e3, "best_us": best["metric_ns"] / 1e3,
        "speedup": best.get("speedup"), "spread": spread, "best": best_text(best.get("config") or {}),
        "tune_s": (s.get("timing") or {}).get("search_s"),
    }


def best_text(c: Dict[str, Any]) -> str:
    dims = lambda d: "x".join(str(d.get(k, 1)) for k in "xyz")  # noqa: E731
    parts = [f"grid {dims(c.get('grid', {}))}", f"block {dims(c.get('block', {}))}", c.get("passes", ""),
             f"-O{c.get('codegen_opt')}"]
    if c.get("specialize"):
        parts.append("specialize")
    if c.get("specialize_dims"):
        parts.append("dims")
    if c.get("set_launch_bounds"):
        parts.append(f"bounds({c.get('max_threads')},{c.get('min_blocks_per_sm')})")
    return " ".join(p for p in parts if p)


def main(argv: List[str] = None) -> int:
    from mneme.record.db import find_dbs

    ap = benchlib.arguments(NAME, __doc__)
    ap.add_argument("--only", default=None, help=f"comma list of examples (default {','.join(EXAMPLES)})")
    ap.add_argument("--trials", type=int, default=None, help="trials per instance (default 60; --quick 30)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=None, help="seconds per instance's tuning (default 300; --quick 90)")
    args = ap.parse_args(argv)
    trials = args.trials or (30 if args.quick else 60)
    timeout = args.timeout or (90 if args.quick else 300)
    run = benchlib.Run(NAME, __doc__, args.quick)
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mneme-bench-best-") as tmp:
        for name in (args.only.split(",") if args.only else list(EXAMPLES)):
            try:
                dbs = find_dbs(str(record(name, EXAMPLES[name], Path(tmp))))
            except Exception as e:  # noqa: BLE001 - one example's failure is its row
                rows.append(benchlib.error_row({"example": name, "kernel": "*"}, e, args.verbose))
                continue
            for db in dbs:
                rows.append(benchlib.guarded({"example": name}, lambda: tune(db, trials, args.seed, Path(tmp), timeout),
                                             args.verbose))
                print(f"  {name}: {rows[-1].get('kernel', '?')} {rows[-1].get('speedup') or rows[-1].get('error')}",
                      file=sys.stderr, flush=True)
    run.add(benchlib.table(f"Best speedup over the recorded baseline (TPE, {trials} trials)",
                           COLUMNS, rows, ident=2))
    ups = [r["speedup"] for r in rows if r.get("speedup")]
    geo = math.exp(sum(math.log(u) for u in ups) / len(ups)) if ups else None
    run.summary = {"geomean_speedup": geo, "instances": len(ups), "trials": trials}
    run.ratio = (f"best / baseline speedup, geometric mean {geo:.3f} over {len(ups)} instances "
                 f"(range {min(ups):.3f}-{max(ups):.3f}; {trials} trials each)" if ups
                 else "best / baseline speedup: no instance tuned (see the errors above)")
    return run.finish(args.out)


if __name__ == "__main__":
    sys.exit(main())
