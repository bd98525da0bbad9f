"""`mneme apply` on a real GPU: the examples run with their tuned kernels swapped in, pass their own checks,
keep the app's __constant__ and __device__ state, and the realized in-app speedup is compared with the
predicted one. Each test appends its summary to $OUT/apply-evidence.jsonl (or .gpu/apply-evidence.jsonl)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "examples" / "bin"
MNEME = [sys.executable, "-m", "mneme.cli"]

EVIDENCE = Path(os.environ.get("OUT") or ROOT / ".gpu") / "apply-evidence.jsonl"


def tune(db: Path, out: Path, *args, env=None) -> dict:
    p = subprocess.run([*MNEME, "tune", "-rdb", str(db), "--quiet", "--json", "-o", str(out), "--devices", "0",
                        "--seed", "1", *map(str, args)], capture_output=True, text=True, timeout=900, env=env)
    assert p.stdout.strip().startswith("{"), f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    s = json.loads(p.stdout)
    assert s["best"] is not None, why_no_best(out, s, p.stderr)
    print((out / "summary.txt").read_text())
    return s


def why_no_best(out: Path, s: dict, stderr: str) -> str:
    """The tune's summary, the baseline's and the first failed trials' errors (their verification verdicts)."""
    lines = [json.dumps(s.get("trials")), f"baseline: {json.dumps(s.get('baseline'))[:800]}"]
    base = out / "baseline.json"
    if base.is_file():
        res = json.loads(base.read_text()).get("result") or {}
        lines.append(f"baseline result: {res.get('status')}: {str(res.get('error'))[:2000]}")
    trials = out / "trials.jsonl"
    rows = [json.loads(t) for t in trials.read_text().splitlines()] if trials.is_file() else []
    for row in [r for r in rows if r.get("status") != "verified"][:3]:
        res = row.get("result") or {}
        lines.append(f"trial {row.get('number')}: {row.get('status')}: {str(res.get('error') or row)[:2000]}")
    return "\n".join(lines + [stderr[-3000:]])


def apply(tuned, argv, *flags, env=None, check=True):
    wd = Path(f"{tuned[0]}-apply-{len(flags)}-{'-'.join(map(str, flags))[:40]}")
    p = subprocess.run([*MNEME, "apply", *map(str, tuned), "--workdir", str(wd), "--app-timeout", "60",
                        *map(str, flags), "--",
                        str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=600, env=env)
    print(p.stdout[-6000:], p.stderr[-3000:])
    if check:
        assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    rep = json.loads((wd / "apply.json").read_text()) if (wd / "apply.json").is_file() else None
    return p, rep


def plain(argv):
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=300)


def checksum(text: str) -> str:
    m = re.search(r"checksum=(\S+)", text)
    assert m, text
    return m.group(1)


def keep(name: str, rep: dict, lines: str) -> None:
    EVIDENCE.parent.mkdir(parents=True, exist_ok=True)
    with open(EVIDENCE, "a") as fd:
        fd.write(json.dumps({"test": name, "apply": {k: rep[k] for k in ("kernels_applied", "app_ok", "wall_speedup",
                                                                          "kernels")},
                             "lines": [l for l in lines.splitlines() if l.startswith(("apply", "  launches"))]}) + "\n")


@pytest.fixture(scope="module")
def tuned_for(tmp_path_factory):
    """(record DB, tune results) per app command line and space, recorded and tuned once per module."""
    cache = {}

    def get(name, argv, space, trials, env=None):
        key = (tuple(argv), space, trials, bool(env))
        if key not in cache:
            root = tmp_path_factory.mktemp(name)
            _, db = recorded(name, argv, root)
            out = root / "tune"
            cache[key] = (db, out, tune(db, out, "--space", space, "--trials", trials,
                                        *([] if env else ["--no-track"]), env=env))
        return cache[key]

    return get


def recorded(name, argv, tmp_path):
    from mneme.record.db import find_dbs

    d = tmp_path / "rec" / name
    p = subprocess.run([*MNEME, "record", "-rdb", str(d), "--", str(BIN / argv[0]), *argv[1:]], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    (db,) = find_dbs(str(d))
    return p, Path(db)


@pytest.mark.parametrize("app, argv, space, trials", [
    ("vecadd", ["vecadd", str(1 << 24), "64"], "launch", 30),
    # 12 steps: 36 timed launches per mode over 3 rounds; with 2 steps (6) the realized share of a 5.8 % predicted
    # gain read 81 %, 103 % and 118 % on three H200 runs of the same code
    ("stencil2d", ["stencil2d", "4096", "4096", "12"], "compiler", 20),
])
def test_apply_realizes_the_tuned_speedup_in_the_app(app, argv, space, trials, tuned_for):
    db, out, s = tuned_for(app, argv, space, trials)
    # --check first (the tuned kernel's output equals the original's), then the timed rounds without it (a checked
    # launch runs right after the original on the same data: warmer caches than the observed run's)
    p, rep = apply([out], argv, "--check", 1)
    assert rep["app_ok"] and rep["entries"][0]["checked"] == 1 and not rep["check_failed"]
    p, rep = apply([out], argv, "--rounds", 3)
    assert rep["app_ok"] and rep["kernels_applied"] == 1
    assert checksum(p.stdout) == checksum(plain(argv).stdout)  # the app's own output, unchanged
    (e,) = rep["entries"]
    assert e["applied"] >= 3 and e["fell_back"] == 0 and e["applied"] == e["matched"]
    assert e["predicted"] == pytest.approx(s["best"]["speedup"])
    assert e["realized"] and e["original_ns"] > 0 and e["tuned_ns"] > 0
    keep(app, rep, p.stdout)
    if e["predicted"] >= 1.05:  # the bar: >= 90 % of the predicted gain
        assert e["gain_ratio"] >= 0.9, e


@pytest.mark.parametrize("app, argv, launches", [
    ("consttable", ["consttable", str(1 << 20)], 3),
    ("devcounter", ["devcounter", str(1 << 20), "256", "5"], 5),
])
@pytest.mark.parametrize("check", [0, 2])
def test_the_tuned_kernel_sees_and_leaves_the_apps_device_state(app, argv, launches, check, tuned_for, tmp_path):
    db, out, _ = tuned_for(app, argv, "launch", 8)
    # force a launch shape other than the recorded one, so the swapped-in kernel is visibly the tuned one
    w = yaml.safe_load((out / "wisdom.yaml").read_text())
    k = w["kernels"][0]
    k["config"]["block"]["x"], k["config"]["grid"]["x"] = 128, k["config"]["grid"]["x"] * k["config"]["block"]["x"] // 128
    k.pop("code_hash"), k["provenance"].pop("compile_cache", None)
    w["kernels"][0]["record"]["db"] = str(db)  # the copy lives elsewhere: an absolute path
    wpath = tmp_path / "w.yaml"
    wpath.write_text(yaml.safe_dump(w))
    p, rep = apply([wpath], argv, "--check", check)
    assert rep["app_ok"], p.stdout + p.stderr  # the app's own checks passed: tables and counters were right
    (e,) = rep["entries"]
    assert e["applied"] == launches and e["checked"] == min(check, launches)
    assert "was not found" not in p.stderr  # every variable was mirrored
    assert checksum(p.stdout) == checksum(plain(argv).stdout)
    keep(f"{app}-check{check}", rep, p.stdout)


def test_scaled_rule_applies_to_another_problem_size(tuned_for):
    db, out, _ = tuned_for("vecadd", ["vecadd", str(1 << 22)], "launch", 12)
    other = ["vecadd", str(3 * (1 << 22) + 17)]
    p, rep = apply([out], other, "--rule", "exact")
    assert rep["entries"][0]["matched"] == 0 and "no launch matched" in p.stdout
    p, rep = apply([out], other, "--rule", "scaled", "--check", 1)
    (e,) = rep["entries"]
    if "refused" in json.dumps(rep["notes"]):
        pytest.fail(f"the tune's best configuration does not allow scaling: {rep['notes']}")
    assert e["rule"] == "scaled" and e["applied"] == 1 and rep["app_ok"]
    assert checksum(p.stdout) == checksum(plain(other).stdout)


def test_a_cubin_that_fails_to_load_falls_back_with_a_warning(tuned_for, tmp_path):
    argv = ["vecadd"]
    db, out, _ = tuned_for("vecadd", argv, "quick", 4)
    w = yaml.safe_load((out / "wisdom.yaml").read_text())
    bad = tmp_path / "bad.cubin"
    bad.write_bytes(b"not a cubin")
    w["kernels"][0]["cubin"] = str(bad)
    w["kernels"][0]["record"]["db"] = str(db)  # the copy lives elsewhere: an absolute path
    wpath = tmp_path / "w.yaml"
    wpath.write_text(yaml.safe_dump(w))
    p, rep = apply([wpath], argv)
    assert "failed to load" in p.stderr and rep["app_ok"]
    assert rep["entries"][0]["fell_back"] == 1 and rep["entries"][0]["applied"] == 0


def test_check_stops_the_app_on_a_wrong_tuned_kernel(tuned_for, tmp_path):
    argv = ["vecadd"]
    db, out, _ = tuned_for("vecadd", argv, "quick", 4)
    w = yaml.safe_load((out / "wisdom.yaml").read_text())
    k = w["kernels"][0]
    k["config"]["block"]["x"], k["config"]["grid"]["x"] = 256, 1  # covers only the first 256 elements
    k.pop("code_hash"), k["provenance"].pop("compile_cache", None)
    w["kernels"][0]["record"]["db"] = str(db)  # the copy lives elsewhere: an absolute path
    wpath = tmp_path / "w.yaml"
    wpath.write_text(yaml.safe_dump(w))
    p, rep = apply([wpath], argv, "--check", 1, check=False)
    assert p.returncode == 86 and "--check failed" in p.stderr and "differs from the original" in p.stderr
    assert rep["check_failed"] and not rep["app_ok"]


def test_export_wisdom_apply_on_a_tracked_sweep(tmp_path):
    argv = ["vecadd", str(1 << 24)]
    rec, db = recorded("vecadd", argv, tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    tune(db, tmp_path / "tune", "--space", "launch", "--trials", 12, env=env)
    p = subprocess.run([*MNEME, "export", "-o", str(tmp_path / "w.yaml")], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    p, rep = apply([tmp_path / "w.yaml"], argv, "--track", env=env)
    assert rep["app_ok"] and rep["kernels_applied"] == 1
    from mlflow import MlflowClient

    c = MlflowClient(uri)
    w = yaml.safe_load((tmp_path / "w.yaml").read_text())
    sweep = w["kernels"][0]["provenance"]["sweep_run_id"]
    runs = c.search_runs([c.get_run(sweep).info.experiment_id], "tags.`mneme.role` = 'apply'")
    assert len(runs) == 1 and runs[0].data.tags["mlflow.parentRunId"] == sweep
    assert runs[0].data.metrics["app_ok"] == 1.0 and "k0.realized" in runs[0].data.metrics
    keep("export-vecadd", rep, p.stdout)


def test_a_kernel_inside_a_cuda_graph_is_applied_and_timed_by_ncu(tuned_for, tmp_path):
    """examples/graph.cu: graphStep captured into a graph launched 5 times. The swap happens at capture, where the
    in-app timer cannot time; `--timer auto` adds an observe/apply pair under Nsight Compute that does."""
    from mneme.record.db import RecordedExecution

    argv = ["graph", str(1 << 24), "5"]
    root = tmp_path / "graph"
    _, db = recorded("graph", argv, root)
    rec = RecordedExecution.from_json(str(db))
    inst = sorted((i for i in rec.values() if i.occ == 5), key=lambda i: i.dynamic_hash)[0]  # a graph node
    out = root / "tune"
    tune(db, out, "-rid", inst.dynamic_hash, "--space", "launch", "--trials", 12, "--no-track")
    p, rep = apply([out], argv)
    assert rep["app_ok"], p.stdout + p.stderr
    assert checksum(p.stdout) == checksum(plain(argv).stdout)
    (e,) = rep["entries"]
    assert e["applied"] >= 1 and e["fell_back"] == 0  # swapped in while the app captured the graph
    assert e["timer"] == "ncu", p.stdout + p.stderr
    assert e["original_ns"] > 0 and e["tuned_ns"] > 0 and 0.5 < e["realized"] < 2.0
    assert "under ncu" in p.stderr and "in-app (ncu)" in p.stdout
    keep("graph-ncu", rep, p.stdout)


def test_a_cooperative_launch_gets_the_tuned_kernel(tuned_for, tmp_path):
    """examples/cooperative.cu: coopSum launched with cudaLaunchCooperativeKernel (grid.sync). Its launch shape is
    fixed by launch safety, so the tuned kernel applies at the recorded shape (one block per SM: co-resident)."""
    argv = ["cooperative", str(1 << 24), "132"]
    db, out, _ = tuned_for("cooperative", argv, "compiler", 10)
    p, rep = apply([out], argv, "--check", 1)
    assert rep["app_ok"] and not rep["check_failed"], p.stdout + p.stderr
    (e,) = rep["entries"]
    assert e["matched"] == e["applied"] == e["checked"] == 1 and e["fell_back"] == 0, e
    p, rep = apply([out], argv, "--rounds", 2)
    (e,) = rep["entries"]
    assert e["applied"] == e["matched"] == 2 and e["fell_back"] == 0, p.stdout + p.stderr
    assert e["timer"] == "events" and e["realized"]
    assert float(checksum(p.stdout)) == pytest.approx(float(checksum(plain(argv).stdout)), rel=1e-4)
    keep("cooperative", rep, p.stdout)
