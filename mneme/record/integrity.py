"""The bytes a record DB owns are the bytes that were recorded: SHA-256 per file, checked before use.

A schema-2 DB stores the SHA-256 of every IR module and snapshot (mneme/record/schema.py). Readers call
`check_file` before LLVM or the snapshot reader sees a file, so a flipped bit, a truncated or edited
file, or a file swapped for another one is refused with the file named, instead of aborting inside
LLVM or compiling into a different kernel.

A schema-1 DB stores no hashes. Its snapshots are still safe to read (the snapshot format checksums
every record itself); its IR modules are parsed once in a child process first (`check_bitcode_contained`),
so bytes that make LLVM abort take the child down, not mneme.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from typing import Dict, Optional, Tuple

from mneme.errors import RecordError

_CHUNK = 1 << 20
#: (path, size, mtime_ns) -> digest, so a file read twice in one process is hashed once
_DIGESTS: Dict[Tuple[str, int, int], str] = {}
_PARSED: Dict[Tuple[str, int, int], Optional[str]] = {}


def _key(path: str) -> Tuple[str, int, int]:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


def sha256(path: str) -> str:
    """Hex SHA-256 of a file's bytes (OSError when it cannot be read)."""
    key = _key(path)
    digest = _DIGESTS.get(key)
    if digest is None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
        digest = _DIGESTS[key] = h.hexdigest()
    return digest


def file_sha256(path: str, db_path: str) -> str:
    """The SHA-256 to store for a file a DB is being written with; RecordError when it cannot be read."""
    try:
        return sha256(path)
    except OSError as e:
        raise RecordError(f"{db_path}: cannot write the DB, its file {path} cannot be read ({e.strerror or e})") from None


def check_file(path: str, expected: Optional[str], db_path: str, what: str) -> str:
    """`path` once its bytes match `expected` (skipped when None); RecordError naming both files otherwise."""
    if not os.path.isfile(path):
        raise RecordError(f"{db_path}: {what} {path} is missing or not a file; restore it or record the app again")
    if expected is None:
        return path
    try:
        actual = sha256(path)
    except OSError as e:
        raise RecordError(f"{db_path}: {what} {path} cannot be read ({e.strerror or e})") from None
    if actual != expected:
        raise RecordError(
            f"{path}: {what} does not match the SHA-256 recorded in {db_path} (recorded {expected[:16]}..., "
            f"file has {actual[:16]}...): it was changed or damaged after recording; restore it or record again"
        )
    return path


_CHILD = (
    "import sys, llvmlite.binding as llvm\n"
    "llvm.initialize_all_targets(); llvm.initialize_all_asmprinters()\n"
    "data = open(sys.argv[1], 'rb').read()\n"
    "try:\n"
    "    m = llvm.parse_bitcode(data) if data[:2] == b'BC' or data[:4] == b'\\xde\\xc0\\x17\\x0b' else llvm.parse_assembly(data.decode())\n"
    "    m.verify()\n"
    "except Exception as e:\n"
    "    print(str(e).splitlines()[0] if str(e) else type(e).__name__); sys.exit(3)\n"
)


def check_bitcode_contained(path: str, db_path: str, timeout: float = 60.0) -> None:
    """Parse and verify an IR module in a child process; RecordError when LLVM rejects it or aborts on it."""
    key = _key(path)
    if key not in _PARSED:
        try:
            p = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            _PARSED[key] = f"LLVM did not finish parsing it within {timeout:.0f} s"
        else:
            if p.returncode == 0:
                _PARSED[key] = None
            elif p.returncode == 3:
                _PARSED[key] = p.stdout.strip() or "LLVM rejected it"
            else:
                why = f"signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
                last = (p.stderr.strip().splitlines() or [""])[-1][:200]
                _PARSED[key] = f"LLVM aborted on it ({why}{': ' + last if last else ''})"
    why = _PARSED[key]
    if why is not None:
        raise RecordError(f"{path}: IR module of {db_path} is not valid LLVM IR ({why}); restore it or record the app again")


def check_snapshot_kinds(prologue, epilogue, db_path: str) -> None:
    """The prologue file holds a prologue and the epilogue file an epilogue (not swapped)."""
    from mneme.snapshot import SnapshotType

    for snap, want in ((prologue, SnapshotType.PROLOGUE), (epilogue, SnapshotType.EPILOGUE)):
        if snap is not None and snap.kind != want:
            raise RecordError(
                f"{snap.path}: recorded in {db_path} as the {want.name.lower()}, but the file holds a "
                f"{snap.kind.name.lower()} (prologue and epilogue swapped?); restore the files or record again"
            )


def check_prologue(inst, prologue, db_path: str, attributes: Optional[dict] = None) -> None:
    """`prologue` (a read Snapshot) belongs to instance `inst`: it is a prologue, its arguments are the
    ones the DB recorded for the instance, and with the DB's geometry they hash to the instance's
    dynamic hash. Run before specialization bakes any argument into code."""
    from mneme.record.hashing import dynamic_hash

    check_snapshot_kinds(prologue, None, db_path)
    args = [bytes(a) for a in prologue.args]
    where = f"{prologue.path}: the prologue of instance {inst.dynamic_hash} in {db_path}"
    if len(args) != len(inst.args):
        raise RecordError(f"{where} holds {len(args)} kernel arguments, the DB records {len(inst.args)}; "
                          "it belongs to another kernel: restore the file or record again")
    for i, (a, rec) in enumerate(zip(args, inst.args)):
        if a.hex() != rec:
            raise RecordError(f"{where} holds argument {i} = 0x{a[::-1].hex()}, the DB records 0x{bytes.fromhex(rec)[::-1].hex()}; "
                              "it belongs to another instance: restore the file or record again")
    attrs = attributes or {}
    if "MaskedBytes" in attrs and len(inst.static_hash) == 64:
        dh = dynamic_hash(inst.static_hash, tuple(inst.grid_dim), tuple(inst.block_dim), inst.shared_mem,
                          bytes(prologue.args.raw),
                          [tuple(r) for r in attrs["MaskedBytes"]], attrs.get("Cluster"), bool(attrs.get("Cooperative")))
        if dh != inst.dynamic_hash:
            raise RecordError(f"{where}: its arguments with the DB's geometry hash to {dh}, not {inst.dynamic_hash}; "
                              "the DB's instance entry was edited or belongs to other files: record again")
