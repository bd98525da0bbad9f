"""`mneme tune` logs to MLflow by default, through the tuner's observer hook, in real processes.

The GPU worker runs the tune tests' SyntheticBackend (there is no GPU here)."""

import socket
import subprocess
import sys

from mlflow import MlflowClient

from test_tune_support import backend, env_with_tests, write_record


def tune(cwd, *args, env=None):
    env = env_with_tests(env)
    env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{cwd}/mlflow.db")
    return subprocess.run(
        [sys.executable, "-m", "mneme.cli", "tune", "-rdb", "rec/saxpy.json", "--space", "quick", "--devices", "0",
         "--compile-jobs", "1", "-it", "4", "--quiet", "--backend", backend("SyntheticBackend"), "--seed", "2", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )


def test_tune_logs_one_parent_and_a_run_per_trial_and_resumes_under_it(tmp_path):
    write_record(tmp_path / "rec")
    p = tune(tmp_path, "--trials", "5", "--study", "s1", "-o", "out")
    assert p.returncode == 0, p.stderr
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("mneme")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("mneme.role") == "sweep"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED" and parent[0].info.run_name == "s1"
    assert parent[0].data.params["space"] == "quick" and parent[0].data.params["trials"] == "5"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    kernel = children[0].data.params["kernel"]
    assert kernel and "(" not in kernel  # the short name, an axis in MLflow's compare view
    assert [r.info.run_name for r in children if r.data.tags["mneme.role"] == "baseline"] == [f"{kernel} baseline"]
    trials = [r for r in children if r.data.tags["mneme.role"] == "trial"]
    assert len(trials) == 5
    for r in trials:  # named by kernel and what differs from the baseline, e.g. "saxpy b128 O2 #3"
        assert r.info.run_name.startswith(kernel + " ") and r.info.run_name.endswith(f" #{r.data.tags['mneme.trial']}")
        assert r.data.params["space"] == "quick" and r.data.params["instance"]
        assert r.info.end_time - r.info.start_time >= 0
    ok = [r for r in trials if r.info.status == "FINISHED"]
    assert ok and all(r.data.metrics["verified"] == 1 and "speedup" in r.data.metrics for r in ok)
    assert len(client.get_metric_history(ok[0].info.run_id, "exec_time_ns")) == 4
    files = {a.path for a in client.list_artifacts(parent[0].info.run_id)}
    assert {"speedup_over_trials.png", "best_config.yaml", "results"} <= files
    assert {a.path for a in client.list_artifacts(parent[0].info.run_id, "results")} >= {"results/summary.json", "results/best.json"}

    again = tune(tmp_path, "--trials", "7", "--study", "s1", "-o", "out", "--resume")
    assert again.returncode == 0, again.stderr
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs if r.data.tags.get("mneme.role") == "sweep"] == [parent[0].info.run_id]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    assert sum(r.data.tags["mneme.role"] == "trial" for r in children) == 7
    assert sum(r.data.tags["mneme.role"] == "baseline" for r in children) == 1
    # the resumed process's summary counts the first process's runs too, and its best cannot be worse
    after = client.get_run(parent[0].info.run_id).data.metrics
    assert after["runs"] == 8 and after["best_exec_time_ns"] <= parent[0].data.metrics["best_exec_time_ns"]
    assert len({r.data.tags["mneme.tracker"] for r in children}) == 2


def test_no_track_logs_nothing(tmp_path):
    write_record(tmp_path / "rec")
    p = tune(tmp_path, "--trials", "2", "-o", "out", "--no-track")
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_an_unreachable_store_stops_tune_before_any_work(tmp_path):
    write_record(tmp_path / "rec")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = tune(tmp_path, "--trials", "2", "-o", "out", env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"})
    assert p.returncode == 2
    assert f"127.0.0.1:{port}" in p.stderr and "--no-track" in p.stderr
    assert not (tmp_path / "out").exists()  # no study, no workers, no GPU
