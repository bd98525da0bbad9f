"""The compile-only experiment end to end, without a GPU: a real recording of saxpy (IR built with
clang-22, snapshots written by mneme.snapshot.Writer), real compilation (llvmlite, nvJitLink) in the
executor's worker processes, and the MLflow runs read back through MlflowClient."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from irutil import compile_cu
from mnemetest import read_artifact
from test_tune_support import SAXPY_CU, write_record

from mneme.config import ExperimentConfiguration, MeasurementSettings


@pytest.fixture(scope="module")
def record_db(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("saxpy-record")
    (d / "saxpy.cu").write_text(SAXPY_CU)
    bc = compile_cu(d / "saxpy.cu", d / "bc")
    return write_record(d / "rec", module=bc, snapshots=True)


def run_app(cwd, *overrides):
    p = subprocess.run([sys.executable, "-m", "mneme", *overrides], cwd=cwd, capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"})
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr[-5000:]}"
    return p


def runs_of(cwd):
    client = MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    exp = client.get_experiment_by_name("mneme")
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def check_compile_run(client, run, kernel_name="saxpy("):
    m, t, p = run.data.metrics, run.data.tags, run.data.params
    assert run.info.status == "FINISHED" and t["mneme.status"] == "compiled"
    assert m["registers"] > 0 and m["obj_size_bytes"] > 1000 and m["local_mem_bytes"] == 0
    assert m["opt_time_s"] > 0 and m["cubin_time_s"] > 0 and m["compile_time_s"] >= m["opt_time_s"] + m["cubin_time_s"]
    assert "verified" not in m and "exec_time_median_ns" not in m  # nothing ran
    assert t["mneme.kernel"].startswith(kernel_name) and t["mneme.dynamic_hash"] == "d" * 16
    assert len(t["mneme.code_hash"]) == 64 and len(t["mneme.config_hash"]) == 64
    assert {"mneme.static_hash", "mneme.gpu", "mneme.driver", "mneme.version", "mneme.git_commit"} <= set(t)
    assert {"replay.passes", "replay.block.x", "replay.codegen_opt", "measure.iterations", "kernel", "instance"} <= set(p)
    assert p["kernel"] and p["instance"] == "d" * 16  # axes and groupings of MLflow's compare view
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"kernel.ll", "kernel.ptx", "kernel.cubin", "config.yaml", "result.json"} <= files
    assert {"kernel.ll.txt", "kernel.ptx.txt"} <= files  # names MLflow's artifact viewer previews
    read = lambda name: read_artifact(client, run.info.run_id, name)  # noqa: E731
    assert b"define " in read("kernel.ll") and b".entry" in read("kernel.ptx")
    assert read("kernel.ptx.txt") == read("kernel.ptx") and read("kernel.ll.txt") == read("kernel.ll")
    assert read("kernel.cubin")[:4] == b"\x7fELF"
    return read


def test_multirun_logs_compile_metrics_tags_and_kernel_files(record_db, tmp_path):
    run_app(tmp_path, "+experiment=compile_only", "--multirun", f"record.db={record_db}", "replay.codegen_opt=0,3")
    client, runs = runs_of(tmp_path)
    parent = [r for r in runs if r.data.tags.get("mneme.role") == "sweep"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    assert sorted(r.data.params["replay.codegen_opt"] for r in trials) == ["0", "3"]
    for r in trials:
        read = check_compile_run(client, r)
        assert b"mode: compile_only" in read("config.yaml")
    # different code, different hashes; the parent names the best (fewest spills, then registers)
    assert len({r.data.tags["mneme.code_hash"] for r in trials}) == 2
    best = client.get_run(parent[0].data.tags["mneme.best_run_id"])
    assert best.data.metrics["registers"] == min(r.data.metrics["registers"] for r in trials)
    files = {a.path for a in client.list_artifacts(parent[0].info.run_id)}
    assert {"best_config.yaml", "registers_over_trials.png"} <= files


def test_a_single_run_compiles_in_process_and_logs_one_run(record_db, tmp_path):
    p = run_app(tmp_path, "+experiment=compile_only", f"record.db={record_db}", "replay.block.x=64",
                "replay.passes='default<O2>'")
    assert "compiled" in p.stdout and "passes=default<O2>" in p.stdout
    client, runs = runs_of(tmp_path)
    assert len(runs) == 1 and "mlflow.parentRunId" not in runs[0].data.tags
    check_compile_run(client, runs[0])
    assert runs[0].data.params["replay.block.x"] == "64" and runs[0].data.params["replay.grid.x"] == "256"


def test_replay_track_logs_one_run_with_its_kernel_files(record_db, tmp_path):
    from mneme.replay.pipeline import ReplayPipeline
    from mneme.track import log_replay

    pipe = ReplayPipeline(str(record_db), device_id=None, settings=MeasurementSettings())
    config = pipe.baseline_config()
    result = pipe.compile_only(config)
    ck = pipe.compile(config, keep_ll=True)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_id = log_replay(pipe, config, MeasurementSettings(), result, ck, uri=uri, experiment="replays")
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    check_compile_run(client, run)
    assert run.data.tags["mneme.role"] == "replay" and run.data.tags["mneme.record_db"] == str(record_db)
    saved = json.loads(read_artifact(client, run_id, "result.json"))
    assert ExperimentConfiguration.from_dict(saved["configuration"]).hash() == config.hash()


def test_relative_paths_mean_the_directory_the_user_ran_in_even_when_hydra_changes_it(record_db, tmp_path):
    """`hydra.job.chdir=true` runs the job in its output directory: record.db, a journal study storage and a
    relative tracking URI still name files relative to where `python -m mneme` ran."""
    rel = os.path.relpath(record_db, tmp_path)
    run_app(tmp_path, "+experiment=compile_only", f"record.db={rel}", "hydra.job.chdir=true",
            "tracking.uri=sqlite:///mlflow.db", "replay.block.x=64")
    client, runs = runs_of(tmp_path)
    assert len(runs) == 1 and runs[0].data.tags["mneme.status"] == "compiled"
    assert not list(tmp_path.glob("outputs/**/mlflow.db")), "the store is where the user ran, not in the job's directory"
