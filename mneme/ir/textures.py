"""Which kernel parameters are texture or surface objects, read from the kernel's IR.

A `cudaTextureObject_t` / `cudaSurfaceObject_t` is an i64 handle: in the IR the kernel passes it to a
texture or surface instruction, either an NVVM intrinsic (`llvm.nvvm.tex.*`, `suld.*`, `sust.*`,
`txq.*`, `suq.*`) or, from clang's CUDA headers, inline PTX (`tex.2d.v4.f32.f32 ..., [$4, {...}]`).
The handle is the first i64 operand of that call. On an optimized clone (`default<O1>`: the header's
helpers inlined, allocas promoted) each handle operand is traced back through casts, phis and selects:
to a kernel parameter, or a field of a struct parameter passed by value (replay substitutes the object
it recreates for that argument's bytes), or to anything else, typically a load from memory (a handle in
a `__device__` variable or in a struct behind a pointer), which replay cannot follow and reports by name
instead of guessing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Set, Tuple

import llvmlite.binding as llvm

from mneme.errors import MnemeError
from mneme.ir.module import kernel_function

_INTRINSIC = re.compile(r"llvm\.nvvm\.(?:tex|tld4|suld|sust|txq|suq)\.")
_ASM_OP = re.compile(r'\basm\b[^"]*"\s*(tex|tld4|suld|sust|sured|txq|suq)\.')
_SURFACE_OPS = ("suld", "sust", "sured", "suq")
_WRITE_OPS = ("sust", "sured")
_PASS_THROUGH = {"bitcast", "zext", "sext", "trunc", "freeze", "inttoptr", "ptrtoint"}


@dataclass(frozen=True)
class TextureUses:
    """Texture/surface operations of one kernel: which parameters are handles, and how they are used.

    `params` maps a parameter index to the operations it feeds ("tex", "suld", "sust", ...);
    `offsets` the byte offsets of the handles inside each of them (0 for a handle parameter; the fields'
    offsets for a struct passed by value); `from_memory` lists the operations whose handle does not
    come from a parameter (a readable description each); `writes` are the parameter indices whose
    surface the kernel writes."""

    params: Dict[int, Tuple[str, ...]] = field(default_factory=dict)
    offsets: Dict[int, Tuple[int, ...]] = field(default_factory=dict)
    from_memory: Tuple[str, ...] = ()
    writes: Tuple[int, ...] = ()
    analyzed: str = ""

    @property
    def any(self) -> bool:
        return bool(self.params or self.from_memory)


def _call_op(ins: llvm.ValueRef) -> str:
    """The texture/surface operation a call performs ("tex", "sust", ...), or ""."""
    if ins.opcode != "call":
        return ""
    text = str(ins)
    m = _ASM_OP.search(text)
    if m:
        return m.group(1)
    ops = list(ins.operands)
    callee = ops[-1].name if ops else ""
    if _INTRINSIC.match(callee):
        return callee[len("llvm.nvvm."):].split(".", 1)[0]
    return ""


_RESULT = re.compile(r"\s*(%[-\w.$\"]+) =")


class _Function:
    """A function's arguments and instructions by name (operands of llvmlite are opaque views)."""

    def __init__(self, fn: llvm.ValueRef) -> None:
        self.args = {str(a): i for i, a in enumerate(fn.arguments)}
        self.byval = {i for i, a in enumerate(fn.arguments) if any(x.startswith(b"byval(") for x in a.attributes)}
        self.ins: Dict[str, llvm.ValueRef] = {}
        for block in fn.blocks:
            for ins in block.instructions:
                m = _RESULT.match(str(ins))
                if m:
                    self.ins[m.group(1)] = ins

    def resolve(self, v: llvm.ValueRef):
        """("arg", index) / ("ins", instruction) / ("other", value) for an operand."""
        kind = v.value_kind
        if kind == llvm.ValueKind.argument and str(v) in self.args:
            return "arg", self.args[str(v)]
        if kind == llvm.ValueKind.instruction:
            m = _RESULT.match(str(v))
            if m and m.group(1) in self.ins:
                return "ins", self.ins[m.group(1)]
        return "other", v

    def sources(self, v: llvm.ValueRef, seen: Set[str], depth: int = 0) -> List[Tuple[str, object]]:
        """What a handle value comes from, looking through casts, phis and selects."""
        kind, x = self.resolve(v)
        if kind != "ins":
            return [(kind, x)]
        key = str(x)
        if key in seen or depth > 64:
            return []
        seen.add(key)
        op = x.opcode
        ops = list(x.operands)
        if op in _PASS_THROUGH:
            return self.sources(ops[0], seen, depth + 1)
        if op == "phi":
            return [s for o in ops for s in self.sources(o, seen, depth + 1)]
        if op == "select":
            return [s for o in ops[1:] for s in self.sources(o, seen, depth + 1)]
        if op == "load":
            fld = self.byval_field(ops[0])
            if fld is not None:
                return [("field", fld)]
        return [("ins", x)]

    def byval_field(self, ptr: llvm.ValueRef):
        """(parameter, byte offset) when `ptr` addresses a field of a struct passed by value, else None."""
        kind, x = self.resolve(ptr)
        if kind == "arg":
            return (x, 0) if x in self.byval else None
        if kind != "ins" or x.opcode != "getelementptr" or " i8, ptr " not in str(x):
            return None
        ops = list(x.operands)
        base_kind, base = self.resolve(ops[0])
        if len(ops) != 2 or base_kind != "arg" or base not in self.byval:
            return None
        if ops[1].value_kind != llvm.ValueKind.constant_int:
            return None
        return base, int(ops[1].get_constant_value(signed_int=True))


def _describe(kind: str, src) -> str:
    if kind == "ins" and src.opcode == "load":
        text = str(src)
        g = re.search(r"@([-\w.$]+|\"[^\"]+\")", text)
        return f"a handle loaded from memory ({'variable @' + g.group(1) if g else 'through a pointer'})"
    if kind == "ins":
        return f"a handle computed by `{src.opcode}`"
    if src.value_kind in (llvm.ValueKind.constant_int, llvm.ValueKind.constant_expr, llvm.ValueKind.poison_value,
                          llvm.ValueKind.undef_value):
        return "a constant handle"
    return "a handle of unknown origin"


def texture_uses_of(fn: llvm.ValueRef, analyzed: str = "as given") -> TextureUses:
    """TextureUses of one function (the kernel, with its helpers inlined)."""
    f = _Function(fn)
    params: Dict[int, Set[str]] = {}
    offsets: Dict[int, Set[int]] = {}
    writes: Set[int] = set()
    memory: List[str] = []
    for block in fn.blocks:
        for ins in block.instructions:
            op = _call_op(ins)
            if not op:
                continue
            handle = next((o for o in list(ins.operands)[:-1] if str(o.type) == "i64"), None)
            if handle is None:
                memory.append(f"`{op}` without an i64 handle operand")
                continue
            for kind, src in f.sources(handle, set()):
                if kind == "field":
                    src, off = src
                elif kind == "arg":
                    off = 0
                else:
                    what = f"`{op}` reads {_describe(kind, src)}"
                    if what not in memory:
                        memory.append(what)
                    continue
                params.setdefault(src, set()).add(op)
                offsets.setdefault(src, set()).add(off)
                if op in _WRITE_OPS:
                    writes.add(src)
    return TextureUses({i: tuple(sorted(ops)) for i, ops in sorted(params.items())},
                       {i: tuple(sorted(o)) for i, o in sorted(offsets.items())}, tuple(memory), tuple(sorted(writes)),
                       analyzed)


def texture_uses(mod: llvm.ModuleRef, kernel: str, pipeline: str = "default<O1>") -> TextureUses:
    """TextureUses of `kernel` in `mod` (left unchanged), read on an optimized clone so the helpers of
    clang's texture headers are inlined into the kernel. Falls back to the IR as given (then only the
    kernel's own calls are seen) if the pipeline fails."""
    from mneme.ir.pipeline import optimize

    text = str(mod)
    if not (_INTRINSIC.search(text) or _ASM_OP.search(text)):
        return TextureUses(analyzed="no texture or surface operation in the IR")
    try:
        clone = mod.clone()
        optimize(clone, pipeline)
        return texture_uses_of(kernel_function(clone, kernel), f"{pipeline} clone")
    except (RuntimeError, MnemeError):
        return texture_uses_of(kernel_function(mod, kernel), "unoptimized IR (the pipeline failed)")


def is_surface_op(op: str) -> bool:
    return op in _SURFACE_OPS
