"""The baseline is the app's code (issue 16): build settings recorded by `mneme nvcc`/`mneme cc` read back, map
onto the replay configuration, and the replay compiled that way is the app's code (real clang-22, llvmlite,
ptxas, nvlink; PTX read back; the app's SASS from cuobjdump, the dev extra's nvidia-cuda-cuobjdump)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mnemetest import FIXTURES, ROOT, run_mneme
from mneme.cc.embedded import BUILD_VERSION, EmbeddedModule, read_embedded, recorded_build
from mneme.config import ExperimentConfiguration
from mneme.ir import compile_kernel, link_modules
from mneme.ir.appbuild import APP_BUILD, MNEME_CODE, MNEME_DEFAULTS, from_build, mneme_defaults
from mneme.record.kerneltable import IRIndex
from mneme.replay import sassdiff

EXAMPLES = ROOT / "examples"
RDC_MATMUL = "_Z12matmulTile32PKfS0_Pfi"
FAST = "_Z8fastMathPKfPfii"
RDC_APPLY = "_Z8rdcApplyPKfPfi"
APPS = ["nvcc_matmul_rdc", "nvcc_fastmath", "nvcc_precmath", "rdc"]


@pytest.fixture(scope="module")
def bins(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("baseline")
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CXXFLAGS", "MAKEFLAGS")}
    p = subprocess.run(["make", "-C", str(EXAMPLES), f"MNEME={sys.executable} -m mneme.cli", f"BIN={out}/bin",
                        f"OBJ={out}/obj", *[f"{out}/bin/{a}" for a in APPS]], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return out / "bin"


def closure(binary: Path, kernel: str):
    index = IRIndex()
    index.add_file(binary)
    return index.closure(kernel)


def replay(binary: Path, kernel: str, baseline=None):
    """The kernel compiled as the replay pipeline compiles it under `baseline` (default: the app's build)."""
    ir = closure(binary, kernel)
    b = baseline or from_build(ir.build, "sm_90", "", ir.other_unit_functions)
    cfg = b.apply(ExperimentConfiguration())
    mod = link_modules([ir.bitcode], kernel, internalize=cfg.internalize)
    return b, compile_kernel(mod, kernel, cfg, cache=False, no_inline=ir.other_unit_functions)


def app_ptx(tmp: Path, *flags: str) -> str:
    out = tmp / "app.ptx"
    run_mneme("nvcc", "-O3", "-std=c++17", "-arch=sm_90", *flags, "-ptx", "-o", out, EXAMPLES / "fastmath.cu")
    return out.read_text()


def body(ptx: str):
    """The kernel's PTX from its .entry on (header and comments left out)."""
    lines = (ln.split("//", 1)[0].strip() for ln in ptx.split(".entry", 1)[1].splitlines())
    # labels and the local frame are numbered by the function's place in the module, which differs
    return [re.sub(r"(\$L__BB|__local_depot)\d+", r"\1", ln) for ln in lines if ln]


def ops(ptx: str):
    return set(re.findall(r"\b((?:div|sqrt)\.[\w.]+)", ptx))


# -- the settings read back ----------------------------------------------------------------------------------
def test_nvcc_records_the_settings_that_change_code(bins):
    fast = recorded_build(read_embedded(bins / "nvcc_fastmath")[0])
    assert fast["version"] == BUILD_VERSION and fast["compiler"] == "nvcc" and fast["arch"] == "sm_90"
    assert fast["fast_math"] and fast["ftz"] and not fast["prec_div"] and not fast["prec_sqrt"] and fast["fmad"]
    assert fast["ptxas_opt"] == 3 and not fast["relocatable"]
    prec = recorded_build(read_embedded(bins / "nvcc_precmath")[0])
    assert prec["prec_div"] and prec["prec_sqrt"] and not prec["ftz"]
    assert prec["maxrregcount"] == 32 and prec["ptxas"] == ["-dlcm=ca"]
    rdc = recorded_build(read_embedded(bins / "nvcc_matmul_rdc")[0])
    assert rdc["rdc"] and rdc["relocatable"] and not rdc["dlto"]
    cc = recorded_build(read_embedded(bins / "rdc")[0])
    assert cc["compiler"] == "cc" and cc["opt_level"] == "3" and cc["ptxas_opt"] == 3 and cc["relocatable"]
    assert cc["prec_sqrt"] is False, "clang approximates sqrtf unless told"


def test_settings_map_onto_the_replay_configuration(bins):
    fast = from_build(closure(bins / "nvcc_fastmath", FAST).build, "sm_90")
    assert fast.kind == APP_BUILD and fast.fields["prec_div"] is False and fast.fields["prec_sqrt"] is False
    assert fast.fields["fast_math"] is False, "nvcc's fast math is ftz + approximate div/sqrt, not LLVM's fast flags"
    assert fast.fields["passes"] == "default<O3>" and fast.fields["ptxas_opt"] == -1 and fast.fields["whole_program"]
    prec = from_build(closure(bins / "nvcc_precmath", FAST).build, "sm_90")
    assert prec.fields["max_regs"] == 32 and prec.fields["dlcm"] == "ca" and prec.fields["prec_sqrt"] is True
    assert "maxrregcount=32" in prec.describe() and "prec-sqrt" in prec.describe()
    ir = closure(bins / "nvcc_matmul_rdc", RDC_MATMUL)
    rdc = from_build(ir.build, "sm_90", "", ir.other_unit_functions)
    assert rdc.fields["whole_program"] is False and rdc.fields["internalize"] is False
    assert rdc.fields["cross_unit_inline"] is True, "one translation unit: nothing of another unit to keep a call to"
    assert rdc.describe().startswith("app-build (nvcc -O3, fmad") and "rdc (ptxas -c + nvlink)" in rdc.describe()
    two = closure(bins / "rdc", RDC_APPLY)
    assert two.other_unit_functions == ["_Z13rdc_transformf"]
    assert from_build(two.build, "sm_90", "", two.other_unit_functions).fields["cross_unit_inline"] is False


def test_the_ir_carries_ftz_and_is_read_for_it(bins):
    ir = closure(bins / "nvcc_fastmath", FAST)
    from mneme.ir.appbuild import ir_facts
    from mneme.ir.module import parse_module

    assert ir_facts(str(parse_module(ir.bitcode)))["ftz"] is True
    b = from_build(ir.build, "sm_90", str(parse_module(ir.bitcode)))
    assert "ftz" in b.words and not b.notes


# -- the replay's code is the app's --------------------------------------------------------------------------
def test_fast_math_build_replays_approximate_div_and_sqrt_with_ftz(bins, tmp_path):
    _, ck = replay(bins / "nvcc_fastmath", FAST)
    assert {"div.approx.ftz.f32", "sqrt.approx.ftz.f32"} <= ops(ck.ptx) and not {"div.rn.f32", "sqrt.rn.f32"} & ops(ck.ptx)
    assert body(ck.ptx) == body(app_ptx(tmp_path, "--use_fast_math")), "the replay's PTX is the app's"
    _, mine = replay(bins / "nvcc_fastmath", FAST, mneme_defaults("test"))
    assert "div.approx.ftz.f32" not in ops(mine.ptx), "mneme's defaults divide exactly"


def test_precise_build_replays_ieee_div_and_sqrt(bins, tmp_path):
    _, ck = replay(bins / "nvcc_precmath", FAST)
    assert {"div.rn.f32", "sqrt.rn.f32"} <= ops(ck.ptx)
    assert body(ck.ptx) == body(app_ptx(tmp_path, "-maxrregcount=32", "-Xptxas", "-dlcm=ca"))
    assert ck.cubin.registers <= 32
    _, mine = replay(bins / "nvcc_precmath", FAST, mneme_defaults("test"))
    assert "sqrt.approx.f32" in ops(mine.ptx), "mneme's default (clang's) approximates sqrtf"


@pytest.mark.parametrize("app,kernel", [("nvcc_matmul_rdc", RDC_MATMUL), ("nvcc_fastmath", FAST),
                                        ("nvcc_precmath", FAST), ("rdc", RDC_APPLY)])
def test_the_replays_sass_is_the_apps(bins, tmp_path, app, kernel):
    assert sassdiff.find_cuobjdump(), "cuobjdump missing: pip install -e '.[dev]' (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)"
    _, ck = replay(bins / app, kernel)
    cubin = tmp_path / "replay.cubin"
    cubin.write_bytes(ck.cubin.cubin)
    d = sassdiff.compare(sassdiff.kernel_sass(str(bins / app), kernel, "sm_90"),
                         sassdiff.kernel_sass(str(cubin), kernel, "sm_90"))
    assert d["same_code"] and d["same_mix"] and d["registers"]["app"] == d["registers"]["replay"], d


def test_mnemes_defaults_are_not_the_rdc_apps_code(bins, tmp_path):
    """The corpus case: built -rdc, the app's shared loads are scalar; mneme's whole program vectorizes them."""
    _, ck = replay(bins / "nvcc_matmul_rdc", RDC_MATMUL, mneme_defaults("test"))
    cubin = tmp_path / "mine.cubin"
    cubin.write_bytes(ck.cubin.cubin)
    app = sassdiff.kernel_sass(str(bins / "nvcc_matmul_rdc"), RDC_MATMUL, "sm_90")
    mine = sassdiff.kernel_sass(str(cubin), RDC_MATMUL, "sm_90")
    d = sassdiff.compare(app, mine)
    assert not d["same_mix"] and d["mix_differs"]["LDS.128"]["app"] == 0 and d["mix_differs"]["LDS.128"]["replay"] > 0
    assert "DIFFERENT" in sassdiff.render({"found": True, "app_binary": "x", **d})


# -- older builds and records ---------------------------------------------------------------------------------
def test_a_binary_without_settings_falls_back_to_mnemes_defaults_and_says_why():
    old = EmbeddedModule(name="a.cu", source="/a.cu", arch="sm_90", sha256="0" * 64, bitcode=b"", meta={"name": "a.cu"})
    assert recorded_build(old) is None
    b = from_build(recorded_build(old), "sm_90")
    assert b.kind == MNEME_DEFAULTS and "rebuild" in b.reason and b.fields == MNEME_CODE
    assert b.describe().startswith("mneme-defaults (the record has no build settings")
    assert from_build({"compiler": "unknown"}).kind == MNEME_DEFAULTS


def test_version_1_settings_take_the_drivers_ptxas_level():
    v1 = {"compiler": "cc", "opt_level": "2", "fmad": True, "prec_div": True, "prec_sqrt": False, "ptxas": [], "rdc": False}
    b = from_build(v1, "sm_90")
    assert b.fields["passes"] == "default<O2>" and b.fields["codegen_opt"] == 2 and b.fields["ptxas_opt"] == -1
    none = from_build({**v1, "opt_level": "0"}, "sm_90")
    assert none.fields["passes"] == "default<O0>" and none.fields["codegen_opt"] == 0


def test_ptxas_options_are_read_and_the_rest_named():
    b = from_build({"compiler": "nvcc", "opt_level": "3", "ptxas": ["-O1", "--maxrregcount=40", "-dlcm=cg", "-v",
                                                                     "--allow-expensive-optimizations=true", "-warn-spills",
                                                                     "--extensible-whole-program"]}, "sm_80")
    f = b.fields
    assert f["ptxas_opt"] == 1 and f["max_regs"] == 40 and f["dlcm"] == "cg" and f["expensive_opts"] is True
    assert any("--extensible-whole-program" in n for n in b.notes), b.notes
    assert any("built for" not in n for n in b.notes)
    assert from_build({"compiler": "nvcc", "opt_level": "3", "arch": "sm_80"}, "sm_90").notes[-1].startswith(
        "the app was built for sm_80")


# -- mneme replay: the baseline field, --baseline, --sass-diff -----------------------------------------------------
@pytest.fixture
def rdc_db(bins, tmp_path) -> Path:
    """The committed rdc fixture (recorded before build settings were) with the settings its build records today."""
    src = FIXTURES / "rdc"
    dst = tmp_path / "rdc"
    shutil.copytree(src, dst)
    (db,) = [p for p in dst.glob("*.json")]
    ir = closure(bins / "rdc", RDC_APPLY)
    data = json.loads(db.read_text())
    data["BuildSettings"], data["OtherUnitFunctions"] = ir.build, ir.other_unit_functions
    data["Provenance"]["runs"][0]["exe"] = str(bins / "rdc")
    db.write_text(json.dumps(data))
    return db


def test_mneme_replay_reports_which_baseline_it_compiled(rdc_db):
    p = run_mneme("replay", "-rdb", rdc_db, "--compile-only", "--json", "-")
    doc = json.loads(p.stdout)
    assert doc["baseline"] == APP_BUILD and doc["config"]["whole_program"] is False
    assert doc["config"]["cross_unit_inline"] is False and doc["config"]["internalize"] is False
    assert "baseline   app-build (cc -O3" in p.stderr
    mine = json.loads(run_mneme("replay", "-rdb", rdc_db, "--compile-only", "--baseline", "mneme-defaults",
                                "--json", "-").stdout)
    assert mine["baseline"] == MNEME_DEFAULTS and mine["baseline_detail"]["reason"] == "asked for"
    assert mine["result"]["code_hash"] != doc["result"]["code_hash"]
    old = json.loads(run_mneme("replay", "-rdb", next((FIXTURES / "vecadd").glob("*.json")), "--compile-only",
                               "--json", "-").stdout)
    assert old["baseline"] == MNEME_DEFAULTS and "no build settings" in old["baseline_detail"]["reason"]


def test_mneme_replay_sass_diff_compares_with_the_apps_binary(rdc_db):
    p = run_mneme("replay", "-rdb", rdc_db, "--compile-only", "--sass-diff", "--json", "-")
    doc = json.loads(p.stdout)["sass_diff"]
    assert doc["found"] and doc["same_code"], doc
    assert "sass-diff  identical code" in p.stderr
    mine = json.loads(run_mneme("replay", "-rdb", rdc_db, "--compile-only", "--baseline", "mneme-defaults",
                                "--sass-diff", "--json", "-").stdout)["sass_diff"]
    assert not mine["same_code"] and "CALL.ABS.NOINC" in mine["mix_differs"], "the app calls rdc_transform"


# -- mneme tune: the baseline trial is the app's code, the space keeps mneme's defaults --------------------------
def test_the_space_keeps_mnemes_defaults_as_a_point():
    from mneme.config import dim3
    from mneme.tune.presets import preset_space
    from mneme.tune.space import SpaceContext

    code = from_build({"compiler": "nvcc", "opt_level": "3", "rdc": True, "maxrregcount": 64}, "sm_90")
    base = code.apply(ExperimentConfiguration(grid=dim3(64), block=dim3(256)))
    space = preset_space("quick", SpaceContext(base, code=code))
    assert space.dimensions()["code"].domain()["choices"] == [APP_BUILD, MNEME_DEFAULTS]
    launch = next(iter(space.shapes))
    app = space.derived({"launch": launch, "passes": "default<O3>", "code": APP_BUILD})
    mine = space.derived({"launch": launch, "passes": "default<O3>", "code": MNEME_DEFAULTS})
    assert app.max_regs == 64 and not app.whole_program and app.prec_sqrt
    assert mine.max_regs == 0 and mine.whole_program and mine.internalize and not mine.prec_sqrt
    assert "code" not in preset_space("quick", SpaceContext(base)).dimensions(), "without a build: nothing to add"


def test_mneme_tune_says_which_code_the_baseline_was(rdc_db, tmp_path):
    out = tmp_path / "tune"
    p = run_mneme("tune", "-rdb", rdc_db, "--devices", "none", "--objective", "registers", "--space", "quick",
                  "--sampler", "random", "--trials", "4", "--no-track", "--quiet", "-o", out)
    assert "baseline code: app-build (cc -O3, fmad" in (out / "summary.txt").read_text(), p.stdout
    base = json.loads((out / "baseline.json").read_text())
    assert base["config"]["whole_program"] is False and base["code"]["kind"] == APP_BUILD
    assert "code" in json.loads((out / "space.json").read_text())["dimensions"]
