"""Studies end to end on CPU (a synthetic backend stands in for the GPU): the results directory written from
the storage, resume and its refusals, exit codes, the CLI, and several processes sharing one study on SQLite,
journal storage and a real PostgreSQL server (started here on loopback), including a study killed midway."""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mneme.errors import ConfigurationError
from mneme.tune import study as st
from mneme.tune.options import EXIT_ALL_FAILED, EXIT_BASELINE_FAILED, EXIT_INTERRUPTED, EXIT_OK, TuneOptions
from mneme.tune.report import write_results
from mneme.tune.tuner import Tuner

from test_tune_support import SyntheticBackend, backend, env_with_tests, write_record

ROOT = Path(__file__).resolve().parent.parent


def options(record: Path, out: Path, **kw) -> TuneOptions:
    base = dict(record_db=str(record), space="launch", sampler="exhaustive", trials=7, devices=[0], compile_jobs=1,
                backend=backend("SyntheticBackend"), output=str(out), track=False, progress=False, iterations=3,
                warmup=0, timeout=5.0)
    base.update(kw)
    return TuneOptions(**base)


def trials_of(url: str, name: str):
    return st.load_study(st.open_storage(url), name).get_trials(deepcopy=False)


def non_duplicate_runs(trials):
    """config hash -> how many trials really ran it (not copies, not excluded)."""
    runs = collections.Counter()
    for t in trials:
        res = t.user_attrs.get(st.T_RESULT) or {}
        if st.counts(t) and t.state.name != "RUNNING" and "duplicate_of" not in res:
            runs[st.claim(t).get("config_hash")] += 1
    return runs


@pytest.fixture
def record(tmp_path) -> Path:
    return write_record(tmp_path / "rec")


def test_results_directory_from_the_storage(tmp_path, record):
    out = tmp_path / "out"
    outcome = Tuner(options(record, out)).run()
    assert outcome.exit_code == EXIT_OK, outcome.message
    for name in ("config.json", "space.json", "baseline.json", "trials.jsonl", "verified.csv", "best.json", "best.yaml",
                 "best.sh", "best.md", "summary.json", "summary.txt", "study.journal"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    # 512 threads is the fastest but does not verify, 1024 fails to launch: the best is 256
    assert summary["best"]["config"]["block"] == {"x": 256, "y": 1, "z": 1}
    assert summary["trials"]["by_status"] == {"verified": 5, "failed_verification": 1, "invalid_launch": 1}
    assert summary["banned_shapes"] == ["1024x1x1", "512x1x1"]  # no launch; a wrong answer at bit-exact settings
    base_ns, best_ns = summary["baseline"]["metric_ns"], summary["best"]["metric_ns"]
    assert summary["best"]["speedup"] == pytest.approx(base_ns / best_ns) and summary["best"]["speedup"] > 1.1
    spread = summary["best"]["speedup_spread"]
    assert spread["min"] <= spread["median"] <= spread["max"]
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["config"]["block"]["x"] == 256 and best["config"]["grid"]["x"] == 128
    assert "--block-dim-x 256" in best["replay_command"] and "--grid-dim-x 128" in best["replay_command"]
    assert (out / "best.sh").read_text().splitlines()[-1].startswith("mneme replay -rdb ")
    assert "dim3(256, 1, 1)" in (out / "best.md").read_text()
    import pandas as pd

    table = pd.read_csv(out / "verified.csv")
    assert list(table["median_ns"]) == sorted(table["median_ns"]) and len(table) == 5
    assert table.iloc[0]["block"] == "256x1x1"

    # everything comes back from the storage alone
    jsonl = (out / "trials.jsonl").read_text()
    shutil.rmtree(out / "logs")
    for f in out.glob("*.json*"):
        f.unlink()
    study = st.load_study(st.open_storage(st.storage_url(None, str(out))), outcome.summary["study"])
    assert study.metric_names == ["median time (ns)"]  # what optuna-dashboard names the objective
    again = write_results(study, str(out))
    assert (out / "trials.jsonl").read_text() == jsonl
    assert again["best"]["config_hash"] == summary["best"]["config_hash"]


def test_resume_continues_without_redoing_and_refuses_changes(tmp_path, record):
    out = tmp_path / "out"
    first = Tuner(options(record, out, space="standard", sampler="tpe", trials=8, seed=1)).run()
    assert first.exit_code == EXIT_OK
    url, name = st.storage_url(None, str(out)), first.summary["study"]
    before = {t.number: (t.user_attrs[st.T_CLAIM]["owner"], t.values) for t in trials_of(url, name)}

    with pytest.raises(ConfigurationError, match="already exists"):
        Tuner(options(record, out, space="standard", sampler="tpe", trials=16)).run()
    resumed = Tuner(options(record, out, space="standard", sampler="tpe", trials=16, resume=True)).run()
    assert resumed.exit_code == EXIT_OK
    after = trials_of(url, name)
    assert sum(1 for t in after if st.counts(t)) == 16
    for t in after:
        if t.number in before:
            assert (t.user_attrs[st.T_CLAIM]["owner"], t.values) == before[t.number]  # not redone
    owners = {t.user_attrs[st.T_CLAIM]["owner"] for t in after if st.T_CLAIM in t.user_attrs}
    assert len(owners) == 2

    with pytest.raises(ConfigurationError, match="search space"):
        Tuner(options(record, out, space="standard", sampler="tpe", trials=20, resume=True,
                      launch_safety="aggressive", study=name)).run()
    db = json.loads(record.read_text())
    db["instances"]["d" * 16]["GridDims"]["x"] = 512
    record.write_text(json.dumps(db))
    with pytest.raises(ConfigurationError, match="the record"):
        Tuner(options(record, out, space="standard", sampler="tpe", trials=20, resume=True, study=name)).run()


def test_every_trial_failing_and_a_failing_baseline_have_their_exit_codes(tmp_path, record, monkeypatch):
    failing = Tuner(options(record, tmp_path / "a", backend=backend("FailingBackend"))).run()
    assert failing.exit_code == EXIT_ALL_FAILED and "every trial failed" in failing.message
    assert failing.summary["best"] is None and failing.summary["trials"]["succeeded"] == 0
    monkeypatch.setenv("MNEME_TEST_FAIL_BASELINE", "1")
    base = Tuner(options(record, tmp_path / "b", backend=backend("FailingBackend"))).run()
    assert base.exit_code == EXIT_BASELINE_FAILED
    assert (tmp_path / "b" / "summary.json").is_file() and base.summary["trials"]["counted"] == 0


def test_every_trial_names_the_gpu_it_ran_on(tmp_path, record, monkeypatch):
    monkeypatch.setenv("MNEME_TEST_RUN_DELAY", "0.1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    out = tmp_path / "two"
    outcome = Tuner(options(record, out, devices=[0, 1], space="standard", sampler="random", trials=16, seed=1)).run()
    assert outcome.exit_code == EXIT_OK
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    ran = [r["result"] for r in rows if r["result"] and r["result"].get("executed") and r["duplicate_of"] is None]
    assert {r["gpu_id"] for r in ran} == {0, 1}
    assert all(f"CUDA_VISIBLE_DEVICES={r['gpu_id']}" in r["gpu_name"] for r in ran)


def test_baseline_only_and_device_less_compile_only_tuning(tmp_path, record):
    only = Tuner(options(record, tmp_path / "a", baseline_only=True)).run()
    assert only.exit_code == EXIT_OK and only.summary["trials"]["counted"] == 0
    assert only.summary["baseline"]["status"] == "verified"
    cpu = Tuner(options(record, tmp_path / "b", devices=[], objective="registers", space="compiler",
                        sampler="random", trials=12, seed=4)).run()
    assert cpu.exit_code == EXIT_OK
    best = cpu.summary["best"]
    assert best["config"]["codegen_opt"] == 3 and best["gpu_id"] == -1  # fewest registers at level 3 (synthetic)
    assert (tmp_path / "b" / "compiled.csv").is_file()
    with pytest.raises(ConfigurationError, match="needs a GPU"):
        Tuner(options(record, tmp_path / "c", devices=[], objective="time")).run()


def mneme(*args, check=False, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "mneme.cli", *map(str, args)], capture_output=True, text=True,
                          env=env or env_with_tests(), cwd=ROOT, **kw)


def test_cli_errors_list_the_choices_and_dry_run_prints_the_space(tmp_path, record):
    p = mneme("tune", "-rdb", record, "--space", "fastest", "--no-track")
    assert p.returncode == 2 and all(n in p.stderr for n in ("quick", "standard", "launch", "compiler", "full"))
    p = mneme("tune", "-rdb", record, "--sampler", "annealing", "--no-track")
    assert p.returncode == 2 and "tpe" in p.stderr and "nsga2" in p.stderr
    p = mneme("tune", "-rdb", record, "--passes", "instcombine,nosuchpass", "--space", "compiler", "--dry-run")
    assert p.returncode == 2 and "nosuchpass" in p.stderr
    p = mneme("tune", "-rdb", record, "--space", "launch", "--dry-run", "-o", tmp_path / "dry")
    assert p.returncode == 0, p.stderr
    assert "256x1x1" in p.stdout and "launch candidates (balanced)" in p.stdout and not (tmp_path / "dry").exists()
    p = mneme("tune", "--help")
    assert "exit codes" in p.stdout and "conservative" in p.stdout


def test_optuna_dashboard_opens_the_default_storage_by_its_path(tmp_path, record):
    """`optuna-dashboard <output>/study.journal` (docs/USAGE.md): the dashboard's CLI guesses the storage from
    the argument as below (optuna_dashboard._storage_url, 0.21)."""
    guess = pytest.importorskip("optuna_dashboard._storage_url").guess_storage_from_url
    out = tmp_path / "out"
    outcome = Tuner(options(record, out)).run()
    assert outcome.exit_code == EXIT_OK, outcome.message
    import optuna

    storage = guess(str(out / "study.journal"))
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == [outcome.summary["study"]]
    assert len(optuna.load_study(study_name=outcome.summary["study"], storage=storage).trials) == 7


def test_cli_without_a_gpu_says_how_to_compile_only(tmp_path, record):
    from mneme.tune.executor import visible_devices

    if visible_devices():
        pytest.skip("this machine has a GPU")
    p = mneme("tune", "-rdb", record, "--space", "launch", "--no-track", "--quiet", "-o", tmp_path / "o")
    assert p.returncode == 5 and "--devices none" in p.stderr
    assert not list((tmp_path / "o").glob("study.*"))  # no empty study left behind


def test_cli_run_prints_the_best_and_a_replay_command(tmp_path, record):
    p = mneme("tune", "-rdb", record, "--space", "launch", "--sampler", "exhaustive", "--trials", "7",
              "--devices", "0", "--compile-jobs", "1", "--backend", backend("SyntheticBackend"), "--no-track", "--quiet",
              "-o", tmp_path / "o", "-it", "3", "--warmup", "0", "--json")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["best"]["replay_command"].startswith("mneme replay") and summary["exit_code"] == 0
    rdb = shlex.split(summary["best"]["replay_command"])[3]
    assert os.path.isabs(rdb) and Path(rdb).is_file(), "best.sh reproduces the best from any directory"
    report = tmp_path / "report"
    p = mneme("tune", "-rdb", record, "--space", "launch", "--storage", f"journal:{tmp_path / 'o' / 'study.journal'}",
              "--report-only", "-o", report, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["best"]["config_hash"] == summary["best"]["config_hash"]
    assert (report / "trials.jsonl").read_text() == (tmp_path / "o" / "trials.jsonl").read_text()


# -- several processes, one study ---------------------------------------------------------------------
def launch(record: Path, out: Path, storage: str, study: str, trials: int, *extra, delay="0.02"):
    env = env_with_tests({"MNEME_TEST_RUN_DELAY": delay})
    argv = [sys.executable, "-m", "mneme.cli", "tune", "-rdb", record, "--space", "standard", "--sampler", "tpe",
            "--trials", trials, "--devices", "0", "--compile-jobs", "1", "--backend", backend("SyntheticBackend"),
            "--storage", storage, "--study", study, "--resume", "--no-track", "--quiet", "-o", out, "-it", "3",
            "--warmup", "0", "--stale-after", "5", *extra]
    return subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT, start_new_session=True)


def shared_study(tmp_path, record, storage: str, n: int = 24, procs: int = 2):
    ps = [launch(record, tmp_path / f"p{i}", storage, "shared", n, "--seed", i, delay="0.2") for i in range(procs)]
    outs = [p.communicate(timeout=300) for p in ps]
    for p, (o, e) in zip(ps, outs):
        assert p.returncode == 0, e
    trials = trials_of(storage, "shared")
    counted = [t for t in trials if st.counts(t)]
    assert len(counted) == n  # exactly --trials, however the processes raced
    assert all(t.state.name in ("COMPLETE", "FAIL") for t in counted)
    runs = non_duplicate_runs(trials)
    assert runs and max(runs.values()) == 1  # no configuration ran twice
    owners = collections.Counter(st.claim(t)["owner"] for t in counted)
    assert len(owners) == procs  # both processes did work
    for i in range(procs):  # each wrote the complete results of the shared study
        s = json.loads((tmp_path / f"p{i}" / "summary.json").read_text())
        assert s["trials"]["counted"] == n
    return trials


def test_two_processes_share_a_sqlite_study(tmp_path, record):
    shared_study(tmp_path, record, f"sqlite:///{tmp_path / 'shared.db'}")


def test_two_processes_share_a_journal_study(tmp_path, record):
    shared_study(tmp_path, record, f"journal:{tmp_path / 'shared.journal'}")


def wait_for(predicate, timeout=120.0, step=0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return False


def completed(storage: str, name: str) -> int:
    """COMPLETE trials of a study that another process is writing (0 while it does not exist yet)."""
    try:
        return sum(1 for t in trials_of(storage, name) if t.state.name == "COMPLETE")
    except Exception:  # noqa: BLE001 - no database or no study yet
        return 0


def killed_study_resumes(tmp_path, record, storage: str):
    n = 14
    p = launch(record, tmp_path / "k", storage, "killed", n, delay="0.4")
    assert wait_for(lambda: completed(storage, "killed") >= 4), p.communicate()[1] if p.poll() is not None else "no progress"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    before = {t.number: (t.state.name, t.values, st.claim(t).get("owner")) for t in trials_of(storage, "killed")}
    done_before = {k: v for k, v in before.items() if v[0] in ("COMPLETE", "FAIL")}
    assert any(v[0] == "RUNNING" for v in before.values())  # killed with trials in flight
    outcome = Tuner(options(record, tmp_path / "r", storage=storage, study="killed", space="standard", sampler="tpe",
                            trials=n, resume=True, stale_after=2.0)).run()
    assert outcome.exit_code == EXIT_OK, outcome.message
    after = trials_of(storage, "killed")
    assert sum(1 for t in after if st.counts(t)) == n
    for t in after:
        if t.number in done_before:
            assert (t.state.name, t.values, st.claim(t).get("owner")) == done_before[t.number]  # not redone
    retried = [t for t in after if st.flag(t) == "retried"]
    assert {t.number for t in retried} == {k for k, v in before.items() if v[0] == "RUNNING"}
    assert all(t.state.name != "RUNNING" for t in after)


def test_ctrl_c_gives_unfinished_trials_back_for_an_immediate_resume(tmp_path, record):
    storage = f"sqlite:///{tmp_path / 'int.db'}"
    # 40 trials of >= 0.4 s: the interrupt must come mid-search even when polling the study is slow under load
    # (with 14 the search was once seen finishing first: exit 0)
    p = launch(record, tmp_path / "i", storage, "interrupted", 40, delay="0.4")
    assert wait_for(lambda: completed(storage, "interrupted") >= 3)
    os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends to the whole process group
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert (tmp_path / "i" / "summary.json").is_file()
    trials = trials_of(storage, "interrupted")
    assert not any(t.state.name == "RUNNING" for t in trials)
    given_back = [t for t in trials if st.flag(t) == "retried"]
    assert len(given_back) == sum(1 for t in trials if t.state.name == "WAITING")
    t0 = time.monotonic()
    outcome = Tuner(options(record, tmp_path / "r", storage=storage, study="interrupted", space="standard",
                            sampler="tpe", trials=40, resume=True)).run()  # default stale_after: nothing to wait for
    assert outcome.exit_code == EXIT_OK and time.monotonic() - t0 < 60
    assert sum(1 for t in trials_of(storage, "interrupted") if st.counts(t)) == 40


def test_a_killed_sqlite_study_resumes_without_redoing_finished_trials(tmp_path, record):
    killed_study_resumes(tmp_path, record, f"sqlite:///{tmp_path / 'killed.db'}")


def test_a_killed_journal_study_resumes_without_redoing_finished_trials(tmp_path, record):
    killed_study_resumes(tmp_path, record, f"journal:{tmp_path / 'killed.journal'}")  # the default storage's kind


# -- PostgreSQL ------------------------------------------------------------------------------------------
def test_resume_on_postgresql(tmp_path, record, postgres_url):
    first = Tuner(options(record, tmp_path / "a", storage=postgres_url, study="pg-resume", space="standard",
                          sampler="tpe", trials=6, seed=2)).run()
    assert first.exit_code == EXIT_OK
    before = {t.number: t.values for t in trials_of(postgres_url, "pg-resume") if st.counts(t)}
    again = Tuner(options(record, tmp_path / "b", storage=postgres_url, study="pg-resume", space="standard",
                          sampler="tpe", trials=12, resume=True)).run()
    assert again.exit_code == EXIT_OK
    after = {t.number: t.values for t in trials_of(postgres_url, "pg-resume") if st.counts(t)}
    assert len(after) == 12 and all(after[k] == v for k, v in before.items())
    with pytest.raises(ConfigurationError, match="search space"):
        Tuner(options(record, tmp_path / "c", storage=postgres_url, study="pg-resume", space="standard",
                      sampler="tpe", trials=14, resume=True, launch_safety="conservative")).run()


def test_two_processes_share_a_postgresql_study(tmp_path, record, postgres_url):
    shared_study(tmp_path, record, postgres_url, n=24, procs=2)


def test_a_killed_postgresql_study_resumes(tmp_path, record, postgres_url):
    db = postgres_url.rsplit("/", 1)[0]
    import psycopg2

    conn = psycopg2.connect(postgres_url)
    conn.autocommit = True
    conn.cursor().execute("CREATE DATABASE killed_study")
    conn.close()
    killed_study_resumes(tmp_path, record, f"{db}/killed_study")


def test_compile_only_tuning_of_a_real_kernel(tmp_path):
    """No GPU, the real pipeline: rank compiler configurations of clang-22 saxpy bitcode by registers."""
    from test_tune_support import real_record

    db = real_record(tmp_path / "real")
    out = tmp_path / "out"
    outcome = Tuner(TuneOptions(record_db=str(db), space="compiler", sampler="tpe", trials=14, devices=[], compile_jobs=2,
                                objective="registers", output=str(out), track=False, progress=False, seed=5)).run()
    assert outcome.exit_code == EXIT_OK, outcome.message
    s = outcome.summary
    assert s["baseline"]["status"] == "compiled" and s["trials"]["counted"] == 14
    assert s["best"]["registers"] > 0 and s["best"]["values"][0] == s["best"]["registers"]
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    ran = [r for r in rows if r["result"]]
    assert all(r["result"]["status"] in ("compiled", "compile_error", "invalid_config") for r in ran)
    assert min(r["values"][0] for r in ran if r["values"]) == s["best"]["registers"]
    import pandas as pd

    table = pd.read_csv(out / "compiled.csv")
    assert list(table["value"]) == sorted(table["value"]) and (table["obj_size"] > 0).all()


def test_storage_passwords_never_leave_the_process():
    assert st.redacted("postgresql://tuner:pa55@word@db:5432/s") == "postgresql://tuner:***@db:5432/s"
    assert st.redacted("postgresql://tuner@db/s") == "postgresql://tuner@db/s"
    assert st.storage_url("journal:/x/s.journal", "/o") == "journal:/x/s.journal"
    assert st.storage_url(None, "/o") == "journal:/o/study.journal"


def test_the_default_storage_is_a_journal_unless_an_earlier_sqlite_study_is_there(tmp_path):
    assert st.default_storage(tmp_path, "studies") == f"journal:{tmp_path}/studies.journal"
    (tmp_path / "studies.db").write_bytes(b"")
    assert st.default_storage(tmp_path, "studies") == f"sqlite:///{tmp_path}/studies.db"
    (tmp_path / "studies.journal").write_bytes(b"")  # both: the journal, which only this mneme writes
    assert st.default_storage(tmp_path, "studies") == f"journal:{tmp_path}/studies.journal"


def test_an_output_directory_with_a_study_db_from_an_earlier_mneme_keeps_it(tmp_path, record):
    """Before the journal default, `mneme tune` kept its study in <output>/study.db: such a study still resumes
    with the same command, and its trials are not redone."""
    out = tmp_path / "out"
    old = f"sqlite:///{out / 'study.db'}"
    first = Tuner(options(record, out, storage=old, space="standard", sampler="tpe", trials=6, seed=1)).run()
    assert first.exit_code == EXIT_OK
    assert st.storage_url(None, str(out)) == old
    before = {t.number: t.values for t in trials_of(old, first.summary["study"]) if st.counts(t)}
    resumed = Tuner(options(record, out, space="standard", sampler="tpe", trials=10, resume=True)).run()
    assert resumed.exit_code == EXIT_OK, resumed.message
    after = trials_of(old, first.summary["study"])
    assert sum(1 for t in after if st.counts(t)) == 10
    assert all(t.values == before[t.number] for t in after if t.number in before)
    assert not (out / "study.journal").exists()


def test_file_storages_are_named_absolutely_so_any_working_directory_finds_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert st.storage_url("runs/s.log", "/o") == f"journal:{tmp_path}/runs/s.log"
    assert st.storage_url("journal:s.journal", "/o") == f"journal:{tmp_path}/s.journal"
    assert st.storage_url("sqlite:///a/study.db", "/o") == f"sqlite:///{tmp_path}/a/study.db"
    assert st.storage_url("sqlite:////abs/study.db", "/o") == "sqlite:////abs/study.db"
    with pytest.raises(ConfigurationError, match="expected a database URL"):
        st.storage_url("some/dir", "/o")


def test_a_trial_waits_for_the_earlier_trials_to_claim_their_configuration(tmp_path, monkeypatch):
    """The race two processes once lost (CI, journal storage): process A has asked trial 0 but not yet written its
    claim when process B reads the study for trial 1. B must wait for A's claim, so that it sees A ran first."""
    import threading

    import optuna

    from mneme.tune import session as se

    storage = st.open_storage(f"journal:{tmp_path / 'race.journal'}")
    study = optuna.create_study(study_name="race", storage=storage)
    a = study.ask()  # process A: asked, claim not written yet
    b = study.ask()
    b.set_user_attr(st.T_CLAIM, {"owner": "B", "config_hash": "H"})
    threading.Timer(0.3, lambda: a.set_user_attr(st.T_CLAIM, {"owner": "A", "config_hash": "H"})).start()
    session = se.TrialSession(study, space=None, proposer=None, objective=None, trials=10, owner="B")
    t0 = time.monotonic()
    ledger = session._settled_ledger(b.number)
    assert time.monotonic() - t0 >= 0.25  # it waited for A's claim...
    assert ledger.original("H", b.number).number == a.number  # ...and so B copies A instead of running H again

    monkeypatch.setattr(se, "CLAIM_WAIT_S", 0.2)
    study.ask()  # a process that died between asking and claiming holds nobody up for long
    t0 = time.monotonic()
    session._settled_ledger(10)
    assert 0.15 <= time.monotonic() - t0 < 2.0


def test_journal_storage_needs_no_fsync_per_write_and_optunas_own_backend_reads_it(tmp_path, monkeypatch):
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from mneme.tune.study import open_storage

    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    path = tmp_path / "s.journal"
    study = optuna.create_study(storage=open_storage(f"journal:{path}"), study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=6)
    assert synced == []  # Optuna's own backend fsyncs every write
    stock = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))))
    assert [t.params["x"] for t in stock.trials] == [t.params["x"] for t in study.trials] and len(stock.trials) == 6


def test_ctrl_c_between_answer_and_tell_still_tells_the_trial(tmp_path, record, monkeypatch):
    """SIGINT sent while a trial's answer is on its way to the storage: the trial is told, then the run stops."""
    from mneme.tune.session import TrialSession

    told = TrialSession._tell

    def tell_after_ctrl_c(self, t, result, extra):
        if t.number == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return told(self, t, result, extra)

    monkeypatch.setattr(TrialSession, "_tell", tell_after_ctrl_c)
    storage = f"sqlite:///{tmp_path / 'tell.db'}"
    outcome = Tuner(options(record, tmp_path / "o", storage=storage, study="s", compile_jobs=1,
                            max_inflight=1)).run()
    assert outcome.exit_code == EXIT_INTERRUPTED
    trials = {t.number: t for t in trials_of(storage, "s")}
    assert trials[2].state.name in ("COMPLETE", "FAIL") and st.T_RESULT in trials[2].user_attrs
    assert not any(t.state.name == "RUNNING" for t in trials.values())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the guard put the handler back


def test_a_ledger_that_remembers_finished_trials_answers_like_a_fresh_one():
    """Ledger's `finished` memo (kept by the session across snapshots) must not change any answer, also after
    running trials finish, get excluded or are queued."""
    import optuna
    from optuna.trial import TrialState

    study = optuna.create_study()
    trials = [study.ask() for _ in range(6)]
    for i, t in enumerate(trials):
        t.set_user_attr(st.T_CLAIM, {"owner": "me", "config_hash": f"h{i % 3}"})

    def answers(ledger):
        return ([t.number for t in ledger.counted], ledger.numbers, [t.number for t in ledger.running],
                {h: t.number for h, t in ledger.first_by_hash.items()}, ledger.rank(4), sorted(ledger.by_number))

    memo = {}
    study.tell(trials[0], 1.0)
    trials[1].set_user_attr(st.T_FLAG, "rejected")
    study.tell(trials[1], state=TrialState.FAIL)
    snap = study.get_trials(deepcopy=False)
    assert answers(st.Ledger(snap, memo)) == answers(st.Ledger(snap))
    assert set(memo) == {0, 1}  # only finished trials are remembered
    study.tell(trials[3], 2.0)
    trials[4].set_user_attr(st.T_FLAG, "surplus")
    study.tell(trials[4], state=TrialState.FAIL)
    study.enqueue_trial({"x": 1.0})
    snap = study.get_trials(deepcopy=False)
    fresh, remembered = st.Ledger(snap), st.Ledger(list(reversed(snap)), memo)
    assert answers(remembered) == answers(fresh)
    assert fresh.numbers == [0, 2, 3, 5] and [t.number for t in fresh.running] == [2, 5]
    assert {h: t.number for h, t in fresh.first_by_hash.items()} == {"h0": 0, "h2": 2}  # h1: excluded trials only


class InstantExecutor:
    """Answers every configuration at submission (SyntheticBackend's result), to test the search loop's order
    alone; the studies above run the same loop on the real executor."""

    def __init__(self, *args, **kwargs):
        self.compile_jobs, self.devices = 1, [0]
        self.backend = SyntheticBackend(None, None, 0, {}, None)

    def evaluate(self, config):
        return self.backend.run(None, config)

    def submit(self, config):
        from concurrent.futures import Future

        fut = Future()
        fut.set_result(self.evaluate(config))
        return fut

    def shutdown(self, wait=True, cancel_futures=False):
        pass

    def stats(self):
        return {"workers": []}

    def worker_errors(self):
        return []


def test_finished_trials_are_told_before_more_are_asked(tmp_path, record, monkeypatch):
    """With every result ready at once, each batch asks for a full --max-inflight: no trial waits on an original
    that has finished but was not told yet (the loop used to ask one trial at a time behind such originals)."""
    import mneme.tune.executor as executor_mod
    from mneme.tune.session import TrialSession

    needs = []
    ask = TrialSession.ask

    def counting_ask(self, need):
        needs.append(need)
        return ask(self, need)

    monkeypatch.setattr(executor_mod, "AsyncReplayExecutor", InstantExecutor)
    monkeypatch.setattr(TrialSession, "ask", counting_ask)
    outcome = Tuner(options(record, tmp_path / "o", storage=f"journal:{tmp_path / 'j.log'}", space="standard",
                            sampler="random", trials=40, max_inflight=4)).run()
    assert outcome.exit_code == EXIT_OK, outcome.message
    assert needs == [4] * 10
