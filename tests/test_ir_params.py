"""Kernel parameters from the IR signature: kinds, sizes, byval struct layouts, value canonicalization."""

import struct

import pytest
from irutil import bc_dir, build  # noqa: F401  (fixtures)

from mneme.errors import ConfigurationError
from mneme.ir import arg_names, canonical_value, kernel_params, link_modules, parse_module
from mneme.ir.params import ir_constant

KINDS = "_Z5kindsbcsxjfd6__half6float45Small5OuterPi"


@pytest.fixture(scope="module")
def kinds(build):
    mod = link_modules([build("params.cu")], KINDS)
    return mod, kernel_params(mod, KINDS)


def test_scalar_and_pointer_parameters(kinds):
    _, params = kinds
    got = [(p.name, p.kind, p.size, p.align, p.ir_type, p.specializable) for p in params[:7]]
    assert got == [
        ("b", "int", 1, 1, "i1", True),
        ("c", "int", 1, 1, "i8", True),
        ("s", "int", 2, 2, "i16", True),
        ("ll", "int", 8, 8, "i64", True),
        ("u", "int", 4, 4, "i32", True),
        ("f", "float", 4, 4, "float", True),
        ("d", "float", 8, 8, "double", True),
    ]
    p = params[11]
    assert (p.name, p.kind, p.size, p.pointer_ranges, p.specializable) == ("p", "ptr", 8, ((0, 8),), False)


def test_structs_are_byval_with_abi_layout_and_pointer_offsets(kinds):
    _, params = kinds
    half, f4, small, outer = params[7:11]
    assert all(p.kind == "struct" and not p.specializable for p in (half, f4, small, outer))
    assert (half.size, half.align, half.pointer_ranges) == (2, 2, ())
    assert (f4.size, f4.align) == (16, 16)
    assert (small.size, small.align) == (8, 4)
    # struct Outer { char c; Inner in[2] /* {int k; float *q;} at 8 */; double d /* 40 */; int *r /* 48 */; }
    assert (outer.size, outer.align) == (56, 8)
    assert outer.pointer_ranges == ((16, 8), (32, 8), (48, 8))


def test_clang_lowers_aggregates_to_byval_pointers(kinds):
    mod, _ = kinds
    define = next(l for l in str(mod).splitlines() if l.startswith("define") and KINDS in l)
    assert "ptr noundef byval(%struct.Outer) align 8 %o" in define


def test_arg_names_fall_back_to_positions(build, tmp_path):
    assert arg_names(parse_module(build("params.cu")), "_Z5saxpyfPKfPfii") == ["a", "x", "y", "n", "stride"]
    unnamed = parse_module(build("params.cu", extra=["-fdiscard-value-names"]))
    assert arg_names(unnamed, "_Z5saxpyfPKfPfii") == ["arg0", "arg1", "arg2", "arg3", "arg4"]


def test_canonical_values_take_the_parameter_type(kinds):
    _, p = kinds
    b, c, s, ll, u, f, d = p[:7]
    assert canonical_value(u, 0xFFFFFFFF) == -1
    assert canonical_value(c, 200) == -56
    assert canonical_value(b, 1) == 1 and ir_constant(b, 1) == "true"
    assert canonical_value(ll, struct.pack("<q", -5)) == -5
    assert canonical_value(s, b"\x01\x02") == 0x0201
    assert canonical_value(f, 0.1) == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert canonical_value(d, struct.pack("<d", 0.1)) == 0.1
    assert ir_constant(f, canonical_value(f, 2.5)) == "0x4004000000000000"
    with pytest.raises(ConfigurationError, match="struct"):
        canonical_value(p[10], 3)
    with pytest.raises(ConfigurationError, match="cannot take the value 1.5"):
        canonical_value(u, 1.5)


def test_half_and_bfloat_constants():
    from mneme.ir import ParamInfo

    h = ParamInfo(0, "h", "float", 2, 2, "half", (), True)
    bf = ParamInfo(1, "bf", "float", 2, 2, "bfloat", (), True)
    assert canonical_value(h, 1.5) == 1.5 and ir_constant(h, 1.5) == "0xH3E00"
    assert canonical_value(bf, struct.pack("<H", 0x3FC0)) == 1.5 and ir_constant(bf, 1.5) == "0xR3FC0"
    assert canonical_value(bf, 1.00390625) == 1.0  # rounds to 8 mantissa bits, ties to even


def test_literal_byval_types_are_laid_out_too():
    from mneme.ir import parse_module

    ll = b"""
target datalayout = "e-p6:32:32-i64:64-i128:128-i256:256-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"
%struct.Named = type { i8, ptr }
define ptx_kernel void @k(ptr byval({ i32, [2 x ptr], double }) align 8 %lit, ptr byval(%struct.Named) align 8 %named, half %h) {
  ret void
}
"""
    lit, named, h = kernel_params(parse_module(ll), "k")
    assert (lit.kind, lit.size, lit.align, lit.pointer_ranges) == ("struct", 32, 8, ((8, 8), (16, 8)))
    assert (named.size, named.pointer_ranges) == (16, ((8, 8),))
    assert (h.kind, h.size, h.specializable) == ("float", 2, True)
