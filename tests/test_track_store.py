"""Tracking against a real MLflow store (SQLite in a temp dir), read back through MlflowClient."""

import socket
import subprocess
import sys
import time

import pytest
from mlflow import MlflowClient

from mnemetest import read_artifact
from mneme import cli
from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings, dim3
from mneme.errors import ConfigurationError
from mneme.track.store import check_store, resolve_uri
from mneme.track.sweep import SweepRun
from mneme.track.tracker import Tracker

EXP = "track-test"


def _result(i: int) -> ExperimentResult:
    ok = i % 4 != 3
    return ExperimentResult(
        exec_time=[1000 - 10 * i + j for j in range(5)], executed=True, verified=ok,
        status="verified" if ok else "failed_verification", error="" if ok else f"mismatch in trial {i}",
        reg_usage=16 + i, local_mem_usage=0, obj_size=2048, opt_time=0.01, cubin_time=0.03, occupancy=0.5,
        fidelity=0.97, gpu_name="NVIDIA H200",
    )


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory):
    """One sweep of 8 trials logged through two writer processes; returns (uri, parent run id, client)."""
    d = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{d}/mlflow.db"
    with Tracker(uri, EXP, writers=2) as tracker:  # two writer processes share the store
        sweep = SweepRun.start(tracker, "sweep-a", params={"space": "launch", "trials": 8}, tags={"mneme.study": "a"})
        for i in range(8):
            cfg = ExperimentConfiguration(grid=dim3(64 // (i + 1) + 1), block=dim3(32 * (i + 1)))
            sweep.trial(i, cfg, MeasurementSettings(iterations=5), _result(i), baseline_ns=1000.0, name=f"trial-{i}",
                        kernel="_Z6vecaddPfS_S_i", static_hash="st", dynamic_hash="dy",
                        artifacts={"kernel.ptx": f"// ptx {i}", "kernel.cubin": b"\x7fELF" + bytes([i])})
        parent = sweep.run_id
        sweep.finish()
        assert tracker.stats()["messages"] == 1 + 8 + 2  # start, one per trial, summary, end
    import mlflow

    from mneme.track.bulk import verified_release

    # the table writer on the MLflow releases it was verified on, MLflow's public API on the others
    want = "bulk-sql" if verified_release(mlflow.__version__) else "client (MLflow "
    assert tracker.report["errors"] == [] and tracker.report["path"].startswith(want)
    return uri, parent, MlflowClient(uri)


def test_trials_nest_under_one_parent_with_params_tags_metrics(sweep_store):
    uri, parent, client = sweep_store
    exp = client.get_experiment_by_name(EXP)
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert len(children) == 8
    r = next(c for c in children if c.info.run_name == "trial-2")
    assert r.info.status == "FINISHED"
    assert r.data.params["replay.block.x"] == "96" and r.data.params["measure.iterations"] == "5"
    t = r.data.tags
    assert t["mneme.kernel"] == "_Z6vecaddPfS_S_i" and t["mneme.gpu"] == "NVIDIA H200"
    assert t["mneme.config_hash"] == ExperimentConfiguration(grid=dim3(22), block=dim3(96)).hash()
    m = r.data.metrics
    assert m["exec_time_median_ns"] == 982.0 and m["registers"] == 18 and m["verified"] == 1
    assert m["speedup"] == pytest.approx(1000 / 982)
    history = client.get_metric_history(r.info.run_id, "exec_time_ns")
    assert sorted((h.step, h.value) for h in history) == [(j, 980.0 + j) for j in range(5)]
    files = {a.path for a in client.list_artifacts(r.info.run_id)}
    assert files == {"kernel.ptx", "kernel.cubin", "config.yaml", "result.json"}
    assert r.data.params["kernel"] == "_Z6vecaddPfS_S_i" and r.data.params["instance"] == "dy"


def test_failed_trial_is_a_failed_run_with_its_error(sweep_store):
    _, parent, client = sweep_store
    exp = client.get_experiment_by_name(EXP)
    failed = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}' and attributes.status = 'FAILED'")
    assert sorted(r.info.run_name for r in failed) == ["trial-3", "trial-7"]
    assert failed[0].data.tags["mneme.error"].startswith("mismatch in trial")


def test_parent_gets_best_configuration_and_plots(sweep_store):
    _, parent, client = sweep_store
    p = client.get_run(parent)
    assert p.info.status == "FINISHED"
    assert p.data.params == {"space": "launch", "trials": "8"}
    assert p.data.metrics["runs"] == 8 and p.data.metrics["failed_runs"] == 2 and p.data.metrics["verified_runs"] == 6
    best = client.get_run(p.data.tags["mneme.best_run_id"])
    assert best.info.run_name == "trial-6"  # fastest verified (trial-7 is faster but failed verification)
    assert p.data.metrics["best_speedup"] == pytest.approx(1000 / 942)
    files = {a.path for a in client.list_artifacts(parent)}
    assert {"best_config.yaml", "best_config.json", "speedup_over_trials.png", "pareto_time_registers.png"} <= files
    assert read_artifact(client, parent, "pareto_time_registers.png")[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_summary_from_the_writers_rows_is_the_one_read_back_from_the_store(sweep_store):
    from mneme.track.summary import summarize_sweep

    _, parent, client = sweep_store
    p = client.get_run(parent)
    searched = summarize_sweep(client, parent)  # no rows: the children are searched in the store
    assert searched["run_id"] == p.data.tags["mneme.best_run_id"] and searched["run_name"] == "trial-6"
    assert client.get_run(parent).data.metrics["runs"] == p.data.metrics["runs"] == 8


def _compare(capsys, uri, *args):
    rc = cli.main(["compare", EXP, "--tracking-uri", uri, *args])
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out.out, out.err)


def test_compare_filters_and_formats(sweep_store, capsys):
    uri = sweep_store[0]
    p = _compare(capsys, uri, "--format", "csv", "--filter", "metrics.verified = 1")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[0].startswith("run,kernel,status,median_us,speedup") and "block.x" in lines[0]
    assert len(lines) == 1 + 6 and lines[1].startswith("trial-6,")  # best first
    head = lines[0].split(",")
    row = dict(zip(head, lines[1].split(",")))
    assert row["regs"] == "22" and row["block.x"] == "224"  # integers as integers, not 22.0
    assert float(row["median_us"]) == pytest.approx(0.942)  # µs (the runs log ns: 940..944)
    md = _compare(capsys, uri, "--best", "--format", "markdown")
    assert md.returncode == 0, md.stderr
    rows = md.stdout.strip().splitlines()
    assert rows[1].startswith("| ---") and len(rows) == 3 and "| trial-6 |" in rows[2]
    none = _compare(capsys, uri, "--kernel", "matmul")
    assert none.returncode == 0 and "(no runs)" in none.stdout
    bad = _compare(capsys, uri, "--filter", "metrics.verified ==== 1")
    assert bad.returncode == 2 and "--filter" in bad.stderr


def test_compare_names_known_experiments(sweep_store):
    """As a user runs it: the console script in its own process."""
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "compare", "nope", "--tracking-uri", sweep_store[0]],
                       capture_output=True, text=True)
    assert p.returncode == 2 and EXP in p.stderr


def test_compare_without_a_store_creates_none(tmp_path):
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "compare"], cwd=tmp_path, capture_output=True, text=True,
                       env={**__import__("os").environ, "MLFLOW_TRACKING_URI": ""})
    assert p.returncode == 2 and "no MLflow store at" in p.stderr and "mlflow.db" in p.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_ui_prints_the_runs_page_of_the_experiment_not_mlflows_traces_page(sweep_store, tmp_path):
    uri, parent, client = sweep_store
    exp_id = client.get_experiment_by_name(EXP).experiment_id
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "ui", EXP, "--tracking-uri", uri, "--port", "5123", "--print-url"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"http://127.0.0.1:5123/#/experiments/{exp_id}/runs?workflowType=machine_learning"
    none = subprocess.run([sys.executable, "-m", "mneme.cli", "ui", "--print-url"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ, "MLFLOW_TRACKING_URI": ""})
    assert none.returncode == 2 and "no MLflow store at" in none.stderr and not (tmp_path / "mlflow.db").exists()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_fails_fast_naming_the_fix():
    uri = f"http://127.0.0.1:{_closed_port()}"
    t = time.monotonic()
    with pytest.raises(ConfigurationError) as e:
        Tracker(uri, EXP).open()
    assert time.monotonic() - t < 10
    assert uri in str(e.value) and "tracking.enabled=false" in str(e.value)


def test_store_in_missing_directory_is_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        check_store(resolve_uri(f"sqlite:///{tmp_path}/no/such/dir/m.db"))


def test_default_store_is_mlflow_db_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_uri() == f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://example.invalid:5000")
    assert resolve_uri() == "http://example.invalid:5000"


def test_disabled_tracker_does_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with Tracker(enabled=False) as t:
        key = SweepRun.start(t, "x").trial(0, ExperimentConfiguration(), None, _result(0))
        assert key and not t.active
    assert not (tmp_path / "mlflow.db").exists()


def _writer_processes(uri: str) -> list:
    """pids of live writer processes (not zombies) whose command line names `uri`."""
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"mneme.track.writer" in cmd and uri.encode() in cmd and state != "Z":
            found.append(int(pid))
    return found


def test_writers_start_together_and_none_is_left_when_the_store_is_unusable(tmp_path):
    """The extra writers start with the first (importing MLflow meanwhile) and open the store only after it; a
    store the first cannot open stops them all."""
    good = f"sqlite:///{tmp_path}/good.db"
    tracker = Tracker(good, EXP, writers=3).open()
    assert len(_writer_processes(good)) == 3
    assert tracker.close().get("errors") == []
    uri = f"mysql://user@127.0.0.1:1/{tmp_path.name}"  # its driver is not installed: the first writer says so
    with pytest.raises(ConfigurationError, match="MySQLdb"):
        Tracker(uri, EXP, writers=3).open()
    deadline = time.monotonic() + 10
    while _writer_processes(uri) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _writer_processes(uri) == []


def test_a_file_that_is_not_a_database_is_refused_at_once(tmp_path):
    """MLflow itself would retry such a store for about 100 s; the check names the file and the fix."""
    bad = tmp_path / "mlflow.db"
    bad.write_bytes(b"half of a copied file" * 200)
    t = time.monotonic()
    with pytest.raises(ConfigurationError, match="not a usable SQLite database.*move it away"):
        Tracker(f"sqlite:///{bad}", EXP).open()
    assert time.monotonic() - t < 5
    good = f"sqlite:///{tmp_path}/real.db"
    Tracker(good, EXP).open().close()  # a real store, created and then checked again: accepted
    check_store(good)
