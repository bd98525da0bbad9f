"""`mneme record -rdb DIR [options] -- ./app ARGS`: run an app under the recorder and write the record DB.

Exit status: the app's own when it failed (128+N for a signal), 3 when the app succeeded but the record
is incomplete (a write failed), else 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mneme.record.layout import DEFAULT_VADDR
from mneme.record.runner import EPILOGUE_FORMATS, RecordSettings, exit_status, record

INCOMPLETE_STATUS = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-rdb", "--record-db", dest="rdb", required=True, type=Path,
                        help="record directory (created; recording into one that holds records adds to them)")
    parser.add_argument("--kernels", metavar="REGEX",
                        help="record only kernels whose mangled or demangled name matches (re.search)")
    parser.add_argument("--max-recordings", type=int, default=10, metavar="N",
                        help="instances recorded per kernel; further ones are counted only (0: no limit; default 10)")
    parser.add_argument("--skip", type=int, default=0, metavar="N",
                        help="let the first N launches of each kernel pass unrecorded (warm-up)")
    parser.add_argument("--va-size", type=float, default=4.0, metavar="GIB",
                        help="size of the fixed-address device arena in GiB; every device allocation must fit (default 4)")
    parser.add_argument("--va-base", type=lambda s: int(s, 0), default=DEFAULT_VADDR, metavar="ADDR",
                        help=f"address of the device arena (default {DEFAULT_VADDR:#x})")
    parser.add_argument("--pinned-size", type=float, default=1.0, metavar="GIB",
                        help="size of the fixed-address pinned host region in GiB (default 1)")
    parser.add_argument("--epilogue-format", choices=EPILOGUE_FORMATS, default="diff",
                        help="epilogue storage: diff (changed byte ranges), bytes, or best (smaller of the two)")
    parser.add_argument("--record-ranks", default="0", metavar="R",
                        help="MPI ranks to record: 'all' or a list such as 0,3 or 0-3 (default 0)")
    parser.add_argument("--retime", type=int, default=10, metavar="N",
                        help="time each new instance N more times on its restored prologue, so the in-app median "
                             "is not one cold launch (0: only the recorded launch; default 10)")
    parser.add_argument("--retime-budget", type=float, default=1.0, metavar="SECONDS",
                        help="and rerun it for at most this long (the first rerun always runs; a kernel whose last "
                             "recorded launch took longer is not rerun; 0: no bound; default 1)")
    parser.add_argument("--snapshot-fsync", action="store_true",
                        help="fsync every snapshot file, so a record survives a crash of the machine, not only of "
                             "the app (slower: the app waits for the disk)")
    parser.add_argument("--keep-raw", action="store_true", help="keep the recorder's raw log next to the DB")
    parser.add_argument("--quiet", action="store_true", help="no progress while the app runs")
    parser.add_argument("app", nargs=argparse.REMAINDER, help="-- then the app and its arguments")


def run(args: argparse.Namespace) -> int:
    app = list(args.app)
    if app and app[0] == "--":
        app = app[1:]
    settings = RecordSettings(
        db_dir=args.rdb,
        kernels=args.kernels,
        max_recordings=args.max_recordings,
        skip=args.skip,
        va_size_gib=args.va_size,
        epilogue_format=args.epilogue_format,
        retime=args.retime,
        retime_budget_s=args.retime_budget,
        record_ranks=args.record_ranks,
        va_base=args.va_base,
        pinned_size_gib=args.pinned_size,
        keep_raw=args.keep_raw,
        snapshot_fsync=args.snapshot_fsync,
    )
    rc, outcome = record(app, settings, out=sys.stderr, show_progress=not args.quiet)
    print(f"mneme record: {outcome.processes} process(es) recorded into {outcome.db_dir}")
    for k in outcome.kernels:
        print(f"  {k.line()}")
    if not outcome.kernels:
        print("  no kernel launch was recorded (did the app find the CUDA driver and launch a kernel?)")
    if outcome.kernels_without_ir:
        print(f"mneme record: no IR for {len(outcome.kernels_without_ir)} kernel(s) (app not built with `mneme cc`): "
              + ", ".join(outcome.kernels_without_ir))
    line = outcome.recorder_time_line()
    if line:
        print(f"mneme record: {line}")
    line = outcome.wall_line()
    if line:
        print(f"mneme record: {line}")
    for w in outcome.warnings:
        print(f"mneme record: warning: {w}", file=sys.stderr)
    line = outcome.holds_line()
    if line:
        print(f"mneme record: warning: {line}", file=sys.stderr)
    if not outcome.complete:
        print("mneme record: the record is INCOMPLETE (a write failed or the app was killed mid-write); the DBs say "
              "Complete: false", file=sys.stderr)
    status = exit_status(rc)
    if status:
        print(f"mneme record: the app exited with status {status}", file=sys.stderr)
        return status
    return 0 if outcome.complete else INCOMPLETE_STATUS
