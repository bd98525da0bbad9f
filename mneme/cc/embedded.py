"""The device bitcode `mneme cc` embeds in objects, and reading it back from binaries and libraries.

Every CUDA translation unit contributes one *entry* to the ELF section `.mneme_ir` of its object. The
linker concatenates the sections of all objects (each 8-byte aligned, so the entries stay contiguous
up to zero padding), so one section of a binary or shared library holds the modules of all its
translation units and must be split again. An entry is self-delimiting:

    offset  size  field
    0       8     magic  b"MNEMEIR\\0"
    8       2     format version (1)
    10      2     header size (56): readers skip unknown header growth
    12      4     metadata size M (UTF-8 JSON: name, source, arch, rdc, flags, build)
    16      8     bitcode size B
    24      32    sha256 of the bitcode
    56      M     metadata
    56+M    B     bitcode
    ...           zero padding to a multiple of 8

The sha256 both detects corruption and identifies the module (it feeds the static hash).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from mneme.errors import RecordError

SECTION = ".mneme_ir"
MAGIC = b"MNEMEIR\x00"
VERSION = 1
_HEADER = struct.Struct("<8sHHIQ32s")
ALIGN = 8

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class EmbeddedModule:
    """One translation unit's device bitcode as found in an ELF file."""

    name: str  #: the translation unit, as named on the compiler command line
    source: str  #: absolute path of the source file at build time
    arch: str  #: GPU architecture the IR was generated for (e.g. sm_90)
    sha256: str  #: hex digest of `bitcode`
    bitcode: bytes = field(repr=False)
    elf_path: Path = Path()
    offset: int = 0  #: byte offset of the entry inside the section
    meta: Mapping[str, object] = field(default_factory=dict, repr=False)


def pack_entry(bitcode: bytes, meta: Mapping[str, object]) -> bytes:
    """One section entry for `bitcode`; `meta` should name the translation unit ('name', 'source')."""
    blob = json.dumps(dict(meta), sort_keys=True, separators=(",", ":")).encode()
    head = _HEADER.pack(MAGIC, VERSION, _HEADER.size, len(blob), len(bitcode), hashlib.sha256(bitcode).digest())
    entry = head + blob + bitcode
    return entry + b"\0" * (-len(entry) % ALIGN)


def unpack_entries(data: bytes, origin: PathLike = "<memory>") -> List[EmbeddedModule]:
    """Split a `.mneme_ir` section's contents into modules; corrupt entries raise RecordError naming
    `origin` and the byte offset inside the section."""
    modules: List[EmbeddedModule] = []
    off, end = 0, len(data)
    while off < end:
        if data[off : off + ALIGN].strip(b"\0") == b"":  # linker padding between objects
            off += ALIGN
            continue
        where = f"{origin}: section {SECTION} offset {off}"
        if end - off < _HEADER.size:
            raise RecordError(f"{where}: truncated entry header ({end - off} bytes left)")
        magic, version, hsize, msize, bsize, digest = _HEADER.unpack_from(data, off)
        if magic != MAGIC:
            raise RecordError(f"{where}: bad magic {magic!r} (not written by mneme cc, or corrupt)")
        if version != VERSION:
            raise RecordError(
                f"{where}: embedded IR format version {version}, this mneme reads {VERSION}: "
                f"rebuild the binary with this mneme's `mneme cc`"
            )
        if hsize < _HEADER.size or off + hsize + msize + bsize > end:
            raise RecordError(
                f"{where}: entry sizes (header {hsize}, meta {msize}, bitcode {bsize}) run past the section end"
            )
        mstart = off + hsize
        bstart = mstart + msize
        bitcode = bytes(data[bstart : bstart + bsize])
        if hashlib.sha256(bitcode).digest() != digest:
            raise RecordError(f"{where}: bitcode checksum mismatch (corrupt file)")
        try:
            meta = json.loads(bytes(data[mstart:bstart]).decode())
        except (UnicodeDecodeError, ValueError) as e:
            raise RecordError(f"{where}: unreadable metadata ({e})") from None
        source = str(meta.get("source", ""))
        modules.append(
            EmbeddedModule(
                name=str(meta.get("name") or source or f"module@{off}"),
                source=source,
                arch=str(meta.get("arch", "")),
                sha256=digest.hex(),
                bitcode=bitcode,
                elf_path=Path(origin),
                offset=off,
                meta=meta,
            )
        )
        off = bstart + bsize
        off += -off % ALIGN
    return modules


#: version of the "build" metadata (the device build settings) `mneme cc`/`mneme nvcc` write today:
#: 1 (first recorded) had no "version" key; 2 added it with ptxas_opt (the ptxas -O the build used),
#: relocatable (ptxas -c, a device link after), arch and the -Xptxas options sorted by what they set
BUILD_VERSION = 2

#: the device-code settings a build without recorded settings (older binaries) is taken to have used
DEFAULT_BUILD = {"compiler": "unknown", "opt_level": "3", "ftz": False, "prec_div": True, "prec_sqrt": True,
                 "fmad": True, "fast_math": False, "maxrregcount": None, "ptxas": []}


def recorded_build(mod: EmbeddedModule) -> Optional[Dict[str, object]]:
    """The device build settings `mneme cc`/`mneme nvcc` stored with `mod` ("version" 1 when the build
    predates versioning), or None when the binary was built before they were recorded: the replay baseline
    then falls back to mneme's defaults and says so (mneme.ir.appbuild)."""
    build = mod.meta.get("build")
    if not isinstance(build, Mapping) or not build:
        return None
    out = dict(build)
    out.setdefault("version", 1)
    out.setdefault("arch", mod.arch)
    out.setdefault("rdc", bool(mod.meta.get("rdc", False)))
    return out


def build_settings(mod: EmbeddedModule) -> Dict[str, object]:
    """How the app's build compiled `mod`'s device code, for display (`mneme ir`): keys
    compiler ("nvcc" | "cc"), opt_level (device -O), host_opt_level, ftz, prec_div, prec_sqrt, fmad,
    fast_math, maxrregcount (None: no limit), ptxas (the -Xptxas options), ptxas_opt, relocatable, rdc,
    dlto, arch, lineinfo, device_debug; `mneme cc` adds fp_flags (its clang floating-point flags). Keys
    missing in older binaries take DEFAULT_BUILD's values; `recorded_build` tells them apart."""
    out = dict(DEFAULT_BUILD)
    out.update(recorded_build(mod) or {})
    return out


def _open_elf(path: Path):
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        fh = open(path, "rb")
    except OSError as e:
        raise RecordError(f"{path}: cannot open ({e.strerror})") from None
    try:
        return fh, ELFFile(fh)
    except ELFError as e:
        fh.close()
        raise RecordError(f"{path}: not an ELF binary, shared library or object ({e})") from None


def read_embedded(path: PathLike) -> List[EmbeddedModule]:
    """The modules embedded in one ELF file (executable, shared library or object); [] when none.
    A module present twice (same sha256: an RDC archive member, see `archive_rdc_sections`) is
    listed once."""
    p = Path(path)
    fh, elf = _open_elf(p)
    with fh:
        sec = elf.get_section_by_name(SECTION)
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            return []
        seen = set()
        unique = []
        for m in unpack_entries(sec.data(), p):
            if m.sha256 not in seen:
                seen.add(m.sha256)
                unique.append(m)
        return unique


def has_embedded(path: PathLike) -> bool:
    """Whether an ELF file has a `.mneme_ir` section (cheap: reads section headers only)."""
    try:
        fh, elf = _open_elf(Path(path))
    except RecordError:
        return False
    with fh:
        return elf.get_section_by_name(SECTION) is not None


# ---- static archives ------------------------------------------------------------------------------


def archive_members(path: PathLike) -> Iterator[Tuple[str, bytes]]:
    """(name, contents) of each member of a System V / GNU `ar` archive."""
    data = Path(path).read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise RecordError(f"{path}: not an ar archive")
    off, names = 8, b""
    while off + 60 <= len(data):
        head = data[off : off + 60]
        name, size = head[:16].decode(errors="replace").rstrip(), int(head[48:58].decode().strip() or 0)
        body = data[off + 60 : off + 60 + size]
        off += 60 + size + (size & 1)
        if name == "//":
            names = body
        elif name in ("/", "/SYM64/"):
            continue
        elif name.startswith("/") and name[1:].isdigit():
            start = int(name[1:])
            yield names[start : names.index(b"/\n", start)].decode(errors="replace"), body
        else:
            yield name.rstrip("/"), body


def archive_rdc_sections(path: PathLike) -> List[bytes]:
    """The `.mneme_ir` section contents of the archive members that hold relocatable device code.

    The host linker takes an archive member only when the host side needs one of its symbols, but
    the device link may need a member for its device functions alone; its IR would then be missing
    from the binary. `mneme cc` therefore adds these sections to every link that names the archive
    (duplicates are dropped when reading)."""
    import io

    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    out = []
    for name, body in archive_members(path):
        if not body.startswith(b"\x7fELF"):
            continue
        try:
            elf = ELFFile(io.BytesIO(body))
            sec = elf.get_section_by_name(SECTION)
            if sec is not None and elf.get_section_by_name(".llvm.offloading") is not None:
                out.append(sec.data())
        except ELFError as e:
            raise RecordError(f"{path}({name}): unreadable ELF member ({e})") from None
    return out


# ---- shared-library dependencies -----------------------------------------------------------------

_DEFAULT_DIRS = ("/lib64", "/usr/lib64", "/lib", "/usr/lib", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")


def _dynamic_info(path: Path) -> Tuple[List[str], List[str], List[str], int]:
    """(DT_NEEDED, DT_RPATH dirs, DT_RUNPATH dirs, ELF class) of one file."""
    fh, elf = _open_elf(path)
    with fh:
        needed: List[str] = []
        rpath: List[str] = []
        runpath: List[str] = []
        dyn = elf.get_section_by_name(".dynamic")
        if dyn is not None and hasattr(dyn, "iter_tags"):
            for tag in dyn.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED":
                    needed.append(tag.needed)
                elif tag.entry.d_tag == "DT_RPATH":
                    rpath += tag.rpath.split(":")
                elif tag.entry.d_tag == "DT_RUNPATH":
                    runpath += tag.runpath.split(":")
        return needed, rpath, runpath, elf.elfclass


def _expand(dirs: Iterable[str], origin: Path) -> List[str]:
    out = []
    for d in dirs:
        if d:
            out.append(re.sub(r"\$(ORIGIN|\{ORIGIN\})", str(origin), d))
    return out


def _ldconfig_cache() -> Dict[str, str]:
    text = ""
    for exe in ("ldconfig", "/sbin/ldconfig"):
        try:
            text = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout
            break
        except (OSError, subprocess.SubprocessError):
            continue
    cache: Dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)", line)
        if m and "64" in m.group(2):  # 64-bit entries: "(libc6,x86-64)", "(libc6,AArch64)"
            cache.setdefault(m.group(1), m.group(3))
    return cache


def _resolve(name: str, search: Sequence[str], cache: Dict[str, str]) -> Optional[Path]:
    if "/" in name:
        return Path(name) if Path(name).exists() else None
    for d in search:
        cand = Path(d) / name
        if cand.is_file():
            return cand
    if name in cache:
        return Path(cache[name])
    for d in _DEFAULT_DIRS:
        cand = Path(d) / name
        if cand.is_file():
            return cand
    return None


def shared_library_deps(binary: PathLike, ld_library_path: Optional[str] = None) -> List[Path]:
    """All shared libraries `binary` loads (transitively), resolved the way the dynamic loader does:
    DT_RPATH (when there is no DT_RUNPATH), LD_LIBRARY_PATH, DT_RUNPATH, the ldconfig cache, the
    default directories. Unresolvable names are skipped (the loader would fail on them anyway).
    `ld_library_path` defaults to the environment's LD_LIBRARY_PATH."""
    root = Path(binary).resolve()
    if ld_library_path is None:
        ld_library_path = os.environ.get("LD_LIBRARY_PATH", "")
    lib_path = [d for d in ld_library_path.split(":") if d]
    cache: Optional[Dict[str, str]] = None
    found: Dict[str, Path] = {}
    queue: List[Tuple[Path, List[str]]] = [(root, [])]
    while queue:
        path, inherited_rpath = queue.pop(0)
        needed, rpath, runpath, _ = _dynamic_info(path)
        origin = path.parent
        own_rpath = _expand(rpath, origin) if not runpath else []
        # DT_RPATH of the loading object and of its loaders apply (unless DT_RUNPATH is present).
        chain = own_rpath + inherited_rpath if not runpath else []
        search = chain + lib_path + _expand(runpath, origin)
        for name in needed:
            if name in found:
                continue
            hit = _resolve(name, search, {})
            if hit is None:
                if cache is None:
                    cache = _ldconfig_cache()
                hit = _resolve(name, search, cache)
            if hit is None:
                continue
            found[name] = hit.resolve()
            queue.append((found[name], chain))
    return list(found.values())


def libraries_with_ir(binary: PathLike, ld_library_path: Optional[str] = None) -> List[Path]:
    """The shared libraries of `binary` that carry embedded device IR, in load order."""
    return [p for p in shared_library_deps(binary, ld_library_path) if has_embedded(p)]


def collect_embedded(binary: PathLike, ld_library_path: Optional[str] = None) -> List[EmbeddedModule]:
    """Modules embedded in `binary` followed by those of its shared libraries."""
    mods = read_embedded(binary)
    for lib in libraries_with_ir(binary, ld_library_path):
        mods += read_embedded(lib)
    return mods


def ldd_libraries(binary: PathLike) -> List[Path]:
    """Shared libraries as `ldd` reports them (runs the dynamic loader: use only on trusted binaries);
    a cross-check for shared_library_deps."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    return [Path(m) for m in re.findall(r"=>\s+(/\S+)\s+\(0x", out)]


__all__ = [
    "SECTION",
    "MAGIC",
    "VERSION",
    "EmbeddedModule",
    "BUILD_VERSION",
    "DEFAULT_BUILD",
    "build_settings",
    "recorded_build",
    "pack_entry",
    "unpack_entries",
    "read_embedded",
    "has_embedded",
    "archive_members",
    "archive_rdc_sections",
    "shared_library_deps",
    "libraries_with_ir",
    "collect_embedded",
    "ldd_libraries",
]
