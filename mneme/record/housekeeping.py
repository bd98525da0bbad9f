"""Record-DB housekeeping: `mneme show`, `mneme clean`, `mneme copy`, `mneme move`.

A DB owns its IR modules and snapshot files (all stored relative to the DB's directory), so moving a
recording is moving those files and rewriting the relative paths.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional

from mneme.errors import RecordError
from mneme.record import integrity
from mneme.record.db import RecordedExecution, find_dbs
from mneme.record.textures import texture_summary


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


#: SnapshottedMemory kinds (mneme/record/rawlog.py SNAPSHOTTED) as `mneme show` names them
_OUTSIDE = {"managed": "managed memory", "host_registered": "registered host memory"}


def _outside_arena(attrs: dict) -> str:
    """`  (+ managed memory 64.0 KiB in 1 range)` for an instance whose snapshots hold memory outside the arena."""
    mem = attrs.get("SnapshottedMemory") or {}
    kinds = [k for k in _OUTSIDE if k in mem] + sorted(set(mem) - set(_OUTSIDE))
    parts = [f"{_OUTSIDE.get(k, k)} {_fmt_bytes(mem[k].get('Bytes', 0))} in {mem[k].get('Ranges', 0)} range(s)"
             for k in kinds]
    return f"  (+ {', '.join(parts)})" if parts else ""


def _missing(db: RecordedExecution) -> List[str]:
    return [f for f in owned_files(db) if not Path(f).is_file()]


def show(paths: List[str], problems: Optional[List[str]] = None) -> str:
    """The DBs under `paths`, ranked; DBs that cannot be read are appended to `problems` (one line each)."""
    problems = [] if problems is None else problems
    dbs = []
    for p in paths:
        for f in find_dbs(p, unreadable=problems):
            try:
                dbs.append(RecordedExecution.from_json(f, check_files=False))
            except RecordError as e:
                problems.append(str(e))
    if not dbs:
        if problems:
            raise RecordError("\n".join(problems))
        raise RecordError(f"no record DB found in {', '.join(paths)}; record one with `mneme record -rdb DIR -- ./app`")
    dbs.sort(key=lambda d: d.total_in_app_time_ns, reverse=True)
    lines = []
    for db in dbs:
        state = "replayable" if db.replayable else f"NOT replayable: {db.not_replayable_reason}"
        if not db.llvm_files:
            state = "NOT replayable: no IR (app not built with `mneme cc`)"
        missing = _missing(db)
        if missing:
            state = f"NOT replayable: {len(missing)} of its files missing ({', '.join(os.path.relpath(m, Path(db.path).parent) for m in missing[:3])})"
        incomplete = "" if db.complete else "  [record incomplete]"
        lines.append(
            f"{db.demangled_name}  [{db.static_hash[:16]}]  total {_fmt_time(db.total_in_app_time_ns)}  "
            f"{len(db)} instance(s)  {state}{incomplete}"
        )
        lines.append(f"    db: {db.path}")
        ranked = sorted(db.items(), key=lambda kv: (kv[1].in_app_time_ns or 0) * kv[1].occ, reverse=True)
        attrs = db.extra.get("InstanceAttributes") or {}
        for dhash, inst in ranked:
            snap = _size(inst.prologue_fn) + _size(inst.epilogue_fn)
            lines.append(
                f"    {dhash[:16]}  grid {inst.grid_dim} block {inst.block_dim} shmem {inst.shared_mem}  "
                f"x{inst.occ}  median {_fmt_time(inst.in_app_time_ns)}  snapshots {_fmt_bytes(snap)}"
                f"{_outside_arena(attrs.get(dhash) or {})}"
            )
            tex = texture_summary(((db.extra.get("InstanceAttributes") or {}).get(dhash) or {}).get("Textures") or [])
            if tex:
                lines.append(f"      textures: {tex}")
    return "\n".join(lines)


def _expected_hashes(db: RecordedExecution) -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = dict(zip(db.llvm_files, db.module_sha256))
    for inst in db.values():
        out[inst.prologue_fn] = inst.prologue_sha256
        out[inst.epilogue_fn] = inst.epilogue_sha256
    return out


def _belongs(db: RecordedExecution, f: str, expected: Optional[str]) -> Optional[str]:
    """None when `f` is the DB's own file (its recorded hash, or - without one - its name carries the DB's
    static hash); else why not."""
    if expected is not None:
        try:
            ok = integrity.sha256(f) == expected
        except OSError as e:
            return f"cannot be read ({e.strerror or e})"
        return None if ok else "its SHA-256 is not the one the DB records"
    return None if db.static_hash in Path(f).name else f"its name does not carry the DB's static hash {db.static_hash[:16]}..."


def _others_files(db_path: str) -> Dict[str, str]:
    """Files referred to by the other DBs of `db_path`'s directory -> that DB."""
    out: Dict[str, str] = {}
    me = os.path.realpath(db_path)
    for other in find_dbs(str(Path(db_path).parent)):
        if os.path.realpath(other) == me:
            continue
        try:
            odb = RecordedExecution.from_json(other, check_files=False)
        except RecordError:
            continue
        for f in owned_files(odb):
            out.setdefault(os.path.realpath(f), other)
    return out


def _remove_all(files: List[str], what: str) -> None:
    """Remove `files` all or none: each is first renamed to a temporary name next to it (a rename that fails
    undoes the earlier ones), then the renamed ones are unlinked."""
    renamed: List[tuple] = []
    try:
        for f in files:
            tmp = f"{f}.mneme-del-{os.getpid()}"
            os.replace(f, tmp)
            renamed.append((f, tmp))
    except BaseException as e:
        for f, tmp in reversed(renamed):
            try:
                os.replace(tmp, f)
            except OSError:
                pass
        if isinstance(e, OSError):
            raise RecordError(f"{e.filename or files[len(renamed)]}: cannot {what} ({e.strerror or e}); nothing was removed") from None
        raise
    for _, tmp in renamed:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def clean(db_paths: List[str], skipped: Optional[List[str]] = None) -> List[str]:
    """Delete DBs and the files they own; returns what was removed. A file the DB names but that is not its
    own (another DB refers to it, or neither its hash nor its name ties it to this DB) is kept and noted in
    `skipped`. Each DB goes all at once or not at all."""
    removed = []
    skipped = [] if skipped is None else skipped
    for p in db_paths:
        db = RecordedExecution.from_json(p, check_files=False)
        others = _others_files(p)
        expected = _expected_hashes(db)
        mine = []
        for f in owned_files(db):
            if not os.path.lexists(f):
                continue
            other = others.get(os.path.realpath(f))
            why = f"{other} refers to it too" if other else _belongs(db, f, expected.get(f))
            if why:
                skipped.append(f"{f}: kept, {why}")
            else:
                mine.append(f)
        _remove_all(mine + [p], f"clean {p}")
        removed += mine + [p]
    return removed


_TMP = ".mneme-tmp-"


def _free_bytes(d: Path) -> int:
    try:
        return shutil.disk_usage(d).free
    except OSError:
        return -1


def _relocate_one(p: str, dest_dir: Path, move: bool) -> str:
    db = RecordedExecution.from_json(p, check_files=True)
    missing = _missing(db)
    if missing:
        raise RecordError(f"{p}: cannot relocate, its file(s) {', '.join(missing)} are missing")
    expected = _expected_hashes(db)
    for f in owned_files(db):  # copy only what was recorded
        integrity.check_file(f, expected.get(f), p, "file")
    if db.llvm_files and any(h is None for h in db.module_sha256):
        db.checked_modules()  # a schema-1 DB's IR is parsed (contained) before its hash is written into the copy
    for f, h in expected.items():
        if h is None and f not in db.llvm_files:  # schema 1: the snapshot format's own checks stand in for a hash
            from mneme.snapshot import Snapshot

            Snapshot.read(f).close()
    db.fill_sha256()
    src_dir = Path(p).resolve().parent
    new_path = dest_dir / Path(p).name
    if move and not os.access(src_dir, os.W_OK):
        raise RecordError(f"{p}: cannot move it, its directory {src_dir} is not writable; copy it instead")
    plan = []  # (source, final target)
    for f in owned_files(db):
        target = dest_dir / os.path.relpath(f, src_dir)
        if Path(f).resolve() == target.resolve():
            raise RecordError(f"{p} is already in {dest_dir}")
        plan.append((f, target))
    for f, target in plan:
        if target.exists() and integrity.sha256(str(target)) != integrity.sha256(f):
            raise RecordError(f"{target} already exists with other content; refusing to overwrite it (remove it or pick "
                              "another destination)")
    need = sum(_size(f) for f, t in plan if not t.exists()) + _size(p) + (1 << 16)
    free = _free_bytes(dest_dir)
    if 0 <= free < need:
        raise RecordError(f"{dest_dir}: not enough free space to {'move' if move else 'copy'} {p} "
                          f"(needs {_fmt_bytes(need)}, {_fmt_bytes(free)} free); nothing was written")
    created_dirs: List[Path] = []
    temps: List[tuple] = []  # (temp, final)
    placed: List[Path] = []
    try:
        for f, target in plan:
            for d in reversed([target.parent, *target.parent.parents]):
                if not d.exists():
                    d.mkdir()
                    created_dirs.append(d)
            if target.exists():
                continue  # the same bytes are there already
            tmp = target.with_name(f"{target.name}{_TMP}{os.getpid()}")
            temps.append((tmp, target))
            shutil.copy2(f, tmp)
        mapping = {f: str(t.resolve()) for f, t in plan}
        db.llvm_files = [mapping[f] for f in db.llvm_files]
        for inst in db.values():
            inst.prologue_fn, inst.epilogue_fn = mapping[inst.prologue_fn], mapping[inst.epilogue_fn]
            inst.prologue_rel = inst.epilogue_rel = ""
        db.path = str(new_path)
        tmp_db = new_path.with_name(f"{new_path.name}{_TMP}{os.getpid()}")
        temps.append((tmp_db, new_path))
        data = db.to_dict()
        with open(tmp_db, "w") as fd:
            json.dump(data, fd, indent=2)
            fd.write("\n")
        for tmp, final in temps[:-1]:
            os.replace(tmp, final)
            placed.append(final)
        RecordedExecution.from_json(str(tmp_db))  # the copy must read back before it is published
        os.replace(tmp_db, new_path)
        placed.append(new_path)
    except BaseException as e:
        for tmp, _ in temps:
            if os.path.lexists(tmp):
                os.unlink(tmp)
        for f in reversed(placed):
            os.unlink(f)
        for d in reversed(created_dirs):
            try:
                d.rmdir()
            except OSError:
                pass
        if isinstance(e, OSError):
            raise RecordError(f"{e.filename or dest_dir}: cannot {'move' if move else 'copy'} {p} there "
                              f"({e.strerror or e}); nothing was left behind") from None
        raise
    if move:
        _remove_all([f for f, _ in plan] + [p], f"remove {p} after copying it to {new_path}")
    return str(new_path)


def relocate(db_paths: List[str], dest: str, move: bool) -> List[str]:
    """Copy or move DBs with their files under `dest`, keeping their layout, and rewrite the paths.

    Each DB is all or nothing: its files are checked against their hashes, free space is checked, files are
    written under temporary names and renamed into place, and on any failure what was written is removed; a
    move deletes the source only once the copy reads back, and then all of it or none."""
    dest_dir = Path(dest)
    if dest_dir.exists() and not dest_dir.is_dir():
        raise RecordError(f"{dest} is not a directory")
    made = [d for d in [dest_dir, *dest_dir.parents] if not d.exists()]
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _rmdirs(made)
        raise RecordError(f"{dest}: cannot create the destination directory ({e.strerror or e})") from None
    written: List[str] = []
    try:
        for p in db_paths:
            written.append(_relocate_one(p, dest_dir, move))
    except BaseException:
        if not written:
            _rmdirs(made)  # nothing was copied: the destination is as it was
        raise
    return written


def _rmdirs(dirs: List[Path]) -> None:
    for d in dirs:  # innermost first
        try:
            d.rmdir()
        except OSError:
            pass


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
        problems: List[str] = []
        print(show(args.paths, problems))
        for line in problems:
            print(f"mneme show: error: {line}", file=sys.stderr)
        return 2 if problems else 0
    elif args._name == "clean":
        skipped: List[str] = []
        for f in clean(args.dbs, skipped):
            print(f"removed {f}")
        for line in skipped:
            print(f"mneme clean: {line}", file=sys.stderr)
    else:
        for f in relocate(args.dbs, args.dest, move=args._name == "move"):
            print(f"{'moved' if args._name == 'move' else 'copied'} to {f}")
    return 0
