"""Binaries built here by `mneme nvcc` run on the GPU: nvcc's pipeline (-dc, the device-link object
made from clang's offloading sections, the host link by g++) registers the kernels and the __device__
variables of both translation units, with the static runtime (nvcc's default) and the shared one, and
the result equals the `mneme cc` build's; the shared-runtime build records with its IR."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

BIN = Path(__file__).resolve().parents[2] / "examples" / "bin"
MNEME = [sys.executable, "-m", "mneme.cli"]


def run_app(name, *args):
    if not (BIN / name).exists():
        pytest.fail(f"{BIN / name} is missing: build the examples with `make gpu-bundle` and carry examples/bin")
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("app", ["nvcc_rdc", "nvcc_rdc_shared"])
def test_nvcc_built_rdc_app_computes_what_the_cc_build_does(app):
    ref = run_app("rdc")
    got = run_app(app)
    assert ref.returncode == 0 and got.returncode == 0, got.stdout + got.stderr
    assert got.stdout == ref.stdout and got.stdout.startswith("checksum=")


def test_nvcc_built_app_records_with_its_ir(tmp_path):
    p = subprocess.run([*MNEME, "record", "-rdb", str(tmp_path / "rec"), "--", str(BIN / "nvcc_rdc_shared")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    from mneme.record.db import RecordedExecution, find_dbs

    names = [RecordedExecution.from_json(str(d), check_files=False).demangled_name for d in find_dbs(str(tmp_path / "rec"))]
    assert any("rdcApply" in n for n in names), names
