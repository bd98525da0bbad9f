"""Element types of pointer parameters from real clang-22 IR (mneme.ir.elemtypes): what verification
shows values as and which buffers may get a float tolerance."""

from __future__ import annotations

from pathlib import Path

from irutil import compile_cu
from mneme.ir.elemtypes import global_elem_types, pointer_elem_types
from mneme.ir.module import module_kernels, parse_module

ROOT = Path(__file__).resolve().parents[1]
INCLUDES = (f"-I{ROOT / 'examples'}", f"-I{ROOT / 'mneme' / 'include'}")


def kernel_types(tmp_path_factory, example: str, kernel_part: str):
    out = tmp_path_factory.getbasetemp() / "elemtypes"
    bc = compile_cu(ROOT / "examples" / example, out, extra=INCLUDES)
    mod = parse_module(bc)
    name = next(k for k in module_kernels(mod) if kernel_part in k)
    return pointer_elem_types(mod, name)


def test_float_atomics_and_plain_floats_are_f32(tmp_path_factory):
    # jacobiStep(const float *x, const float *b, float *xnew, float *res, int n); res only by atomicAdd
    assert kernel_types(tmp_path_factory, "atomicsum.cu", "jacobiStep") == {0: "f32", 1: "f32", 2: "f32", 3: "f32"}


def test_integer_buffers_and_an_atomic_counter_are_not_floats(tmp_path_factory):
    # queueSquare(const float *in, float *out, int *owner, unsigned *next, int nchunks)
    assert kernel_types(tmp_path_factory, "workqueue.cu", "queueSquare") == {0: "f32", 1: "f32", 2: "i32", 3: "i32"}


def test_a_tree_reduction_with_an_atomic_result(tmp_path_factory):
    # reduceSum(const float *in, float *out, int n): out only through atomicAdd after a shared-memory tree
    assert kernel_types(tmp_path_factory, "reduce.cu", "reduceSum") == {0: "f32", 1: "f32"}


def test_a_parameter_that_is_never_dereferenced_gets_no_type(tmp_path_factory):
    src = tmp_path_factory.mktemp("src") / "unused.cu"
    src.write_text("__global__ void k(float *used, double *unused, int n) { if (n) used[0] = 1.0f; }\n")
    bc = compile_cu(src, tmp_path_factory.getbasetemp() / "elemtypes")
    mod = parse_module(bc)
    assert pointer_elem_types(mod, module_kernels(mod)[0]) == {0: "f32"}


def test_variables_get_their_scalar_or_array_element_type():
    from mneme.ir.link import module_globals
    from mneme.record.db import RecordedExecution, find_dbs

    rec = RecordedExecution.from_json(find_dbs(str(ROOT / "tests" / "fixtures" / "ptrglobal"))[0])
    mod = rec.link_llvm_modules(prune=True, internalize=True)
    names = [g.name for g in module_globals(mod)]
    # int g_value; int *g_ptr (a pointer: no element type); float g_table[...]
    assert global_elem_types(mod, names + ["no_such_variable"]) == {"g_value": "i32", "g_table": "f32"}
