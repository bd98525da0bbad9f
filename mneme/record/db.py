"""The record DB: one JSON file per recorded kernel (`<static-hash>.json`).

This module is the one definition of the record-DB schema. The field names follow the seeds' record DB
(StaticHash, KernelName, DemangledName, Modules, ArgNames, Specializations, VAddr, VASize, instances
{dynamic hash: Prologue, Epilogue, GridDims, BlockDims, SharedMem, Args, Occurrences}); mneme adds a
schema version, in-app times, per-argument kinds, replayability and provenance.

Every path stored in a DB is relative to the DB's directory; a path that escapes it is refused, so a
DB can be copied or moved as a directory and never reads files it does not own.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from mneme.config import dim3
from mneme.errors import RecordError

SCHEMA_VERSION = 1
DEFAULT_VADDR = 0x153940000000


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

    @property
    def available_specializations(self) -> List[int]:
        return [i for i, v in enumerate(self.specializations) if v]

    @property
    def prologue(self):
        from mneme.record.memstate import MemState, SnapshotType

        return MemState(self.prologue_fn, self.kernel_name, SnapshotType.PROLOGUE)

    @property
    def epilogue(self):
        from mneme.record.memstate import MemState, SnapshotType

        return MemState(self.epilogue_fn, self.kernel_name, SnapshotType.EPILOGUE, prologue_fn=self.prologue_fn)

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
            for f in self.llvm_files:
                if not Path(f).exists():
                    raise RecordError(f"{self.path}: IR module {f} is missing")
            self._link_mod = link_modules(self.llvm_files, self.kernel_name, prune=prune, internalize=internalize)
        return self._link_mod

    # -- (de)serialisation ----------------------------------------------------------------------
    def _rel(self, p: str) -> str:
        """`p` (absolute, or relative to the working directory) as a path relative to the DB's directory."""
        if self.path is None:
            return p
        return relative_to_db(p, self.path)

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "SchemaVersion": SCHEMA_VERSION,
            "StaticHash": self.static_hash,
            "KernelName": self.kernel_name,
            "DemangledName": self.demangled_name,
            "Modules": [self._rel(m) for m in self.llvm_files],
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
        path = Path(fn)
        if not path.exists():
            raise RecordError(f"record DB {fn} does not exist")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RecordError(f"{fn}: not a record DB (invalid JSON: {e})") from None
        return cls.from_dict(data, str(path), check_files=check_files)

    @classmethod
    def from_dict(cls, data: Dict[str, Any], fn: str, check_files: bool = True) -> "RecordedExecution":
        path = Path(fn)
        version = data.get("SchemaVersion")
        if version != SCHEMA_VERSION:
            raise RecordError(
                f"{fn}: record-DB schema version {version!r} is not supported (this mneme reads version "
                f"{SCHEMA_VERSION}); record the app again with this mneme"
            )
        missing = [k for k in ("StaticHash", "KernelName", "instances", "VAddr", "VASize") if k not in data]
        if missing:
            raise RecordError(f"{fn}: record DB lacks the field(s) {missing}")
        base = path.parent
        modules = [str(resolve_inside(base, m, "IR module", path)) for m in data.get("Modules", [])]
        if check_files:
            for m in modules:
                if not Path(m).exists():
                    raise RecordError(f"{fn}: IR module {m} is missing")
        specs = list(data.get("Specializations", []))
        instances: Dict[str, KernelInstance] = {}
        for dhash, inst in data["instances"].items():
            pro = str(resolve_inside(base, inst["Prologue"], "prologue", path))
            epi = str(resolve_inside(base, inst["Epilogue"], "epilogue", path))
            instances[dhash] = KernelInstance(
                static_hash=data["StaticHash"],
                dynamic_hash=dhash,
                kernel_name=data["KernelName"],
                args=list(inst.get("Args", [])),
                shared_mem=int(inst.get("SharedMem", 0)),
                block_dim=dim3.from_dict(inst["BlockDims"]),
                grid_dim=dim3.from_dict(inst["GridDims"]),
                specializations=specs,
                occ=int(inst.get("Occurrences", 1)),
                prologue_fn=pro,
                epilogue_fn=epi,
                in_app_time_ns=inst.get("InAppTimeNs"),
                in_app_times_ns=list(inst.get("InAppTimesNs", [])),
                prologue_rel=inst["Prologue"],
                epilogue_rel=inst["Epilogue"],
            )
        known = {
            "SchemaVersion", "StaticHash", "KernelName", "DemangledName", "Modules", "BinaryBlobs", "ArgNames",
            "ArgKinds", "Specializations", "VAddr", "VASize", "Replayable", "NotReplayableReason", "Provenance",
            "Complete", "instances",
        }
        return cls(
            static_hash=data["StaticHash"],
            kernel_name=data["KernelName"],
            demangled_name=data.get("DemangledName", data["KernelName"]),
            llvm_files=modules,
            arg_names=list(data.get("ArgNames", [])),
            specializations=specs,
            va_addr=data["VAddr"],
            va_size=int(data["VASize"]),
            kernel_instances=instances,
            arg_kinds=list(data.get("ArgKinds", [])),
            replayable=bool(data.get("Replayable", True)),
            not_replayable_reason=data.get("NotReplayableReason", ""),
            provenance=data.get("Provenance", {}),
            complete=bool(data.get("Complete", True)),
            path=str(path),
            extra={k: v for k, v in data.items() if k not in known},
        )


def median(values: List[float]) -> Optional[float]:
    return float(statistics.median(values)) if values else None


def find_dbs(path: str) -> List[str]:
    """Record DBs under a directory (or the file itself)."""
    p = Path(path)
    if p.is_file():
        return [str(p)]
    if not p.is_dir():
        raise RecordError(f"{path}: no such record DB or directory")
    out = []
    for f in sorted(p.glob("*.json")):
        try:
            head = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            continue
        if isinstance(head, dict) and "StaticHash" in head and "instances" in head:
            out.append(str(f))
    return out
