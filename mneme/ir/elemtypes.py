"""What a kernel's pointer parameters point to, read from its IR: the element type of each buffer.

Verification reports differing elements as values and compares nondeterministic float outputs with a
tolerance; both need to know whether the bytes behind `float *out` are floats. With opaque pointers
the parameter type says only `ptr`, so this follows each pointer parameter through the kernel after
`always-inline,function(sroa)` (which removes clang's parameter allocas and inlines atomicAdd & co.):
every value derived from it by getelementptr, phi, select, addrspacecast or bitcast belongs to it,
and the types of the loads, stores and atomics through those values are its element types. A
derived pointer passed to a defined function (atomicAdd, a helper) is followed into that function's
parameter, a few calls deep.

`pointer_elem_types(mod, kernel)` -> {parameter index: "f32" | "f64" | "i32" | ... | "mixed"}; a
parameter that is never dereferenced in the kernel is absent.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Set

import llvmlite.binding as llvm

from mneme.errors import MnemeError
from mneme.ir.module import kernel_function, new_context, parse_module

#: LLVM scalar type -> snapshot element type
IR_ELEMS = {"float": "f32", "double": "f64", "half": "f16", "bfloat": "bf16",
            "i8": "u8", "i16": "i16", "i32": "i32", "i64": "i64"}
#: the element type of a parameter whose accesses disagree
MIXED = "mixed"
#: how many calls deep a pointer is followed
DEPTH = 4

_NAME = r"(%[-\w.$]+|%\"[^\"]+\")"
_DEF = re.compile(r"^\s*" + _NAME + r"\s*=\s*(.*)$")
_DERIVE = re.compile(r"^(getelementptr|phi|select|addrspacecast|bitcast|freeze)\b")
_LOAD = re.compile(r"^load (?:atomic )?(?:volatile )?([^,]+), ptr(?: addrspace\(\d+\))? " + _NAME)
_STORE = re.compile(r"^\s*store (?:atomic )?(?:volatile )?(\S+) [^,]+, ptr(?: addrspace\(\d+\))? " + _NAME)
_RMW = re.compile(r"^atomicrmw (?:volatile )?\w+ ptr(?: addrspace\(\d+\))? " + _NAME + r", (\S+) ")
_CALL = re.compile(r"call [^@]*@(\"[^\"]+\"|[-\w.$]+)\(")
_CMPXCHG = re.compile(r"^cmpxchg (?:weak )?(?:volatile )?ptr(?: addrspace\(\d+\))? " + _NAME + r", (\S+) ")


def _elem(ty: str) -> Optional[str]:
    ty = ty.strip()
    if ty in IR_ELEMS:
        return IR_ELEMS[ty]
    m = re.match(r"<\d+ x (\w+)>$", ty)  # vector loads (float4) count as their element
    return IR_ELEMS.get(m.group(1)) if m else None


def _body(mod: llvm.ModuleRef, kernel: str) -> List[str]:
    return str(kernel_function(mod, kernel)).splitlines()


def _simplified(mod: llvm.ModuleRef, kernel: str) -> llvm.ModuleRef:
    """A copy of the module with the kernel's allocas promoted and always-inline callees inlined."""
    from mneme.ir.pipeline import optimize

    copy = parse_module(mod.as_bitcode(), context=new_context())
    try:
        optimize(copy, "always-inline,function(sroa)")
    except MnemeError:  # a module the pipeline refuses: fall back to the unsimplified text
        return mod
    return copy


def pointer_elem_types(mod: llvm.ModuleRef, kernel: str) -> Dict[int, str]:
    """{parameter index: element type} for the kernel's pointer parameters that it dereferences."""
    fn = kernel_function(mod, kernel)
    params = [(i, a.name) for i, a in enumerate(fn.arguments) if a.type.is_pointer]
    if not params:
        return {}
    simple = _simplified(mod, kernel)
    lines = _body(simple, kernel)
    out: Dict[int, str] = {}
    for index, name in params:
        if not name:
            continue
        found = _access_types(simple, lines, "%" + name, DEPTH)
        if found:
            out[index] = found.pop() if len(found) == 1 else MIXED
    return out


def _split_args(text: str) -> List[str]:
    """The top-level comma-separated items of a call's argument list."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
            if depth < 0:
                break
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur).strip())
    return out


def _callee_types(mod: llvm.ModuleRef, line: str, derived: Set[str], depth: int) -> Set[str]:
    m = _CALL.search(line)
    if not m or depth <= 0:
        return set()
    try:
        fn = mod.get_function(m.group(1).strip('"'))
    except NameError:
        return set()
    if fn.is_declaration:
        return set()
    names = [a.name for a in fn.arguments]
    types: Set[str] = set()
    body = None
    for pos, arg in enumerate(_split_args(line[m.end():])):
        if pos < len(names) and names[pos] and arg.split()[-1:] and arg.split()[-1] in derived:
            body = body or str(fn).splitlines()
            types |= _access_types(mod, body, "%" + names[pos], depth - 1)
    return types


def _access_types(mod: llvm.ModuleRef, lines: List[str], root: str, depth: int) -> Set[str]:
    derived = {root}
    changed = True
    while changed:  # phis may refer forward: iterate to a fixed point
        changed = False
        for line in lines:
            m = _DEF.match(line)
            if not m or m.group(1) in derived or not _DERIVE.match(m.group(2)):
                continue
            if any(re.search(re.escape(d) + r"(?![-\w.$])", m.group(2)) for d in derived):
                derived.add(m.group(1))
                changed = True
    types: Set[str] = set()
    for line in lines:
        m = _DEF.match(line)
        rhs = m.group(2) if m else line.strip()
        for pat, ty_group, ptr_group in ((_LOAD, 1, 2), (_RMW, 2, 1), (_CMPXCHG, 2, 1)):
            hit = pat.match(rhs)
            if hit and hit.group(ptr_group) in derived:
                e = _elem(hit.group(ty_group))
                if e:
                    types.add(e)
        hit = _STORE.match(line)
        if hit and hit.group(2) in derived:
            e = _elem(hit.group(1))
            if e:
                types.add(e)
        if " call " in f" {rhs} " or rhs.startswith(("call ", "tail call ")):
            types |= _callee_types(mod, rhs, derived, depth)
    return types


def _scalar_of(ty: llvm.TypeRef) -> Optional[str]:
    while ty.is_array or ty.is_vector:
        ty = next(iter(ty.elements))
    return _elem(str(ty))


def global_elem_types(mod: llvm.ModuleRef, names) -> Dict[str, str]:
    """{variable name: element type} of `__device__`/`__constant__` variables that are scalars or
    (nested) arrays of one scalar type; structs and unknown names are absent."""
    out: Dict[str, str] = {}
    for name in names:
        try:
            gv = mod.get_global_variable(name)
        except NameError:
            continue
        e = _scalar_of(gv.global_value_type)
        if e:
            out[name] = e
    return out
