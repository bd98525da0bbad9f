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
