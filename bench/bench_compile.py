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

With `--search N`, each kernel instead compiles N configurations drawn at random from the `standard` preset
(launch safety from the IR, code knobs included) the way one compile worker does it: the linked module once,
a CompileCache shared by the draws (code-hash hits, and cubins reused when the PTX is the same). It reports
distinct configurations per second on one core, and how many draws needed no ptxas (identical PTX), no LLVM
(PTX reused: the draw differed from an earlier one only in what the assembler sees) or gave machine code that
an earlier draw already had (identical binary: the tuner times it once).

`--paths old,new` runs the search twice per kernel on the same draws, side by side: `old` compiles every draw
from the IR (compile_kernel(reuse_ptx=False)) and assembles with the ptxas process (MNEME_PTXAS_INPROCESS=0);
`new` reuses PTX and assembles in-process where mneme.ir.ptxcompiler can. (The cubin section reader,
mneme.ir.cubinelf, which replaced two pyelftools parses of every cubin, serves both paths: its ~3 ms per
configuration is not in the difference.) Each path compiles the baseline once, untimed, before its draws.
The ratio line projects each path's configurations per CPU-second to a 16-core host against 150/s.

`--bitcode FILE.bc:KERNEL:GRID:BLOCK` adds a kernel of device bitcode that has no record (e.g. a corpus program
built with clang-22 -emit-llvm, see docs/BENCHMARKS.md): the standard space of that launch, without argument values.

Usage: python bench/bench_compile.py [--quick] [--reps N] [--search N [--paths old,new] [--bitcode SPEC ...]]
                                     [--record-dir DIR ...] [--out FILE]
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


#: the goal of issue 17: distinct configurations per second on one 16-core host
GOAL_PER_S, HOST_CORES = 150.0, 16
PATHS = ("old", "new")

SEARCH_COLUMNS = [
    ["example", "example"], ["kernel", "kernel"], ["path", "path"], ["draws", "draws", "d"],
    ["distinct", "distinct configs", "d"], ["code_hits", "code-hash hits", "d"],
    ["llvm_skipped", "PTX reused (no LLVM)", "d"], ["ptx_reused", "cubin reused (same PTX)", "d"],
    ["same_binary", "same binary", "d"], ["compile_s", "compile s", ".2f"], ["configs_per_s", "configs/s/core", ".1f"],
    ["ms_per_config", "ms/config", ".1f"], ["cpu_ms_per_config", "CPU ms/config", ".1f"],
    ["configs_per_cpu_s", "configs/CPU-s", ".1f"], ["cubin_share", "cubin share", ".0%"],
]


def _cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (ptxas): what a loaded machine does not inflate."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def search(k: Dict[str, Any], n: int, seed: int = 1, path: str = "new") -> Dict[str, Any]:
    """Compile `n` random draws of the standard preset of one kernel (a row of kernels() or bitcode_kernel())
    with one shared cache, on `path`."""
    import os

    from mneme.ir import ptxcompiler

    if path not in PATHS:
        raise ValueError(f"path {path!r}: one of {PATHS}")
    before = os.environ.get(ptxcompiler.ENV)
    os.environ[ptxcompiler.ENV] = "1" if path == "new" else "0"
    try:
        return _search(k, n, seed, reuse_ptx=path == "new")
    finally:
        if before is None:
            os.environ.pop(ptxcompiler.ENV, None)
        else:
            os.environ[ptxcompiler.ENV] = before


def bitcode_kernel(spec: str) -> Dict[str, Any]:
    """FILE.bc:KERNEL:GRID:BLOCK (e.g. lavamd.bc:_Z15kernel...:1000:128) -> a kernels() row for a kernel of device
    bitcode that has no record (a corpus program built with clang-22): no argument values, so no argument
    specialization, and the launch given here."""
    parts = spec.rsplit(":", 3)
    if len(parts) != 4:
        raise SystemExit(f"--bitcode {spec!r}: FILE.bc:KERNEL:GRID:BLOCK (GRID, BLOCK: x or x,y or x,y,z)")
    bc, name, grid, block = parts
    short = name if len(name) < 40 else name[:37] + "..."
    return {"example": Path(bc).stem, "kernel": short, "bc": bc, "name": name,
            "grid": [int(v) for v in grid.split(",")], "block": [int(v) for v in block.split(",")]}


def _prepare(k: Dict[str, Any]):
    """(linked module, kernel name, baseline, static hash, arch, argument values, space context)"""
    from mneme.ir.launchsafety import analyze_launch
    from mneme.tune.space import SpaceContext

    if "bc" in k:
        from mneme.config import ExperimentConfiguration, dim3
        from mneme.ir import link_modules, static_hash

        linked = link_modules([k["bc"]], k["name"], prune=True, internalize=True)
        base = ExperimentConfiguration(grid=dim3(*k["grid"]), block=dim3(*k["block"]))
        facts = analyze_launch(linked, k["name"])
        return linked, k["name"], base, static_hash(linked, k["name"]), "sm_90", None, \
            SpaceContext(base, launch_facts=facts)
    from mneme.replay.pipeline import ReplayPipeline

    pipe = ReplayPipeline(k["db"], k["rid"], device_id=None)
    linked, base = pipe.linked(), pipe.baseline_config()
    ctx = SpaceContext(base, pipe.record, pipe.instance, launch_facts=analyze_launch(linked, pipe.kernel_name))
    return linked, pipe.kernel_name, base, pipe.record.static_hash, pipe.arch, pipe.arg_values(), ctx


def _search(k: Dict[str, Any], n: int, seed: int, reuse_ptx: bool) -> Dict[str, Any]:
    import random
    import time

    from mneme.ir import CompileCache, compile_kernel
    from mneme.tune.presets import preset_space

    linked, name, base, shash, arch, args, ctx = _prepare(k)
    space = preset_space("standard", ctx)
    rng = random.Random(seed)
    cache = CompileCache()
    keys, binaries = set(), set()
    row = {"draws": n, "distinct": 0, "code_hits": 0, "llvm_skipped": 0, "ptx_reused": 0, "same_binary": 0}
    busy = cubin = 0.0
    # one-time set-up (LLVM's target, the assembler's first start or library load) is not a configuration's
    compile_kernel(linked, name, base, arch=arch, static_hash=shash, cache=False)
    cpu0 = _cpu_s()
    for _ in range(n):
        cfg = space.derived(space.sample_random(rng))
        t = time.perf_counter()
        ck = compile_kernel(linked, name, cfg, arch=arch, static_hash=shash,
                            arg_values=args if cfg.specialize else None, cache=cache, reuse_ptx=reuse_ptx)
        busy += time.perf_counter() - t
        if ck.cache_hit:
            row["code_hits"] += 1
            continue
        row["distinct"] += 1
        cubin += ck.cubin_time
        row["ptx_reused"] += int(ck.cubin_reused)
        row["llvm_skipped"] += int(ck.ptx_reused)
        row["same_binary"] += int(ck.binary in binaries)
        binaries.add(ck.binary)
        keys.add(ck.code_hash)
    row["compile_s"] = busy
    row["cpu_s"] = _cpu_s() - cpu0
    row["cpu_ms_per_config"] = 1e3 * row["cpu_s"] / row["distinct"] if row["distinct"] else None
    row["configs_per_cpu_s"] = row["distinct"] / row["cpu_s"] if row["cpu_s"] else None
    row["configs_per_s"] = row["distinct"] / busy if busy else None
    row["ms_per_config"] = 1e3 * busy / row["distinct"] if row["distinct"] else None
    row["cubin_share"] = benchlib.ratio(cubin, busy)
    return row


def search_summary(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    ok = [r for r in rows if "error" not in r and r.get("configs_per_s")]
    total_s, distinct, cpu_s = (sum(r[k] for r in ok) for k in ("compile_s", "distinct", "cpu_s"))
    per_cpu_s = distinct / cpu_s if cpu_s else None
    each = [r["configs_per_cpu_s"] for r in ok if r.get("configs_per_cpu_s")]
    return {"kernels": len(ok), "failed_rows": len(rows) - len(ok), "distinct": distinct, "compile_s": total_s,
            "median_configs_per_cpu_s": benchlib.median(each),
            "kernels_meeting_goal": sum(1 for v in each if v * HOST_CORES >= GOAL_PER_S),
            "configs_per_s_per_core": distinct / total_s if total_s else None, "cpu_s": cpu_s,
            "configs_per_cpu_s": per_cpu_s, "host_projection_per_s": per_cpu_s * HOST_CORES if per_cpu_s else None,
            "llvm_skipped": sum(r["llvm_skipped"] for r in ok), "ptx_reused": sum(r["ptx_reused"] for r in ok),
            "same_binary": sum(r["same_binary"] for r in ok)}


def search_line(path: str, s: Dict[str, Any]) -> str:
    if not s["configs_per_cpu_s"]:
        return f"{path}: nothing compiled"
    med = s["median_configs_per_cpu_s"]
    return (f"{path}: {s['distinct']} distinct configurations in {s['cpu_s']:.1f} CPU-s ({s['llvm_skipped']} without "
            f"LLVM, {s['ptx_reused']} without ptxas); per kernel median {med:.1f} per CPU-second -> {med * HOST_CORES:.0f}/s "
            f"on {HOST_CORES} cores; {s['kernels_meeting_goal']} of {s['kernels']} kernels project to >= "
            f"{GOAL_PER_S:.0f}/s")


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
    ap.add_argument("--search", type=int, default=0, metavar="N",
                    help="compile N random draws of the standard preset per kernel (configs/s per core)")
    ap.add_argument("--paths", default="new",
                    help="with --search: compile paths to run side by side on the same draws (old, new; default new)")
    ap.add_argument("--bitcode", action="append", default=[], metavar="FILE.bc:KERNEL:GRID:BLOCK",
                    help="with --search: also a kernel of device bitcode without a record (repeatable)")
    ap.add_argument("--record-dir", type=Path, action="append", default=None,
                    help="directory of record DBs (repeatable; default every tests/fixtures/* directory)")
    args = ap.parse_args(argv)
    reps = args.reps or (3 if args.quick else 10)
    dirs = args.record_dir or sorted(p for p in FIXTURES.iterdir() if p.is_dir())
    run = benchlib.Run(NAME, __doc__, args.quick)
    rows: List[Dict[str, Any]] = []
    if args.search:
        paths = [p.strip() for p in args.paths.split(",") if p.strip()]
        bad = [p for p in paths if p not in PATHS]
        if bad or not paths:
            ap.error(f"--paths {args.paths!r}: a comma-separated list of {', '.join(PATHS)}")
        for k in kernels(dirs) + [bitcode_kernel(b) for b in args.bitcode]:
            for path in paths:
                ident = {"example": k["example"], "kernel": k["kernel"], "path": path}
                try:
                    rows.append({**ident, **search(k, args.search, path=path)})
                except Exception as e:  # noqa: BLE001 - one kernel's failure is its row
                    rows.append(benchlib.error_row(ident, e, args.verbose))
            print(f"  {k['example']}/{k['kernel']} done", file=sys.stderr, flush=True)
        run.add(benchlib.table(f"Standard-preset search, {args.search} draws per kernel, one core "
                               f"({benchlib.cpu_model()})", SEARCH_COLUMNS, rows, ident=3))
        run.summary = {"draws": args.search, "paths": {p: search_summary([r for r in rows if r["path"] == p])
                                                       for p in paths}}
        run.ratio = "; ".join(search_line(p, s) for p, s in run.summary["paths"].items())
        if len(paths) == 2:
            by = {(r["example"], r["kernel"], r["path"]): r.get("configs_per_cpu_s") for r in rows if "error" not in r}
            gains = [by[(e, k, paths[1])] / v for (e, k, p), v in by.items()
                     if p == paths[0] and v and by.get((e, k, paths[1]))]
            if gains:
                run.summary["speedup_median"] = benchlib.median(gains)
                run.ratio += (f"; {paths[1]} / {paths[0]} per kernel: median {run.summary['speedup_median']:.2f}x "
                              f"({min(gains):.2f}-{max(gains):.2f}x) configurations per CPU-second")
        return run.finish(args.out)
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
