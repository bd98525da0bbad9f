"""Compile time per stage: link, specialize, optimize, PTX, cubin, per recorded kernel.

For every kernel of the record DBs under tests/fixtures (real H200 recordings; or --record-dir), the IR is
linked and pruned as ReplayPipeline does it (`link`: RecordedExecution.link_llvm_modules), then compiled with
mneme.ir.compile_kernel and no cache, so every stage really runs: `specialize` (the code hash, then a clone, or a
rewrite and reparse), `optimize` (the pass pipeline), `PTX` (NVPTX codegen), `cubin` (whole-program ptxas, or nvJitLink: mneme.ir.codegen.assembler()). Two configurations
per kernel: the recorded launch at default<O3> (`O3`), and the same with argument and dimension
specialization and launch bounds (`O3+spec`). Each stage's time is the median over the repetitions, after
one untimed warm-up, on the machine's CPU (no GPU is involved).

The ratio is the per-configuration compile time (specialize..cubin: what the tuner pays for every new
configuration; link is paid once per kernel) at O3, median over kernels, divided by 10 ms, the time one
configuration may take at the goal of 100 configurations per second: its ceiling is the number of
parallel compile jobs the goal needs when nothing comes from the cache.

Usage: python bench/bench_compile.py [--quick] [--reps N] [--record-dir DIR ...] [--out FILE]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

NAME = "compile"
FIXTURES = benchlib.ROOT / "tests" / "fixtures"
#: the time one configuration may take at 100 configurations per second
BUDGET_S = 0.010
STAGES = ("link", "specialize", "optimize", "ptx", "cubin")

COLUMNS = [
    ["example", "example"], ["kernel", "kernel"], ["variant", "variant"],
    ["link_ms", "link ms", ".1f"], ["specialize_ms", "specialize ms", ".1f"], ["optimize_ms", "optimize ms", ".1f"],
    ["ptx_ms", "PTX ms", ".1f"], ["cubin_ms", "cubin ms", ".1f"], ["config_ms", "per-config ms", ".1f"],
    ["cubin_share", "cubin share", ".0%"], ["regs", "regs", "d"], ["cubin_bytes", "cubin B", ",d"],
]


def kernels(dirs: List[Path]) -> List[Dict[str, Any]]:
    """(example, DB path, kernel) for every record DB under the given directories."""
    from mneme.record.db import RecordedExecution, find_dbs

    out = []
    for d in dirs:
        for db in find_dbs(str(d)):
            try:
                rec = RecordedExecution.from_json(db, check_files=False)
                name, rid = rec.demangled_name.split("(")[0], sorted(rec)[0] if len(rec) else None
            except Exception as e:  # noqa: BLE001 - measure() raises it again as the row's error
                name, rid = f"? ({type(e).__name__})", None
            out.append({"example": d.name, "db": db, "kernel": name, "rid": rid})
    return out


def variants(base) -> Dict[str, Any]:
    threads = base.block.total()
    return {
        "O3": base,
        "O3+spec": replace(base, specialize=True, specialize_dims=True, set_launch_bounds=True,
                           max_threads=threads, min_blocks_per_sm=1),
    }


def measure(db: str, rid: str, reps: int) -> Dict[str, Dict[str, Any]]:
    """Per variant: the median time of every stage over `reps` fresh links and uncached compiles (of the
    instance `rid`: the code differs between instances only where specialized values do)."""
    from mneme.ir import compile_kernel
    from mneme.replay.pipeline import ReplayPipeline

    samples: Dict[str, Dict[str, List[float]]] = {}
    last: Dict[str, Any] = {}
    for rep in range(reps + 1):
        pipe = ReplayPipeline(db, rid, device_id=None)
        linked = pipe.linked()
        for vname, cfg in variants(pipe.baseline_config()).items():
            ck = compile_kernel(linked, pipe.kernel_name, cfg, arch=pipe.arch, static_hash=pipe.record.static_hash,
                                arg_values=pipe.arg_values() if cfg.specialize else None, cache=False)
            last[vname] = ck
            if rep == 0:
                continue  # warm-up: one-time initialization (targets, the assembler, page cache) is not a stage
            s = samples.setdefault(vname, {k: [] for k in STAGES})
            for stage, t in zip(STAGES, (pipe.link_time, ck.preprocess_ir_time, ck.opt_time, ck.ptx_time,
                                         ck.cubin_time)):
                s[stage].append(t)
    return {v: stage_row(s, last[v].cubin.registers, last[v].obj_size) for v, s in samples.items()}


def stage_row(samples: Dict[str, List[float]], regs: int, size: int) -> Dict[str, Any]:
    """Median milliseconds per stage, the per-configuration total (all but link) and the cubin share."""
    row: Dict[str, Any] = {f"{k}_ms": 1e3 * benchlib.median(samples[k]) for k in STAGES}
    row["config_ms"] = sum(row[f"{k}_ms"] for k in STAGES if k != "link")
    row["cubin_share"] = benchlib.ratio(row["cubin_ms"], row["config_ms"])
    row["regs"], row["cubin_bytes"] = regs, size
    return row


def summarize(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    ok = [r for r in rows if "error" not in r and r["variant"] == "O3"]
    config_ms = benchlib.median(r["config_ms"] for r in ok)
    total = {k: sum(r[f"{k}_ms"] for r in ok) for k in STAGES}
    per_config = sum(v for k, v in total.items() if k != "link")
    return {
        "kernels": len(ok),
        "failed_rows": sum(1 for r in rows if "error" in r),
        "config_ms_median": config_ms,
        "stage_share": {k: benchlib.ratio(v, per_config) for k, v in total.items() if k != "link"},
        "budget_ms": BUDGET_S * 1e3,
        "budget_ratio": benchlib.ratio(config_ms, BUDGET_S * 1e3),
    }


def ratio_line(s: Dict[str, Any]) -> str:
    if s["budget_ratio"] is None:
        return "no kernel compiled (see the errors above)"
    import math

    share = s["stage_share"]
    return (f"per-configuration compile {s['config_ms_median']:.1f} ms (median over {s['kernels']} kernels, O3) / "
            f"{s['budget_ms']:.0f} ms budget at 100 configs/s = {s['budget_ratio']:.2f} "
            f"(>= {max(1, math.ceil(s['budget_ratio']))} compile jobs needed without cache hits; "
            f"cubin {benchlib.fmt(share['cubin'], '.0%')}, optimize {benchlib.fmt(share['optimize'], '.0%')}, "
            f"PTX {benchlib.fmt(share['ptx'], '.0%')} of it)")


def main(argv: List[str] = None) -> int:
    ap = benchlib.arguments(NAME, __doc__)
    ap.add_argument("--reps", type=int, default=None, help="repetitions per kernel (default 10; --quick 3)")
    ap.add_argument("--record-dir", type=Path, action="append", default=None,
                    help="directory of record DBs (repeatable; default every tests/fixtures/* directory)")
    args = ap.parse_args(argv)
    reps = args.reps or (3 if args.quick else 10)
    dirs = args.record_dir or sorted(p for p in FIXTURES.iterdir() if p.is_dir())
    run = benchlib.Run(NAME, __doc__, args.quick)
    rows: List[Dict[str, Any]] = []
    for k in kernels(dirs):
        ident = {"example": k["example"], "kernel": k["kernel"]}
        try:
            per_variant = measure(k["db"], k["rid"], reps)
            rows += [{**ident, "variant": v, **r} for v, r in per_variant.items()]
        except Exception as e:  # noqa: BLE001 - one kernel's failure is its row
            rows.append(benchlib.error_row({**ident, "variant": "*"}, e, args.verbose))
        print(f"  {k['example']}/{k['kernel']} done", file=sys.stderr, flush=True)
    run.add(benchlib.table(f"Compile time per stage (median of {reps}, {benchlib.cpu_model()})", COLUMNS, rows,
                           ident=3))
    run.summary = summarize(rows)
    run.summary["reps"] = reps
    run.ratio = ratio_line(run.summary)
    return run.finish(args.out)


if __name__ == "__main__":
    sys.exit(main())
