"""The `mneme` console script: one subcommand per module, imported only when used.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`. `mneme cc` is a compiler
driver and takes its arguments verbatim.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
from typing import List, Optional

from mneme import __version__
from mneme.errors import MnemeError

#: name -> (module, one-line help)
COMMANDS = {
    "cc": ("mneme.cc.cc", "compile and link CUDA code with clang-22, embedding device LLVM bitcode"),
    "nvcc": ("mneme.cc.nvcc", "nvcc's command line over clang-22, embedding device LLVM bitcode"),
    "ir": ("mneme.cc.ircli", "list the device IR modules embedded in a binary and the kernels they define"),
    "record": ("mneme.record.cli", "run an app under the recorder and write the record DB"),
    "show": ("mneme.record.housekeeping", "list recorded kernels ranked by in-app time"),
    "clean": ("mneme.record.housekeeping", "delete record DBs with their IR and snapshots"),
    "copy": ("mneme.record.housekeeping", "copy record DBs with their files to another directory"),
    "move": ("mneme.record.housekeeping", "move record DBs with their files to another directory"),
    "replay": ("mneme.replay.cli", "replay one recorded kernel instance under a replay configuration"),
    "tune": ("mneme.tune.cli", "search replay configurations of a recorded kernel"),
    "compare": ("mneme.track.compare", "compare the MLflow runs of an experiment"),
    "apply": ("mneme.apply.cli", "run an app with its tuned kernels swapped in at launch: mneme apply TUNED... -- ./app"),
    "export": ("mneme.apply.export", "write a wisdom file from the best MLflow run of a sweep"),
}


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
    parser = argparse.ArgumentParser(prog="mneme", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"mneme {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    for name, (modname, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            mod = importlib.import_module(modname)
            mod.add_arguments(p, name) if mod.add_arguments.__code__.co_argcount > 1 else mod.add_arguments(p)
            p.set_defaults(_module=mod)
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
