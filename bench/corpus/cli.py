"""`python -m bench.corpus STAGE [--apps A,B] [options]` (bash scripts/corpus.sh STAGE ...).

CPU (development machine): build, pack, plan, merge.  GPU machine: plain, record, replay, tune, ncu, apply.
Every stage takes --apps (default: all) and writes one result file under --out (default $OUT, else
.corpus/results); the GPU stages stop cleanly inside --budget seconds and print what remains.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from bench.corpus import apps as corpus_apps
from bench.corpus import applystage, build, gpu, merge, render, stage
from bench.corpus import tune as ctune
from bench.corpus.apps import ROOT

RESULTS = ROOT / ".corpus" / "results"
DOC_JSON = ROOT / "docs" / "corpus.json"
DOC_MD = ROOT / "docs" / "CORPUS.md"
GPU_STAGES = ("plain", "record", "replay", "tune", "ncu", "apply")
#: a device call runs at most 600 s; setting up the bundle takes some of it
GPU_BUDGET_S = 450.0
SCRIPT = "bash scripts/corpus.sh"


def default_nvcc() -> str:
    """mneme-nvcc (the project's front door) when installed, else NVIDIA's nvcc (no IR embedded)."""
    for name in ("mneme-nvcc",):
        found = shutil.which(name) or (str(Path(sys.executable).parent / name)
                                       if (Path(sys.executable).parent / name).exists() else None)
        if found:
            return found
    print("corpus build: mneme-nvcc not found; building with nvcc (binaries carry no IR: nothing records)",
          file=sys.stderr)
    return shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="corpus", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("stage", choices=("build", "pack", "plan") + GPU_STAGES + ("gpu", "merge", "list"),
                    help="gpu = the stages of --stages in turn, sharing one budget")
    ap.add_argument("results", nargs="*", help="merge: stage result files or folders (default: .corpus/results)")
    ap.add_argument("--apps", help="comma-separated app names (default: all)")
    ap.add_argument("--corpus", type=Path, default=corpus_apps.DEFAULT_CORPUS, help="corpus folder with apps.tsv")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else RESULTS,
                    help="where the stage result goes (default $OUT, else .corpus/results)")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the stage (GPU default 450, build 4 h)")
    ap.add_argument("--tag", default="", help="suffix of the result file name")
    b = ap.add_argument_group("build / pack")
    b.add_argument("--nvcc", default=None, help="CUDA compiler for $NVCC (default: mneme-nvcc, else nvcc)")
    b.add_argument("--arch", default=build.DEFAULT_ARCH, help="$CUDA_ARCH (default 90: H200)")
    b.add_argument("--keep", action="store_true", help="keep the scratch build folders")
    b.add_argument("--max-mib", type=float, default=build.DEFAULT_MAX_MIB, help="pack size limit (default 28)")
    b.add_argument("--per-call", type=int, default=4, help="plan: apps per device call (default 4)")
    g = ap.add_argument_group("GPU stages")
    g.add_argument("--stages", default="record,replay,tune", help="gpu: the stages to chain (default record,replay,tune)")
    g.add_argument("--pack", type=Path, default=build.PACK,
                   help="the pack: pack writes it, the GPU stages read it (default .corpus/pack)")
    g.add_argument("--work", type=Path, default=gpu.WORK, help="record DBs and runs (default .corpus/work)")
    g.add_argument("--app-timeout", type=float, default=300.0, help="seconds one plain run may take")
    g.add_argument("--max-recordings", type=int, default=3, help="record: instances per kernel (default 3)")
    g.add_argument("--retime", type=int, default=None, help="record: mneme record --retime N (default: mneme's)")
    g.add_argument("--max-instances", type=int, default=3, help="replay: instances per kernel (default 3)")
    g.add_argument("--trials", type=int, default=ctune.TRIALS, help=f"tune: trials per kernel (default {ctune.TRIALS})")
    g.add_argument("--space", default=ctune.SPACE, help=f"tune: search space (default {ctune.SPACE})")
    g.add_argument("--top", type=int, default=ctune.TOP, help=f"tune: heaviest kernels per app (default {ctune.TOP})")
    g.add_argument("--min-us", type=float, default=ctune.MIN_US,
                   help=f"tune: only instances of at least this in-app time (default {ctune.MIN_US:g})")
    g.add_argument("--jobs", type=int, default=None, help="tune: compile jobs (default: mneme's)")
    g.add_argument("--fresh", action="store_true",
                   help="tune: redo every kernel (default: reuse the rows and studies an earlier call left in --work)")
    g.add_argument("--launch-count", type=int, default=300, help="ncu: launches profiled (default 300)")
    g.add_argument("--apply-rounds", type=int, default=3, help="apply: observed/applied run pairs (default 3)")
    g.add_argument("--apply-min-speedup", type=float, default=applystage.MIN_SPEEDUP,
                   help=f"apply: kernels tuned to at least this (default {applystage.MIN_SPEEDUP})")
    g.add_argument("--apply-check", type=int, default=0, metavar="K",
                   help="apply: mneme apply --check K (default 0: the app's own success check is the referee)")
    g.add_argument("--apply-timer", default="auto", choices=["auto", "events", "ncu"],
                   help="apply: mneme apply --timer (default auto; ncu: every run under Nsight Compute, the "
                        "referee of the apply issue, for kernels too short for the in-app timer's spread)")
    m = ap.add_argument_group("merge")
    m.add_argument("--json", type=Path, default=DOC_JSON, help="corpus.json to update (default docs/corpus.json)")
    m.add_argument("--md", type=Path, default=DOC_MD, help="markdown to write (default docs/CORPUS.md)")
    return ap


def result_files(paths: Sequence[str]) -> List[Path]:
    files: List[Path] = []
    for p in paths or [str(RESULTS)]:
        q = Path(p)
        files += sorted(q.glob("*.json")) if q.is_dir() else [Path(x) for x in glob.glob(p)] or [q]
    return files


def run_gpu_stage(args, budget: Optional[stage.Budget] = None) -> Dict[str, Any]:
    """A GPU stage over the pack's apps (the GPU machine has no corpus folder: the manifest is the list)."""
    manifest = build.read_manifest(args.pack)
    packed = [corpus_apps.App.from_dict(e) for e in manifest["apps"]]
    names = corpus_apps.parse_names(args.apps)
    absent = [n for n in names or [] if n not in {a.name for a in packed}]
    if absent:
        raise corpus_apps.CorpusError(f"not in the pack {args.pack}: {', '.join(absent)} (it has: "
                                      f"{', '.join(a.name for a in packed)}); pack them on the development machine")
    selected = corpus_apps.select(packed, names)
    ctx = gpu.Ctx(manifest, args.pack, args.work, args.app_timeout, args.max_recordings, args.retime)
    fns = {
        "plain": lambda a, b: gpu.plain_app(a, b, ctx),
        "record": lambda a, b: gpu.record_app(a, b, ctx),
        "replay": lambda a, b: gpu.replay_app(a, b, ctx, args.max_instances),
        "tune": lambda a, b: ctune.tune_app(a, b, ctx, args.trials, args.space, args.top, args.min_us, args.jobs,
                                            resume=not args.fresh),
        "ncu": lambda a, b: gpu.ncu_app(a, b, ctx, args.launch_count),
        "apply": lambda a, b: applystage.apply_app(a, b, ctx, gpu.mneme(), args.apply_rounds, args.apply_min_speedup,
                                                   args.apply_check, timer=args.apply_timer),
    }
    budget = budget or stage.Budget(args.budget or GPU_BUDGET_S)
    path = stage.result_path(args.out, args.stage, _tag(args))
    extra = {"pack_commit": manifest.get("commit"), "settings": _settings(args)}
    res = stage.run_stage(args.stage, selected, fns[args.stage], budget, commit_fallback=manifest.get("commit", "unknown"),
                          save=lambda r: stage.save({**r, **extra}, path))
    return {**res, **extra, "_path": path}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.stage in GPU_STAGES:
            return _finish(args, run_gpu_stage(args))
        if args.stage == "gpu":
            return chain(args)
        if args.stage == "merge":
            return merge_cli(args)
        all_apps = corpus_apps.load(args.corpus)
        selected = corpus_apps.select(all_apps, corpus_apps.parse_names(args.apps))
        if args.stage == "list":
            for a in selected:
                print(f"{a.name}\t{','.join(a.features)}\t{a.binary} {a.args}")
            return 0
        if args.stage == "build":
            path = stage.result_path(args.out, "build", _tag(args))
            res = build.build_stage(selected, stage.Budget(args.budget or 4 * 3600.0), args.corpus,
                                    args.nvcc or default_nvcc(), args.arch, keep=args.keep, save_path=path)
            return _finish(args, {**res, "_path": path})
        built = build.built_apps([stage.read_result(f) for f in sorted(args.out.glob("build*.json"))])
        if args.stage == "pack":
            m = build.pack(selected, built, out=args.pack, max_mib=args.max_mib)
            print(f"corpus pack: {len(m['apps'])} app(s), {m['bytes'] / 2 ** 20:.1f} MiB in {args.pack} "
                  f"(carry it with '.bundle'); not built: {', '.join(m['not_built']) or 'none'}")
            return 0
        if args.stage == "plan":
            return plan(selected, built, args.max_mib, args.per_call)
    except (corpus_apps.CorpusError, FileNotFoundError, ValueError) as e:
        print(f"corpus {args.stage}: error: {e}", file=sys.stderr)
        return 2
    return 2


def merge_cli(args) -> int:
    import json

    try:
        names = [a.name for a in corpus_apps.load(args.corpus)]
    except corpus_apps.CorpusError as e:
        names = []
        print(f"corpus merge: {e}; listing only the apps in the results", file=sys.stderr)
    files = result_files(args.results)
    results = [stage.read_result(f) for f in files]
    doc = merge.merge(merge.load_doc(args.json), results, names)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    args.md.write_text(render.render(doc))
    print(f"corpus merge: {len(results)} stage result(s) into {args.json} and {args.md}")
    print(doc["summary"])
    return 0


def chain(args) -> int:
    """The stages of --stages in turn under one budget; a later stage runs on the apps the earlier finished."""
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in GPU_STAGES]
    if bad:
        raise corpus_apps.CorpusError(f"--stages: not a GPU stage: {', '.join(bad)} (choose from {', '.join(GPU_STAGES)})")
    budget = stage.Budget(args.budget or GPU_BUDGET_S)
    args.stage = stages[0]
    args.tag = _tag(args)  # every stage's file carries the same suffix
    for st in stages:
        args.stage = st
        res = run_gpu_stage(args, budget)
        _finish(args, res)
        if not res["apps"]:
            break
        args.apps = ",".join(res["apps"])
    return 0


def _own_pack(args) -> bool:
    return args.stage in GPU_STAGES and Path(args.pack).resolve() != build.PACK.resolve()


def _tag(args) -> str:
    """The result file's suffix: --tag, else the apps, else the pack's name, else 'all'."""
    if args.tag:
        return args.tag
    if args.apps:
        return args.apps.replace(",", "+")[:60]
    return Path(args.pack).name if _own_pack(args) else "all"


def _settings(args) -> Dict[str, Any]:
    keys = {"plain": ("app_timeout",), "record": ("app_timeout", "max_recordings", "retime"),
            "replay": ("max_instances",), "tune": ("trials", "space", "top", "min_us", "jobs", "fresh"),
            "ncu": ("launch_count",), "apply": ("app_timeout", "apply_rounds", "apply_min_speedup", "apply_check", "apply_timer"),
            }.get(args.stage, ())
    return {k: getattr(args, k) for k in keys}


def _finish(args, res: Dict[str, Any]) -> int:
    path = res.pop("_path", None) or stage.write_result(res, args.out, _tag(args))
    print(f"corpus {args.stage}: result in {path}")
    print(stage.remaining_line(res, SCRIPT, f" --pack {args.pack}" if _own_pack(args) else ""))
    return 0


def plan(selected, built: Dict[str, Dict[str, Any]], max_mib: float, per_call: int) -> int:
    """The device calls for the GPU stages: app groups whose binaries fit one call's carry, each call
    written out as the coordinator runs it."""
    sizes = {a.name: built[a.name]["stripped_bytes"] for a in selected if a.name in built}
    groups = build.plan_groups(sizes, max_mib * 2 ** 20, per_call)
    print(f"corpus plan: {len(sizes)} built app(s) in {len(groups)} group(s) of <= {max_mib} MiB and <= {per_call} apps"
          f"; not built: {', '.join(a.name for a in selected if a.name not in built) or 'none'}")
    for i, g in enumerate(groups, 1):
        mib = sum(sizes[n] for n in g) / 2 ** 20
        apps, pk = ",".join(g), f".corpus/pack{i}"
        carry = f'[".bundle", "{pk}"]'
        print(f"group {i} ({mib:.1f} MiB):")
        print(f"  here:  {SCRIPT} pack --apps {apps} --pack {pk}")
        print(f'  GPU:   run(command="{SCRIPT} gpu --pack {pk}", carry={carry}, timeout_s=600)')
        print(f'  GPU:   run(command="{SCRIPT} ncu --pack {pk}", carry={carry}, timeout_s=600)')
    print(f"then here: {SCRIPT} merge FILES_AT/*.json   (each call's files; a stage that stopped early prints its "
          f"--apps to continue with)")
    return 0
