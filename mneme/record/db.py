"""The record DB: one JSON file per recorded kernel (`<static-hash>.json`).

The schema itself (every field, its type, the version and the migration of older versions) is
mneme/record/schema.py; this module turns a validated DB into RecordedExecution / KernelInstance and back.
The field names follow the seeds' record DB (StaticHash, KernelName, DemangledName, Modules, ArgNames,
Specializations, VAddr, VASize, instances {dynamic hash: Prologue, Epilogue, GridDims, BlockDims,
SharedMem, Args, Occurrences}); mneme adds a schema version, in-app times, per-argument kinds,
replayability, provenance and the SHA-256 of every file the DB owns (checked before use, see
mneme/record/integrity.py).

Every path stored in a DB is relative to the DB's directory; a path that escapes it is refused, so a
DB can be copied or moved as a directory and never reads files it does not own.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from mneme.config import dim3
from mneme.errors import RecordError
from mneme.record import integrity
from mneme.record.schema import SCHEMA_VERSION, SchemaViolation, validate
from mneme.record.layout import DEFAULT_VADDR  # noqa: F401 - the DB's default arena base (re-exported)


def relative_to_db(p: str, db_path: str) -> str:
    """A file path (absolute, or relative to the working directory) relative to the DB file's directory.

    Both sides are resolved first, so `-rdb rec`, `./rec`, `../x/rec`, an absolute path and a symlinked
    directory all store the same `RecordedIR_<hash>.bc`, whatever the working directory."""
    root = os.path.realpath(os.path.dirname(os.path.abspath(db_path)))
    return os.path.relpath(os.path.realpath(p), root)


def _legacy_candidate(base: Path, rel: str) -> Optional[Path]:
    """Schema-1 DBs written by `mneme record -rdb REL` stored paths relative to the recording's working
    directory (`demo/rec/RecordedIR_x.bc` inside `demo/rec/`). Such a path is read as the shortest
    suffix of it that names an existing file in the DB's directory."""
    parts = Path(rel).parts
    for i in range(1, len(parts)):
        cand = base.joinpath(*parts[i:])
        if cand.exists():
            return cand
    return None


def resolve_inside(base: Path, rel: str, what: str, db_path: Path) -> Path:
    """Resolve `rel` against the DB directory and refuse anything outside it."""
    if os.path.isabs(rel):
        raise RecordError(f"{db_path}: {what} path {rel!r} is absolute; record DBs store paths relative to their directory")
    p = (base / rel).resolve()
    root = base.resolve()
    if not p.exists() and ".." not in Path(rel).parts:
        legacy = _legacy_candidate(base, rel)
        if legacy is not None:
            p = legacy.resolve()
    if p != root and root not in p.parents:
        raise RecordError(f"{db_path}: {what} path {rel!r} points outside the DB's directory {root}; refusing to read it")
    return p


@dataclass
class KernelInstance:
    """One distinct launch of a kernel (a dynamic hash): geometry, arguments and its two snapshots."""

    static_hash: str
    dynamic_hash: str
    kernel_name: str
    args: List[Any]
    shared_mem: int
    block_dim: dim3
    grid_dim: dim3
    specializations: List[bool]
    occ: int
    prologue_fn: str
    epilogue_fn: str
    in_app_time_ns: Optional[float] = None
    in_app_times_ns: List[float] = field(default_factory=list)
    #: paths as stored in the DB (relative); prologue_fn/epilogue_fn are the resolved ones
    prologue_rel: str = ""
    epilogue_rel: str = ""
    #: SHA-256 of the snapshot files as recorded (None: unknown, a schema-1 DB or not yet written)
    prologue_sha256: Optional[str] = None
    epilogue_sha256: Optional[str] = None
    #: the DB file this instance belongs to (for messages)
    db_path: str = ""

    def checked_prologue(self) -> str:
        """The prologue's path, after its bytes were checked against the recorded SHA-256."""
        return integrity.check_file(self.prologue_fn, self.prologue_sha256, self.db_path, "prologue")

    def checked_epilogue(self) -> str:
        """The epilogue's path, after its bytes were checked against the recorded SHA-256."""
        return integrity.check_file(self.epilogue_fn, self.epilogue_sha256, self.db_path, "epilogue")

    @property
    def available_specializations(self) -> List[int]:
        return [i for i, v in enumerate(self.specializations) if v]

    @property
    def prologue(self):
        from mneme.record.memstate import MemState, SnapshotType

        return MemState(self.checked_prologue(), self.kernel_name, SnapshotType.PROLOGUE)

    @property
    def epilogue(self):
        from mneme.record.memstate import MemState, SnapshotType

        return MemState(self.checked_epilogue(), self.kernel_name, SnapshotType.EPILOGUE,
                        prologue_fn=self.checked_prologue())

    def __hash__(self) -> int:
        return hash(self.dynamic_hash + self.static_hash)

    def __str__(self) -> str:
        return f"Grid:{self.grid_dim}, BlockDim: {self.block_dim}, Shared Memory {self.shared_mem}"

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "Args": self.args,
            "BlockDims": self.block_dim.to_dict(),
            "GridDims": self.grid_dim.to_dict(),
            "Occurrences": self.occ,
            "SharedMem": self.shared_mem,
            "Prologue": self.prologue_rel or self.prologue_fn,
            "Epilogue": self.epilogue_rel or self.epilogue_fn,
        }
        if self.in_app_time_ns is not None:
            d["InAppTimeNs"] = self.in_app_time_ns
        if self.in_app_times_ns:
            d["InAppTimesNs"] = list(self.in_app_times_ns)
        return d


class RecordedExecution:
    """A recorded kernel and its instances; a mapping of dynamic hash -> KernelInstance."""

    KernelInstance = KernelInstance

    def __init__(
        self,
        static_hash: str,
        kernel_name: str,
        demangled_name: str,
        llvm_files: List[str],
        arg_names: List[str],
        specializations: List[bool],
        va_addr: str,
        va_size: int,
        kernel_instances: Dict[str, KernelInstance],
        *,
        arg_kinds: Optional[List[str]] = None,
        replayable: bool = True,
        not_replayable_reason: str = "",
        provenance: Optional[Dict[str, Any]] = None,
        complete: bool = True,
        path: Optional[str] = None,
        extra: Optional[Dict[str, Any]] = None,
        module_sha256: Optional[List[Optional[str]]] = None,
        schema_version: int = SCHEMA_VERSION,
    ):
        self.static_hash = static_hash
        self.kernel_name = kernel_name
        self.demangled_name = demangled_name
        self.llvm_files = list(llvm_files)
        self.arg_names = list(arg_names)
        self.arg_kinds = list(arg_kinds or [])
        self.specializations = list(specializations)
        self.va_addr = va_addr
        self.va_size = int(va_size)
        self.kernel_instances = dict(kernel_instances)
        self.replayable = replayable
        self.not_replayable_reason = not_replayable_reason
        self.provenance = dict(provenance or {})
        self.complete = complete
        self.path = path
        self.extra = dict(extra or {})
        #: SHA-256 per llvm_files entry as recorded (None: unknown)
        self.module_sha256: List[Optional[str]] = list(module_sha256 or [None] * len(self.llvm_files))
        #: the version the DB was read as (SCHEMA_VERSION for new ones; writing always writes SCHEMA_VERSION)
        self.schema_version = schema_version
        self._link_mod = None

    # -- mapping over instances -------------------------------------------------------------
    def __getitem__(self, key: str) -> KernelInstance:
        try:
            return self.kernel_instances[key]
        except KeyError:
            raise RecordError(
                f"{self.path or self.kernel_name}: no instance {key!r}; recorded instances: "
                f"{sorted(self.kernel_instances)}"
            ) from None

    def __setitem__(self, key: str, value: KernelInstance) -> None:
        self.kernel_instances[key] = value

    def __delitem__(self, key: str) -> None:
        del self.kernel_instances[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.kernel_instances)

    def __len__(self) -> int:
        return len(self.kernel_instances)

    def __contains__(self, key: object) -> bool:
        return key in self.kernel_instances

    def items(self):
        return self.kernel_instances.items()

    def keys(self):
        return self.kernel_instances.keys()

    def values(self):
        return self.kernel_instances.values()

    def __str__(self) -> str:
        return f"KernelName: {self.kernel_name} NumArgs: {len(self.arg_names)}, VASize: {self.va_size}, VAddr: {self.va_addr}"

    def instance(self, record_id: Optional[str] = None) -> KernelInstance:
        """The instance named by `record_id`, or the only one when the DB holds exactly one."""
        if record_id:
            return self[record_id]
        if len(self.kernel_instances) == 1:
            return next(iter(self.kernel_instances.values()))
        raise RecordError(
            f"{self.path}: holds {len(self.kernel_instances)} instances; choose one with -rid "
            f"({', '.join(sorted(self.kernel_instances))})"
        )

    @property
    def vaddr(self) -> int:
        return int(self.va_addr, 16) if isinstance(self.va_addr, str) else int(self.va_addr)

    @property
    def total_in_app_time_ns(self) -> float:
        return sum((i.in_app_time_ns or 0.0) * i.occ for i in self.values())

    # -- IR -------------------------------------------------------------------------------------
    def link_llvm_modules(self, prune: bool = True, internalize: bool = True):
        """The kernel's linked IR (cached); clone it before changing it."""
        if self._link_mod is None:
            from mneme.ir import link_modules

            if not self.llvm_files:
                raise RecordError(
                    f"{self.path}: kernel {self.demangled_name or self.kernel_name} has no recorded IR; "
                    "rebuild the app with `mneme cc` and record it again"
                )
            files = self.checked_modules()
            self._link_mod = link_modules(files, self.kernel_name, prune=prune, internalize=internalize)
        return self._link_mod

    def checked_modules(self) -> List[str]:
        """The IR module paths, each checked before LLVM may parse it: against its recorded SHA-256, or
        (schema 1, no hash) parsed once in a separate process, where an LLVM abort cannot take this one."""
        hashes = self.module_sha256 + [None] * (len(self.llvm_files) - len(self.module_sha256))
        for f, h in zip(self.llvm_files, hashes):
            integrity.check_file(f, h, str(self.path), "IR module")
            if h is None:
                integrity.check_bitcode_contained(f, str(self.path))
        return list(self.llvm_files)

    # -- (de)serialisation ----------------------------------------------------------------------
    def _rel(self, p: str) -> str:
        """`p` (absolute, or relative to the working directory) as a path relative to the DB's directory."""
        if self.path is None:
            return p
        return relative_to_db(p, self.path)

    def fill_sha256(self) -> None:
        """Hash the files whose SHA-256 is not known yet (new files, or a schema-1 DB about to be written)."""
        hashes = self.module_sha256 + [None] * (len(self.llvm_files) - len(self.module_sha256))
        self.module_sha256 = [h or integrity.file_sha256(m, str(self.path)) for m, h in zip(self.llvm_files, hashes)]
        for inst in self.values():
            inst.prologue_sha256 = inst.prologue_sha256 or integrity.file_sha256(inst.prologue_fn, str(self.path))
            inst.epilogue_sha256 = inst.epilogue_sha256 or integrity.file_sha256(inst.epilogue_fn, str(self.path))

    def to_dict(self) -> Dict[str, Any]:
        self.fill_sha256()
        d: Dict[str, Any] = {
            "SchemaVersion": SCHEMA_VERSION,
            "StaticHash": self.static_hash,
            "KernelName": self.kernel_name,
            "DemangledName": self.demangled_name,
            "Modules": [self._rel(m) for m in self.llvm_files],
            "ModuleSha256": list(self.module_sha256),
            "BinaryBlobs": [],
            "ArgNames": self.arg_names,
            "ArgKinds": self.arg_kinds,
            "Specializations": self.specializations,
            "VAddr": self.va_addr,
            "VASize": self.va_size,
            "Replayable": self.replayable,
            "NotReplayableReason": self.not_replayable_reason,
            "Provenance": self.provenance,
            "Complete": self.complete,
            "instances": {},
        }
        d.update(self.extra)
        for k, inst in self.items():
            idict = inst.to_dict()
            idict["Prologue"] = self._rel(inst.prologue_fn)
            idict["Epilogue"] = self._rel(inst.epilogue_fn)
            idict["PrologueSha256"] = inst.prologue_sha256
            idict["EpilogueSha256"] = inst.epilogue_sha256
            d["instances"][k] = idict
        return d

    def to_json(self, fn: Optional[str] = None) -> str:
        fn = fn or self.path
        if fn is None:
            raise RecordError("to_json needs a file name")
        if self.path is None:
            self.path = str(fn)
        data = self.to_dict()
        json.dumps(data)  # fail here, not half-way through the file, on values JSON cannot hold
        tmp = f"{fn}.tmp{os.getpid()}"
        with open(tmp, "w") as fd:
            json.dump(data, fd, indent=2)
            fd.write("\n")
        os.replace(tmp, fn)
        return str(fn)

    @classmethod
    def from_json(cls, fn: str, check_files: bool = True) -> "RecordedExecution":
        return cls.from_dict(read_json(fn), str(fn), check_files=check_files)

    @classmethod
    def from_dict(cls, data: Any, fn: str, check_files: bool = True) -> "RecordedExecution":
        """A DB from its parsed JSON: validated against the schema first (mneme/record/schema.py), so
        every violation is refused with its file and field path before anything uses a value."""
        path = Path(fn)
        try:
            m = validate(data, fn)
        except SchemaViolation as e:
            raise RecordError(str(e)) from None
        base = path.parent
        modules = [str(resolve_inside(base, rel, "IR module", path)) for rel in m.Modules]
        if check_files:
            for rel, f in zip(m.Modules, modules):
                if not Path(f).is_file():
                    raise RecordError(f"{fn}: IR module {rel} ({f}) is missing or not a file")
        specs = list(m.Specializations)
        instances: Dict[str, KernelInstance] = {}
        for dhash, inst in m.instances.items():
            pro = str(resolve_inside(base, inst.Prologue, "prologue", path))
            epi = str(resolve_inside(base, inst.Epilogue, "epilogue", path))
            instances[dhash] = KernelInstance(
                static_hash=m.StaticHash,
                dynamic_hash=dhash,
                kernel_name=m.KernelName,
                args=list(inst.Args),
                shared_mem=inst.SharedMem,
                block_dim=dim3(inst.BlockDims.x, inst.BlockDims.y, inst.BlockDims.z),
                grid_dim=dim3(inst.GridDims.x, inst.GridDims.y, inst.GridDims.z),
                specializations=specs,
                occ=inst.Occurrences,
                prologue_fn=pro,
                epilogue_fn=epi,
                in_app_time_ns=inst.InAppTimeNs,
                in_app_times_ns=list(inst.InAppTimesNs),
                prologue_rel=inst.Prologue,
                epilogue_rel=inst.Epilogue,
                prologue_sha256=inst.PrologueSha256,
                epilogue_sha256=inst.EpilogueSha256,
                db_path=str(path),
            )
        known = {"SchemaVersion", "StaticHash", "KernelName", "DemangledName", "Modules", "ModuleSha256", "BinaryBlobs",
                 "ArgNames", "ArgKinds", "Specializations", "VAddr", "VASize", "Replayable", "NotReplayableReason",
                 "Provenance", "Complete", "instances"}
        # the other fields (instance attributes, counts, fields of later mneme) are kept as they were read
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(
            static_hash=m.StaticHash,
            kernel_name=m.KernelName,
            demangled_name=m.DemangledName or m.KernelName,
            llvm_files=modules,
            arg_names=list(m.ArgNames),
            specializations=specs,
            va_addr=m.VAddr,
            va_size=m.VASize,
            kernel_instances=instances,
            arg_kinds=list(m.ArgKinds),
            replayable=m.Replayable,
            not_replayable_reason=m.NotReplayableReason,
            provenance=dict(m.Provenance),
            complete=m.Complete,
            path=str(path),
            extra=extra,
            module_sha256=list(m.ModuleSha256) if m.ModuleSha256 is not None else None,
            schema_version=m.SchemaVersion,
        )


def read_json(fn: str) -> Any:
    """The parsed JSON of a DB file; RecordError (one line, naming the file) for anything that is not one."""
    path = Path(fn)
    if path.is_dir():
        inside = [Path(f).name for f in find_dbs(str(path))] if os.access(path, os.R_OK) else []
        hint = f"; it holds {', '.join(inside[:5])}" if inside else ""
        raise RecordError(f"{fn} is a directory, not a record DB file: pass one of its <static-hash>.json files{hint}")
    if not path.exists():
        raise RecordError(f"record DB {fn} does not exist")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise RecordError(f"{fn}: cannot read the record DB ({e.strerror or e})") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise RecordError(f"{fn}: not a record DB (not UTF-8 text: byte {e.start} is {raw[e.start]:#04x})") from None
    except json.JSONDecodeError as e:
        raise RecordError(f"{fn}: not a record DB (invalid JSON at line {e.lineno} column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise RecordError(f"{fn}: not a record DB (JSON nested too deeply)") from None


def median(values: List[float]) -> Optional[float]:
    return float(statistics.median(values)) if values else None


_DB_NAME = re.compile(r"^[0-9a-f]{64}\.json$")


def find_dbs(path: str, unreadable: Optional[List[str]] = None) -> List[str]:
    """Record DBs under a directory (or the file itself).

    A `*.json` file there that is not a DB is skipped; when it looks like one (named `<static-hash>.json`,
    or a JSON object with a StaticHash) but cannot be read, a one-line reason is appended to `unreadable`."""
    p = Path(path)
    if p.is_file():
        return [str(p)]
    if not p.is_dir():
        raise RecordError(f"{path}: no such record DB or directory")
    out = []
    try:
        files = sorted(p.glob("*.json"))
    except OSError as e:
        raise RecordError(f"{path}: cannot list the directory ({e.strerror or e})") from None
    for f in files:
        try:
            head = read_json(str(f))
        except RecordError as e:
            if unreadable is not None and _DB_NAME.match(f.name):
                unreadable.append(str(e))
            continue
        if isinstance(head, dict) and "StaticHash" in head and "instances" in head:
            out.append(str(f))
        elif unreadable is not None and (_DB_NAME.match(f.name) or (isinstance(head, dict) and "StaticHash" in head)):
            unreadable.append(f"{f}: not a record DB (expected a JSON object with StaticHash and instances)")
    return out
