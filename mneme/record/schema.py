"""The record-DB schema: what a `<static-hash>.json` file may hold, checked with pydantic (v2, strict).

One schema, versioned. Version 2 added the SHA-256 of every file a DB owns (`ModuleSha256`, one per
`Modules` entry; `PrologueSha256`/`EpilogueSha256` per instance), so readers check the bytes before LLVM
or the snapshot reader sees them. Version 3 (written by this mneme) adds to the instance attributes
`SnapshottedMemory` (memory outside the arena, managed or app-registered host memory, that the snapshots
hold by contents and replay must place at the recorded addresses) and `Textures` (the texture and surface
objects its arguments hold, which replay recreates): a version-2 reader could do neither.
Version 2 DBs (neither) read as they are; version 1 DBs (no hashes) are read through
`migrate_v1`; their files are checked in other ways (see mneme/record/integrity.py). docs/RECORD_DB.md
describes every field.

Why pydantic: it is already installed (through MLflow), checks types strictly (no `256.7` -> 256, no
`"false"` -> True), and reports every violation with its field path, which `violations` turns into one
line each: `FILE: instances.<hash>.BlockDims.x: expected an integer, got 256.7`.
"""

from __future__ import annotations

from typing import Annotated, Any, Dict, List, Literal, Optional, Tuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SCHEMA_VERSION = 3
#: versions this mneme reads (older ones through a migration)
READABLE_VERSIONS = (1, 2, 3)

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Hash64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
HexAddress = Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{1,16}$")]
DynamicHash = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
HexBytes = Annotated[str, Field(pattern=r"^(?:[0-9a-f]{2})*$")]
RelPath = Annotated[str, Field(min_length=1)]
Count = Annotated[int, Field(ge=0)]
Dimension = Annotated[int, Field(ge=1, le=0x7FFFFFFF)]
TimeNs = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class _Open(BaseModel):
    #: fields this schema does not name are kept (and written back) unchanged
    model_config = ConfigDict(strict=True, extra="allow")


class Dim3(_Strict):
    x: Dimension
    y: Dimension
    z: Dimension


class Instance(_Open):
    """One recorded launch (a dynamic hash)."""

    Args: List[HexBytes]
    BlockDims: Dim3
    GridDims: Dim3
    Occurrences: Annotated[int, Field(ge=1)]
    SharedMem: Count
    Prologue: RelPath
    Epilogue: RelPath
    PrologueSha256: Sha256
    EpilogueSha256: Sha256
    InAppTimeNs: Optional[TimeNs] = None
    InAppTimesNs: List[TimeNs] = []


class SnapshottedRange(_Strict):
    Address: HexAddress
    Bytes: Count


class SnapshottedKind(_Strict):
    """One kind of memory outside the arena held by an instance's snapshots (all of its ranges)."""

    Ranges: Count
    Bytes: Count
    #: the ranges the recorder named (the first 32), address order
    Named: List[SnapshottedRange] = []
class TextureArg(_Strict):
    """A texture or surface object one argument holds (version 3); replay recreates it from the prologue's
    records and passes the new handle at `Offset` of the argument buffer."""

    Param: Count
    Offset: Count
    Handle: Annotated[str, Field(pattern=r"^0x[0-9a-f]{1,16}$")]
    Kind: Literal["texture", "surface"]
    Resource: Literal["array", "mipmapped", "linear", "pitch2d"]
    Format: str
    Channels: Count
    Dims: Annotated[List[Count], Field(min_length=3, max_length=3)]
    Levels: Count = 0
    Flags: Count = 0
    #: bytes of array contents in each snapshot (0 for linear and pitched memory, which blobs hold)
    Bytes: Count = 0
    #: the kernel stores to it (surface writes): its contents are verified after a replay
    Written: bool = False


class LaunchAttributes(_Open):
    Api: str = ""
    MaskedBytes: List[Annotated[List[Count], Field(min_length=2, max_length=2)]] = []  # [offset, length]
    MaskSource: str = ""
    Rank: int = 0
    StateBytes: Count = 0
    SnapshotBytes: Count = 0
    Cluster: Optional[List[Count]] = None
    Cooperative: bool = False
    #: the context's limits at the launch (mneme.config.CONTEXT_LIMITS names), set again by replay
    ContextLimits: Dict[str, Count] = {}
    SnapshottedMemory: Dict[Literal["managed", "host_registered"], SnapshottedKind] = {}
    Textures: List[TextureArg] = []


class RecordDB(_Open):
    """A record DB of the current version."""

    SchemaVersion: Literal[3]
    StaticHash: Hash64
    KernelName: Annotated[str, Field(min_length=1)]
    DemangledName: str = ""
    Modules: List[RelPath]
    ModuleSha256: List[Sha256]
    BinaryBlobs: List[Any] = []
    ArgNames: List[str]
    ArgKinds: List[str] = []
    Specializations: List[bool]
    VAddr: HexAddress
    VASize: Count
    Replayable: bool = True
    NotReplayableReason: str = ""
    Provenance: Dict[str, Any] = {}
    Complete: bool = True
    instances: Dict[DynamicHash, Instance]
    UnsupportedLaunches: Dict[str, Count] = {}
    Launches: Count = 0
    InstanceAttributes: Dict[DynamicHash, LaunchAttributes] = {}
    SourceModules: List[str] = []
    DeviceState: List[str] = []
    #: how the app's build compiled the kernel's module (mneme.cc.embedded.recorded_build; the replay baseline's
    #: code, mneme.ir.appbuild); absent for apps built before it was recorded
    BuildSettings: Dict[str, Any] = {}
    #: functions of the kernel's closure that other translation units define (relocatable device code): a
    #: separately compiled app calls them, it cannot inline them
    OtherUnitFunctions: List[str] = []
    #: parameters the kernel calls as device functions: replay gives them its module's address of the function
    #: the app's address named (mneme.replay.codemap)
    FunctionPointerParams: List[Annotated[int, Field(ge=0)]] = []

    @model_validator(mode="after")
    def _consistent(self) -> "RecordDB":
        problems = []
        n = len(self.ArgNames)
        if len(self.Specializations) != n:
            problems.append(f"Specializations: expected {n} entries (one per ArgNames entry), got {len(self.Specializations)}")
        if self.ArgKinds and len(self.ArgKinds) != n:
            problems.append(f"ArgKinds: expected {n} entries (one per ArgNames entry), got {len(self.ArgKinds)}")
        hashes = getattr(self, "ModuleSha256", None)
        if hashes is not None and len(hashes) != len(self.Modules):
            problems.append(f"ModuleSha256: expected {len(self.Modules)} entries (one per Modules entry), got {len(hashes)}")
        for dh, inst in self.instances.items():
            if len(inst.Args) != n:
                problems.append(f"instances.{dh}.Args: expected {n} entries (one per ArgNames entry), got {len(inst.Args)}")
            if inst.Prologue == inst.Epilogue:
                problems.append(f"instances.{dh}.Epilogue: expected a file other than the prologue, got {inst.Epilogue!r}")
        if problems:
            raise ValueError("\n".join(problems))
        return self


class RecordDBV2(RecordDB):
    """Version 2: as version 3 without memory outside the arena (no `SnapshottedMemory`) and without texture
    objects (a version-2 DB never marks such kernels replayable)."""

    SchemaVersion: Literal[2]


class InstanceV1(Instance):
    PrologueSha256: Optional[Sha256] = None
    EpilogueSha256: Optional[Sha256] = None


class RecordDBV1(RecordDB):
    """Version 1: as version 2 without the file hashes."""

    SchemaVersion: Literal[1]
    ModuleSha256: Optional[List[Sha256]] = None
    instances: Dict[DynamicHash, InstanceV1]


MODELS = {1: RecordDBV1, 2: RecordDBV2, 3: RecordDB}


def _path(loc: Tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _expected(err: Dict[str, Any]) -> str:
    msg = err["msg"]
    if msg.startswith("Input should be "):
        msg = "expected " + msg[len("Input should be "):]
    elif msg.startswith("String should match pattern "):
        msg = "expected a string matching " + msg[len("String should match pattern "):]
    elif msg == "Field required":
        return "required field is missing"
    elif msg.startswith("Extra inputs are not permitted"):
        return "unknown field"
    elif msg.startswith("Value error, "):
        return msg[len("Value error, "):]
    inp = repr(err.get("input"))
    return f"{msg}, got {inp if len(inp) <= 60 else inp[:57] + '...'}"


def violations(fn: str, exc: ValidationError, limit: int = 20) -> List[str]:
    """One line per violation: `FILE: field.path: what was expected, got what`."""
    lines = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not str(p).startswith("function-after[_consistent()"))
        what = _expected(err)
        for part in what.split("\n"):
            lines.append(f"{fn}: {part}" if err["type"] == "value_error" else f"{fn}: {_path(loc)}: {part}")
    if len(lines) > limit:
        lines = lines[:limit] + [f"{fn}: ... and {len(lines) - limit} more violation(s)"]
    return lines


class SchemaViolation(ValueError):
    """A DB that does not match the schema; `lines` are the violations, one per line."""

    def __init__(self, lines: List[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def migrate_v1(model: RecordDBV1) -> RecordDBV1:
    """Version 1 -> what readers of version 2 use: the same fields, file hashes unknown (None)."""
    return model


def validate(data: Any, fn: str) -> RecordDB:
    """The DB `data` (parsed JSON of file `fn`) as a model of its version; SchemaViolation otherwise.

    A version-1 DB comes back as a RecordDBV1 (hash fields None)."""
    if not isinstance(data, dict):
        raise SchemaViolation([f"{fn}: (top level): expected a JSON object (a record DB), got {type(data).__name__}"])
    version = data.get("SchemaVersion")
    if type(version) is not int or version not in MODELS:
        raise SchemaViolation([
            f"{fn}: SchemaVersion: record-DB schema version {version!r} is not supported (this mneme reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}); record the app again with this mneme"
        ])
    try:
        model = MODELS[version].model_validate(data)
    except ValidationError as e:
        raise SchemaViolation(violations(fn, e)) from None
    if version == 1:
        model = migrate_v1(model)
    return model


def json_schema() -> Dict[str, Any]:
    """The current version's JSON Schema (for docs and other tools)."""
    return RecordDB.model_json_schema()
