"""Verification that knows nondeterminism, on the H200 (docs/VERIFY.md): the float-atomics example
verifies with a tolerance learned from baseline replays, the work queue's owner log is skipped as
scratch with evidence, and deliberately wrong configurations of four different kernels still fail
with values in the message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BIN = ROOT / "examples" / "bin"
MNEME = [sys.executable, "-m", "mneme.cli"]
RUNS = 4


def _record(root: Path, name: str, *argv: str) -> Path:
    d = root / name
    p = subprocess.run([*MNEME, "record", "-rdb", str(d), "--", str(BIN / name), *argv],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"recording {name} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    from mneme.record.db import find_dbs

    dbs = find_dbs(str(d))
    assert len(dbs) == 1, dbs
    return Path(dbs[0])


@pytest.fixture(scope="module")
def dbs(tmp_path_factory) -> Dict[str, Path]:
    if not BIN.is_dir():
        pytest.fail(f"{BIN} is missing: build the examples with `make gpu-bundle` and carry examples/bin")
    root = tmp_path_factory.mktemp("rec-verify")
    return {"atomicsum": _record(root, "atomicsum"), "workqueue": _record(root, "workqueue"),
            "vecadd": _record(root, "vecadd"), "stencil2d": _record(root, "stencil2d")}


@pytest.fixture(scope="module")
def rows(dbs) -> Dict[str, Dict[str, dict]]:
    p = subprocess.run([sys.executable, str(HERE / "verify_runs.py"), str(RUNS), *map(str, dbs.values())],
                       capture_output=True, text=True, timeout=600)
    found: List[dict] = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert p.returncode == 0, f"verify_runs exited {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    out: Dict[str, Dict[str, dict]] = {}
    for name, db in dbs.items():
        out[name] = {r["variant"]: r for r in found if r["db"] == str(db)}
    return out


def _show(r: dict) -> str:
    return f"{r['kernel']} {r['variant']}: {r['status']}\n{r['verification'] or r['error']}"


def test_float_atomics_verify_with_a_tolerance_learned_from_baseline_runs(rows):
    by = rows["atomicsum"]
    for variant in ("O3", "O0", "O3-after"):
        assert by[variant]["verified"], _show(by[variant])
    v = by["O3"]["verification"]
    res_line = next(line for line in v.splitlines() if "arg res" in line)
    xnew_line = next(line for line in v.splitlines() if "arg xnew" in line)
    # the residual's last bits varied between identical runs: compared with the calibrated tolerance
    assert f"calibration: {RUNS + 1} runs" in res_line and "f32 |a-e| <=" in res_line, v
    assert "f32 from IR" in res_line
    # the Jacobi update itself is deterministic: compared exactly
    assert "exact on" in xnew_line and "|a-e|" not in xnew_line, v
    assert by["O3"]["max_abs_err"] >= 0.0


def test_the_work_queue_owner_log_is_skipped_as_scratch_with_evidence(rows):
    by = rows["workqueue"]
    for variant in ("O3", "O0", "O3-after"):
        assert by[variant]["verified"], _show(by[variant])
    v = by["O3"]["verification"]
    owner = next(line for line in v.splitlines() if "arg owner" in line)
    out = next(line for line in v.splitlines() if "arg out" in line)
    assert "as scratch" in owner and "poisoned" in owner and "identical runs" in owner, v
    assert "exact on" in out and "scratch" not in out, v


@pytest.mark.parametrize("name", ["atomicsum", "workqueue", "vecadd", "stencil2d"])
def test_a_deliberately_wrong_configuration_still_fails_with_values(rows, name):
    by = rows[name]
    bad = by["half-block"]
    assert bad["status"] == "failed_verification" and not bad["verified"], _show(bad)
    err = bad["error"]
    assert "FAIL blob" in err and "expected" in err and " got " in err, err
    assert "max abs err" in err and "to accept" in err or "computes something else" in err, err
    assert by["O3-after"]["verified"], _show(by["O3-after"])


def test_mneme_replay_takes_the_verification_flags(dbs, tmp_path):
    # 6 calibration replays, not 3: on the H200 (2026-12-03) jacobiStep's float-atomic residual once differed by
    # 0.5 where the recording and 3 replays had spread only 0.156 (3x that with margin 2 is 0.469); a range of 4
    # values is too small a sample of that order-dependent sum
    out = tmp_path / "r.json"
    p = subprocess.run([*MNEME, "replay", "-rdb", str(dbs["atomicsum"]), "--verify-runs", "6", "--verify-margin", "2",
                        "-it", "3", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert doc["settings"]["verify_runs"] == 6 and doc["settings"]["verify_margin"] == 2.0
    assert doc["result"]["verified"] and "calibration: 7 runs" in doc["result"]["verification"]
    assert "margin 2x" in doc["result"]["verification"]
    assert "verify " in p.stdout


def test_mneme_tune_trials_use_the_calibrated_verification(dbs, tmp_path):
    out = tmp_path / "tune"
    argv = [*MNEME, "tune", "-rdb", str(dbs["atomicsum"]), "--no-track", "--quiet", "--json", "-o", str(out),
            "--space", "launch", "--trials", "6", "--devices", "0", "--verify-runs", "3", "-it", "3"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=480)
    assert p.stdout.strip().startswith("{"), f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    summary = json.loads(p.stdout)
    assert summary["baseline"]["status"] == "verified", summary["baseline"]
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    executed = [r["result"] for r in rows if r.get("result") and r["result"].get("executed")]
    assert executed, rows
    for res in executed:  # every trial was judged under the calibration, and says how
        assert "calibration: 4 runs" in res["verification"], res["verification"]
        assert "arg res" in res["verification"]
    assert any(res["verified"] for res in executed)
