"""A kernel's parameters as its IR declares them: kind, size, alignment, where pointers lie.

clang-22 passes every aggregate to an NVPTX kernel `byval`: the IR parameter is a `ptr` with
`byval(%struct.T) align N`, and the launch copies sizeof(T) bytes into the parameter space. The
recorder needs those sizes to cut the argument buffer, and the pointer offsets inside a struct to
know which argument bytes hold device addresses.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Tuple, Union

import llvmlite.binding as llvm

from mneme.errors import ConfigurationError
from mneme.ir.module import kernel_function, new_context

PARAM_KINDS = ("ptr", "int", "float", "struct", "other")
Scalar = Union[int, float]

_BYVAL = re.compile(r"byval\((.*)\)\Z")
_ALIGN = re.compile(r"align (\d+)\Z")
_FLOATS = {"half": (2, "e"), "bfloat": (2, None), "float": (4, "f"), "double": (8, "d")}


@dataclass(frozen=True)
class ParamInfo:
    """One kernel parameter.

    `pointer_ranges` are (offset, size) of device addresses inside the parameter's bytes;
    `specializable` marks integer and floating scalars, whose recorded value can become a constant.
    """

    index: int
    name: str
    kind: str
    size: int
    align: int
    ir_type: str
    pointer_ranges: Tuple[Tuple[int, int], ...] = field(default=())
    specializable: bool = False


def _pointer_ranges(td: llvm.TargetData, ty: llvm.TypeRef, base: int = 0) -> List[Tuple[int, int]]:
    if ty.is_pointer:
        return [(base, td.get_abi_size(ty))]
    if ty.is_struct:
        out: List[Tuple[int, int]] = []
        for i, elem in enumerate(ty.elements):
            out += _pointer_ranges(td, elem, base + td.get_element_offset(ty, i))
        return out
    if ty.is_array:
        elem = next(iter(ty.elements))
        inner = _pointer_ranges(td, elem)
        if not inner:
            return []
        stride = td.get_abi_size(elem)
        return [(base + k * stride + off, size) for k in range(ty.element_count) for off, size in inner]
    return []


def _byval_type(mod: llvm.ModuleRef, spelled: str) -> llvm.TypeRef:
    if spelled.startswith("%"):
        name = spelled[1:]
        return mod.get_struct_type(name[1:-1] if name.startswith('"') else name)
    # a literal type: let LLVM read it in a scratch module with the same data layout
    probe = llvm.parse_assembly(
        f'target datalayout = "{mod.data_layout}"\n@probe = external global {spelled}\n', context=new_context()
    )
    probe_ty = probe.get_global_variable("probe").global_value_type
    probe_ty._mneme_keepalive = probe  # the type lives in the probe's context
    return probe_ty


def kernel_params(mod: llvm.ModuleRef, kernel: str) -> List[ParamInfo]:
    """The kernel's parameters, in order, from its IR signature."""
    fn = kernel_function(mod, kernel)
    td = llvm.create_target_data(mod.data_layout)
    out = []
    for i, arg in enumerate(fn.arguments):
        ty = arg.type
        attrs = [a.decode() for a in arg.attributes]
        byval = next((m.group(1) for m in map(_BYVAL.match, attrs) if m), None)
        align = next((int(m.group(1)) for m in map(_ALIGN.match, attrs) if m), None)
        spelled = str(ty)
        if byval is not None:
            sty = _byval_type(mod, byval)
            size = td.get_abi_size(sty)
            info = ParamInfo(
                i, arg.name, "struct", size, align or td.get_abi_alignment(sty), byval,
                tuple(_pointer_ranges(td, sty)),
            )
        else:
            size = td.get_abi_size(ty)
            if ty.is_pointer:
                kind, ranges = "ptr", ((0, size),)
            elif ty.type_kind == llvm.TypeKind.integer:
                kind, ranges = "int", ()
            elif spelled in _FLOATS:
                kind, ranges = "float", ()
            else:
                kind, ranges = "other", tuple(_pointer_ranges(td, ty))
            info = ParamInfo(
                i, arg.name, kind, size, align or td.get_abi_alignment(ty), spelled, ranges, kind in ("int", "float")
            )
        out.append(info)
    return out


def arg_names(mod: llvm.ModuleRef, kernel: str) -> List[str]:
    """Parameter names (kept by -fno-discard-value-names), `arg<i>` where the IR has none."""
    return [p.name or f"arg{p.index}" for p in kernel_params(mod, kernel)]


def _int_bits(p: ParamInfo) -> int:
    return int(p.ir_type[1:])


def canonical_value(p: ParamInfo, value: Union[Scalar, bytes, bytearray]) -> Scalar:
    """The value a specialized parameter takes, in its own type: integers wrap to their width
    (signed), floats round to their precision; raw argument bytes are decoded (little-endian)."""
    if not p.specializable:
        raise ConfigurationError(
            f"parameter {p.index} ({p.name or 'unnamed'}: {p.ir_type}) is a {p.kind}; only integer and "
            "floating scalars can be specialized"
        )
    if p.kind == "int":
        bits = _int_bits(p)
        if isinstance(value, (bytes, bytearray)):
            value = int.from_bytes(bytes(value[: p.size]), "little")
        if isinstance(value, float):
            if not value.is_integer():
                raise ConfigurationError(f"parameter {p.index} ({p.ir_type}) cannot take the value {value}")
            value = int(value)
        v = int(value) & ((1 << bits) - 1)
        return v - (1 << bits) if bits > 1 and v >> (bits - 1) else v
    width, code = _FLOATS[p.ir_type]
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value[:width])
        if p.ir_type == "bfloat":
            return struct.unpack("<f", b"\0\0" + raw)[0]
        return struct.unpack("<" + code, raw)[0]
    v = float(value)
    if p.ir_type == "bfloat":
        # round to nearest even on the upper 16 bits of the float32
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    return struct.unpack("<" + code, struct.pack("<" + code, v))[0]


def ir_constant(p: ParamInfo, value: Scalar) -> str:
    """How textual IR spells `value` (already canonical) as a constant of the parameter's type."""
    if p.kind == "int":
        return ("true" if value else "false") if p.ir_type == "i1" else str(int(value))
    if p.ir_type == "half":
        return "0xH%04X" % struct.unpack("<H", struct.pack("<e", value))[0]
    if p.ir_type == "bfloat":
        return "0xR%04X" % (struct.unpack("<I", struct.pack("<f", value))[0] >> 16)
    # float and double constants are written as the exact double's bits
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]


def canonical_args(params: List[ParamInfo], values: Dict[int, object]) -> Dict[int, Scalar]:
    """Check indices and canonicalize every value (see `canonical_value`)."""
    out = {}
    for idx, v in sorted(values.items()):
        idx = int(idx)
        if not 0 <= idx < len(params):
            raise ConfigurationError(f"argument index {idx} is out of range: the kernel has {len(params)} parameters")
        out[idx] = canonical_value(params[idx], v)
    return out
