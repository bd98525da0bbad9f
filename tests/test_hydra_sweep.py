"""`python -m mneme +experiment=sweep --multirun` end to end, in real processes: the Optuna sweeper, the
executor launcher with real worker processes, and a real MLflow store, read back through MlflowClient.

There is no GPU here, so the GPU workers run the tune tests' SyntheticBackend (a stand-in with a known
landscape: 512-thread blocks compute a wrong answer); everything else is the real thing.
"""

import re
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from mneme.tune import study as st
from mnemetest import read_artifact
from test_tune_support import backend, env_with_tests, write_record

SWEEP = ["+experiment=sweep", "record.db=rec/saxpy.json", f"executor.backend={backend('SyntheticBackend')}",
         "executor.devices=[0]", "executor.compile_jobs=1", "search_space=quick", "measure.iterations=3",
         "study.name=saxpy-quick", "sampler.seed=1"]


def run_app(cwd, *overrides, env=None, check=True):
    env = env_with_tests(env)
    env.pop("MLFLOW_TRACKING_URI", None)
    p = subprocess.run([sys.executable, "-m", "mneme", *overrides], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\n{p.stdout}\n{p.stderr[-5000:]}")
    return p


def mlflow_runs(cwd):
    client = MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    exp = client.get_experiment_by_name("mneme")
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]) if exp else []


def study_trials(cwd):
    s = st.load_study(st.open_storage(f"journal:{cwd}/multirun/sweep/studies.journal"), "saxpy-quick")
    return s, s.get_trials(deepcopy=False)


def counted(trials):
    """Trials that count toward study.trials (mneme.tune.study's rule)."""
    return [t for t in trials if t.state.name != "WAITING"
            and t.user_attrs.get("mneme.flag") not in ("rejected", "surplus", "retried")]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A sweep of 8 trials."""
    cwd = tmp_path_factory.mktemp("sweep")
    write_record(cwd / "rec")
    return cwd, run_app(cwd, *SWEEP, "study.trials=8")


def test_one_parent_run_with_the_baseline_and_every_trial_nested(swept):
    cwd = swept[0]
    client, runs = mlflow_runs(cwd)
    parents = [r for r in runs if r.data.tags.get("mneme.role") == "sweep"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["mneme.study"] == "saxpy-quick"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(runs) - 1
    base = [r for r in children if r.data.tags["mneme.role"] == "baseline"]
    assert len(base) == 1 and base[0].data.metrics["speedup"] == 1.0
    assert base[0].info.run_name == base[0].data.params["kernel"] + " baseline"
    s, trials = study_trials(cwd)
    assert s.user_attrs["mneme.mlflow_run_id"] == parent.info.run_id
    assert len(counted(trials)) == 8
    ran = {t.number for t in counted(trials) if "duplicate_of" not in t.user_attrs.get("mneme.result", {})}
    assert {int(r.data.tags["mneme.trial"]) for r in children if r.data.tags["mneme.role"] != "baseline"} == ran
    assert all(r.info.run_name.endswith(f" #{r.data.tags['mneme.trial']}") for r in children if r not in base)


def test_trial_runs_have_params_tags_metrics_and_artifacts(swept):
    cwd = swept[0]
    client, runs = mlflow_runs(cwd)
    trial = next(r for r in runs if r.data.tags.get("mneme.role") == "trial" and r.info.status == "FINISHED")
    p, t, m = trial.data.params, trial.data.tags, trial.data.metrics
    assert {"replay.block.x", "replay.grid.x", "replay.passes", "measure.iterations", "measure.warmup"} <= set(p)
    assert p["measure.iterations"] == "3"
    assert t["mneme.kernel"].startswith("saxpy(") and t["mneme.dynamic_hash"] == "d" * 16 and t["mneme.static_hash"]
    assert len(t["mneme.config_hash"]) == 64 and t["mneme.gpu"].startswith("synthetic")
    assert {"mneme.driver", "mneme.version", "mneme.git_commit", "mneme.code_hash"} <= set(t)
    for k in ("exec_time_median_ns", "exec_time_min_ns", "exec_time_mean_ns", "exec_time_std_ns", "verified",
              "speedup", "registers", "occupancy", "fidelity", "opt_time_s", "codegen_time_s", "obj_size_bytes"):
        assert k in m, k
    assert len(client.get_metric_history(trial.info.run_id, "exec_time_ns")) == 3
    files = {a.path for a in client.list_artifacts(trial.info.run_id)}
    assert {"config.yaml", "result.json"} <= files
    composed = read_artifact(client, trial.info.run_id, "config.yaml").decode()
    assert "name: sweep" in composed and f"x: {p['replay.block.x']}" in composed


def test_a_wrong_answer_is_a_failed_run_and_never_the_best(swept):
    cwd = swept[0]
    client, runs = mlflow_runs(cwd)
    failed = [r for r in runs if r.info.status == "FAILED"]
    assert failed, "the quick space has 512-thread blocks, which compute a wrong answer"
    assert all(r.data.tags["mneme.status"] == "failed_verification" and r.data.tags["mneme.error"] for r in failed)
    assert all("speedup" not in r.data.metrics for r in failed)
    parent = next(r for r in runs if r.data.tags.get("mneme.role") == "sweep")
    best = client.get_run(parent.data.tags["mneme.best_run_id"])
    assert best.info.status == "FINISHED" and best.data.metrics["verified"] == 1
    assert parent.data.metrics["best_speedup"] == pytest.approx(best.data.metrics["speedup"])
    files = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"best_config.yaml", "best_config.json", "speedup_over_trials.png", "pareto_time_registers.png"} <= files


def test_the_sweep_writes_the_tuners_results_directory(swept):
    cwd = swept[0]
    results = sorted((cwd / "multirun" / "sweep").glob("*/results/saxpy-quick"))
    assert len(results) == 1
    assert {"best.json", "best.sh", "trials.jsonl", "summary.json"} <= {p.name for p in results[-1].iterdir()}


def test_sweeps_over_other_keys_run_one_study_each_with_command_line_dimensions(tmp_path):
    write_record(tmp_path / "rec")
    run_app(tmp_path, *SWEEP, "search_space=params", "replay.codegen_opt=range(1,4)", "replay.block.x=choice(128,256)",
            "sampler=random,tpe", "study.trials=3")
    _, runs = mlflow_runs(tmp_path)
    parents = {r.info.run_name: r for r in runs if r.data.tags.get("mneme.role") == "sweep"}
    assert set(parents) == {"saxpy-quick-random", "saxpy-quick-tpe"}
    assert {r.data.tags["mneme.sampler"] for r in parents.values()} == {"random", "tpe"}
    trials = [r for r in runs if r.data.tags.get("mneme.role") == "trial"]
    assert trials and all(r.data.params["replay.block.x"] in ("128", "256") for r in trials)
    assert all(r.data.params["replay.codegen_opt"] in ("1", "2", "3") for r in trials)
    for name in parents:
        s = st.load_study(st.open_storage(f"journal:{tmp_path}/multirun/sweep/studies.journal"), name)
        # search_space/params.yaml's own dimensions, and the command line's (which wins for codegen_opt)
        assert set(s.trials[0].params) == {"replay.codegen_opt", "replay.block.x", "replay.passes"}
        assert len(counted(s.trials)) == 3


def test_an_unreachable_store_fails_the_sweep_before_any_job(tmp_path):
    write_record(tmp_path / "rec")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    p = run_app(tmp_path, *SWEEP, "study.trials=2", f"tracking.uri={uri}", check=False)
    assert p.returncode == 1
    assert f"MLflow tracking server {uri} is unreachable" in p.stderr and "tracking.enabled=false" in p.stderr
    assert not list((tmp_path / "multirun").glob("*/*/[0-9]*")) and not list((tmp_path / "multirun").glob("*/*/logs"))


def test_an_interrupted_sweep_leaves_no_running_run_and_resumes(tmp_path):
    write_record(tmp_path / "rec")
    env = env_with_tests({"MNEME_TEST_RUN_DELAY": "0.7"})
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([sys.executable, "-m", "mneme", *SWEEP, "study.trials=40", "study.batch_size=2"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        # job directories appear once the store is set up and jobs run: baseline, then trials
        while len(list((tmp_path / "multirun" / "sweep").glob("*/[0-9]*"))) < 4 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    _, runs = mlflow_runs(tmp_path)
    statuses = {r.info.status for r in runs}
    assert "RUNNING" not in statuses and statuses <= {"FINISHED", "FAILED", "KILLED"}
    parent = next(r for r in runs if r.data.tags.get("mneme.role") == "sweep")
    assert parent.info.status == "KILLED"
    _, trials = study_trials(tmp_path)
    assert not [t for t in trials if t.state.name == "RUNNING"]
    done = len(counted(trials))
    assert 0 < done < 40
    assert all(t.user_attrs["mneme.flag"] == "retried" for t in trials if t not in counted(trials) and t.state.name == "FAIL"
               and "reasons" not in t.user_attrs.get("mneme.result", {}))
    run_app(tmp_path, *SWEEP, f"study.trials={done + 2}", "study.resume=true", env={"MNEME_TEST_RUN_DELAY": "0"})
    _, runs = mlflow_runs(tmp_path)
    # the resumed study logs under the same parent run, which ends FINISHED this time
    assert [r.info.status for r in runs if r.data.tags.get("mneme.role") == "sweep"] == ["FINISHED"]
    assert "RUNNING" not in {r.info.status for r in runs}
    study, trials = study_trials(tmp_path)
    assert len(counted(trials)) == done + 2
    assert study.user_attrs["mneme.mlflow_run_id"] == parent.info.run_id


def test_sweep_ends_on_its_summary_and_results_path_with_overrides_in_the_job_logs(swept):
    cwd, p = swept
    tail = p.stdout.strip().splitlines()[-3:]
    results = next(line for line in tail if line.startswith("results: "))
    out = Path(results.split()[1])
    assert (out / "summary.txt").is_file() and (out / "best.sh").is_file()
    # the sweeper keeps which code the baseline compiled, as mneme tune does (not "the study predates ...")
    summary = (out / "summary.txt").read_text()
    assert re.search(r"^baseline code: (app-build|mneme-defaults) ", summary, re.M) and "predates" not in summary, summary
    hydra_file = Path(next(line for line in tail if line.startswith("Hydra: ")).split()[1])
    doc = yaml.safe_load(hydra_file.read_text())
    assert doc["best_params"]["replay.block.x"] > 0 and doc["results"] == str(out)
    assert "#0 :" not in p.stdout + p.stderr  # no per-job override dumps
    logs = sorted(cwd.glob("multirun/sweep/*/*/mneme.log"))
    assert logs and "overrides: " in logs[0].read_text() and "codegen_opt=" in logs[0].read_text()


def test_a_sweep_rerun_on_an_existing_study_is_told_the_hydra_keys(tmp_path):
    """The advice names the Hydra keys that continue or rename the study, not `mneme tune`'s flags."""
    write_record(tmp_path / "rec")
    run_app(tmp_path, *SWEEP, "study.trials=2")
    p = run_app(tmp_path, *SWEEP, "study.trials=2", check=False)
    assert p.returncode != 0
    assert "study 'saxpy-quick' already exists" in p.stderr and "study.resume=true" in p.stderr, p.stderr[-3000:]
    assert "study.name=NAME" in p.stderr and "--resume" not in p.stderr and "--study" not in p.stderr
