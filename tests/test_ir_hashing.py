"""The static hash: same code, same hash (across processes and unrelated edits); other code, other hash."""

import subprocess
import sys
from pathlib import Path

import pytest
from irutil import DATA, bc_dir, build  # noqa: F401  (fixtures)

import llvmlite.binding as llvm

from mneme.ir import link_modules, parse_module, static_hash

VECADD = "_Z6vecAddPKfS0_Pfi"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def base(build):
    return static_hash(parse_module(build("vecadd.cu")), VECADD)


def _variant(tmp_path, name, text):
    path = tmp_path / f"{name}.cu"
    path.write_text(text)
    return path


def test_same_hash_in_another_process(build, base):
    code = (
        "import sys; from mneme.ir import parse_module, static_hash; "
        f"print(static_hash(parse_module(sys.argv[1]), {VECADD!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(build("vecadd.cu"))], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == base


def test_parsing_history_linking_and_debug_info_change_nothing(build, base):
    bc = build("vecadd.cu")
    for _ in range(3):  # renames struct types in the global context (%struct.X.N)
        llvm.parse_bitcode(bc.read_bytes())
    assert static_hash(parse_module(bc), VECADD) == base
    assert static_hash(link_modules([bc], VECADD), VECADD) == base
    assert static_hash(parse_module(build("vecadd.cu", extra=["-g"])), VECADD) == base


def test_unrelated_edits_change_nothing(build, base, tmp_path):
    src = (DATA / "vecadd.cu").read_text()
    edited = (
        # a new kernel first: it makes the TU define the threadIdx/blockDim helpers before vecAdd
        "__device__ int fresh[3];\n"
        "__global__ void first(int *p) { p[threadIdx.x + blockDim.x] = fresh[1] + gridDim.x; }\n"
        + src.replace("x[i] * s", "x[i] * s * 2.0f")
        + "\n// trailing comment shifts nothing\n"
    )
    assert static_hash(parse_module(build(_variant(tmp_path, "vecadd_edit", edited))), VECADD) == base


def test_kernel_changes_and_other_kernels_hash_differently(build, base, tmp_path):
    src = (DATA / "vecadd.cu").read_text()
    changed = build(_variant(tmp_path, "vecadd_sub", src.replace("a[i] + b[i]", "a[i] - b[i]")))
    assert static_hash(parse_module(changed), VECADD) != base
    mod = parse_module(build("vecadd.cu"))
    assert static_hash(mod, "_Z11scaleKernelPffi") != base
    assert len(base) == 64 and int(base, 16) >= 0


def test_hashing_leaves_the_module_and_its_context_alone(build):
    from mneme.ir import kernel_params

    kinds = "_Z5kindsbcsxjfd6__half6float45Small5OuterPi"
    mod = link_modules([build("params.cu")], kinds)
    before, params = str(mod), kernel_params(mod, kinds)
    static_hash(mod, kinds)
    assert str(mod) == before and "%struct.Outer = type" in before
    assert kernel_params(mod, kinds) == params


TEMPLATE_KERNELS = ["_Z6reduceILj256ELb1EEvPKfPfj", "_Z6reduceILj32ELb0EEvPKfPfj"]


@pytest.mark.parametrize("kernel", TEMPLATE_KERNELS)
def test_a_template_kernel_hashes_the_same_recorded_and_linked_for_replay(build, kernel):
    """The recorder hashes the kernel's closure as extracted (with -fgpu-rdc a template instantiation is
    weak_odr); replay hashes the module it compiles, where internalize made the kernel external. Before
    the kernel's linkage was left out of the print, every template kernel of relocatable device code
    failed replay with `its IR module(s) ... hash to static hash ..., the DB records ...` (the corpus's
    reduction and threadFenceReduction, CMake's CUDA_SEPARABLE_COMPILATION)."""
    from mneme.ir import module_kernels

    bc = build("template.cu", rdc=True)
    mod = parse_module(bc)
    assert set(TEMPLATE_KERNELS) <= set(module_kernels(mod))
    assert mod.get_function(kernel).linkage == llvm.Linkage.weak_odr
    recorded = static_hash(mod, kernel)
    replayed = link_modules([bc], kernel, prune=True, internalize=True)
    assert replayed.get_function(kernel).linkage == llvm.Linkage.external
    assert static_hash(replayed, kernel) == recorded
    other = next(k for k in TEMPLATE_KERNELS if k != kernel)
    assert static_hash(mod, other) != recorded
