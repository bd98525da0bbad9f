# PYTHON_ARGCOMPLETE_OK
"""mneme: record the CUDA kernels of an app once, then replay, tune and compare any of them alone.

(Implementation: each subcommand module exposes `add_arguments(parser)` and `run(args) -> int` and is
imported only when its command runs; `mneme cc` is a compiler driver and takes its arguments verbatim.)
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import shlex
import sys
from typing import List, Optional

from mneme import __version__
from mneme.errors import MnemeError

#: name -> (module, what it is for, one example)
COMMANDS = {
    "cc": ("mneme.cc.cc", "compile and link CUDA code with clang-22, embedding device LLVM bitcode",
           "mneme cc -O2 -o app app.cu"),
    "ir": ("mneme.cc.ircli", "list the device IR modules embedded in a binary and the kernels they define",
           "mneme ir ./app"),
    "record": ("mneme.record.cli", "run an app once under the recorder and write a record DB per kernel",
               "mneme record -rdb rec -- ./app 1000000"),
    "show": ("mneme.record.housekeeping", "list recorded kernels ranked by in-app time", "mneme show rec"),
    "clean": ("mneme.record.housekeeping", "delete record DBs with their IR and snapshots",
              "mneme clean rec/<static-hash>.json"),
    "copy": ("mneme.record.housekeeping", "copy record DBs with their files to another directory",
             "mneme copy rec/*.json other/"),
    "move": ("mneme.record.housekeeping", "move record DBs with their files to another directory",
             "mneme move rec/*.json other/"),
    "replay": ("mneme.replay.cli", "replay one recorded kernel alone under a configuration and time or compile it",
               "mneme replay -rdb rec/<static-hash>.json -bidx 128 'default<O2>'"),
    "tune": ("mneme.tune.cli", "search launch and compiler settings of a recorded kernel for the fastest",
             "mneme tune -rdb rec/<static-hash>.json --space launch --trials 100"),
    "compare": ("mneme.track.compare", "show the tracked runs of an experiment side by side, best first",
                "mneme compare --latest --best"),
    "nvcc": ("mneme.cc.nvcc", "nvcc's command line over clang-22, embedding device LLVM bitcode (also mneme-nvcc)",
             "mneme nvcc -O3 -arch=sm_90 --use_fast_math -o app app.cu"),
    "apply": ("mneme.apply.cli", "run an app with its tuned kernels swapped in at launch, no rebuild",
              "mneme apply rec/tune -- ./app 1000000"),
    "export": ("mneme.apply.export", "write a wisdom file from the best MLflow run of a sweep",
               "mneme export -o wisdom.yaml"),
    "ui": ("mneme.track.ui", "start MLflow's UI on the store and print the URL of the experiment's runs page",
           "mneme ui --port 5000"),
}

EPILOG = """examples:
  mneme cc -O2 -o app app.cu                       build with embedded device IR
  mneme record -rdb rec -- ./app 1000000           record every kernel once (GPU)
  mneme show rec                                   what was recorded
  mneme replay -rdb rec/<static-hash>.json         replay one kernel (--compile-only without a GPU)
  mneme tune -rdb rec/<static-hash>.json --trials 200
  python -m mneme +experiment=sweep record.db=rec/<static-hash>.json   (Hydra + MLflow; also mneme-run)
  mneme compare --latest
  mneme ui                                         MLflow's UI, at the runs page

`mneme COMMAND --help` for a command's options; docs/USAGE.md for all of them.
shell completion: eval "$(register-python-argcomplete mneme)"
"""


def _completing_command(argv: List[str]) -> Optional[str]:
    """The subcommand being completed by argcomplete (it passes the command line in COMP_LINE)."""
    if "_ARGCOMPLETE" not in os.environ:
        return None
    try:
        words = shlex.split(os.environ.get("COMP_LINE", ""))[1:]
    except ValueError:
        return None
    return words[0] if words and words[0] in COMMANDS else None


def build_parser(chosen: Optional[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mneme", description=__doc__.splitlines()[0], epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"mneme {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (modname, help_text, example) in COMMANDS.items():
        epilog = f"example:\n  {example}\n\nmore: docs/USAGE.md"
        p = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
                           epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
        if name == chosen:
            mod = importlib.import_module(modname)
            mod.add_arguments(p, name) if mod.add_arguments.__code__.co_argcount > 1 else mod.add_arguments(p)
            if p.epilog != epilog:  # the command's own notes follow the example
                p.epilog = f"example:\n  {example}\n\n{p.epilog}"
            p.set_defaults(_module=mod)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "cc":
        from mneme.cc.cc import main as cc_main

        return cc_main(argv[1:])
    if argv and argv[0] == "nvcc":
        from mneme.cc.nvcc import main as nvcc_main

        return nvcc_main(argv[1:])
    app_argv = None
    if argv and argv[0] == "apply" and "--" in argv:  # everything after `--` is the app's command line
        i = argv.index("--")
        argv, app_argv = argv[:i], argv[i + 1:]
    chosen = argv[0] if argv and argv[0] in COMMANDS else _completing_command(argv)
    parser = build_parser(chosen)
    try:
        import argcomplete
    except ImportError:
        argcomplete = None
    if argcomplete is not None:
        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    if not _REAP_AT_EXIT:
        _REAP_AT_EXIT.append(atexit.register(_reap))
    if app_argv is not None:
        args.app = app_argv
    try:
        mod = args._module
        return int(mod.run(args) or 0)
    except KeyboardInterrupt:
        print(f"mneme {args.command}: interrupted", file=sys.stderr)
        return 130
    except (MnemeError, OSError) as e:
        # a user error (a bad input, an unwritable output): one line; MNEME_DEBUG=1 shows the traceback
        _debug()
        what = f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else str(e)
        print(f"mneme {args.command}: error: {what}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a bug: one line and how to see it, never a bare traceback
        _debug()
        print(f"mneme {args.command}: internal error: {type(e).__name__}: {e} (MNEME_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


_REAP_AT_EXIT: List[object] = []


def _reap() -> None:
    from mneme.tmpfiles import reap

    reap()


def _debug() -> None:
    if os.environ.get("MNEME_DEBUG"):
        import traceback

        traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main())
