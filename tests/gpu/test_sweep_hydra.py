"""`python -m mneme +experiment=sweep --multirun` on a recorded example, on the GPU: every trial a Hydra
job run by the AsyncReplayExecutor's GPU worker, every job an MLflow run with every metric, tag and
artifact of the tracking spec; then `mneme tune` with tracking on, and `mneme compare` over both."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ITERATIONS = 12
TRIAL_METRICS = (
    "exec_time_median_ns", "exec_time_min_ns", "exec_time_mean_ns", "exec_time_std_ns",
    "preprocess_time_s", "opt_time_s", "codegen_time_s", "ptx_time_s", "cubin_time_s", "compile_time_s",
    "obj_size_bytes", "registers", "local_mem_bytes", "const_mem_bytes", "occupancy", "verified", "speedup",
    "fidelity",
)
TAGS = ("mneme.config_hash", "mneme.code_hash", "mneme.static_hash", "mneme.dynamic_hash", "mneme.kernel",
        "mneme.gpu", "mneme.driver", "mneme.version", "mneme.git_commit")


def _env() -> dict:
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _client(cwd: Path):
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{cwd}/mlflow.db")


def _check_trial(client, run) -> None:
    m, t = run.data.metrics, run.data.tags
    missing = [k for k in TRIAL_METRICS if k not in m]
    assert not missing, f"{run.info.run_name}: metrics missing {missing}"
    assert m["verified"] == 1 and m["exec_time_median_ns"] > 0 and m["occupancy"] > 0 and m["fidelity"] > 0
    assert m["registers"] > 0 and m["obj_size_bytes"] > 0
    assert len(client.get_metric_history(run.info.run_id, "exec_time_ns")) == ITERATIONS
    missing = [k for k in TAGS if not t.get(k)]
    assert not missing, f"{run.info.run_name}: tags missing {missing}"
    assert "H200" in t["mneme.gpu"] and t["mneme.driver"] != "none"
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"kernel.ll", "kernel.ptx", "kernel.cubin", "config.yaml", "result.json"} <= files, files


def test_hydra_sweep_logs_every_metric(big_recordings, tmp_path):
    db = big_recordings["vecadd"].db("vecAdd")
    p = subprocess.run(
        [sys.executable, "-m", "mneme", "+experiment=sweep", "--multirun", f"record.db={db}", "search_space=launch",
         "study.trials=24", "executor.devices=[0]", f"measure.iterations={ITERATIONS}", "sampler.seed=0"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=900,
    )
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    closing = _closing_lines(p.stdout)
    client = _client(tmp_path)
    exp = client.get_experiment_by_name("mneme")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("mneme.role") == "sweep"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    assert closing["speedup"] == pytest.approx(parent[0].data.metrics["best_speedup"], rel=0.01), closing
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    baseline = [r for r in children if r.data.tags.get("mneme.role") == "baseline"]  # named "vecAdd baseline"
    assert len(baseline) == 1 and baseline[0].data.metrics["speedup"] == 1.0
    assert baseline[0].info.run_name == "vecAdd baseline", baseline[0].info.run_name
    # configurations the study measured already are answered from it, without a job: fewer runs than trials
    verified = [r for r in children if r.data.metrics.get("verified") == 1]
    assert len(verified) >= 5, [(r.info.run_name, r.data.tags.get("mneme.status")) for r in children]
    for r in verified:
        _check_trial(client, r)
    for r in children:
        assert r.info.status in ("FINISHED", "FAILED")
        if r.info.status == "FAILED":
            assert r.data.tags.get("mneme.error")
    pm = parent[0].data.metrics
    assert pm["best_speedup"] >= 1.0 and pm["best_exec_time_ns"] > 0
    files = {a.path for a in client.list_artifacts(parent[0].info.run_id)}
    assert {"best_config.yaml", "best_config.json", "speedup_over_trials.png", "pareto_time_registers.png"} <= files
    table = subprocess.run([sys.executable, "-m", "mneme.cli", "compare", "--latest", "--best", "--format", "markdown"],
                           cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert table.returncode == 0 and "vecAdd" in table.stdout, table.stderr
    print(table.stdout)
    print(f"{len(children)} runs, {len(verified)} verified, best speedup {pm['best_speedup']:.3f}, "
          f"best median {pm['best_exec_time_ns']:.0f} ns")


def _closing_lines(stdout: str) -> dict:
    """The sweep ends as `mneme tune` does: its summary (trials, baseline, best with its speedup), the results
    directory and Hydra's optimization_results.yaml, after one progress line instead of per-job override dumps."""
    import re

    import yaml

    lines = stdout.strip().splitlines()
    tail = lines[-20:]
    results = next((ln for ln in tail if ln.startswith("results: ")), None)
    assert results, "the sweep did not end on its results path:\n" + "\n".join(tail)
    hydra = next((ln for ln in tail if ln.startswith("Hydra: ")), None)
    assert hydra and tail.index(hydra) == tail.index(results) + 1, "\n".join(tail)
    out = Path(results.split()[1])
    assert out.is_absolute() and (out / "summary.txt").is_file() and (out / "best.sh").is_file(), results
    assert (out / "best.sh").read_text().splitlines()[-1].startswith("mneme replay -rdb ")
    best = next((ln for ln in tail if ln.startswith("best: trial ")), None)
    assert best and any(ln.startswith("trials: 24 of 24 counted") for ln in tail), "\n".join(tail)
    assert any(ln.startswith("baseline (recorded launch") and "verified" in ln for ln in tail), "\n".join(tail)
    m = re.search(r"(\d+\.\d+)x over the baseline", best)
    assert m, best
    doc = yaml.safe_load(Path(hydra.split()[1]).read_text())
    assert doc["best_params"]["replay.block.x"] > 0 and doc["results"] == str(out), doc
    assert "#0 :" not in stdout, "per-job override dumps in the sweep's output"
    print("\n".join(tail))
    return {"speedup": float(m.group(1)), "out": out}


def test_mneme_tune_logs_under_one_parent(big_recordings, tmp_path):
    db = big_recordings["vecadd"].db("vecAdd")
    p = subprocess.run(
        [sys.executable, "-m", "mneme.cli", "tune", "-rdb", str(db), "--space", "launch", "--trials", "16",
         "--devices", "0", "-it", str(ITERATIONS), "--quiet", "-o", str(tmp_path / "tune")],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=900,
    )
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    client = _client(tmp_path)
    exp = client.get_experiment_by_name("mneme")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("mneme.role") == "sweep"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    verified = [r for r in children if r.data.metrics.get("verified") == 1]
    assert verified and all(k in verified[0].data.metrics for k in TRIAL_METRICS)
    assert "RUNNING" not in {r.info.status for r in runs}
    files = {a.path for a in client.list_artifacts(parent[0].info.run_id)}
    assert "speedup_over_trials.png" in files and any(f.startswith("results") for f in files)


def test_record_experiment_records_an_app(tmp_path):
    app = Path(__file__).resolve().parents[2] / "examples" / "bin" / "vecadd"
    p = subprocess.run([sys.executable, "-m", "mneme", "+experiment=record", f"record.app=[{app}]",
                        f"record.dir={tmp_path / 'rec'}"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    from mneme.record.db import RecordedExecution, find_dbs

    dbs = [RecordedExecution.from_json(f) for f in find_dbs(str(tmp_path / "rec"))]
    assert any(r.demangled_name.startswith("vecAdd") for r in dbs)
    assert not (tmp_path / "mlflow.db").exists()  # the record experiment does not track
