"""`mneme tune`: search replay configurations of one recorded kernel.

    mneme tune -rdb REC.json [-rid DYN] --space NAME --sampler NAME --trials N [--devices IDS] [--compile-jobs J]
               [--storage URL] [--study NAME] [--resume] ...
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from mneme.errors import ConfigurationError
from mneme.replay.cli import add_verify_arguments, verify_settings
from mneme.tune.launch import LAUNCH_SAFETY
from mneme.tune.options import EXIT_CODES, EXIT_OK, METRICS, OBJECTIVES, TuneOptions
from mneme.tune.presets import PRESET_HELP, PRESETS
from mneme.tune.samplers import SAMPLERS

_EPILOG = (
    "spaces:\n" + "".join(f"  {k:<12} {v}\n" for k, v in PRESET_HELP.items())
    + "samplers:\n" + "".join(f"  {k:<12} {v}\n" for k, v in SAMPLERS.items())
    + "launch safety:\n"
    "  conservative exact cuts of the recorded work, no block larger than the recorded one\n"
    "  balanced     grid rounds up, whole warps, up to 1024 threads, at most 2x the recorded threads\n"
    "  aggressive   also reshapes dimensions the recorded block does not span, any size up to 1024\n"
    "exit codes:\n" + "".join(f"  {k:<4} {v}\n" for k, v in EXIT_CODES.items())
    + "results: <output>/ holds config.json, space.json, baseline.json, trials.jsonl, verified.csv,\n"
    "best.json/.yaml/.sh/.md and summary.json/.txt, written from the study storage\n"
    "(default: the journal file <output>/study.journal).\n"
)


def _devices(text: str) -> Optional[List[int]]:
    t = text.strip().lower()
    if t in ("all", ""):
        return None
    if t in ("none", "cpu", "-"):
        return []
    try:
        return [int(v) for v in t.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--devices {text!r}: expected GPU ordinals like 0,1 (or 'all', 'none')") from None


def _choice(kind: str, choices):
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"unknown {kind} {text!r}; choose one of {', '.join(choices)}")
        return text

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    a = parser.add_argument
    a("-rdb", "--record-db", required=True, help="record DB (<static-hash>.json) of the kernel to tune")
    a("-rid", "--record-id", default=None, help="dynamic hash of the instance (optional when the DB holds one)")
    a("--space", default="standard", help=f"search space: {', '.join(PRESETS)} (default standard)")
    a("--sampler", default="tpe", type=_choice("sampler", list(SAMPLERS)), help="sampler (default tpe); see below")
    a("--trials", type=int, default=100, help="trials in the study, counting those of earlier runs (default 100)")
    a("--devices", type=_devices, default=None, help="GPU ordinals, e.g. 0,1 (default: all visible; 'none': compile only)")
    a("--compile-jobs", type=int, default=None, help="compile processes (default: CPU count)")
    a("--storage", default=None,
      help="Optuna storage: sqlite:///PATH, postgresql://..., journal:PATH "
           "(default journal:<output>/study.journal; an existing <output>/study.db is kept)")
    a("--study", default=None, help="study name (default: kernel, instance and space)")
    a("--resume", action="store_true", help="continue the study if it exists (refused if the record or space changed)")
    a("--metric", default="median", type=_choice("metric", METRICS), help="time statistic over iterations (default median)")
    a("--objective", default="time", type=_choice("objective", OBJECTIVES),
      help="time or speedup (GPU); registers or size (compile only)")
    a("-it", "--iterations", type=int, default=10, help="timed iterations per trial (default 10)")
    a("--warmup", type=int, default=2, help="untimed warm-up runs per trial (default 2)")
    a("--timeout", type=float, default=60.0, help="seconds before a hung kernel is stopped (default 60)")
    a("--l2-flush", action="store_true", help="flush L2 between timed iterations")
    a("--rewrite-inputs", action="store_true",
      help="rewrite the kernel's recorded memory before every timed run, as the app's producer leaves its inputs")
    a("--atol", type=float, default=None, help="absolute tolerance for verification")
    a("--rtol", type=float, default=None, help="relative tolerance for verification")
    a("--tol-type", default="f32", help="element type the tolerances apply to (default f32)")
    add_verify_arguments(parser)
    a("--arch", default=None, help="target arch, e.g. sm_90 (default: the recorded one)")
    a("--seed", type=int, default=None, help="sampler seed")
    a("--launch-safety", default="balanced", type=_choice("launch safety", list(LAUNCH_SAFETY)),
      help="how far launch candidates may stray from the recording (default balanced)")
    a("--passes", action="append", default=[], metavar="PIPELINE", help="a custom pass pipeline to search (repeatable)")
    a("--pipeline-file", default=None, help="file with one custom pipeline per line (# comments)")
    a("--space-module", default=None, metavar="MODULE:CLASS", help="a SearchSpace subclass to search instead of --space")
    a("--space-arg", action="append", default=[], metavar="K=V", help="argument for --space-module (repeatable)")
    a("-o", "--output", default=None, help="results directory (default ./mneme-tune/<study>)")
    a("--no-track", action="store_true", help="do not log to MLflow")
    a("--dry-run", "--print-space", dest="dry_run", action="store_true", help="print the space and the plan; run nothing")
    a("--baseline-only", action="store_true", help="measure the baseline, write the results, stop")
    a("--baseline", choices=("app-build", "mneme-defaults"), default="app-build",
      help="the baseline's code: as the app was built (default; the space keeps mneme's defaults as a point) or "
           "mneme's defaults")
    a("--report-only", action="store_true", help="write the results directory from the study storage; run nothing")
    a("--json", action="store_true", help="print the summary as JSON")
    a("--no-attribute", dest="attribute", action="store_false",
      help="skip measuring the best configuration without each of its knobs after the search")
    a("--quiet", action="store_true", help="no progress bar")
    a("--derived", action="append", default=[], metavar="'NAME = EXPR'",
      help="a derived metric over the kernel's scalar arguments by name and time_s/_ms/_us/_ns, shown for the baseline "
           "and the best and logged to MLflow per trial, e.g. --derived 'gbps = 3 * n * 4 / time_s / 1e9' (repeatable)")
    g = parser.add_argument_group("advanced")
    g.add_argument("--compile-timeout", type=float, default=600.0, help="seconds one compilation may take (default 600)")
    g.add_argument("--stale-after", type=float, default=120.0,
                   help="seconds without a heartbeat after which another process's running trial is redone (default 120)")
    g.add_argument("--max-inflight", type=int, default=None, help="trials in flight at once (default: compile jobs + 2 per GPU)")
    g.add_argument("--cache-dir", default=None, help="shared cubin cache (default <output>/cache)")
    g.add_argument("--backend", default=None, help=argparse.SUPPRESS)


def options_from_args(args: argparse.Namespace) -> TuneOptions:
    from mneme.tune.space import parse_space_args

    o = TuneOptions(
        record_db=args.record_db, record_id=args.record_id, space=args.space, sampler=args.sampler, trials=args.trials,
        devices=args.devices, compile_jobs=args.compile_jobs, storage=args.storage, study=args.study,
        metric=args.metric, objective=args.objective, iterations=args.iterations, warmup=args.warmup,
        timeout=args.timeout, l2_flush=args.l2_flush, rewrite_inputs=args.rewrite_inputs, atol=args.atol, rtol=args.rtol, tol_type=args.tol_type,
        verification=verify_settings(args),
        arch=args.arch, seed=args.seed, resume=args.resume, baseline_only=args.baseline_only,
        launch_safety=args.launch_safety, passes=list(args.passes), pipeline_file=args.pipeline_file,
        space_module=args.space_module, space_args=parse_space_args(args.space_arg), output=args.output,
        track=not args.no_track, compile_timeout=args.compile_timeout, stale_after=args.stale_after,
        max_inflight=args.max_inflight, cache_dir=args.cache_dir, progress=not args.quiet,
        attribute=args.attribute, derived=list(args.derived), baseline=args.baseline,
    )
    if args.backend:
        o.backend = args.backend
    if o.space_module is None and o.space not in PRESETS:
        raise ConfigurationError(
            f"unknown search space {o.space!r}; choose one of {', '.join(PRESETS)} (or --space-module MODULE:CLASS)"
        )
    return o


def run(args: argparse.Namespace) -> int:
    from mneme.tune.hooks import load_track_hook
    from mneme.tune.tuner import Tuner

    options = options_from_args(args)
    if args.dry_run:
        tuner = Tuner(options)
        tuner.prepare()
        plan = tuner.plan()
        if args.json:
            print(json.dumps(plan, indent=2, default=str))
        else:
            _print_plan(plan)
        return EXIT_OK
    if args.report_only:
        return _report_only(options, args.json)
    hook = load_track_hook(options) if options.track else None
    outcome = Tuner(options, hook).run()
    s = outcome.summary
    if args.json:
        print(json.dumps({k: v for k, v in s.items() if k != "text"}, indent=2, default=str))
    else:
        if s.get("text"):
            print(s["text"])
        best = s.get("best") or {}
        if best.get("replay_command"):
            print(f"replay it: {best['replay_command']}")
        print(f"results: {outcome.out_dir}")
    if outcome.message and outcome.exit_code != EXIT_OK:
        print(f"mneme tune: {outcome.message}", file=sys.stderr)
    return outcome.exit_code


def _report_only(options: TuneOptions, as_json: bool) -> int:
    from mneme.tune import study as st
    from mneme.tune.report import write_results
    from mneme.tune.tuner import Tuner

    tuner = Tuner(options)
    tuner.prepare()
    summary = write_results(st.load_study(st.open_storage(tuner.storage_url), tuner.study_name), tuner.out_dir)
    print(json.dumps({k: v for k, v in summary.items() if k != "text"}, indent=2, default=str) if as_json else summary["text"])
    return EXIT_OK


def _print_plan(plan: dict) -> None:
    sp = plan["space"]
    print(f"study    {plan['study']}")
    print(f"storage  {plan['storage']}")
    print(f"output   {plan['output']}")
    print(f"kernel   {plan['record']['kernel']} (instance {plan['record']['dynamic_hash']})")
    b = plan["baseline"]
    print(f"baseline grid {tuple(b['grid'].values())} block {tuple(b['block'].values())} shared {b['shared_mem']} {b['passes']}")
    if plan.get("baseline_code"):
        print(f"baseline code: {plan['baseline_code']['description']}")
    print(f"space    {sp['name']}: {sp['size'] if sp['size'] is not None else 'infinite'} points")
    for name, dom in sp["dimensions"].items():
        print(f"  {name:<18} {json.dumps(dom)[:150]}")
    la = sp.get("launch_analysis")
    if la:
        f = la["facts"]
        reads = ", ".join(f"{k}.{v}" for k, v in f["reads"].items()) or "none"
        print(f"launch safety from the IR ({f['analyzed']}): reads {reads}")
        for t in f["shared_tiles"]:
            print(f"  shared {t['name']} {'x'.join(map(str, t['shape']))} ({t['bytes']} B) indexed by threadIdx "
                  f"{t['threadIdx'] or '-'}")
        for line in la["rules"]["lines"]:
            print(f"  {line}")
        print(f"  (these hold at every --launch-safety level; --launch-safety {sp.get('launch_safety')} decides how far "
              "the free axes may stray; aggressive drops only the block.x warp rule)")
    if sp.get("launch"):
        print(f"  launch candidates ({sp.get('launch_safety')}):")
        for key, s in sp["launch"].items():
            g = s["grid"]
            print(f"    {key:<14} grid {g['x']}x{g['y']}x{g['z']}  shared {s['shared_mem']}")
    print(f"sampler  {plan['sampler']}; objective {plan['objective']['objective']} ({plan['objective']['metric']}); "
          f"{plan['trials']} trials; devices {plan['devices']}; compile jobs {plan['compile_jobs']}")
    for note in plan["notes"]:
        print(f"note: {note}")
