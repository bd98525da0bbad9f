"""scripts/mlflow_screenshot.py's choice of runs for the compare view, on a real MLflow store with a sweep per
kernel: finished trials only, an equal share of each of the latest sweeps, the latest sweep's name for the runs
page. (The browser part runs by hand: docs/EXPERIMENTS.md says how the screenshots in docs/img were made.)"""

import importlib.util
from pathlib import Path

import pytest

from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings, dim3
from mneme.track.sweep import SweepRun
from mneme.track.tracker import Tracker

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("mlflow_screenshot", ROOT / "scripts" / "mlflow_screenshot.py")
shot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shot)


def _result(i: int) -> ExperimentResult:
    ok = i != 2
    return ExperimentResult(exec_time=[1000.0 - 10 * i] * 3, executed=True, verified=ok,
                            status="verified" if ok else "failed_verification", reg_usage=20, obj_size=2048)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('shot')}/mlflow.db"
    ids = {}
    with Tracker(uri, "mneme") as tracker:
        for kernel in ("vecAdd(float const*, float*, int)", "stencil2d(float const*, float*, int, int)",
                       "reduce(float const*, float*)"):
            sweep = SweepRun.start(tracker, f"sweep-{kernel.split('(')[0]}")
            sweep.trial(-1, ExperimentConfiguration(grid=dim3(64), block=dim3(256)), MeasurementSettings(), _result(0),
                        role="baseline", baseline_ns=1000.0, kernel=kernel)
            for i in range(5):
                sweep.trial(i, ExperimentConfiguration(grid=dim3(64), block=dim3(32 * (i + 1))), MeasurementSettings(),
                            _result(i), baseline_ns=1000.0, kernel=kernel)
            ids[kernel.split("(")[0]] = sweep.run_id
            sweep.finish()
    return uri, ids


def test_trials_of_the_latest_sweeps_in_equal_shares(store):
    from mlflow import MlflowClient

    uri, ids = store
    exp, runs, name = shot.pick_runs(uri, "mneme", 6, sweeps=2)
    client = MlflowClient(uri)
    parents = [client.get_run(r).data.tags["mlflow.parentRunId"] for r in runs]
    assert name == "sweep-reduce" and exp == client.get_experiment_by_name("mneme").experiment_id
    assert parents == [ids["stencil2d"]] * 3 + [ids["reduce"]] * 3  # the older sweep first; vecAdd's is not the latest
    names = [client.get_run(r).info.run_name for r in runs]
    assert names[:3] == ["stencil2d b32 #0", "stencil2d b64 #1", "stencil2d b128 #3"], names  # #2 failed: not shown
    _, one, _ = shot.pick_runs(uri, "mneme", 8)
    assert len(one) == 4 and all(client.get_run(r).data.params["kernel"].startswith("reduce") for r in one)


def test_an_unknown_experiment_names_the_ones_there(store):
    with pytest.raises(SystemExit, match=r"no experiment 'nope' .*experiments: .*mneme"):
        shot.pick_runs(store[0], "nope", 4)
