"""Linking recorded modules, pruning to one kernel's closure, internalizing, RDC closures."""

import pytest
from irutil import bc_dir, build  # noqa: F401  (fixtures)

import llvmlite.binding as llvm

from mneme.errors import CompileError
from mneme.ir import (
    emit_ptx,
    extract_kernel_closure,
    link_cubin,
    link_modules,
    module_globals,
    module_kernels,
    new_context,
    optimize,
    parse_module,
    undefined_symbols,
)

VECADD = "_Z6vecAddPKfS0_Pfi"
SAXPY = "_Z5saxpyfPKfPfii"
RDC = "_Z9rdcKernelPfi"


def _defined(mod):
    return {f.name: f.linkage for f in mod.functions if not f.is_declaration}


def test_prune_keeps_only_the_kernel_closure_and_internalizes_helpers(build):
    mod = link_modules([build("vecadd.cu")], VECADD)
    funcs = _defined(mod)
    assert module_kernels(mod) == [VECADD]
    assert funcs[VECADD] == llvm.Linkage.external
    assert "_Z11scaleKernelPffi" not in funcs
    helpers = {n: l for n, l in funcs.items() if n != VECADD}
    assert helpers and all(l == llvm.Linkage.internal for l in helpers.values())
    assert module_globals(mod) == []  # unused_table belongs to the other kernel
    assert "llvm.compiler.used" not in str(mod)


def test_without_prune_or_internalize_everything_stays(build):
    mod = link_modules([build("vecadd.cu")], VECADD, prune=False, internalize=False)
    assert set(module_kernels(mod)) == {VECADD, "_Z11scaleKernelPffi"}
    assert all(l != llvm.Linkage.internal for l in _defined(mod).values())


def test_used_variables_stay_external_through_o3_and_are_visible_in_ptx(build):
    mod = link_modules([build("params.cu")], SAXPY)
    names = {g.name: g for g in module_globals(mod)}
    assert set(names) == {"counter", "coeffs"}  # other_unused is pruned
    assert names["coeffs"].addrspace == 4 and names["coeffs"].size == 64
    assert names["counter"].addrspace == 1 and names["counter"].size == 4
    optimize(mod, "default<O3>")
    assert {g.name for g in module_globals(mod)} == {"counter", "coeffs"}
    ptx = emit_ptx(mod)
    assert ".visible .global .align 4 .u32 counter" in ptx
    assert ".visible .const .align 4 .b8 coeffs[64]" in ptx


def test_rdc_closure_spans_two_modules_and_links_to_a_cubin(build):
    kern = build("rdc_kernel.cu", rdc=True)
    lib = build("rdc_lib.cu", rdc=True)
    assert undefined_symbols(parse_module(kern)) == ["_Z5scalef", "bias"]
    mod = link_modules([kern, lib], RDC)
    funcs = _defined(mod)
    assert {RDC, "_Z5scalef", "_Z5twiceIfET_S0_"} <= set(funcs)
    assert "_Z11otherKernelPi" not in funcs and "_Z9libKernelPi" not in funcs
    assert {g.name for g in module_globals(mod)} == {"bias", "factor"}  # `unrelated` stays out
    assert undefined_symbols(mod) == []
    optimize(mod, "default<O3>")
    res = link_cubin(emit_ptx(mod), kernel=RDC)
    assert res.cubin[:4] == b"\x7fELF" and res.registers > 0


def test_extract_kernel_closure_names_the_modules_it_used(build):
    kern = build("rdc_kernel.cu", rdc=True).read_bytes()
    lib = build("rdc_lib.cu", rdc=True).read_bytes()
    vec = build("vecadd.cu").read_bytes()
    mod, used = extract_kernel_closure([("lib.bc", lib), ("vec.bc", vec), ("kern.bc", kern)], RDC)
    assert used == ["kern.bc", "lib.bc"]
    assert module_kernels(mod) == [RDC]
    mod2, used2 = extract_kernel_closure([("lib.bc", lib), ("vec.bc", vec), ("kern.bc", kern)], "_Z9libKernelPi")
    assert used2 == ["lib.bc"] and [g.name for g in module_globals(mod2)] == ["unrelated"]


def test_same_named_symbols_of_separate_units_do_not_collide(build, tmp_path):
    # Without -fgpu-rdc every unit is its own device module, so two units may define the same
    # strong __device__ function; linking them wholesale fails, the closure takes only what it needs.
    a, b = tmp_path / "unit_a.cu", tmp_path / "unit_b.cu"
    a.write_text("__device__ int helper() { return 11; }\n__global__ void ka(int *p) { *p = helper(); }\n")
    b.write_text("__device__ int helper() { return 22; }\n__global__ void kb(int *p) { *p = helper(); }\n")
    bca, bcb = build(a), build(b)
    ctx = new_context()
    wholesale = parse_module(bca, context=ctx)
    with pytest.raises(RuntimeError, match="helper"):
        wholesale.link_in(parse_module(bcb, context=ctx))
    assert module_kernels(link_modules([bca, bcb], "_Z2kbPi", prune=False)) == ["_Z2kbPi"]
    mod = optimize(link_modules([bca, bcb], "_Z2kbPi"), "default<O3>")
    assert "store i32 22" in str(mod)
    assert [f.name for f in mod.functions if not f.is_declaration] == ["_Z2kbPi"]


def test_module_refs_are_read_not_consumed(build):
    src = parse_module(build("vecadd.cu"))
    before = str(src)
    mod = link_modules([src], VECADD)
    assert str(src) == before
    assert module_kernels(mod) == [VECADD]


def test_unknown_kernel_lists_what_the_modules_define(build):
    with pytest.raises(CompileError) as e:
        link_modules([build("vecadd.cu")], "_Z7missingv")
    assert "_Z7missingv" in str(e.value) and VECADD in str(e.value)


def test_missing_module_file_is_named(tmp_path):
    from mneme.errors import RecordError

    with pytest.raises(RecordError, match="nope.bc"):
        link_modules([tmp_path / "nope.bc"], VECADD)
