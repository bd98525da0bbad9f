"""Failed trials are reported with their reason in the tune summary (mneme/tune/failures.py): each failed
trial's number, status and the compiler's own words, and the reasons counted (issue 17: corpus trials that
ended as 25 bare `compile_error`s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mneme.config import ExperimentResult
from mneme.tune.failures import failure_reason, failures
from mneme.tune.report import TrialRow

ROOT = Path(__file__).resolve().parents[1]
PARSE_ERROR = ("kernel 'init': specialized IR does not parse (LLVM IR parsing error\n"
               "<string>:{}:1: error: Metadata id is already used\n)")


def row(number, status, error="", **params):
    res = ExperimentResult(status=status, error=error, failed=status != "verified", exec_time=[1])
    return TrialRow(number=number, state="COMPLETE", status=status, flag="", params=params, config=None,
                    config_hash="", result=res, values=None)


def test_reasons_name_the_compiler_line_and_fold_numbers():
    assert failure_reason(PARSE_ERROR.format(171)).endswith("| <string>:171:1: error: Metadata id is already used")
    assert failure_reason("CUDA_ERROR_ILLEGAL_ADDRESS in cuStreamSynchronize") == \
        "CUDA_ERROR_ILLEGAL_ADDRESS in cuStreamSynchronize"
    assert failure_reason("") == "no error text"
    rows = [row(0, "compile_error", PARSE_ERROR.format(171), unroll=2), row(1, "verified"),
            row(2, "compile_error", PARSE_ERROR.format(173), unroll=8),
            row(3, "runtime_error", "CUDA_ERROR_ILLEGAL_ADDRESS", launch="1x256x1")]
    f = failures(rows)
    assert f["total"] == 3 and f["listed"] == 3
    assert f["reasons"][0]["count"] == 2 and f["reasons"][0]["status"] == "compile_error"
    assert "Metadata id is already used" in f["reasons"][0]["reason"]
    assert f["reasons"][1] == {"status": "runtime_error", "count": 1, "reason": "CUDA_ERROR_ILLEGAL_ADDRESS"}
    assert [(t["number"], t["params"]) for t in f["trials"]] == [(0, {"unroll": 2}), (2, {"unroll": 8}),
                                                                 (3, {"launch": "1x256x1"})]


BAD_SPACE = '''
from dataclasses import replace
from mneme.config import dim3
from mneme.tune import SearchSpace
from mneme.tune.params import CategoricalParam

class BadPasses(SearchSpace):
    name = "badpasses"
    def __init__(self, ctx):
        super().__init__()
        self.ctx = ctx
    def dimensions(self):
        return {"passes": CategoricalParam("passes", ["default<O3>", "default<O2>", "no-such-pass"])}
    def derived(self, params):
        b = self.ctx.baseline
        return replace(b, grid=dim3.from_dict(b.grid), block=dim3.from_dict(b.block), passes=params["passes"])
'''


def test_tune_summary_reports_each_failed_trial_with_its_reason(tmp_path):
    """A real compile-only study (llvmlite, ptxas) whose space proposes a pipeline that does not exist."""
    (tmp_path / "badspace.py").write_text(BAD_SPACE)
    db = next((ROOT / "tests" / "fixtures" / "vecadd").glob("*.json"))
    argv = [sys.executable, "-m", "mneme.cli", "tune", "-rdb", str(db), "--devices", "none", "--objective", "registers",
            "--space-module", "badspace:BadPasses", "--sampler", "exhaustive", "--trials", "3", "--no-track", "--quiet",
            "--compile-jobs", "1", "--json", "-o", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    s = json.loads(p.stdout)
    assert s["trials"]["by_status"] == {"compiled": 2, "compile_error": 1}
    f = s["failures"]
    assert f["total"] == 1 and f["trials"][0]["params"] == {"passes": "no-such-pass"}
    assert f["reasons"][0]["status"] == "compile_error" and "unknown pass 'no-such-pass'" in f["reasons"][0]["reason"]
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert "1 x compile_error: " in text and "unknown pass" in text
