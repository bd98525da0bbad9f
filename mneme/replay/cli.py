"""`mneme replay -rdb REC.json [-rid DYNAMIC_HASH] [PASSES]`: one instance, one configuration.

Every configuration flag maps onto one ExperimentConfiguration field (CONFIG_FLAGS) and every
measurement flag onto one MeasurementSettings field; omitted flags keep the recorded values.
Exit codes: 0 verified (or compiled, with --compile-only), 1 ran but did not verify, 2 error.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import fields
from typing import Any, List, Optional, Tuple

from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings
from mneme.errors import ConfigurationError
from mneme.ir.codegen import assembler

#: (flags, config field path, type, help) — the one mapping from CLI flags to the replay configuration
CONFIG_FLAGS: List[Tuple[Tuple[str, ...], str, Any, str]] = [
    (("--grid-dim-x", "-gidx"), "grid.x", int, "grid dimension x"),
    (("--grid-dim-y", "-gidy"), "grid.y", int, "grid dimension y"),
    (("--grid-dim-z", "-gidz"), "grid.z", int, "grid dimension z"),
    (("--block-dim-x", "-bidx"), "block.x", int, "block dimension x"),
    (("--block-dim-y", "-bidy"), "block.y", int, "block dimension y"),
    (("--block-dim-z", "-bidz"), "block.z", int, "block dimension z"),
    (("--shared-mem", "-shem"), "shared_mem", int, "dynamic shared memory bytes"),
    (("--max-threads",), "max_threads", int, "launch bound: max threads per block"),
    (("--min-blocks-per-sm", "--min-threads-per-block"), "min_blocks_per_sm", int,
     "launch bound: min blocks per SM (--min-threads-per-block is an alias)"),
    (("--codegen-opt", "-co"), "codegen_opt", int, "backend optimization level 0-3"),
    (("--codegen-method",), "codegen_method", str, "the assembler: serial, or parallel (split compilation over several threads)"),
    (("--unroll",), "unroll", int, "loop unroll count on every loop without a pragma (0: compiler decides, 1: none)"),
    (("--inline-threshold",), "inline_threshold", int, "inliner threshold of the default pipelines (0: LLVM's; <=255)"),
    (("--ptxas-opt",), "ptxas_opt", int, "ptxas -O level (-1: the codegen level)"),
    (("--max-regs",), "max_regs", int, "ptxas --maxrregcount (0: no limit)"),
    (("--dlcm",), "dlcm", str, "ptxas default load cache: ca | cg | cs ('' default)"),
]
BOOL_FLAGS = [
    (("--specialize",), ("--no-specialize",), "specialize", "specialize scalar arguments to their recorded values"),
    (("--specialize-dims", "-sdims"), ("--no-specialize-dims",), "specialize_dims", "specialize launch dimensions"),
    (("--set-launch-bounds", "-slb"), ("--no-launch-bounds",), "set_launch_bounds", "inject launch bounds"),
    (("--fast-math",), ("--no-fast-math",), "fast_math", "fast-math flags and flush-to-zero (rounds differently)"),
    (("--fma",), ("--no-fma",), "fma", "floating-point contraction into FMA (default on)"),
    (("--vectorize",), ("--no-vectorize",), "vectorize", "loop and SLP vectorization (default on)"),
    (("--expensive-opts",), ("--no-expensive-opts",), "expensive_opts", "ptxas --allow-expensive-optimizations true"),
    (("--whole-program",), ("--no-whole-program",), "whole_program",
     "ptxas sees one whole program (--no-whole-program: ptxas -c + nvlink, as an -rdc app is built)"),
    (("--internalize",), ("--no-internalize",), "internalize", "give the kernel's helper functions internal linkage"),
    (("--prec-div",), ("--no-prec-div",), "prec_div", "IEEE single-precision division (--no-prec-div: div.approx)"),
    (("--prec-sqrt",), ("--no-prec-sqrt",), "prec_sqrt", "IEEE sqrtf, sqrt.rn (--no-prec-sqrt: sqrt.approx)"),
    (("--contract-all",), ("--no-contract-all",), "contract_all",
     "every add/sub/mul may fuse into FMA, as clang's -ffp-contract=fast (CUDA's default) builds the app"),
    (("--cross-unit-inline",), ("--no-cross-unit-inline",), "cross_unit_inline",
     "inline functions of other translation units (--no-cross-unit-inline: calls, as a separately compiled -rdc app)"),
]

#: (flags, MeasurementSettings field, type, help) — the verification flags of `mneme replay` and `mneme tune`
#: (docs/VERIFY.md); the Hydra config sets the same fields under `measure`
VERIFY_FLAGS: List[Tuple[Tuple[str, ...], str, Any, str]] = [
    (("--verify-runs",), "verify_runs", int,
     "replay the recorded configuration N times first and learn which bytes vary between identical runs "
     "(float atomics, work queues, scratch); default 0: compare with the recorded epilogue only"),
    (("--verify-margin",), "verify_margin", float,
     "calibrated tolerance = (1 + margin) x the spread seen across those runs (default 3)"),
    (("--float-rtol",), "float_rtol", float,
     "relative tolerance for float buffers (element type from the IR): outputs that only round differently "
     "(fast-math, FMA contraction); the error is reported per run"),
]


def add_verify_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("verification (docs/VERIFY.md)")
    for flags, name, typ, help_text in VERIFY_FLAGS:
        g.add_argument(*flags, dest=name, type=typ, default=None, help=help_text)


def verify_settings(args: argparse.Namespace) -> dict:
    """The verification fields of MeasurementSettings the command line set."""
    return {name: getattr(args, name) for _, name, _, _ in VERIFY_FLAGS if getattr(args, name, None) is not None}


def add_baseline_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline", choices=("app-build", "mneme-defaults"), default="app-build",
                   help="the code the baseline compiles: as the app was built (its recorded -O level, fast-math, "
                        "ptxas and rdc settings; default), or mneme's defaults (default<O3>, whole program)")


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("replay configuration (defaults: the recorded instance, compiled as --baseline says)")
    g.add_argument("passes", nargs="?", default=None, help="pass pipeline in opt syntax, e.g. 'default<O3>'")
    for flags, path, typ, help_text in CONFIG_FLAGS:
        metavar = ("BYTES" if path == "shared_mem" else "N") if typ is int else None
        choices = {"codegen_method": ("serial", "parallel"), "dlcm": ("", "ca", "cg", "cs")}.get(path)
        if path == "dlcm":
            metavar = "{ca,cg,cs}"
        g.add_argument(*flags, dest="cfg:" + path, type=typ, default=None, metavar=metavar, choices=choices,
                       help=help_text)
    for on, off, name, help_text in BOOL_FLAGS:
        g.add_argument(*on, dest="cfg:" + name, action="store_const", const=True, default=None, help=help_text)
        g.add_argument(*off, dest="cfg:" + name, action="store_const", const=False, help=argparse.SUPPRESS)


def add_measurement_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("measurement (does not change the configuration hash)")
    g.add_argument("--iterations", "-it", type=int, default=None, help="timed iterations (default 10)")
    g.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 2)")
    g.add_argument("--l2-flush", action="store_true", default=None, help="flush L2 before every timed run")
    g.add_argument("--rewrite-inputs", action="store_true", default=None,
                   help="rewrite all of the kernel's recorded memory (device to device) before every timed run, as "
                        "the app's producer (a copy, the kernel before) leaves its inputs: recently written, partly "
                        "in L2 (default: only what the kernel writes is restored)")
    g.add_argument("--atol", type=float, default=None, help="absolute tolerance for unannotated buffers")
    g.add_argument("--rtol", type=float, default=None, help="relative tolerance for unannotated buffers")
    g.add_argument("--tol-type", default=None, help="element type the tolerances apply to (default f32)")
    g.add_argument("--arch", default=None, help="target arch, e.g. sm_90 (default: the recorded one)")
    g.add_argument("--timeout", type=float, default=None, help="watchdog seconds for a hung kernel (default 60)")
    add_verify_arguments(p)


def config_from_args(args: argparse.Namespace, base: ExperimentConfiguration) -> ExperimentConfiguration:
    d = base.to_dict()
    for key, value in vars(args).items():
        if not key.startswith("cfg:") or value is None:
            continue
        path = key[4:].split(".")
        if len(path) == 2:
            d[path[0]][path[1]] = value
        else:
            d[path[0]] = value
    if getattr(args, "passes", None):
        d["passes"] = args.passes
    return ExperimentConfiguration.from_dict(d)


def settings_from_args(args: argparse.Namespace) -> MeasurementSettings:
    s = MeasurementSettings()
    for f in fields(MeasurementSettings):
        v = getattr(args, f.name, None)
        if v is not None:
            setattr(s, f.name, v)
    return s


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-rdb", "--record-db", required=True, metavar="REC.json", help="record DB of the kernel")
    p.add_argument("-rid", "--record-id", default=None, metavar="DYNAMIC_HASH",
                   help="instance to replay (optional when the DB holds one)")
    add_baseline_argument(p)
    add_config_arguments(p)
    add_measurement_arguments(p)
    o = p.add_argument_group("output")
    o.add_argument("--sass-diff", metavar="APP_BINARY", nargs="?", const="",
                   help="compare the app's SASS of the kernel (cuobjdump -sass on APP_BINARY; default: the binary "
                        "the record names) with the replay's cubin: instruction mix and registers")
    o.add_argument("--compile-only", action="store_true", help="no GPU: compile and print resource usage and size")
    o.add_argument("--output-ll", "-ol", metavar="FILE", help="write the optimized IR")
    o.add_argument("--output-ptx", metavar="FILE", help="write the PTX")
    o.add_argument("--output-cubin", metavar="FILE", help="write the cubin")
    o.add_argument("--json", metavar="FILE", nargs="?", const="-", help="write the result as JSON (- for stdout)")
    o.add_argument("--track", action="store_true", help="log this replay as one MLflow run")
    o.add_argument("--device", type=int, default=0, help="GPU ordinal (default 0)")


def _us(ns: Optional[float]) -> str:
    return "-" if ns is None else f"{ns / 1000:.2f} us"


def summary(pipe, config: ExperimentConfiguration, r: ExperimentResult) -> str:
    rec = pipe.record
    lines = [
        f"kernel     {rec.demangled_name}",
        f"record     {pipe.record_db}  instance {pipe.record_id[:16]}  (static {rec.static_hash[:16]})",
        f"config     grid {config.grid} block {config.block} shmem {config.shared_mem}  passes {config.passes}  "
        f"codegen O{config.codegen_opt} {config.codegen_method}"
        + ("  +specialize" if config.specialize else "")
        + ("  +dims" if config.specialize_dims else "")
        + (f"  +bounds({config.max_threads},{config.min_blocks_per_sm})" if config.set_launch_bounds else "")
        + f"  [config {r.config_hash[:12]} code {r.code_hash[:12]}]",
        f"baseline   {pipe.baseline.describe()}" + ("" if pipe.baseline.apply(config) == config else
                                                     "  (code fields changed by the command line)"),
    ]
    lines += [f"           note: {n}" for n in pipe.baseline.notes]
    lines += [
        f"compile    preprocess {r.preprocess_ir_time * 1e3:.1f} ms  opt {r.opt_time * 1e3:.1f} ms  "
        f"ptx {r.ptx_time * 1e3:.1f} ms  cubin {r.cubin_time * 1e3:.1f} ms ({assembler()}){'  (cached)' if r.cache_hit else ''}  "
        f"size {r.obj_size} B",
        f"resources  {r.reg_usage} registers  local {r.local_mem_usage} B  const {r.const_mem_usage} B  "
        f"shared {r.shared_mem_usage} B  spills {r.spill_stores}/{r.spill_loads}  stack {r.stack_size} B"
        + (f"  occupancy {r.occupancy:.0%}" if r.occupancy else ""),
    ]
    if r.status == "compiled":
        lines.append("run        not run (--compile-only); timing needs a GPU")
    elif r.exec_time:
        t = r.exec_time
        lines.append(
            f"run        {r.status}  median {_us(statistics.median(t))}  min {_us(min(t))}  "
            f"mean {_us(statistics.mean(t))}  std {_us(statistics.pstdev(t))}  over {len(t)} iterations on "
            f"{r.gpu_name} #{r.gpu_id}"
        )
        inapp = pipe.instance.in_app_time_ns
        if inapp:
            lines.append(f"fidelity   {r.fidelity:.3f}  (replay median / in-app median {_us(inapp)})")
    else:
        lines.append(f"run        {r.status}")
    if r.verified and r.verification:
        lines.append("verify     " + r.verification.replace("\n", "\n           "))
    if r.error:
        lines.append(f"error      {r.error}")
    return "\n".join(lines)


def write_output(path: str, data: bytes) -> None:
    """Write an output file whole or not at all (a temporary name, then a rename); ConfigurationError names it."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ConfigurationError(f"{path}: cannot write it ({e.strerror or e})") from None


def run(args: argparse.Namespace) -> int:
    from mneme.replay.pipeline import ReplayPipeline

    settings = settings_from_args(args)
    pipe = ReplayPipeline(args.record_db, args.record_id, device_id=None if args.compile_only else args.device,
                          settings=settings, baseline=args.baseline)
    config = config_from_args(args, pipe.baseline_config())
    problems = config.problems()
    if problems:
        raise ConfigurationError("invalid replay configuration: " + "; ".join(problems))
    # a damaged or inconsistent record is the user's error (one line, exit 2), not a compile_error result
    pipe.linked()
    if config.specialize:
        pipe.arg_values()
    # --track logs the .ll too; deciding it here lets the artifact step below hit the compile cache
    keep_ll = bool(args.output_ll or args.track)
    if args.compile_only:
        result = pipe.compile_only(config, keep_ll=keep_ll)
    else:
        with pipe:
            result = pipe.execute(config, keep_ll=keep_ll)
    ck = None
    if result.code_hash and (args.output_ll or args.output_ptx or args.output_cubin or args.track):
        ck = pipe.compile(config, keep_ll=keep_ll)
        for path, data in ((args.output_ll, ck.ll), (args.output_ptx, ck.ptx)):
            if path and data is not None:
                write_output(path, data.encode())
        if args.output_cubin:
            write_output(args.output_cubin, ck.cubin.cubin)
    # `--json -` keeps stdout JSON only: the human summary goes to stderr then
    human = sys.stderr if args.json == "-" else sys.stdout
    print(summary(pipe, config, result), file=human)
    sass = None
    if args.sass_diff is not None and result.code_hash:
        from mneme.replay.sassdiff import compare_replay, render

        sass = compare_replay(pipe, pipe.compile(config), args.sass_diff or None)
        print(render(sass), file=human)
    if args.json:
        doc = {"config": config.to_dict(), "settings": settings.to_dict(), "result": result.to_dict(),
               "record_db": os.path.abspath(args.record_db), "record_id": pipe.record_id,
               "baseline": pipe.baseline.kind, "baseline_detail": pipe.baseline.to_dict()}
        if sass is not None:
            doc["sass_diff"] = sass
        text = json.dumps(doc, indent=2)
        if args.json == "-":
            print(text)
        else:
            write_output(args.json, (text + "\n").encode())
    if args.track:
        from mneme.track import log_replay

        run_id = log_replay(pipe, config, settings, result, ck)
        print(f"tracked    MLflow run {run_id}", file=human)
    if not pipe.usable:
        # The context holds a hung or faulted kernel; tearing it down could block. Leave now.
        sys.stdout.flush()
        os._exit(1)
    if result.status in ("verified", "compiled"):
        return 0
    return 1 if result.status == "failed_verification" else 2
