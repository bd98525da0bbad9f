"""A resumed study takes back the running trials of a dead process on this host at once (its pid is gone);
--stale-after (heartbeat age) decides only for processes on other hosts, and a live local owner keeps its
trials however old its heartbeat (issue 14: a resume after kill -9 waited 96 s for the dead process)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from mneme.tune import study as st


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_owner_liveness_on_this_host():
    host = socket.gethostname()
    assert st.owner_alive_here(f"{host}:{os.getpid()}:abc") is True
    assert st.owner_alive_here(f"{host}:{dead_pid()}:abc") is False
    assert st.owner_alive_here(f"not-{host}:1:abc") is None  # another host: only its heartbeat tells
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 10
    while time.time() < deadline:  # exited but not yet reaped: a zombie is not alive
        with open(f"/proc/{zombie.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.05)
    assert st.owner_alive_here(f"{host}:{zombie.pid}:abc") is False
    zombie.wait()


@pytest.fixture
def study(tmp_path):
    import optuna

    storage = st.open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    return optuna.create_study(storage=storage, study_name="s")


def _running(study, owner: str):
    t = study.ask()
    t.set_user_attr(st.T_CLAIM, {"owner": owner, "config_hash": owner})
    return t.number


def test_stale_reclaims_dead_local_owners_at_once_and_others_by_heartbeat(study):
    host = socket.gethostname()
    dead = _running(study, f"{host}:{dead_pid()}:dead")
    alive = _running(study, f"{host}:{os.getpid()}:alive")
    remote = _running(study, "elsewhere.example:4242:remote")
    now = time.time()
    beats = {f"{host}:{os.getpid()}:alive": now - 10_000, "elsewhere.example:4242:remote": now - 10}
    ledger = st.Ledger(study.get_trials(deepcopy=False))
    assert [t.number for t in ledger.stale(beats, "me", stale_after=120, now=now)] == [dead]
    later = [t.number for t in ledger.stale(beats, "me", stale_after=120, now=now + 200)]
    assert sorted(later) == sorted([dead, remote]) and alive not in later


def test_a_resume_with_other_options_reports_them(tmp_path):
    from test_tune_study import options
    from test_tune_support import write_record

    from mneme.tune.tuner import Tuner

    record = write_record(tmp_path / "rec")
    out = tmp_path / "out"
    first = Tuner(options(record, out, space="standard", sampler="tpe", trials=4, seed=1)).run()
    assert first.summary["sampler"] == "tpe"
    again = Tuner(options(record, out, space="standard", sampler="random", trials=6, resume=True)).run()
    assert again.exit_code == 0 and again.summary["sampler"] == "random"
