"""A search process that really gets SIGINT, SIGTERM or SIGKILL leaves no run RUNNING."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from mlflow import MlflowClient

SCRIPT = textwrap.dedent("""
    import sys, time
    from mneme.config import ExperimentConfiguration, ExperimentResult
    from mneme.track.sweep import SweepRun
    from mneme.track.tracker import Tracker

    with Tracker(sys.argv[1], "interrupted") as tracker:
        sweep = SweepRun.start(tracker, "sweep")
        sweep.trial(0, ExperimentConfiguration(), None, ExperimentResult(executed=True, verified=True,
                    exec_time=[5, 6], status="verified"), name="trial-0")
        in_flight = sweep.start_trial("trial-1", tags={"mneme.trial": 1})
        tracker.flush()
        print("ready", flush=True)
        time.sleep(120)
""")


def _statuses(uri):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("interrupted")
    return {r.info.run_name: r.info.status for r in client.search_runs([exp.experiment_id])}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_interrupted_sweep_leaves_no_running_run(tmp_path, sig):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read()
        assert _statuses(uri) == {"sweep": "RUNNING", "trial-0": "FINISHED", "trial-1": "RUNNING"}
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    # After SIGKILL nobody in the search process could act: the writer notices and ends the runs.
    deadline = time.monotonic() + 30
    while "RUNNING" in _statuses(uri).values() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _statuses(uri) == {"sweep": "KILLED", "trial-0": "FINISHED", "trial-1": "KILLED"}
    if sig != signal.SIGKILL:
        assert proc.returncode != 0
