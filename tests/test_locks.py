"""mneme.locks.FileLock with real threads, processes and a process killed while it holds the lock."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

from mneme.locks import FileLock

HOLD = "import sys, time; from mneme.locks import FileLock; l = FileLock(sys.argv[1]); l.acquire(); print('held', flush=True); time.sleep(60)"


def test_threads_of_one_process_take_turns(tmp_path):
    lock, inside, overlaps = FileLock(str(tmp_path / "x.flock")), [], []

    def work():
        for _ in range(20):
            with lock:
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(len(inside))
                time.sleep(0.001)
                inside.pop()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []


def test_the_lock_of_a_killed_holder_is_free_at_once(tmp_path):
    path = str(tmp_path / "x.flock")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, path], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    lock, got = FileLock(path), []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire()))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # waiting for the holder
    t = time.monotonic()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    waiter.join(10)
    assert got == [True] and time.monotonic() - t < 5  # no grace period to wait out, no lock file to remove
    lock.release()
    lock.close()


def test_a_journal_study_locks_through_one_flock_file(tmp_path):
    """Optuna's own journal lock created and removed PATH.lock around every write; ours keeps one PATH.flock."""
    import optuna

    from mneme.tune import study as st

    journal = tmp_path / "study.journal"
    study = optuna.create_study(storage=st.open_storage(f"journal:{journal}"), study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.journal", "study.journal.flock"]
    assert len(optuna.load_study(storage=st.open_storage(f"journal:{journal}"), study_name="s").trials) == 5
