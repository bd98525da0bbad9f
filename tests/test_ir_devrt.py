"""Replay compiles of kernels that launch kernels (dynamic parallelism): the child kernels stay kernels in the
pruned module and the cubin is linked with libcudadevrt (nvJitLink), which whole-program ptxas cannot do."""

import pytest
from irutil import bc_dir, build  # noqa: F401  (fixtures)

from mneme.config import ExperimentConfiguration, dim3
from mneme.errors import CompileError
from mneme.ir import compile_kernel, link_modules
from mneme.ir.codegen import devrt_symbols, link_cubin
from mneme.ir.module import module_kernels
from mneme.ir import ptxas

PARENT = "_Z10launchFillPii"
CHILD = "_Z9fillChildPiii"


@pytest.fixture(scope="module")
def parent(build):
    if ptxas.find_cudadevrt() is None:
        pytest.skip("no libcudadevrt.a in the CUDA root")
    return link_modules([build("dynpar_parent.cu", rdc=True), build("dynpar_child.cu", rdc=True)], PARENT)


def test_the_child_kernel_of_another_unit_is_linked_and_stays_a_kernel(parent):
    assert set(module_kernels(parent)) == {PARENT, CHILD}
    assert not parent.get_function(CHILD).is_declaration


def test_device_side_launches_link_cudadevrt(parent):
    ck = compile_kernel(parent, PARENT, ExperimentConfiguration(grid=dim3(4), block=dim3(32)), cache=False)
    assert ".visible .entry " + CHILD in ck.ptx and ".visible .entry " + PARENT in ck.ptx
    assert "__cudaCDP2LaunchDevice" in devrt_symbols(ck.ptx)
    assert ck.cubin.libraries == ["cudadevrt"] and ck.assembler == "nvjitlink"
    assert ck.cubin.cubin[:4] == b"\x7fELF" and {PARENT, CHILD} <= set(ck.cubin.functions)
    assert ck.cubin.registers > 0  # the parent's own resources, not the first library function's


def test_plain_kernels_are_not_linked_with_it(build):
    mod = link_modules([build("dynpar_child.cu", rdc=True)], CHILD)
    ck = compile_kernel(mod, CHILD, ExperimentConfiguration(grid=dim3(4), block=dim3(128)), cache=False)
    assert devrt_symbols(ck.ptx) == [] and ck.cubin.libraries is None


def test_a_missing_device_runtime_is_named(parent, monkeypatch):
    ck = compile_kernel(parent, PARENT, ExperimentConfiguration(grid=dim3(4), block=dim3(32)), cache=False)
    monkeypatch.setenv("MNEME_CUDADEVRT", "/nonexistent/libcudadevrt.a")
    ptxas.find_cudadevrt.cache_clear()
    try:
        with pytest.raises(CompileError, match="MNEME_CUDADEVRT"):
            link_cubin(ck.ptx, "sm_90", 3, "serial", kernel=PARENT)
    finally:
        monkeypatch.delenv("MNEME_CUDADEVRT")
        ptxas.find_cudadevrt.cache_clear()
