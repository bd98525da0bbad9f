"""Snapshot files (prologue/epilogue device state) through the one C implementation, native/snapshot.c.

The format, its checks and the comparison semantics are defined once, in C (native/snapshot.h says
what every field and every comparison rule means); this module is a thin cffi face over it so that
Python, the recorder and the replay core can never disagree about a byte.

Lifetime: a `Snapshot` owns a native handle. Blob and variable contents are read-only memoryviews
into it (no copies, even for gigabytes). `close()` (or leaving the `with` block) releases the handle
at once when no view is alive; a view that outlives `close()` keeps the memory valid until the view
itself is dropped, so no access can ever read freed memory.
"""

from __future__ import annotations

import enum
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from mneme.errors import ConfigurationError, MnemeError, SnapshotError

PathLike = Union[str, "os.PathLike[str]"]

_NATIVE: Any = None


def _native():
    """(ffi, lib) of mneme._native, imported on first use so that `import mneme` never needs it."""
    global _NATIVE
    if _NATIVE is None:
        try:
            from mneme import _native as mod
        except ImportError as e:
            raise MnemeError(
                f"the native module mneme._native is missing or stale ({e}); build it with "
                "`python native/build_native.py` (part of `make setup`)"
            ) from e
        _NATIVE = (mod.ffi, mod.lib)
    return _NATIVE


def _error(prefix: str = "") -> str:
    ffi, lib = _native()
    return prefix + ffi.string(lib.mn_last_error()).decode("utf-8", "replace")


class SnapshotType(enum.IntEnum):
    """What a snapshot holds: the state before (PROLOGUE) or after (EPILOGUE) the kernel ran."""

    PROLOGUE = 1
    EPILOGUE = 2


class Space(enum.IntEnum):
    DEVICE = 0
    HOST_PINNED = 1
    MANAGED = 2


class Encoding(enum.IntEnum):
    BYTES = 0
    DIFF = 1


#: Epilogue formats of `Writer.blob_epilogue` and `mneme record --epilogue-format`.
EPILOGUE_FORMATS = {"diff": 0, "bytes": 1, "best": 2}
#: Element types for tolerant comparison ("bytes" means byte-exact).
ELEMS = {
    "bytes": 0, "f32": 1, "f64": 2, "f16": 3, "bf16": 4,
    "i8": 5, "i16": 6, "i32": 7, "i64": 8, "u8": 9, "u16": 10, "u32": 11, "u64": 12,
}
MODES = {"abs": 0, "rel": 1}
NORMS = {"element": 0, "l1": 1, "l2": 2, "linf": 3}
_ELEM_NAMES = {v: k for k, v in ELEMS.items()}
_MODE_NAMES = {v: k for k, v in MODES.items()}
_NORM_NAMES = {v: k for k, v in NORMS.items()}
#: Default gap below which two changed ranges merge (a range costs 16 bytes of table).
MERGE_GAP = 16


def _code(table: Dict[str, int], value: Union[str, int], what: str) -> int:
    if isinstance(value, int) and value in table.values():
        return int(value)
    if isinstance(value, str) and value.lower() in table:
        return table[value.lower()]
    raise ConfigurationError(f"unknown {what} {value!r}; valid: {', '.join(table)}")


def elem_code(elem: Union[str, int]) -> int:
    return _code(ELEMS, elem, "element type")


def elem_size(elem: Union[str, int]) -> int:
    return int(_native()[1].mn_elem_size(elem_code(elem)))


def _bytes_arg(data: Any) -> Tuple[Any, int]:
    """A zero-copy C view of any contiguous buffer, and its length in bytes."""
    ffi, _ = _native()
    if data is None:
        return ffi.NULL, 0
    n = memoryview(data).nbytes
    return (ffi.from_buffer("uint8_t[]", data) if n else ffi.NULL), n


def _name(raw: bytes) -> str:
    """Symbol names are bytes in the file; surrogateescape round-trips any of them through str."""
    return raw.decode("utf-8", "surrogateescape")


def _cname(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


class _Handle:
    """Owns one mn_snapshot*; frees it when closed and no exported view is alive, or when collected."""

    def __init__(self, ptr: Any) -> None:
        self.ptr = ptr
        self.views = 0
        self.closing = False
        self._free = weakref.finalize(self, _native()[1].mn_snapshot_free, ptr)

    def view(self, cptr: Any, size: int) -> memoryview:
        if not size:
            return memoryview(b"")
        ffi, _ = _native()
        # The keeper's destructor is a bound method of this handle: the memoryview -> buffer -> keeper
        # chain keeps the handle (and so the native memory) alive exactly as long as the view.
        keeper = ffi.gc(ffi.cast("uint8_t *", cptr), self._view_dropped)
        self.views += 1
        return memoryview(ffi.buffer(keeper, size)).toreadonly()

    def _view_dropped(self, _cdata: Any) -> None:
        self.views -= 1
        if self.closing and not self.views:
            self._free()

    def release(self) -> None:
        self.closing = True
        if not self.views:
            self._free()


@dataclass(frozen=True)
class Blob:
    """A live allocation: `contents` holds all `size` bytes (BYTES) or the changed ranges' bytes (DIFF)."""

    addr: int
    size: int
    space: Space
    encoding: Encoding
    checksum: int
    contents: memoryview = field(repr=False)
    range_table: memoryview = field(repr=False)  # DIFF: nranges x {u64 offset, u64 length}

    @property
    def ranges(self) -> List[Tuple[int, int]]:
        """(offset, length) of each changed range of a DIFF blob, sorted; [] for BYTES."""
        words = self.range_table.cast("Q")
        return [(words[i], words[i + 1]) for i in range(0, len(words), 2)]

    def pieces(self) -> Iterator[Tuple[int, memoryview]]:
        """(offset, bytes) of what this blob stores: the whole blob, or each changed range."""
        if self.encoding == Encoding.BYTES:
            yield 0, self.contents
            return
        pos = 0
        for off, length in self.ranges:
            yield off, self.contents[pos:pos + length]
            pos += length


@dataclass(frozen=True)
class Reloc:
    """The 8 bytes at `offset` of a variable hold address(target) + target_offset (target None: a blob)."""

    offset: int
    target: Optional[str]
    target_offset: int


@dataclass(frozen=True)
class Variable:
    name: str
    addr: int
    size: int
    is_const: bool
    relocs: Tuple[Reloc, ...]
    contents: memoryview = field(repr=False)


@dataclass(frozen=True)
class Annotation:
    """A tolerance the app attached to a device buffer (mneme/tolerance.h)."""

    addr: int
    size: int
    elem: str
    mode: str
    norm: str
    tol: float
    tag: str = ""


#: CUarray_format values of the formats snapshots store, by the name `mneme show` uses
ARRAY_FORMATS = {0x01: "u8", 0x02: "u16", 0x03: "u32", 0x08: "i8", 0x09: "i16", 0x0A: "i32", 0x10: "f16", 0x20: "f32"}
RESOURCE_TYPES = ("array", "mipmapped", "linear", "pitch2d")


@dataclass(frozen=True)
class Array:
    """A CUDA array's recorded contents (mn_array): every level, level 0 first, rows packed."""

    handle: int
    width: int
    height: int
    depth: int
    format: int
    channels: int
    flags: int
    levels: int
    contents: memoryview = field(repr=False)

    @property
    def elem(self) -> str:
        """The channel type as an element type of `compare` ("f32", "u8", ...)."""
        return ARRAY_FORMATS.get(self.format, "bytes")


@dataclass(frozen=True)
class TexObj:
    """A texture or surface object (mn_texobj); `fields` holds every field of the C struct by name."""

    handle: int
    surface: bool
    resource: str
    fields: Dict[str, Any] = field(repr=False)


_TEXOBJ_FIELDS = ("handle", "array", "dev_ptr", "size_bytes", "width", "height", "pitch", "format", "channels", "kind",
                  "res_type", "filter_mode", "tex_flags", "max_anisotropy", "mipmap_filter_mode", "mipmap_level_bias",
                  "min_mipmap_level_clamp", "max_mipmap_level_clamp", "has_view", "view_format", "first_mip",
                  "last_mip", "first_layer", "last_layer", "view_width", "view_height", "view_depth")


def _texobj(t: Any) -> TexObj:
    f: Dict[str, Any] = {name: getattr(t, name) for name in _TEXOBJ_FIELDS}
    f["address_mode"] = [int(t.address_mode[i]) for i in range(3)]
    f["border_color"] = [float(t.border_color[i]) for i in range(4)]
    return TexObj(int(t.handle), t.kind == 1, RESOURCE_TYPES[t.res_type], f)


class Args(Sequence[bytes]):
    """The kernel's parameter buffer: `raw` with each parameter's `offsets` and `sizes`; args[i] is bytes."""

    def __init__(self, raw: memoryview, offsets: Tuple[int, ...], sizes: Tuple[int, ...]) -> None:
        self.raw = raw
        self.offsets = offsets
        self.sizes = sizes

    @property
    def count(self) -> int:
        return len(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return bytes(self.raw[self.offsets[i]:self.offsets[i] + self.sizes[i]])

    def __repr__(self) -> str:
        return f"Args(count={self.count}, total={self.raw.nbytes})"


def pack_args(params: Sequence[Any]) -> Tuple[bytes, List[int], List[int]]:
    """Lays parameters out as a C compiler would for scalars and pointers: each at a multiple of its
    natural alignment (its size's largest power-of-two factor, at most 8). Returns (raw, offsets, sizes)."""
    raw = bytearray()
    offsets, sizes = [], []
    for p in params:
        b = bytes(p)
        align = min(8, len(b) & -len(b)) if b else 1
        raw += bytes(-len(raw) % align)
        offsets.append(len(raw))
        sizes.append(len(b))
        raw += b
    return bytes(raw), offsets, sizes


class Snapshot:
    """One snapshot file, read and validated by the C reader (see `Snapshot.read`)."""

    def __init__(self, handle: _Handle, path: str) -> None:
        self._handle: Optional[_Handle] = handle
        self.path = path
        self._cache: Dict[str, Any] = {}

    @classmethod
    def read(cls, path: PathLike) -> "Snapshot":
        """Reads and checks the whole file (version, every checksum, every size); SnapshotError names
        the file and the byte offset at fault."""
        ffi, lib = _native()
        ptr = lib.mn_snapshot_read(os.fsencode(path))
        if ptr == ffi.NULL:
            raise SnapshotError(_error())
        return cls(_Handle(ptr), os.fspath(path))

    # -- lifetime
    def close(self) -> None:
        if self._handle is not None:
            self._cache.clear()
            handle, self._handle = self._handle, None
            handle.release()

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _snap(self) -> Any:
        if self._handle is None:
            raise SnapshotError(f"{self.path}: the snapshot was closed; read it again")
        return self._handle.ptr

    # -- header
    @property
    def kind(self) -> SnapshotType:
        return SnapshotType(self._snap().kind)

    @property
    def version(self) -> int:
        return int(self._snap().version)

    @property
    def created_ns(self) -> int:
        return int(self._snap().created_ns)

    # -- records
    @property
    def blobs(self) -> List[Blob]:
        """Sorted by address."""
        if "blobs" not in self._cache:
            s, h = self._snap(), self._handle
            out = []
            for i in range(s.nblobs):
                b = s.blobs[i]
                table = h.view(b.ranges, 16 * b.nranges)
                stored = b.size if b.encoding == Encoding.BYTES else sum(table.cast("Q")[1::2])
                out.append(Blob(int(b.addr), int(b.size), Space(b.space), Encoding(b.encoding), int(b.checksum),
                                h.view(b.data, stored), table))
            self._cache["blobs"] = out
        return self._cache["blobs"]

    @property
    def variables(self) -> List[Variable]:
        if "variables" not in self._cache:
            ffi, _ = _native()
            s, h = self._snap(), self._handle
            out = []
            for i in range(s.nvars):
                v = s.vars[i]
                relocs = tuple(
                    Reloc(int(r.offset), _name(ffi.string(r.target)) if r.target != ffi.NULL else None,
                          int(r.target_offset))
                    for r in (v.relocs[j] for j in range(v.nrelocs)))
                out.append(Variable(_name(ffi.string(v.name)), int(v.addr), int(v.size), bool(v.is_const), relocs,
                                    h.view(v.data, v.size)))
            self._cache["variables"] = out
        return self._cache["variables"]

    @property
    def args(self) -> Args:
        """The kernel's parameters (empty when the file has none)."""
        if "args" not in self._cache:
            s, h = self._snap(), self._handle
            a = s.args
            self._cache["args"] = Args(h.view(a.bytes, a.total), tuple(a.offsets[i] for i in range(a.count)),
                                       tuple(a.sizes[i] for i in range(a.count)))
        return self._cache["args"]

    @property
    def arrays(self) -> List[Array]:
        """CUDA arrays behind the texture and surface objects (file order)."""
        if "arrays" not in self._cache:
            snap, h = self._snap(), self._handle
            self._cache["arrays"] = [
                Array(int(a.handle), int(a.width), int(a.height), int(a.depth), int(a.format), int(a.channels),
                      int(a.flags), int(a.levels), h.view(a.data, a.size))
                for a in (snap.arrays[i] for i in range(snap.narrays))]
        return self._cache["arrays"]

    @property
    def texobjs(self) -> List[TexObj]:
        """Texture and surface objects the kernel's arguments named (prologues)."""
        if "texobjs" not in self._cache:
            snap = self._snap()
            self._cache["texobjs"] = [_texobj(snap.texobjs[i]) for i in range(snap.ntexobjs)]
        return self._cache["texobjs"]

    def find_array(self, handle: int) -> Optional[Array]:
        return next((a for a in self.arrays if a.handle == handle), None)

    @property
    def has_args(self) -> bool:
        return bool(self._snap().has_args)

    @property
    def annotations(self) -> List[Annotation]:
        if "annotations" not in self._cache:
            ffi, _ = _native()
            s = self._snap()
            self._cache["annotations"] = [
                Annotation(int(a.addr), int(a.size), _ELEM_NAMES[a.elem], _MODE_NAMES[a.mode], _NORM_NAMES[a.norm],
                           float(a.tol), ffi.string(a.tag).decode("utf-8", "replace"))
                for a in (s.annots[i] for i in range(s.nannots))]
        return self._cache["annotations"]

    def find_blob(self, addr: int) -> Optional[Blob]:
        """The blob that contains `addr`, or None."""
        ffi, lib = _native()
        s = self._snap()
        b = lib.mn_snapshot_find_blob(s, addr)
        return None if b == ffi.NULL else self.blobs[b - s.blobs]

    def find_variable(self, name: str) -> Optional[Variable]:
        return next((v for v in self.variables if v.name == name), None)

    @property
    def is_full(self) -> bool:
        """True when every blob holds its full contents (a prologue, or an epilogue after `apply`)."""
        s = self._snap()
        return all(s.blobs[i].encoding == Encoding.BYTES for i in range(s.nblobs))

    def apply(self, prologue: "Snapshot") -> "Snapshot":
        """Rebuilds this epilogue's full state from `prologue` (see mn_snapshot_apply); returns self.
        Views taken before stay valid; re-read `blobs` for the rebuilt contents."""
        _, lib = _native()
        if lib.mn_snapshot_apply(prologue._snap(), self._snap()) != 0:
            raise SnapshotError(_error())
        self._cache.clear()
        return self

    def __repr__(self) -> str:
        if self.closed:
            return f"Snapshot({self.path!r}, closed)"
        s = self._snap()
        return (f"Snapshot({self.path!r}, {self.kind.name.lower()}, {s.nblobs} blobs, {s.nvars} variables, "
                f"{s.args.count} args, {s.nannots} annotations)")


class Writer:
    """Streams one snapshot file through the C writer; the file is complete only after `close()`.
    Leaving a `with` block by an exception aborts (the file then reads as truncated)."""

    def __init__(self, path: PathLike, kind: Union[SnapshotType, int]) -> None:
        ffi, lib = _native()
        self.path = os.fspath(path)
        self.kind = SnapshotType(kind)
        ptr = lib.mn_writer_open(os.fsencode(path), int(self.kind))
        if ptr == ffi.NULL:
            raise SnapshotError(_error())
        self._ptr = ptr
        self._abort = weakref.finalize(self, lib.mn_writer_abort, ptr)

    def _w(self) -> Any:
        if self._ptr is None:
            raise SnapshotError(f"{self.path}: the snapshot writer is closed")
        return self._ptr

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise SnapshotError(_error())

    def blob(self, addr: int, data: Any, space: Union[Space, int] = Space.DEVICE) -> None:
        ptr, n = _bytes_arg(data)
        self._check(_native()[1].mn_writer_blob(self._w(), addr, n, int(space), ptr))

    def blob_epilogue(self, addr: int, after: Any, before: Any = None, space: Union[Space, int] = Space.DEVICE,
                      format: Union[str, int] = "diff", merge_gap: int = MERGE_GAP,
                      before_checksum: Optional[int] = None) -> None:
        """The blob after the kernel ran, stored per `format` against `before` (its prologue bytes).
        `before_checksum` (the prologue's checksum of `before`, `last_checksum`) spares hashing a
        blob that did not change."""
        a, n = _bytes_arg(after)
        b, nb = _bytes_arg(before)
        if before is not None and nb != n:
            raise ValueError(f"blob 0x{addr:x}: before is {nb} bytes, after {n}")
        fmt = _code(EPILOGUE_FORMATS, format, "epilogue format")
        lib = _native()[1]
        if before_checksum is None:
            self._check(lib.mn_writer_blob_epilogue(self._w(), addr, n, int(space), b, a, fmt, merge_gap))
        else:
            self._check(lib.mn_writer_blob_epilogue_sum(self._w(), addr, n, int(space), b, before_checksum, a, fmt,
                                                        merge_gap))

    @property
    def last_checksum(self) -> int:
        """The content checksum of the blob the last blob/blob_epilogue call wrote."""
        return int(_native()[1].mn_writer_last_checksum(self._w()))

    def variable(self, name: str, addr: int, data: Any, is_const: bool = False,
                 relocs: Iterable[Union[Reloc, Tuple[int, Optional[str], int]]] = ()) -> None:
        ffi, lib = _native()
        rel = [r if isinstance(r, Reloc) else Reloc(*r) for r in relocs]
        keep = [ffi.new("char[]", _cname(r.target)) if r.target is not None else ffi.NULL for r in rel]
        arr = ffi.new("mn_reloc[]", max(1, len(rel)))
        for i, r in enumerate(rel):
            arr[i].offset, arr[i].target, arr[i].target_offset = r.offset, keep[i], r.target_offset
        ptr, n = _bytes_arg(data)
        self._check(lib.mn_writer_var(self._w(), _cname(name), addr, n, int(bool(is_const)), ptr, len(rel), arr))

    def args(self, params: Optional[Sequence[Any]] = None, *, raw: Any = None,
             offsets: Sequence[int] = (), sizes: Sequence[int] = ()) -> None:
        """Either `params` (one bytes-like per parameter, laid out by `pack_args`) or the recorded
        `raw` buffer with each parameter's `offsets` and `sizes`."""
        ffi, lib = _native()
        if params is not None:
            raw, offsets, sizes = pack_args(params)
        if len(offsets) != len(sizes):
            raise ValueError(f"{len(offsets)} offsets but {len(sizes)} sizes")
        ptr, n = _bytes_arg(raw if raw is not None else b"")
        offs = ffi.new("uint32_t[]", list(offsets) or [0])
        szs = ffi.new("uint32_t[]", list(sizes) or [0])
        self._check(lib.mn_writer_args(self._w(), len(offsets), offs, szs, n, ptr))

    def annotation(self, addr: int, size: int, elem: Union[str, int] = "f32", mode: Union[str, int] = "abs",
                   norm: Union[str, int] = "element", tol: float = 0.0, tag: str = "") -> None:
        ffi, lib = _native()
        a = ffi.new("mn_annot *")
        a.addr, a.size, a.tol = addr, size, tol
        a.elem, a.mode, a.norm = elem_code(elem), _code(MODES, mode, "tolerance mode"), _code(NORMS, norm, "norm")
        t = tag.encode()[:31]
        ffi.memmove(a.tag, t, len(t))
        self._check(lib.mn_writer_annot(self._w(), a))

    def array(self, handle: int, data: Any, width: int, height: int = 0, depth: int = 0, format: int = 0x20,
              channels: int = 1, flags: int = 0, levels: int = 0) -> None:
        """A CUDA array's contents (`data`: mn_array_bytes bytes, every level, rows packed)."""
        ffi, lib = _native()
        a = ffi.new("mn_array *")
        a.handle, a.width, a.height, a.depth = handle, width, height, depth
        a.format, a.channels, a.flags, a.levels = format, channels, flags, levels
        ptr, n = _bytes_arg(data)
        a.size, a.data = n, ptr
        self._check(lib.mn_writer_array(self._w(), a))

    def texobj(self, handle: int, surface: bool = False, resource: str = "array", **fields: Any) -> None:
        """A texture or surface object; `fields` are mn_texobj's (array=..., dev_ptr=..., filter_mode=...)."""
        ffi, lib = _native()
        t = ffi.new("mn_texobj *")
        t.handle, t.kind, t.res_type = handle, int(bool(surface)), RESOURCE_TYPES.index(resource)
        for name, value in fields.items():
            if name in ("address_mode", "border_color"):
                for i, v in enumerate(value):
                    getattr(t, name)[i] = v
            else:
                setattr(t, name, value)
        self._check(lib.mn_writer_texobj(self._w(), t))

    @property
    def bytes_written(self) -> int:
        return int(_native()[1].mn_writer_bytes(self._w())) if self._ptr is not None else 0

    def close(self) -> None:
        """Writes END, fsyncs and closes."""
        if self._ptr is None:
            return
        ptr, self._ptr = self._ptr, None
        self._abort.detach()
        self._check(_native()[1].mn_writer_close(ptr))

    def abort(self) -> None:
        if self._ptr is not None:
            self._ptr = None
            self._abort()

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


@dataclass(frozen=True)
class CompareResult:
    """mn_compare's report; `first_mismatch` is a byte offset, None when nothing mismatched."""

    equal: bool
    mismatches: int
    first_mismatch: Optional[int]
    max_abs_err: float
    max_rel_err: float
    err_norm: float
    ref_norm: float

    def __bool__(self) -> bool:
        return self.equal

    @classmethod
    def of(cls, equal: Any, rep: Any, offset: int = 0, **extra: Any):
        """From an mn_cmp_report; `offset` is added to its first mismatch (a range inside a larger buffer)."""
        return cls(equal=bool(equal), mismatches=int(rep.mismatches),
                   first_mismatch=offset + int(rep.first_mismatch) if rep.mismatches else None,
                   max_abs_err=float(rep.max_abs_err), max_rel_err=float(rep.max_rel_err),
                   err_norm=float(rep.err_norm), ref_norm=float(rep.ref_norm), **extra)


def compare(expected: Any, actual: Any, elem: Union[str, int] = "bytes", mode: Union[str, int] = "abs",
            norm: Union[str, int] = "element", tol: float = -1.0, *, atol: Optional[float] = None,
            rtol: Optional[float] = None) -> CompareResult:
    """Compares two equally long buffers under the semantics of mn_compare (snapshot.h): byte-exact by
    default; `tol` with `mode` ("abs"/"rel"), or `atol` and `rtol` together (|a-e| <= atol + rtol*|e|),
    per element or on the L1/L2/Linf `norm` of the error."""
    ffi, lib = _native()
    e, n = _bytes_arg(expected)
    a, na = _bytes_arg(actual)
    if n != na:
        raise ValueError(f"cannot compare buffers of {n} and {na} bytes")
    rep = ffi.new("mn_cmp_report *")
    el, nm = elem_code(elem), _code(NORMS, norm, "norm")
    if atol is not None or rtol is not None:
        rc = lib.mn_compare_ex(e, a, n, el, nm, 0.0 if atol is None else atol, 0.0 if rtol is None else rtol, rep)
    else:
        rc = lib.mn_compare(e, a, n, el, _code(MODES, mode, "tolerance mode"), nm, tol, rep)
    if rc < 0:
        raise ValueError(_error())
    return CompareResult.of(rc, rep)


def diff_ranges(a: Any, b: Any, merge_gap: int = MERGE_GAP) -> List[Tuple[int, int]]:
    """(offset, length) of the byte ranges where a and b differ, merged across gaps < merge_gap."""
    ffi, lib = _native()
    pa, n = _bytes_arg(a)
    pb, nb = _bytes_arg(b)
    if n != nb:
        raise ValueError(f"cannot diff buffers of {n} and {nb} bytes")
    out = ffi.new("mn_range **")
    count = lib.mn_diff_ranges(pa, pb, n, merge_gap, out)
    if count < 0:
        raise MemoryError(_error())
    try:
        words = memoryview(ffi.buffer(out[0], 16 * count)).cast("Q") if count else []
        return [(words[i], words[i + 1]) for i in range(0, 2 * count, 2)]
    finally:
        lib.mn_free(out[0])


def checksum(data: Any, seed: int = 0) -> int:
    """mn_checksum (XXH64) of a buffer."""
    ptr, n = _bytes_arg(data)
    return int(_native()[1].mn_checksum(ptr, n, seed))


@dataclass(frozen=True)
class Check:
    """One comparison of a verification plan (mneme.record.memstate builds plans; the GPU core runs
    them as they are): `length` bytes at `offset` inside a blob (key: its address) or a
    variable (key: its name), whose recorded start address is `base`. atol < 0 means byte-exact."""

    kind: str
    key: Union[int, str]
    base: int
    offset: int
    length: int
    elem: str = "bytes"
    norm: str = "element"
    atol: float = -1.0
    rtol: float = -1.0
    source: str = "exact"

    @property
    def exact(self) -> bool:
        return self.elem == "bytes" or not (self.atol >= 0 and self.rtol >= 0)

    @property
    def addr(self) -> int:
        return self.base + self.offset

    def mode_tol(self) -> Tuple[str, float]:
        """(mode, tol) for mn_compare and the GPU core's compare jobs, which carry a single tolerance."""
        if self.exact:
            return "abs", -1.0
        if self.rtol == 0:
            return "abs", self.atol
        if self.atol == 0:
            return "rel", self.rtol
        raise ValueError(f"{self.describe()}: atol and rtol are both non-zero; mn_compare_ex handles that, "
                         "a single (mode, tol) cannot")

    def describe(self) -> str:
        where = f"blob 0x{self.key:x}" if self.kind == "blob" else f"variable {self.key}"
        return f"{where} [{self.offset}, +{self.length})"
