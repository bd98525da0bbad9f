"""`mneme apply TUNED... -- ./app ARGS`: run the app with its tuned kernels, no rebuild (docs/APPLY.md).

TUNED: wisdom files, `mneme tune` results directories, or directories holding tune results. The app runs
twice per round: observed (original kernels, timed in-app) and applied (tuned kernels swapped in at launch).
"""

from __future__ import annotations

import argparse
import json
import sys

from mneme.errors import ConfigurationError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ("rules:\n  exact   only the tuned instance (same grid, block, shared memory, scalar arguments)\n"
                     "  scaled  other problem sizes: same block and shared memory, grid recomputed from the launch's work\n"
                     "exit status: the applied run's (86: --check found a mismatch), 2 on a usage error\n")
    a = parser.add_argument
    a("tuned", nargs="+", metavar="TUNED", help="wisdom file, tune results directory, or a directory holding them")
    a("--rule", default=None, choices=["exact", "scaled"], help="override the wisdom's instance rule")
    a("--check", type=int, default=0, metavar="K", help="compare original and tuned on the first K launches of each kernel")
    a("--atol", type=float, default=None, help="absolute tolerance for --check (default: byte-exact)")
    a("--rtol", type=float, default=None, help="relative tolerance for --check")
    a("--tol-type", default="f32", help="element type the tolerances apply to (default f32)")
    a("--rounds", type=int, default=1, help="observed/applied run pairs, alternating (default 1)")
    a("--app-timeout", type=float, default=None, metavar="S", help="kill a run of the app after S seconds (default: none)")
    a("--timer", default="auto", choices=["auto", "events", "ncu"],
      help="how launches are timed: auto (the in-app timer; one more observe/apply pair under Nsight Compute for a "
           "kernel it cannot see, one inside a CUDA graph), events (the in-app timer only), ncu (every run under ncu)")
    a("--arch", default=None, help="target arch for rebuilt cubins (default: the recorded one)")
    a("--workdir", default=None, help="where the manifest, cubins, statistics and apply.json go (default: a temp dir)")
    a("--track", action="store_true", help="log the result to MLflow (under the sweep run when known)")
    a("--tracking-uri", default=None, help="MLflow store (default: the wisdom's, MLFLOW_TRACKING_URI, ./mlflow.db)")
    a("--experiment", default=None, help="MLflow experiment when no sweep run is known")
    a("--json", action="store_true", help="print the report as JSON")
    a("--quiet", action="store_true", help="no progress lines")


def split_argv(argv: list) -> tuple:
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def run(args: argparse.Namespace) -> int:
    from mneme.apply.app import apply_app

    app = list(getattr(args, "app", None) or [])
    if not app:
        raise ConfigurationError("no app to run: mneme apply TUNED... -- ./app ARGS")
    rep = apply_app(args.tuned, app, workdir=args.workdir, rule=args.rule, check=args.check, rounds=args.rounds,
                    atol=args.atol, rtol=args.rtol, tol_type=args.tol_type, arch=args.arch, track_run=args.track,
                    tracking_uri=args.tracking_uri, experiment=args.experiment, quiet=args.quiet,
                    app_timeout=args.app_timeout, timer=args.timer)
    if args.json:
        print(json.dumps(rep.to_json(), indent=2, default=str))
    else:
        print("\n".join(rep.lines()))
    if rep.check_failed:
        return 86
    codes = rep.returncodes.get("apply") or [0]
    return next((c for c in codes if c != 0), 0)


def main(argv=None) -> int:
    """Entry for `mneme apply` (mneme/cli.py passes the part after `--` as args.app)."""
    ours, app = split_argv(list(sys.argv[1:] if argv is None else argv))
    p = argparse.ArgumentParser(prog="mneme apply", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(ours)
    args.app = app
    return run(args)
