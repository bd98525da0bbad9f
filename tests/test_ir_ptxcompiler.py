"""ptxas in-process (mneme.ir.ptxcompiler) gives the machine code and the log that the ptxas process gives."""

import re
from pathlib import Path

import pytest

from mneme.errors import CompileError
from mneme.ir import compile_kernel, ptxas, ptxcompiler
from mneme.ir.codegen import binary_digest
from mneme.replay.pipeline import ReplayPipeline

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ["vecadd", "matmul", "stencil2d", "rdc"]
FLAGS = [[], ["--maxrregcount=32"], ["-dlcm=cg", "--allow-expensive-optimizations=true"], ["--fmad=false"]]
_TIME = re.compile(r"^ptxas info\s*: Compile time = .*$", re.M)

pytestmark = pytest.mark.skipif(
    ptxcompiler.library_version() is None or ptxas.find_ptxas() is None,
    reason="no in-process PTX compiler (make native builds it from libnvptxcompiler_static.a) or no ptxas",
)


@pytest.fixture(scope="module")
def ptx_of():
    out = {}
    for ex in KERNELS:
        db = sorted((ROOT / "tests" / "fixtures" / ex).glob("*.json"))[0]
        pipe = ReplayPipeline(str(db), None, device_id=None)
        out[ex] = compile_kernel(pipe.linked(), pipe.kernel_name, pipe.baseline_config(), arch=pipe.arch,
                                 cache=False).ptx
    return out


def _both(monkeypatch, ptx, flags, opt=3):
    monkeypatch.setenv(ptxcompiler.ENV, "0")
    process = ptxas.assemble(ptx, "sm_90", opt, "serial", extra=flags)
    monkeypatch.setenv(ptxcompiler.ENV, "1")
    assert ptxcompiler.library(ptxas.ptxas_version(ptxas.find_ptxas())) is not None
    return process, ptxas.assemble(ptx, "sm_90", opt, "serial", extra=flags)


@pytest.mark.parametrize("kernel", KERNELS)
def test_in_process_gives_the_machine_code_and_log_of_the_process(ptx_of, monkeypatch, kernel):
    for flags in FLAGS:
        (cub_p, log_p), (cub_i, log_i) = _both(monkeypatch, ptx_of[kernel], flags)
        assert binary_digest(cub_i) == binary_digest(cub_p), flags
        assert _TIME.sub("", log_i) == _TIME.sub("", log_p) and "Used" in log_i
        assert ptxas.parse_log(log_i, cub_i) == ptxas.parse_log(log_p, cub_p)
    (cub_p, _), (cub_i, _) = _both(monkeypatch, ptx_of[kernel], [], opt=1)
    assert binary_digest(cub_i) == binary_digest(cub_p)


def test_rejected_ptx_says_what_ptxas_says(ptx_of, monkeypatch):
    bad = ptx_of["vecadd"].replace("ret;", "frobnicate.u32 %r1;", 1)
    monkeypatch.setenv(ptxcompiler.ENV, "0")
    with pytest.raises(CompileError) as process:
        ptxas.assemble(bad, "sm_90", 3, "serial")
    monkeypatch.setenv(ptxcompiler.ENV, "1")
    with pytest.raises(CompileError) as inproc:
        ptxas.assemble(bad, "sm_90", 3, "serial")
    assert "in-process" in str(inproc.value) and "frobnicate" in str(inproc.value)
    assert str(process.value).split("(")[0] == str(inproc.value).split("(")[0] == "ptxas "
    assert "frobnicate" in str(process.value)


def test_the_library_stands_in_only_for_its_own_version_and_can_be_switched_off(monkeypatch):
    version = ptxas.ptxas_version(ptxas.find_ptxas())
    assert ptxcompiler.library_version() == version  # built from the archive of the ptxas in use
    assert ptxcompiler._load("0.0.1") is None
    monkeypatch.setenv(ptxcompiler.ENV, "0")
    assert ptxcompiler.library(version) is None
