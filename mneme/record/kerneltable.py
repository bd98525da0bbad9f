"""What `mneme record` learns from an app's embedded device IR, before and after the run.

Before the run it writes the *kernel table* the recorder reads (MNEME_KERNEL_TABLE): for every kernel
of the app's IR whether `--kernels` selects it, and for the selected ones which argument bytes are not
scalar values (pointers and struct padding: masked out of the instance key) and which variables the
kernel's closure uses (the only ones its snapshots need). After the run the same closures give each
kernel's static hash and its `RecordedIR_<static-hash>.bc`.

Table format (parsed by native/recorder/select.c), one tab-separated line per kernel:
    K  <mangled name>  <selected 0|1>  <parameter count>  <masked: param:offset:length,... | ->  <variables: a,b | ->
       <device state: heap,printf,launch | ->
(the recorder never reruns a kernel for timing whose state includes heap or printf: see device_state).
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

#: device state a kernel's pruned closure reaches through these functions (declarations left after pruning)
_STATE_NAMES = (
    ("heap", r"malloc|free|__nv_malloc|__nv_free"),
    ("printf", r"vprintf"),
    ("launch", r"__cudaCDP2\w*|cudaLaunchDevice\w*|cudaGetParameterBuffer\w*"),
)
_DEVICE_STATE = tuple((name, re.compile(rf"^declare [^\n]*@(?:{p})\(", re.M)) for name, p in _STATE_NAMES)
_STATE_SYMBOL = tuple((name, re.compile(rf"(?:{p})\Z")) for name, p in _STATE_NAMES)


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
    #: device_state() of the closure: heap, printf, launch, and fnptr (calls through pointers loaded from memory)
    state: List[str] = field(default_factory=list)
    #: parameters the kernel calls as device functions (function_pointer_calls)
    fnptr_params: List[int] = field(default_factory=list)
    #: the closure's variables that hold device function addresses (mneme.ir.codeaddr): what replay relocates by
    code_tables: List[str] = field(default_factory=list)
    #: how the app's build compiled the kernel's module (mneme.cc.embedded.recorded_build); {} when the binary
    #: predates recorded build settings
    build: Dict[str, object] = field(default_factory=dict)
    #: which parameters are texture/surface handles (mneme.ir.textures.TextureUses), or None
    textures: Optional[object] = None
    #: functions of the closure defined only by other translation units (relocatable device code)
    other_unit_functions: List[str] = field(default_factory=list)


def device_state(ir_text: str) -> List[str]:
    """What the kernel's closure touches besides its arguments and variables: "heap" (malloc/free, so device
    `new`/`delete`: memory in the context's device heap, which no allocation the recorder sees holds), "printf"
    (output in the app's stdout), "launch" (device-side launches through libcudadevrt). A timing rerun of a
    kernel with heap or printf would allocate or print again, so the recorder runs it once."""
    return [name for name, pattern in _DEVICE_STATE if pattern.search(ir_text)]


def function_pointer_calls(mod, kernel: str) -> Tuple[List[int], bool]:
    """(parameters the kernel calls as device functions, whether its closure calls through pointers it loads
    from memory: virtual functions, function tables). Read after default<O1> on a clone, where a parameter
    called through a local copy is called by its own name; the pipeline runs only when there is an indirect
    call at all."""
    from mneme.errors import MnemeError
    from mneme.ir.codeaddr import INDIRECT_CALL
    from mneme.ir.pipeline import optimize

    text = str(mod)
    if not INDIRECT_CALL.search(text):
        return [], False

    try:
        clone = mod.clone()
        optimize(clone, "default<O1>")
        text = str(clone)
    except (RuntimeError, MnemeError):
        pass
    params: List[str] = []
    m = re.search(r"^define [^\n]*@" + re.escape(kernel) + r"\((.*)\)[^\n]*\{$", text, re.M)
    if m:
        params = re.findall(r"%([-\w.$]+)(?=,|$)", m.group(1))
    callees = INDIRECT_CALL.findall(text)
    called = sorted({params.index(c) for c in callees if c in params})
    return called, any(c not in params for c in callees)


def masked_bytes(mod, params) -> List[Masked]:
    """The argument bytes the dynamic hash leaves out: pointers, and padding inside by-value structs."""
    return sorted((p.index, off, n) for p in params for off, n in list(p.pointer_ranges) + padding_ranges(mod, p))


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


def _undefined(reach: set, refs: dict) -> List[str]:
    """The reached symbols no definition in `refs` covers (intrinsics aside)."""
    return [r for r in reach if r not in refs and not r.startswith("llvm.")]


def _other_unit(undefined: List[str]) -> bool:
    """Whether some of them are not device-state calls, so another translation unit must define them."""
    return any(not any(p.match(r) for _, p in _STATE_SYMBOL) for r in undefined)


class IRIndex:
    """The device IR of an app and its libraries: modules by sha256, kernels by name, closures cached."""

    def __init__(self) -> None:
        self.modules: Dict[str, object] = {}          # sha256 -> EmbeddedModule
        self.defined_in: Dict[str, List[str]] = {}    # kernel -> [sha256]
        self.files: List[str] = []
        self._closures: Dict[str, KernelIR] = {}
        self._graphs: Dict[str, tuple] = {}           # sha256 -> (module, symbol references, visible variables)

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

    def table_entry(self, kernel: str) -> Tuple[int, List[Masked], List[str], List[str]]:
        """What the recorder's kernel table needs of a kernel (parameter count, masked argument bytes, the
        variables it can reach, its device state heap/printf/launch), from one parse and one reference graph
        per module rather than a pruned closure per kernel; the closure where the kernel reaches symbols its
        own module does not define and other modules might (relocatable device code)."""
        if kernel in self._closures or kernel not in self.defined_in:
            info = self.closure(kernel)
            return len(info.arg_kinds), info.masked, info.variables, info.state
        from mneme.ir import kernel_params
        from mneme.ir.codeaddr import closure_roots
        from mneme.ir.module import reachable_symbols

        mod, refs, variables, tables = self._graph(self.defined_in[kernel][0])
        reach = set().union(*(reachable_symbols(refs, r) for r in closure_roots(mod, kernel, refs, tables)))
        undefined = _undefined(reach, refs)
        if len(self.modules) > 1 and _other_unit(undefined):
            info = self.closure(kernel)
            return len(info.arg_kinds), info.masked, info.variables, info.state
        params = kernel_params(mod, kernel)
        state = [name for name, p in _STATE_SYMBOL if any(p.match(r) for r in undefined)]
        return len(params), masked_bytes(mod, params), [g.name for g in variables if g.name in reach], state

    def _graph(self, sha: str) -> tuple:
        """(parsed module, symbol_references, module_globals, code tables kept as roots) of one module, built once
        (the code tables print every variable's initializer: once per module, not per kernel)."""
        if sha not in self._graphs:
            from mneme.ir import module_globals
            from mneme.ir.codeaddr import code_tables
            from mneme.ir.module import parse_module, symbol_references

            m = self.modules[sha]
            mod = parse_module(m.bitcode, name=m.name)
            self._graphs[sha] = (mod, symbol_references(mod), module_globals(mod), code_tables(mod, kept=True))
        return self._graphs[sha]

    def device_state(self, kernel: str) -> List[str]:
        """The kernel's device state (heap, printf, launch) alone, as the table gives unselected kernels: from its
        module's reference graph, and where it reaches symbols other modules define (relocatable device code)
        from the union of every module's graph — not a linked closure per kernel, which --kernels is meant to
        spare. Internal symbols of the same name in two modules merge there, which can only add state (a kernel
        said to use the heap keeps its reruns off: the safe side)."""
        from mneme.ir.module import reachable_symbols

        if kernel in self._closures or kernel not in self.defined_in:
            return self.closure(kernel).state
        refs = self._graph(self.defined_in[kernel][0])[1]
        undefined = _undefined(reachable_symbols(refs, kernel), refs)
        if len(self.modules) > 1 and _other_unit(undefined):
            union: Dict[str, set] = {}
            for sha in self.modules:
                for name, names in self._graph(sha)[1].items():
                    union.setdefault(name, set()).update(names)
            undefined = _undefined(reachable_symbols(union, kernel), union)
        return [name for name, p in _STATE_SYMBOL if any(p.match(r) for r in undefined)]

    def closure(self, kernel: str) -> KernelIR:
        """The kernel's closure across translation units (from its own module when that suffices)."""
        if kernel in self._closures:
            return self._closures[kernel]
        from mneme.ir import arg_names, extract_kernel_closure, kernel_params, module_globals, undefined_symbols
        from mneme.ir.codeaddr import code_tables
        from mneme.cc.embedded import recorded_build
        from mneme.ir.module import demangle, new_context, parse_module
        from mneme.ir.textures import texture_uses
        from mneme.record.hashing import static_hash

        if kernel not in self.defined_in:
            raise RecordError(f"kernel {kernel} is in none of the embedded IR modules")
        own = [(self.modules[s].name, self.modules[s].bitcode) for s in self.defined_in[kernel][:1]]
        mod, used = extract_kernel_closure(own, kernel)
        other_unit: List[str] = []
        if undefined_symbols(mod) and len(self.modules) > 1:
            # relocatable device code: other translation units define what is still missing
            missing = set(undefined_symbols(mod))
            everyone = own + [(m.name, m.bitcode) for s, m in self.modules.items() if s not in self.defined_in[kernel][:1]]
            mod, used = extract_kernel_closure(everyone, kernel)
            other_unit = sorted(f.name for f in mod.functions if not f.is_declaration and f.name in missing)
        params = kernel_params(mod, kernel)
        text = str(mod)
        tex = texture_uses(mod, kernel) if uses_textures(text) else None
        bitcode = mod.as_bitcode()
        fn_params, loaded_calls = function_pointer_calls(mod, kernel)
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
            masked=masked_bytes(mod, params),
            variables=[g.name for g in module_globals(mod)],
            uses_textures=uses_textures(text),
            state=device_state(text) + (["fnptr"] if loaded_calls else []),
            fnptr_params=fn_params,
            code_tables=sorted(code_tables(mod)) if fn_params or loaded_calls else [],
            param_sizes=[p.size for p in params],
            build=recorded_build(self.modules[self.defined_in[kernel][0]]) or {},
            other_unit_functions=other_unit,
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


def _state_field(state: List[str]) -> str:
    return ",".join(s for s in state if s != "fnptr") or "-"  # the recorder reads heap, printf, launch


def table_text(index: IRIndex, selector: Optional[Pattern[str]]) -> str:
    """The kernel table for every kernel of `index`, each entry from its module's reference graph
    (IRIndex.table_entry); unselected kernels keep only their device state (one that allocates from the
    heap stops every later kernel's timing reruns)."""
    from mneme.ir.module import demangle

    lines = ["# mneme kernel table v1: K name selected nparams masked(param:offset:length) variables [state]"]
    for k in index.kernels():
        if not selects(selector, k, demangle(k)):
            lines.append(f"K\t{k}\t0\t0\t-\t-\t{_state_field(index.device_state(k))}")
            continue
        nparams, masked, reached, device_state_ = index.table_entry(k)
        state = _state_field(device_state_)
        ranges = ",".join(f"{p}:{o}:{n}" for p, o, n in masked) or "-"
        variables = ",".join(v for v in reached if "," not in v and "\t" not in v) or "-"
        lines.append(f"K\t{k}\t1\t{nparams}\t{ranges}\t{variables}\t{state}")
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
