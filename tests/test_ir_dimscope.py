"""The dims specialization writes the replayed kernel's launch dimensions only into the code that runs under its
launch: not into the kernels it launches from the device (dynamic parallelism), nor into what they share with it
(clang's blockDim/threadIdx wrappers, a __device__ helper, a function the child calls through a pointer). The
GPU test that saw the children compute with the parent's blockDim: tests/gpu/test_device_state_gpu.py::
test_the_parent_replays_with_its_child_launches_and_a_half_grid_fails (variants O3+dims, O3+all)."""

import re
from pathlib import Path

import pytest
from irutil import bc_dir, build, compile_cu  # noqa: F401  (fixtures)

from mneme.config import ExperimentConfiguration, dim3
from mneme.ir import compile_kernel, emit_ptx, link_modules, optimize, specialize_dims, specialize_dims_assume
from mneme.ir import ptxas
from mneme.ir.dimscope import CLONE_SUFFIX, _definitions

PARENT = "_Z10parentRowsPiiS_"
CHILD = "_Z8childRowPiiPFiiE"
RECURSE = "_Z7recursePii"
HELPER = "_Z11globalIndexv"  # called by both kernels
BY_POINTER = "_Z6scaledi"  # called by the parent, and by the child through the pointer the parent launches it with
PARENT_ONLY = "_Z10parentOnlyv"
BLOCKDIM_X = "_ZN25__cuda_builtin_blockDim_t17__fetch_builtin_xEv"
BLOCKDIM_Y = "_ZN25__cuda_builtin_blockDim_t17__fetch_builtin_yEv"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def defs(mod) -> dict:
    text = str(mod)
    return {name: text[s:e] for name, (s, e) in _definitions(text).items()}


def body(definition: str) -> str:
    return definition.split("\n", 1)[1]


def entry(ptx: str, name: str) -> str:
    """One .entry/.func of the PTX, up to the next one."""
    m = re.search(r"^(?:\.visible |\.weak )?\.(?:entry|func)\s+(?:\([^)]*\)\s*)?" + re.escape(name) + r"\(", ptx, re.M)
    assert m, f"{name} not in the PTX"
    nxt = re.search(r"^(?:\.visible |\.weak |\.extern )?\.(?:entry|func)\b", ptx[m.end():], re.M)
    return ptx[m.start(): m.end() + nxt.start() if nxt else len(ptx)]


@pytest.fixture(scope="module")
def dynpar(build):
    return link_modules([build("dynpar_shared.cu", rdc=True)], PARENT)


@pytest.mark.parametrize("specialize", [specialize_dims, specialize_dims_assume])
def test_the_child_and_what_it_shares_keep_their_dims_reads(dynpar, specialize):
    before = defs(dynpar)
    assert {CHILD, HELPER, BY_POINTER, BLOCKDIM_X, BLOCKDIM_Y} <= set(before)
    after = defs(specialize(dynpar, PARENT, (4, 1, 1), (64, 2, 1)))
    for name in (CHILD, HELPER, BY_POINTER, BLOCKDIM_X, BLOCKDIM_Y):
        assert body(after[name]) == body(before[name]), name
    assert "call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()" in after[BLOCKDIM_X]
    # the parent calls copies of them that know its launch
    parent = after[PARENT]
    for name in (HELPER, BY_POINTER):
        assert f"@{name}{CLONE_SUFFIX}(" in parent and f"@{name}(" not in parent, name
    assert f"@{BLOCKDIM_X}{CLONE_SUFFIX}(" in after[HELPER + CLONE_SUFFIX]
    assert after[BLOCKDIM_X + CLONE_SUFFIX].startswith("define internal ")
    # the child is launched with the original function's address, not the copy's
    assert re.search(rf"ptr noundef @{BY_POINTER}\)", parent) or f"@{BY_POINTER}," in parent
    if specialize is specialize_dims:
        assert "add i32 64, 0" in after[BLOCKDIM_X + CLONE_SUFFIX]
        assert "add i32 2, 0" in after[BLOCKDIM_Y + CLONE_SUFFIX]
        assert "call range(i32 0, 64) i32 @llvm.nvvm.read.ptx.sreg.tid.x()" in after[
            "_ZN26__cuda_builtin_threadIdx_t17__fetch_builtin_xEv" + CLONE_SUFFIX]
    else:
        assert "call range(i32 64, 65) i32 @llvm.nvvm.read.ptx.sreg.ntid.x()" in after[BLOCKDIM_X + CLONE_SUFFIX]
    # a function only the parent reaches is specialized where it is: no copy
    assert PARENT_ONLY + CLONE_SUFFIX not in after and f"@{PARENT_ONLY}(" in parent


def test_the_optimized_child_reads_its_own_block_and_the_parent_none(dynpar):
    ptx = emit_ptx(optimize(specialize_dims(dynpar, PARENT, (4, 1, 1), (64, 2, 1)), "default<O3>"))
    parent, child = entry(ptx, PARENT), entry(ptx, CHILD)
    assert "%ntid" not in parent and "%nctaid" not in parent
    assert "%ntid.x" in child  # blockDim.x of its own launch (128), not the parent's 64
    assert "%ntid.y" in entry(ptx, BY_POINTER)  # what the child calls through the pointer


def test_a_kernel_that_launches_itself_keeps_its_reads(build):
    mod = link_modules([build("dynpar_shared.cu", rdc=True)], RECURSE)
    before, after = defs(mod), defs(specialize_dims(mod, RECURSE, (1, 1, 1), (256, 1, 1)))
    assert "sreg.ntid.x" in before[BLOCKDIM_X]
    assert {n: body(d) for n, d in after.items()} == {n: body(d) for n, d in before.items()}


def test_without_device_launches_everything_the_kernel_reaches_is_specialized(build):
    mod = link_modules([build("dynpar_child.cu", rdc=True)], "_Z9fillChildPiii")
    text = str(specialize_dims(mod, "_Z9fillChildPiii", (4, 1, 1), (128, 1, 1)))
    assert CLONE_SUFFIX not in text and "add i32 128, 0" in text
    assert not re.search(r"call [^\n]*sreg\.n(?:ctaid|tid)", text)


def test_dims_bounds_and_args_together_leave_the_child_alone(dynpar):
    if ptxas.find_cudadevrt() is None:
        pytest.skip("no libcudadevrt.a in the CUDA root")
    cfg = ExperimentConfiguration(grid=dim3(4), block=dim3(64, 2), specialize=True, specialize_dims=True,
                                  set_launch_bounds=True, max_threads=128, min_blocks_per_sm=2)
    ck = compile_kernel(dynpar, PARENT, cfg, arg_values={1: 1000}, cache=False)
    parent, child = entry(ck.ptx, PARENT), entry(ck.ptx, CHILD)
    assert re.search(r"\.maxntid 128\b", parent) and "%ntid" not in parent
    assert ".maxntid" not in child and ".minnctapersm" not in child and "%ntid.x" in child


def test_the_dynpar_example_parent_is_specialized_and_its_child_is_not(bc_dir):
    parent, child = "_Z10launchRowsPfPKfiifiPj", "_Z8scaleRowPfPKfifi"
    bc = compile_cu(EXAMPLES / "dynpar.cu", bc_dir, rdc=True, extra=[f"-I{EXAMPLES}"])
    mod = link_modules([bc], parent)
    ptx = emit_ptx(optimize(specialize_dims(mod, parent, (4, 1, 1), (64, 1, 1)), "default<O3>"))
    assert "%ntid" not in entry(ptx, parent)
    assert "%ntid.x" in entry(ptx, child) and "%tid.x" in entry(ptx, child)
