"""What `mneme record` learns from an app's embedded device IR, before and after the run.

Before the run it writes the *kernel table* the recorder reads (MNEME_KERNEL_TABLE): for every kernel
of the app's IR whether `--kernels` selects it, and for the selected ones which argument bytes are not
scalar values (pointers and struct padding: masked out of the instance key) and which variables the
kernel's closure uses (the only ones its snapshots need). After the run the same closures give each
kernel's static hash and its `RecordedIR_<static-hash>.bc`.

Table format (parsed by native/recorder/select.c), one tab-separated line per kernel:
    K  <mangled name>  <selected 0|1>  <parameter count>  <masked: param:offset:length,... | ->  <variables: a,b | ->
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Pattern, Sequence, Tuple

from mneme.errors import RecordError

_TEXTURE_INTRINSIC = re.compile(r"@llvm\.nvvm\.(?:tex|tld4|suld|sust|txq|suq)\.")
_TEXTURE_ASM = re.compile(r'\basm\b[^"\n]*"[^"\n]*\b(?:tex|tld4|suld|sust|sured|txq|suq)\.')

Masked = Tuple[int, int, int]  # (parameter, offset inside it, length)


@dataclass
class KernelIR:
    """One kernel's pruned closure and what the recorder and the DB need from it."""

    name: str
    demangled: str
    static_hash: str
    modules: List[str]          # translation units the closure came from
    bitcode: bytes              # the closure, as written to RecordedIR_<static-hash>.bc
    arg_names: List[str]
    arg_kinds: List[str]
    specializations: List[bool]
    masked: List[Masked]
    variables: List[str]
    uses_textures: bool
    param_sizes: List[int] = field(default_factory=list)
    #: how the app's build compiled the kernel's module (mneme.cc.embedded.build_settings)
    build: Dict[str, object] = field(default_factory=dict)
    #: which parameters are texture/surface handles (mneme.ir.textures.TextureUses), or None
    textures: Optional[object] = None


def uses_textures(ir_text: str) -> bool:
    """Whether IR reads textures or surfaces (objects replay cannot recreate)."""
    return bool(_TEXTURE_INTRINSIC.search(ir_text) or _TEXTURE_ASM.search(ir_text))


def _covered(td, ty, base: int, out: List[Tuple[int, int]]) -> None:
    """Byte ranges of `ty` that hold data (everything but padding)."""
    if ty.is_struct:
        for i, elem in enumerate(ty.elements):
            _covered(td, elem, base + td.get_element_offset(ty, i), out)
    elif ty.is_array:
        elem = next(iter(ty.elements))
        stride = td.get_abi_size(elem)
        inner: List[Tuple[int, int]] = []
        _covered(td, elem, 0, inner)
        if inner == [(0, stride)]:
            out.append((base, stride * ty.element_count))
        else:
            for k in range(ty.element_count):
                out.extend((base + k * stride + o, n) for o, n in inner)
    else:
        out.append((base, td.get_abi_size(ty)))


def padding_ranges(mod, param) -> List[Tuple[int, int]]:
    """Padding bytes inside a by-value struct parameter (garbage the app never set)."""
    import llvmlite.binding as llvm

    if param.kind != "struct" or not param.ir_type.startswith("%"):
        return []
    name = param.ir_type[1:]
    try:
        ty = mod.get_struct_type(name[1:-1] if name.startswith('"') else name)
    except (NameError, RuntimeError):
        return []
    td = llvm.create_target_data(mod.data_layout)
    covered: List[Tuple[int, int]] = []
    _covered(td, ty, 0, covered)
    gaps, pos = [], 0
    for off, n in sorted(covered):
        if off > pos:
            gaps.append((pos, off - pos))
        pos = max(pos, off + n)
    if pos < param.size:
        gaps.append((pos, param.size - pos))
    return gaps


class IRIndex:
    """The device IR of an app and its libraries: modules by sha256, kernels by name, closures cached."""

    def __init__(self) -> None:
        self.modules: Dict[str, object] = {}          # sha256 -> EmbeddedModule
        self.defined_in: Dict[str, List[str]] = {}    # kernel -> [sha256]
        self.files: List[str] = []
        self._closures: Dict[str, KernelIR] = {}

    def add_file(self, path) -> int:
        """Adds the modules embedded in one ELF file; returns how many were new. Files without
        embedded IR (system libraries) add nothing; unreadable ones raise RecordError."""
        from mneme.cc.embedded import has_embedded, read_embedded
        from mneme.ir.module import module_kernels, parse_module

        p = Path(path)
        if not p.is_file() or not has_embedded(p):
            return 0
        self.files.append(str(p))
        added = 0
        for m in read_embedded(p):
            if m.sha256 in self.modules:
                continue
            self.modules[m.sha256] = m
            added += 1
            for k in module_kernels(parse_module(m.bitcode, name=f"{p}: {m.name}")):
                self.defined_in.setdefault(k, []).append(m.sha256)
        return added

    def add_files(self, paths: Iterable) -> None:
        for p in paths:
            self.add_file(p)

    def kernels(self) -> List[str]:
        return sorted(self.defined_in)

    def has(self, kernel: str) -> bool:
        return kernel in self.defined_in

    def closure(self, kernel: str) -> KernelIR:
        """The kernel's closure across translation units (from its own module when that suffices)."""
        if kernel in self._closures:
            return self._closures[kernel]
        from mneme.ir import arg_names, extract_kernel_closure, kernel_params, module_globals, undefined_symbols
        from mneme.cc.embedded import build_settings
        from mneme.ir.module import demangle, new_context, parse_module
        from mneme.record.hashing import static_hash

        if kernel not in self.defined_in:
            raise RecordError(f"kernel {kernel} is in none of the embedded IR modules")
        own = [(self.modules[s].name, self.modules[s].bitcode) for s in self.defined_in[kernel][:1]]
        mod, used = extract_kernel_closure(own, kernel)
        if undefined_symbols(mod) and len(self.modules) > 1:
            # relocatable device code: other translation units define what is still missing
            everyone = own + [(m.name, m.bitcode) for s, m in self.modules.items() if s not in self.defined_in[kernel][:1]]
            mod, used = extract_kernel_closure(everyone, kernel)
        from mneme.ir.textures import texture_uses

        params = kernel_params(mod, kernel)
        tex = texture_uses(mod, kernel) if uses_textures(str(mod)) else None
        masked: List[Masked] = []
        for p in params:
            for off, n in list(p.pointer_ranges) + padding_ranges(mod, p):
                masked.append((p.index, off, n))
        bitcode = mod.as_bitcode()
        # static_hash strips struct names in its module's LLVM context: give it a private copy
        shash = static_hash(parse_module(bitcode, name=kernel, context=new_context()), kernel)
        info = KernelIR(
            name=kernel,
            demangled=demangle(kernel),
            static_hash=shash,
            modules=list(used),
            bitcode=bitcode,
            arg_names=arg_names(mod, kernel),
            arg_kinds=[p.kind for p in params],
            # a handle baked into the code would name the recorded object, not replay's
            specializations=[bool(p.specializable) and not (tex and p.index in tex.params) for p in params],
            masked=sorted(masked),
            variables=[g.name for g in module_globals(mod)],
            uses_textures=uses_textures(str(mod)),
            param_sizes=[p.size for p in params],
            build=build_settings(self.modules[self.defined_in[kernel][0]]),
            textures=tex,
        )
        self._closures[kernel] = info
        return info


def compile_selector(regex: Optional[str]) -> Optional[Pattern[str]]:
    if not regex:
        return None
    try:
        return re.compile(regex)
    except re.error as e:
        raise RecordError(f"--kernels {regex!r} is not a valid regular expression: {e}") from None


def selects(selector: Optional[Pattern[str]], mangled: str, demangled: str) -> bool:
    """--kernels matches (re.search) the mangled or the demangled name; no regex selects all."""
    return selector is None or bool(selector.search(mangled) or selector.search(demangled))


def table_text(index: IRIndex, selector: Optional[Pattern[str]]) -> str:
    """The kernel table for every kernel of `index`; closures are computed for selected kernels only."""
    from mneme.ir.module import demangle

    lines = ["# mneme kernel table v1: K name selected nparams masked(param:offset:length) variables"]
    for k in index.kernels():
        if not selects(selector, k, demangle(k)):
            lines.append(f"K\t{k}\t0\t0\t-\t-")
            continue
        info = index.closure(k)
        masked = ",".join(f"{p}:{o}:{n}" for p, o, n in info.masked) or "-"
        variables = ",".join(v for v in info.variables if "," not in v and "\t" not in v) or "-"
        lines.append(f"K\t{k}\t1\t{len(info.arg_kinds)}\t{masked}\t{variables}")
    return "\n".join(lines) + "\n"


def write_table(index: IRIndex, selector: Optional[Pattern[str]], path: Path) -> Path:
    path.write_text(table_text(index, selector))
    return path


def executables_in(argv: Sequence[str]) -> List[Path]:
    """ELF files named on the command line (the app, or the app behind a launcher such as mpirun)."""
    import shutil

    out: List[Path] = []
    for a in argv:
        if a.startswith("-"):
            continue
        cand = Path(a) if "/" in a else (Path(shutil.which(a)) if shutil.which(a) else None)
        if cand is None or not cand.is_file():
            continue
        try:
            with open(cand, "rb") as fh:
                if fh.read(4) != b"\x7fELF":
                    continue
        except OSError:
            continue
        out.append(cand.resolve())
    return out
