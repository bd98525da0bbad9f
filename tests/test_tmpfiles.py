"""No litter in $TMPDIR: compile directories and lock files are gone after a normal exit and Ctrl-C, and what a
killed process left is reaped by the next run (issue 14: 30 lock files and ptxas directories piled up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mnemetest import FIXTURES, MNEME, ROOT
from mneme import tmpfiles
from mneme.record.db import find_dbs


def env_tmp(tmp: Path) -> dict:
    env = dict(os.environ, TMPDIR=str(tmp))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def litter(tmp: Path):
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("mneme-"))


def test_a_compile_leaves_nothing_behind(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    db = find_dbs(str(FIXTURES / "vecadd"))[0]
    p = subprocess.run([*MNEME, "replay", "-rdb", db, "--compile-only"], capture_output=True, text=True, env=env_tmp(tmp))
    assert p.returncode == 0, p.stderr
    assert "ptxas" in p.stdout  # it did assemble through ptxas in a temporary directory
    assert litter(tmp) == []


HOLD = """
import sys, time
from mneme.tmpfiles import pid_dir
with pid_dir("ptxas") as d:
    open(d + "/kernel.ptx", "w").write("x")
    print(d, flush=True)
    time.sleep(60)
"""


def _holder(tmp: Path):
    p = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True, env=env_tmp(tmp))
    d = Path(p.stdout.readline().strip())
    assert d.is_dir() and d.parent == tmp
    return p, d


def test_ctrl_c_removes_the_compile_directory(tmp_path):
    p, d = _holder(tmp_path)
    p.send_signal(signal.SIGINT)
    p.wait(timeout=30)
    assert not d.exists()


def test_a_killed_process_is_reaped_by_the_next_run(tmp_path):
    p, d = _holder(tmp_path)
    p.kill()
    p.wait(timeout=30)
    assert d.exists()  # SIGKILL runs no cleanup
    alive, d_alive = _holder(tmp_path)
    try:
        assert tmpfiles.reap(str(tmp_path)) == 1
        assert not d.exists() and d_alive.exists()  # a running process's directory stays
    finally:
        alive.kill()
        alive.wait()
    # the CLI reaps at exit (here: the run that follows the killed one)
    p, d = _holder(tmp_path)
    p.kill()
    p.wait(timeout=30)
    subprocess.run([*MNEME, "show", str(FIXTURES / "vecadd")], capture_output=True, env=env_tmp(tmp_path), check=True)
    assert not d.exists()


def test_commit_lock_files_are_removed_when_unused_and_never_while_held(tmp_path, monkeypatch):
    import tempfile

    from mneme.track.bulk import CommitLock

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    a = CommitLock(str(tmp_path / "mlflow.db"))
    b = CommitLock(str(tmp_path / "mlflow.db"))
    assert a.path == b.path and Path(a.path).exists()
    with a:
        assert not tmpfiles.remove_if_unlocked(a.path)  # held: stays
    assert tmpfiles.remove_if_unlocked(a.path) and not Path(a.path).exists()
    with b:  # b's open file was removed: it locks the file now at the path, which a's next acquire finds too
        assert Path(b.path).exists()
        assert not tmpfiles.remove_if_unlocked(b.path)
        t0 = time.monotonic()
        import threading

        got = []
        th = threading.Thread(target=lambda: (a.acquire(), got.append(time.monotonic()), a.release()))
        th.start()
        time.sleep(0.3)
        assert not got  # a waits for b: both lock the same file
    th.join(10)
    assert got and got[0] - t0 >= 0.3
    a.close()
    b.close()
    assert litter(tmp_path) == []
