"""The baseline is the app's code (issue 16), on the H200: the examples built with settings that change code
(nvcc -rdc=true, --use_fast_math, nvcc's precise defaults with ptxas options, clang -fgpu-rdc across two
translation units) are recorded, replayed at their baseline, and the replay's SASS is compared with the app's
(`mneme replay --sass-diff`, cuobjdump of the binary). Each replay appends one line to
$OUT/baseline-fidelity.jsonl (or .gpu/): baseline, median, in-app median, fidelity, SASS verdict, registers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
MNEME = [sys.executable, "-m", "mneme.cli"]
EVIDENCE = Path(os.environ.get("OUT") or ROOT / ".gpu") / "baseline-fidelity.jsonl"
#: app argv (relative to examples/bin) and a substring of the kernel's name; sized to run >= 20 us on an H200
APPS = {
    "nvcc_matmul_rdc": (["nvcc_matmul_rdc", "1024"], "matmulTile32"),
    "nvcc_fastmath": (["nvcc_fastmath", str(1 << 22), "64"], "fastMath"),
    "nvcc_precmath": (["nvcc_precmath", str(1 << 22), "64"], "fastMath"),
    "rdc": (["rdc"], "rdcApply"),
}


@pytest.fixture(scope="module")
def recordings(tmp_path_factory, recorder):
    root = tmp_path_factory.mktemp("rec-baseline")
    return {name: recorder(name, argv, root) for name, (argv, _) in APPS.items()}


def replay(db: Path, *args: str) -> dict:
    p = subprocess.run([*MNEME, "replay", "-rdb", str(db), "--sass-diff", "--json", "-", "--iterations", "20", *args],
                       capture_output=True, text=True, timeout=600)
    assert p.stdout.strip().startswith("{"), f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    print(p.stderr)
    return json.loads(p.stdout)


def evidence(name: str, doc: dict) -> dict:
    r, s = doc["result"], doc.get("sass_diff") or {}
    row = {"app": name, "kernel": s.get("kernel"), "baseline": doc["baseline"],
           "baseline_description": doc["baseline_detail"]["description"], "status": r["status"],
           "median_ns": sorted(r["exec_time"])[len(r["exec_time"]) // 2] if r["exec_time"] else None,
           "fidelity": r["fidelity"] or None, "registers": s.get("registers"), "instructions": s.get("instructions"),
           "same_code": s.get("same_code"), "same_mix": s.get("same_mix"), "mix_differs": s.get("mix_differs")}
    EVIDENCE.parent.mkdir(parents=True, exist_ok=True)
    with EVIDENCE.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


@pytest.mark.parametrize("name", sorted(APPS))
def test_the_baseline_replays_the_apps_code(recordings, name):
    rec = recordings[name]
    assert rec.returncode == 0, rec.stdout + rec.stderr
    doc = replay(rec.db(APPS[name][1]))
    row = evidence(name, doc)
    assert doc["baseline"] == "app-build", doc["baseline_detail"]
    assert row["status"] == "verified", doc["result"]["error"]
    sass = doc["sass_diff"]
    assert sass["found"], sass
    assert sass["same_mix"] and sass["same_code"], sass["mix_differs"]
    assert sass["registers"]["app"] == sass["registers"]["replay"], sass["registers"]


def test_mnemes_defaults_differ_where_the_build_did(recordings):
    """Against mneme's defaults the rdc matmul gets 128-bit shared loads the app does not have, and fast math
    rounds differently from the recorded (fast-math) results."""
    mm = replay(recordings["nvcc_matmul_rdc"].db("matmulTile32"), "--baseline", "mneme-defaults")
    evidence("nvcc_matmul_rdc", mm)
    assert mm["baseline"] == "mneme-defaults" and mm["result"]["status"] == "verified"
    lds = mm["sass_diff"]["mix_differs"].get("LDS.128") or {}
    assert lds.get("app") == 0 and lds.get("replay", 0) > 0, mm["sass_diff"]
    fast = replay(recordings["nvcc_fastmath"].db("fastMath"), "--baseline", "mneme-defaults")
    evidence("nvcc_fastmath", fast)
    assert not fast["sass_diff"]["same_mix"]
    assert fast["result"]["status"] == "failed_verification", "IEEE division and sqrt do not round as the app's"


def test_the_tuner_measures_against_the_apps_code(recordings, tmp_path):
    db = recordings["nvcc_matmul_rdc"].db("matmulTile32")
    out = tmp_path / "tune"
    p = subprocess.run([*MNEME, "tune", "-rdb", str(db), "--baseline-only", "--no-track", "--quiet", "-o", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    text = (out / "summary.txt").read_text()
    assert "baseline code: app-build (nvcc -O3, fmad" in text and "rdc (ptxas -c + nvlink)" in text, text
    base = json.loads((out / "baseline.json").read_text())
    assert base["config"]["whole_program"] is False and base["code"]["kind"] == "app-build"
    assert base["result"]["status"] == "verified"
