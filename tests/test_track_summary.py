"""The parent run of a sweep over two kernels, in a real MLflow store: a markdown description per kernel, the
best of each kernel (not one across kernels), per-kernel plots and the HTML report."""

import json

import pytest
from mlflow import MlflowClient

from mnemetest import read_artifact
from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings, dim3
from mneme.track.sweep import SweepRun
from mneme.track.tracker import Tracker

KERNELS = {"vecAdd(float const*, float*, int)": 1000, "stencil(float*, float const*)": 5000}


def _result(base_ns: int, i: int) -> ExperimentResult:
    ok = i != 3
    return ExperimentResult(exec_time=[base_ns - 40 * i + j for j in range(3)], executed=True, verified=ok,
                            status="verified" if ok else "failed_verification", reg_usage=20 + 2 * i, obj_size=2048,
                            start_time="2026-12-02T10:00:00.000+00:00", end_time="2026-12-02T10:00:00.250+00:00")


@pytest.fixture(scope="module")
def two_kernels(tmp_path_factory):
    d = tmp_path_factory.mktemp("summary")
    uri = f"sqlite:///{d}/mlflow.db"
    with Tracker(uri, "summary-test") as tracker:
        sweep = SweepRun.start(tracker, "two-kernels", tags={"mneme.output": "multirun/x/results"})
        for kernel, base_ns in KERNELS.items():
            base = ExperimentConfiguration(grid=dim3(64), block=dim3(256))
            sweep.baseline_config = None
            sweep.trial(-1, base, MeasurementSettings(), _result(base_ns, 0), role="baseline", baseline_ns=base_ns + 1,
                        kernel=kernel, dynamic_hash="d" * 20)
            for i in range(1, 5):
                cfg = ExperimentConfiguration(grid=dim3(64), block=dim3(32 * i), codegen_opt=3 - i % 2)
                sweep.trial(i, cfg, MeasurementSettings(), _result(base_ns, i), baseline_ns=base_ns + 1, kernel=kernel,
                            dynamic_hash="d" * 20)
        parent = sweep.run_id
        sweep.finish()
    return MlflowClient(uri), parent


def test_description_summarizes_each_kernel_in_markdown(two_kernels):
    client, parent = two_kernels
    note = client.get_run(parent).data.tags["mlflow.note.content"]
    assert "| vecAdd | 4 | 3 | 1 |" in note and "| stencil | 4 | 3 | 1 |" in note  # trials, verified, failed
    assert "vecAdd b128 #4" in note and "1.19x" in note, note  # best of vecAdd: 841 ns against 1001 ns
    assert "multirun/x/results" in note


def test_best_per_kernel_not_one_across_kernels(two_kernels, tmp_path):
    client, parent = two_kernels
    per = json.loads(read_artifact(client, parent, "best_per_kernel.json"))
    assert set(per) == {"vecAdd", "stencil"}
    assert per["stencil"]["run_name"] == "stencil b128 #4" and per["stencil"]["replay"]["block"]["x"] == 128
    assert "mneme.best_run_id" not in client.get_run(parent).data.tags


def test_plots_and_report_are_artifacts(two_kernels):
    client, parent = two_kernels
    files = {a.path for a in client.list_artifacts(parent)}
    assert {"speedup_over_trials.png", "pareto_time_registers.png", "report.html"} <= files
    page = read_artifact(client, parent, "report.html").decode()
    assert page.count("<tr>") == 1 + 10 and "<svg" in page and "median (µs)" in page and "block.x" in page


def test_trial_durations_are_the_results(two_kernels):
    client, parent = two_kernels
    kids = client.search_runs([client.get_run(parent).info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert kids and all(r.info.end_time - r.info.start_time == 250 for r in kids)
