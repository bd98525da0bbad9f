"""Record-DB housekeeping: `mneme show`, `mneme clean`, `mneme copy`, `mneme move`.

A DB owns its IR modules and snapshot files (all stored relative to the DB's directory), so moving a
recording is moving those files and rewriting the relative paths.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Dict, List

from mneme.errors import RecordError
from mneme.record.db import RecordedExecution, find_dbs


def owned_files(db: RecordedExecution) -> List[str]:
    """Every file a DB refers to (IR modules and snapshots), resolved, without duplicates."""
    files: List[str] = list(db.llvm_files)
    for inst in db.values():
        files += [inst.prologue_fn, inst.epilogue_fn]
    return list(dict.fromkeys(files))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _fmt_time(ns) -> str:
    if ns is None:
        return "-"
    return f"{ns / 1000:.1f} us" if ns < 1e6 else f"{ns / 1e6:.2f} ms"


def show(paths: List[str]) -> str:
    dbs = [RecordedExecution.from_json(f, check_files=False) for p in paths for f in find_dbs(p)]
    if not dbs:
        raise RecordError(f"no record DB found in {', '.join(paths)}; record one with `mneme record -rdb DIR -- ./app`")
    dbs.sort(key=lambda d: d.total_in_app_time_ns, reverse=True)
    lines = []
    for db in dbs:
        state = "replayable" if db.replayable else f"NOT replayable: {db.not_replayable_reason}"
        if not db.llvm_files:
            state = "NOT replayable: no IR (app not built with `mneme cc`)"
        incomplete = "" if db.complete else "  [record incomplete]"
        lines.append(
            f"{db.demangled_name}  [{db.static_hash[:16]}]  total {_fmt_time(db.total_in_app_time_ns)}  "
            f"{len(db)} instance(s)  {state}{incomplete}"
        )
        lines.append(f"    db: {db.path}")
        ranked = sorted(db.items(), key=lambda kv: (kv[1].in_app_time_ns or 0) * kv[1].occ, reverse=True)
        for dhash, inst in ranked:
            snap = _size(inst.prologue_fn) + _size(inst.epilogue_fn)
            lines.append(
                f"    {dhash[:16]}  grid {inst.grid_dim} block {inst.block_dim} shmem {inst.shared_mem}  "
                f"x{inst.occ}  median {_fmt_time(inst.in_app_time_ns)}  snapshots {_fmt_bytes(snap)}"
            )
    return "\n".join(lines)


def clean(db_paths: List[str]) -> List[str]:
    """Delete DBs and the files they own; returns what was removed."""
    removed = []
    for p in db_paths:
        db = RecordedExecution.from_json(p, check_files=False)
        for f in owned_files(db) + [p]:
            if os.path.exists(f):
                os.remove(f)
                removed.append(f)
    return removed


def relocate(db_paths: List[str], dest: str, move: bool) -> List[str]:
    """Copy or move DBs with their files under `dest`, keeping their layout, and rewrite the paths."""
    dest_dir = Path(dest)
    if dest_dir.exists() and not dest_dir.is_dir():
        raise RecordError(f"{dest} is not a directory")
    dest_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for p in db_paths:
        db = RecordedExecution.from_json(p, check_files=True)
        missing = [f for f in owned_files(db) if not Path(f).is_file()]
        if missing:
            raise RecordError(f"{p}: cannot relocate, its file(s) {', '.join(missing)} are missing")
        src_dir = Path(p).resolve().parent
        mapping: Dict[str, str] = {}
        for f in owned_files(db):
            rel = os.path.relpath(f, src_dir)
            target = dest_dir / rel
            if Path(f).resolve() == target.resolve():
                raise RecordError(f"{p} is already in {dest}")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
            mapping[f] = str(target.resolve())
        db.llvm_files = [mapping[f] for f in db.llvm_files]
        for inst in db.values():
            inst.prologue_fn, inst.epilogue_fn = mapping[inst.prologue_fn], mapping[inst.epilogue_fn]
            inst.prologue_rel = inst.epilogue_rel = ""
        new_path = dest_dir / Path(p).name
        db.path = str(new_path)
        db.to_json(str(new_path))
        RecordedExecution.from_json(str(new_path))  # the copy must read back before the source may go
        written.append(str(new_path))
        if move:
            clean([p])
    return written


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    if name == "show":
        parser.add_argument("paths", nargs="+", metavar="DIR|DB.json")
    elif name == "clean":
        parser.add_argument("dbs", nargs="+", metavar="DB.json")
    else:
        parser.add_argument("dbs", nargs="+", metavar="DB.json")
        parser.add_argument("dest", metavar="DEST")
    parser.set_defaults(_name=name)


def run(args: argparse.Namespace) -> int:
    if args._name == "show":
        print(show(args.paths))
    elif args._name == "clean":
        for f in clean(args.dbs):
            print(f"removed {f}")
    else:
        for f in relocate(args.dbs, args.dest, move=args._name == "move"):
            print(f"{'moved' if args._name == 'move' else 'copied'} to {f}")
    return 0
