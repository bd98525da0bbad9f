"""Derived metrics (Kernel Tuner's habit): an expression over the kernel's recorded scalar arguments and the time."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from mneme.errors import ConfigurationError
from mneme.tune.derived import Derived, check, evaluate, parse_all, scalar_args

ROOT = Path(__file__).resolve().parent.parent
VECADD = next((ROOT / "tests" / "fixtures" / "vecadd").glob("*.json"))


def test_gbps_from_the_recorded_n_and_the_time():
    args = scalar_args(str(VECADD))
    assert set(args) == {"n"} and args["n"] > 0  # vecAdd(a, b, c, n): only n is a scalar
    defs = parse_all(["gbps = 3 * n * 4 / time_s / 1e9", "bytes = 3 * n * 4"])
    check(defs, args)
    got = evaluate(defs, args, time_ns=2000.0)
    assert got["bytes"] == 12 * args["n"] and got["gbps"] == pytest.approx(12 * args["n"] / 2e-6 / 1e9)
    assert evaluate(defs, args, time_ns=None) == {"bytes": 12 * args["n"]}  # compile-only: no time


@pytest.mark.parametrize("spec", ["x = __import__('os').system('true')", "x = n.real", "x = 'a' * 3", "no equals"])
def test_anything_but_arithmetic_is_refused(spec):
    with pytest.raises(ConfigurationError):
        Derived.parse(spec)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ConfigurationError, match=r"'m' is not a scalar argument .* known: n, time_ms"):
        check(parse_all(["x = m * 2"]), {"n": 1.0})


def test_hydra_run_logs_the_derived_metric(tmp_path):
    p = subprocess.run([sys.executable, "-m", "mneme", "+experiment=compile_only", f"record.db={VECADD}",
                        'metrics=["bytes = 3 * n * 4"]'], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"})
    assert p.returncode == 0, p.stderr[-3000:]
    n = scalar_args(str(VECADD))["n"]
    assert f"bytes={12 * n:.4g}" in p.stdout
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run, = client.search_runs([client.get_experiment_by_name("mneme").experiment_id])
    assert run.data.metrics["bytes"] == 12 * n


def _tune(tmp_path, *extra):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run([sys.executable, "-m", "mneme.cli", "tune", "-rdb", str(VECADD), "--devices", "none",
                           "--objective", "registers", "--space", "compiler", "--trials", "3", "--seed", "1", "--quiet",
                           "-o", str(tmp_path / "out"), *extra], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=env)


def test_mneme_tune_shows_derived_metrics_in_its_summary_and_logs_them_per_trial(tmp_path):
    n = scalar_args(str(VECADD))["n"]
    p = _tune(tmp_path, "--derived", "bytes = 3 * n * 4", "--derived", "gbps = 3 * n * 4 / time_s / 1e9")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"derived: bytes {12 * n:.4g} (baseline {12 * n:.4g})" in p.stdout, p.stdout  # compile-only: no time, no gbps
    summary = __import__("json").loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["derived"] == {"baseline": {"bytes": 12 * n}, "best": {"bytes": 12 * n}}
    assert f"derived: bytes {12 * n:.4g}" in (tmp_path / "out" / "summary.txt").read_text()
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("mneme").experiment_id], "tags.`mneme.role` != 'sweep'")
    assert len(runs) == 4 and all(r.data.metrics["bytes"] == 12 * n and "gbps" not in r.data.metrics for r in runs)


def test_mneme_tune_refuses_a_derived_metric_over_an_unknown_argument_before_any_work(tmp_path):
    p = _tune(tmp_path, "--no-track", "--derived", "gbps = 3 * size * 4 / time_s / 1e9")
    assert p.returncode == 2 and "'size' is not a scalar argument of the kernel or a time; known: n," in p.stderr, p.stderr
    assert not list((tmp_path / "out").glob("study.*"))
