"""Pass pipelines in opt's syntax, parsed by mneme and run through llvmlite's new pass manager."""

import pytest
from irutil import bc_dir, build  # noqa: F401  (fixtures)

import llvmlite.binding as llvm

from mneme.errors import PipelineError
from mneme.ir import available_passes, link_modules, optimize, parse_pipeline
from mneme.ir.pipeline import LEVELS, PASSES, Stage

VECADD = "_Z6vecAddPKfS0_Pfi"


@pytest.fixture(scope="module")
def vecadd(build):
    return link_modules([build("vecadd.cu")], VECADD)


@pytest.mark.parametrize(
    "text, stages, canonical",
    [
        ("default<O3>", (Stage(level="O3"),), "default<O3>"),
        ("O1", (Stage(level="O1"),), "default<O1>"),
        ("default<Oz>", (Stage(level="Oz"),), "default<Oz>"),
        (" instcombine , simplifycfg ", (Stage(passes=("instcombine", "simplifycfg")),), "instcombine,simplifycfg"),
        (
            "module(function(sroa,loop(loop-rotate)),globaldce),default<O2>,dce",
            (Stage(passes=("sroa", "loop-rotate", "globaldce")), Stage(level="O2"), Stage(passes=("dce",))),
            "sroa,loop-rotate,globaldce,default<O2>,dce",
        ),
        ("function(instcombine,loop(loop-deletion,loop-reduce))", (Stage(passes=("instcombine", "loop-deletion", "loop-reduce")),), "instcombine,loop-deletion,loop-reduce"),
    ],
)
def test_valid_pipelines_parse_into_stages(text, stages, canonical):
    p = parse_pipeline(text)
    assert p.stages == stages
    assert p.canonical == canonical


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "empty pipeline"),
        ("default<O4>", "unknown optimization level 'O4'"),
        ("instcombine,", "expected a pass name"),
        ("licm", "unknown pass 'licm'"),
        ("function(sroa", "missing ')'"),
        ("sroa instcombine", "unexpected 'instcombine'"),
        ("default<O1>)", "unexpected ')'"),
        ("function(globaldce)", "'globaldce' is a module pass"),
        ("loop(instcombine)", "'instcombine' is a function pass"),
        ("function(default<O2>)", "cannot appear inside function"),
        ("loop(function(dce))", "function(...) cannot appear inside loop"),
        ("sroa(dce)", "cannot nest passes"),
        ("loop-unroll<O3>", "pass parameters are not supported"),
        ("internalize", "unknown pass 'internalize'"),
        ("instcombine;dce", "unexpected ';dce'"),
    ],
)
def test_bad_pipelines_say_why_and_list_the_valid_names(text, why):
    with pytest.raises(PipelineError) as e:
        parse_pipeline(text)
    msg = str(e.value)
    assert why in msg
    for name in ("default<O3>", "default<Os>", "instcombine", "loop-rotate", "globaldce", "function(...)"):
        assert name in msg


def test_available_passes_are_sorted_and_exclude_harmful_ones():
    names = available_passes()
    assert names == sorted(names)
    assert {"instcombine", "simplifycfg", "sroa", "loop-unroll", "newgvn", "globalopt", "loop-rotate"} <= set(names)
    assert not {"internalize", "lower-atomic", "verify", "dot-cfg", "view-cfg"} & set(names)


def test_every_available_pass_runs_on_real_ir(vecadd):
    pm_methods = set(dir(llvm.create_new_module_pass_manager()))
    for name in available_passes():
        assert PASSES[name][1] in pm_methods, name
        mod = vecadd.clone()
        optimize(mod, f"{name},verify")
        mod.verify()


def _kernel_ir(mod):
    text = str(mod)
    start = text.index("define dso_local ptx_kernel")
    return text[start : text.index("\n}\n", start)]


def test_default_levels_change_the_code_as_expected(vecadd):
    o0 = optimize(vecadd.clone(), "default<O0>")
    o3 = optimize(vecadd.clone(), "default<O3>")
    assert "alloca" in _kernel_ir(o0)  # O0 keeps clang's stack slots
    assert "alloca" not in _kernel_ir(o3)
    # O0 still runs the always-inliner: clang's alwaysinline threadIdx/blockDim wrappers are gone
    assert "__fetch_builtin_x" not in str(o0) and "__fetch_builtin_x" in str(vecadd)
    assert "llvm.nvvm.read.ptx.sreg.tid.x" in _kernel_ir(o3)


def test_size_levels_mark_functions_and_lower_the_inline_threshold(vecadd):
    os_ = optimize(vecadd.clone(), "default<Os>")
    oz = optimize(vecadd.clone(), "default<Oz>")
    assert " optsize " in str(os_) and " minsize " not in str(os_)
    assert " minsize " in str(oz) and " optsize " in str(oz)
    assert "alloca" not in _kernel_ir(oz)
    # llvmlite's setter declares a bool in C; LLVM's size thresholds (50, 5) still arrive intact
    for threshold in (50, 5, 250):
        pto = llvm.create_pipeline_tuning_options(speed_level=2)
        pto.inlining_threshold = threshold
        assert pto.inlining_threshold == threshold


def test_single_passes_run_in_order(vecadd):
    only_sroa = optimize(vecadd.clone(), "sroa")
    assert "alloca" not in _kernel_ir(only_sroa)
    dce = optimize(vecadd.clone(), "dce")
    assert "alloca" in _kernel_ir(dce)


def test_optimize_accepts_a_parsed_pipeline_and_levels_table_is_complete(vecadd):
    assert set(LEVELS) == {"O0", "O1", "O2", "O3", "Os", "Oz"}
    mod = optimize(vecadd.clone(), parse_pipeline("default<O2>"), arch="sm_80", codegen_opt=1)
    assert "alloca" not in _kernel_ir(mod)
