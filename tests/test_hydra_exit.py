"""The Hydra app's exit codes (docs/USAGE.md): a job's result sets it, a user error is one line without a
traceback, and a multirun runs all its jobs and exits with the worst code (issue 14: `python -m mneme` exited
0 after invalid_config and runtime_error, and a missing record.db was a 22-line traceback)."""

from __future__ import annotations

import os
import subprocess
import sys

from mnemetest import FIXTURES, ROOT
from mneme.record.db import find_dbs

DB = find_dbs(str(FIXTURES / "vecadd"))[0]


def app(tmp_path, *overrides, env=None):
    e = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "mneme", "+experiment=compile_only", "tracking.enabled=false",
                           f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/multi", *overrides],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=e)


def test_a_missing_record_db_is_one_line_and_exit_2(tmp_path):
    p = app(tmp_path, f"record.db={tmp_path}/none.json")
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and f"{tmp_path}/none.json does not exist" in p.stderr
    d = app(tmp_path, f"record.db={tmp_path}/none.json", env={"MNEME_DEBUG": "1"})
    assert d.returncode == 2 and "Traceback" in d.stderr  # MNEME_DEBUG=1 shows it


def test_a_multirun_runs_every_job_and_exits_with_the_worst(tmp_path):
    ok = app(tmp_path, f"record.db={DB}")
    assert ok.returncode == 0, ok.stderr
    p = app(tmp_path, "--multirun", f"record.db={DB}", 'replay.passes="default<O2>","default<O9>"')
    assert p.returncode == 2, p.stdout + p.stderr
    out = p.stdout + p.stderr
    assert "compiled" in out and "compile_error" in out and "1 of 2 job(s) failed (exit 2)" in out
    # the jobs' lines go to their logs (one progress line on the terminal); the end names the failed one
    assert "1 of 2 job(s) failed (exit 2): 1 compiled, 1 compile_error" in p.stderr
    assert "job 1: " in p.stderr and "default<O9>" in p.stderr and f"(log: {tmp_path}/multi/1/mneme.log)" in p.stderr
    assert "Traceback" not in out
