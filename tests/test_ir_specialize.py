"""Specializations, each checked by reading the IR and PTX it produces, and by the code hash it gets."""

import re

import pytest
from irutil import bc_dir, build  # noqa: F401  (fixtures)

from mneme.errors import ConfigurationError
from mneme.ir import (
    code_hash,
    emit_ptx,
    kernel_params,
    link_modules,
    make_specialization,
    optimize,
    set_launch_bounds,
    specialize,
    specialize_args,
    specialize_dims,
    specialize_dims_assume,
    static_hash,
)

SAXPY = "_Z5saxpyfPKfPfii"
DIMS = "_Z6dims3dPi"
BOUNDED = "_Z7boundedPf"
SREG = re.compile(r"call [^\n]*@llvm\.nvvm\.read\.ptx\.sreg\.(\w+)\.([xyz])\(\)")


@pytest.fixture(scope="module")
def saxpy(build):
    return link_modules([build("params.cu")], SAXPY)


@pytest.fixture(scope="module")
def dims(build):
    return link_modules([build("dims.cu")], DIMS)


def _kernel_body(text: str, kernel: str) -> str:
    start = text.index(f"@{kernel}(")
    return text[text.index("\n", start) : text.index("\n}\n", start)]


def _reads(text: str):
    return {f"{r}.{a}" for r, a in SREG.findall(text)}


def test_args_become_constants_and_the_signature_stays(saxpy):
    before = str(saxpy)
    spec = specialize_args(saxpy, SAXPY, {0: 2.5, 4: 1024})
    assert str(saxpy) == before  # the input is never changed
    text = str(spec)
    body = _kernel_body(text, SAXPY)
    assert "store float 2.500000e+00, ptr %a.addr" in body and "store i32 1024, ptr %stride.addr" in body
    assert "%a," not in body and "%stride," not in body
    assert "%n, ptr %n.addr" in body  # not specialized
    assert "(float noundef %a, ptr noundef %x, ptr noundef %y, i32 noundef %n, i32 noundef %stride)" in text
    ptx = emit_ptx(optimize(spec, "default<O3>"))
    assert "0f40200000" in ptx  # 2.5f folded into the code
    assert "_Z5saxpyfPKfPfii_param_4" not in ptx.split("{", 1)[1]  # stride is never loaded


def test_args_work_on_numbered_parameters(build):
    mod = link_modules([build("params.cu", extra=["-fdiscard-value-names"])], SAXPY)
    text = str(specialize_args(mod, SAXPY, {3: 77}))
    body = _kernel_body(text, SAXPY)
    assert "store i32 77, ptr %9" in body and "store i32 %4, ptr %10" in body
    assert not re.search(r"%3\b", body)
    assert "i32 noundef %3, i32 noundef %4)" in text


def test_only_scalars_can_be_specialized(saxpy):
    with pytest.raises(ConfigurationError, match="parameter 1 \\(x: ptr\\) is a ptr"):
        specialize_args(saxpy, SAXPY, {1: 0})
    with pytest.raises(ConfigurationError, match="out of range"):
        specialize_args(saxpy, SAXPY, {9: 0})


def test_dims_become_constants_and_indices_get_ranges(dims):
    spec = specialize_dims(dims, DIMS, (4, 3, 2), (32, 4, 2))
    text = str(spec)
    assert _reads(str(dims)) >= {"ntid.x", "ntid.y", "ntid.z", "nctaid.x", "nctaid.y", "nctaid.z"}
    assert not {r for r in _reads(text) if r.startswith("n")}  # no blockDim/gridDim read is left
    assert "add i32 32, 0" in text and "add i32 2, 0" in text
    assert "call range(i32 0, 32) i32 @llvm.nvvm.read.ptx.sreg.tid.x()" in text
    assert "call range(i32 0, 3) i32 @llvm.nvvm.read.ptx.sreg.ctaid.y()" in text
    ptx = emit_ptx(optimize(spec, "default<O3>"))
    assert "%ntid" not in ptx and "%nctaid" not in ptx and "%tid.x" in ptx


def test_dims_assume_keeps_the_reads_with_exact_ranges(dims):
    spec = specialize_dims_assume(dims, DIMS, (4, 3, 2), (32, 4, 2))
    text = str(spec)
    assert "call range(i32 32, 33) i32 @llvm.nvvm.read.ptx.sreg.ntid.x()" in text
    assert "call range(i32 2, 3) i32 @llvm.nvvm.read.ptx.sreg.nctaid.z()" in text
    assert "call range(i32 0, 4) i32 @llvm.nvvm.read.ptx.sreg.tid.y()" in text
    assert not re.search(r"= add i32 \d+, 0$", text, re.M)
    o3 = optimize(spec, "default<O3>")
    assert not {r for r in _reads(str(o3)) if r.startswith("n")}  # LLVM folds the single-value ranges


def test_dims_on_clang_optimized_ir_and_huge_grids(build):
    mod = link_modules([build("dims.cu", optimize=True)], DIMS)
    assert "tail call" in str(mod)
    grid, block = (2**31 - 1, 65535, 65535), (1024, 1, 1)
    text = str(specialize_dims(mod, DIMS, grid, block))
    assert "%9 = add i32 2147483647, 0" in text and "%1 = add i32 1024, 0" in text
    assert "%2 = tail call noundef range(i32 0, 2147483647) i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()" in text
    assumed = str(specialize_dims_assume(mod, DIMS, grid, block))
    # [2^31 - 1, 2^31) wraps in i32
    assert "range(i32 2147483647, -2147483648) i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()" in assumed


def test_launch_bounds_reach_the_ptx(saxpy):
    spec = set_launch_bounds(saxpy, SAXPY, 256, 3)
    define = next(l for l in str(spec).splitlines() if l.startswith("define") and SAXPY in l)
    group = re.search(r"#(\d+) \{$", define).group(1)
    attrs = re.search(rf"^attributes #{group} = {{(.*)}}$", str(spec), re.M).group(1)
    assert '"nvvm.maxntid"="256"' in attrs and '"nvvm.minctasm"="3"' in attrs
    helpers = [l for l in str(spec).splitlines() if l.startswith("attributes") and "nvvm.maxntid" in l]
    assert len(helpers) == 1  # no other function got them
    ptx = emit_ptx(spec)
    assert re.search(r"\.maxntid 256\b", ptx) and re.search(r"\.minnctapersm 3\b", ptx)


def test_launch_bounds_replace_the_source_ones(build):
    mod = link_modules([build("params.cu")], BOUNDED)
    assert re.search(r"\.maxntid 128\b", emit_ptx(mod.clone())) and "minnctapersm 2" in emit_ptx(mod.clone())
    ptx = emit_ptx(set_launch_bounds(mod, BOUNDED, 64, 0))
    assert re.search(r"\.maxntid 64\b", ptx) and "minnctapersm" not in ptx
    with pytest.raises(ConfigurationError, match="max_threads=2048"):
        set_launch_bounds(mod, BOUNDED, 2048, 1)


def test_all_specializations_in_one_round_trip_and_retarget(saxpy):
    params = kernel_params(saxpy, SAXPY)
    spec = make_specialization(params, {3: 4096}, (16, 1, 1), (256, 1, 1), launch_bounds=(256, 2))
    mod = specialize(saxpy, SAXPY, spec, arch="sm_80")
    text = str(mod)
    assert "store i32 4096, ptr %n.addr" in text and "add i32 256, 0" in text and '"nvvm.maxntid"="256"' in text
    assert '"target-cpu"="sm_80"' in text and "+sm_90" not in text
    ptx = emit_ptx(optimize(mod, "default<O3>", arch="sm_80"), arch="sm_80")
    assert ".target sm_80" in ptx and "%ntid" not in ptx


def test_each_specialization_changes_the_code_hash(saxpy):
    sh = static_hash(saxpy, SAXPY)
    params = kernel_params(saxpy, SAXPY)

    def h(spec, passes="default<O3>", opt=3, method="serial", arch="sm_90"):
        return code_hash(sh, spec, passes, opt, method, arch)

    base = h(make_specialization())
    variants = [
        h(make_specialization(params, {3: 100})),
        h(make_specialization(params, {3: 101})),
        h(make_specialization(params, {0: 0.1})),
        h(make_specialization(params, {0: 0.1 + 2**-40})),  # the same float32 as 0.1
        h(make_specialization(grid=(2, 1, 1), block=(128, 1, 1))),
        h(make_specialization(grid=(2, 1, 1), block=(128, 1, 1), dims_mode="assume")),
        h(make_specialization(launch_bounds=(128, 1))),
        h(make_specialization(launch_bounds=(128, 2))),
        h(make_specialization(), passes="default<O2>"),
        h(make_specialization(), opt=2),
        h(make_specialization(), method="parallel"),
        h(make_specialization(), arch="sm_80"),
    ]
    assert variants[2] == variants[3]  # both round to the same float32 constant
    distinct = [base] + variants[:3] + variants[4:]
    assert len(set(distinct)) == len(distinct)
    assert h(make_specialization(params, {3: 100})) == variants[0]
    assert h(make_specialization(), passes="O3") == base  # same pipeline, spelled differently
