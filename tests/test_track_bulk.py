"""The writer's bulk path (many new runs per transaction of MLflow's own SQL store) against MlflowClient's
path: the same messages written both ways read back identically, row for row, on SQLite and on a real
PostgreSQL server; a batch with broken runs still logs the others."""

import math
from pathlib import Path

import pytest
import sqlalchemy
from mlflow import MlflowClient

from mnemetest import read_artifact
from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings, dim3
from mneme.track.records import FAILED, FINISHED, KILLED, RunRecord
from mneme.track.sweep import SweepRun
from mneme.track.store import resolve_uri
from mneme.track.tracker import Tracker
from mneme.track.writer import Writer

import mlflow

from mneme.track.bulk import VERIFIED_MLFLOW, verified_release

# the table writer runs only on the MLflow releases it was verified on; elsewhere MLflow's public API is the path
# (tests/test_track_store.py and the others test it there)
pytestmark = pytest.mark.skipif(not verified_release(mlflow.__version__),
                                reason=f"MLflow {mlflow.__version__}: the bulk path is verified on {VERIFIED_MLFLOW} only")


@pytest.fixture(params=["sqlite", "postgresql"])
def uri(request, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the store's default artifact root (./mlruns) lands here
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/mlflow.db"
    return resolve_uri(request.getfixturevalue("postgres_url"))  # postgresql:// with psycopg2, as users give it


def _experiment_kwargs(i: int, ok: bool = True) -> dict:
    config = ExperimentConfiguration(grid=dim3(64 // (i + 1)), block=dim3(32 * (i + 1)))
    result = ExperimentResult(
        exec_time=[1000 - 10 * i + j for j in range(6)], executed=True, verified=ok,
        status="verified" if ok else "failed_verification", error="" if ok else f"mismatch in trial {i}",
        reg_usage=16 + i, obj_size=2048, opt_time=0.01, cubin_time=0.03, occupancy=0.5, fidelity=0.97,
        code_hash=f"{i:064x}", gpu_name="NVIDIA H200",
    )
    return dict(name=f"trial-{i}", config=config, settings=MeasurementSettings(iterations=6), result=result,
                role="trial", baseline_ns=1000.0, metric="median", kernel="_Z6vecaddPfS_S_i",
                tags={"mneme.trial": i}, artifacts={"kernel.ptx": f"// ptx {i}\n" * 50,
                                                   "kernel.cubin": b"\x7fELF" + bytes([i]) * 300})


def _messages(tmp_path: Path, negatives: bool = True) -> list:
    """A sweep: a started parent, experiments, and plain runs with every odd value MLflow handles.

    MlflowClient's own path on PostgreSQL now and then sends a multi-row metric INSERT cut short at a negative
    value (psycopg2 'syntax error at end of input', seen in CI at -inf and at -1.5), so the comparison there
    leaves negative and infinite values out; mneme's metrics are finite and not negative. SQLite keeps them."""
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 4)
    odd_metrics = [("loss", 3.0, 0), ("loss", 2.0, 1), ("loss", 2.5, 1), ("loss", 1.0, 2), ("loss", 1.0, 2),
                   ("nan", float("nan"), 0)] \
        + ([("inf", math.inf, 0), ("ninf", -math.inf, 3), ("neg", -1.5, -1)] if negatives else []) \
        + [("tie", 0.0, 5), ("tie", float("nan"), 5), ("int", 7, 0)]
    return [
        ("start", "P", RunRecord("sweep", {"space": "launch"}, {"mneme.role": "sweep"}), None, None),
        ("experiment", "e0", False, "P", _experiment_kwargs(0)),
        ("experiment", "e1", False, "P", _experiment_kwargs(1, ok=False)),
        ("run", "odd", RunRecord("odd", {"a": "1", "long": "y" * 7000, "empty": "", "num": 5, "none": None}, {"t.x": "v", "mlflow.note.content": "n"},
                                 odd_metrics), "P"),
        ("run", "kid", RunRecord("kid-of-odd", {"k": "v"}, {}, [("m", 1.0, 0)], status=KILLED), "odd"),
        ("run", "files", RunRecord("files", artifacts={"sub/dir/a.txt": "text ü", "b.bin": b"\x00\x01",
                                                         "c.dat": blob}, status=FAILED), "P"),
        ("run", "bare", RunRecord("bare"), None),
        ("run", "user", RunRecord("user", tags={"mlflow.user": "alice", "mlflow.source.git.commit": "abc"}), None),
        ("experiment", "e2", False, "P", _experiment_kwargs(2)),
        ("end", "P", FINISHED),
    ]


def _rows(uri: str, client: MlflowClient, experiment_id: str) -> dict:
    """Every row MLflow keeps for the experiment's runs, with ids and times replaced by names."""
    runs = client.search_runs([experiment_id])
    name = {r.info.run_id: r.info.run_name for r in runs}
    root = client.get_experiment(experiment_id).artifact_location
    engine = sqlalchemy.create_engine(uri)
    out = {}
    with engine.connect() as conn:
        ids = list(name)
        for table in ("runs", "tags", "params", "metrics", "latest_metrics"):
            q = sqlalchemy.text(f"SELECT * FROM {table} WHERE run_uuid IN :ids").bindparams(
                sqlalchemy.bindparam("ids", expanding=True))
            rows = []
            for row in conn.execute(q, {"ids": ids}).mappings():
                row = dict(row)
                run_id = row.pop("run_uuid")
                row["run"] = name[run_id]
                for t in ("start_time", "end_time", "timestamp"):
                    if t in row:
                        row[t] = "time" if row[t] is not None else None
                if table == "runs":
                    assert row.pop("experiment_id") == int(experiment_id)
                    assert row["artifact_uri"] == f"{root}/{run_id}/artifacts"
                    row["artifact_uri"] = "<root>/<id>/artifacts"
                if table == "tags" and row["key"] == "mlflow.parentRunId":
                    row["value"] = name[row["value"]]
                if "is_nan" in row:
                    row["is_nan"] = bool(row["is_nan"])
                rows.append(tuple(sorted(row.items())))
            out[table] = sorted(rows)
    engine.dispose()
    return out


def _value(v: float):
    return "nan" if math.isnan(v) else v


def _read_back(client: MlflowClient, experiment_id: str) -> dict:
    """What a user sees through MlflowClient: run info, data, metric histories and artifact bytes."""
    out = {}
    for r in client.search_runs([experiment_id]):
        i, d = r.info, r.data
        assert i.start_time <= i.end_time
        names = {}
        histories = {}
        for key in d.metrics:
            history = client.get_metric_history(i.run_id, key)
            assert all(i.start_time <= h.timestamp <= i.end_time for h in history)
            histories[key] = sorted(((h.step, _value(h.value)) for h in history), key=repr)
        stack = [""]
        while stack:
            for a in client.list_artifacts(i.run_id, stack.pop() or None):
                if a.is_dir:
                    stack.append(a.path)
                else:
                    names[a.path] = read_artifact(client, i.run_id, a.path)
        tags = dict(d.tags)
        if "mlflow.parentRunId" in tags:
            tags["mlflow.parentRunId"] = client.get_run(tags["mlflow.parentRunId"]).info.run_name
        out[i.run_name] = dict(status=i.status, stage=i.lifecycle_stage, user=i.user_id, params=d.params, tags=tags,
                               metrics={k: _value(v) for k, v in d.metrics.items()},
                               history=histories, artifacts=names)
    return out


def _write_both(uri, tmp_path, name):
    msgs = _messages(tmp_path, negatives=uri.startswith("sqlite:"))
    old = Writer(uri, f"{name}-client", bulk=False)
    for m in msgs:
        old.handle(m)
    new = Writer(uri, f"{name}-bulk", bulk=True)
    new.handle_many(msgs)
    return old, new


def test_bulk_runs_read_back_exactly_as_mlflow_client_writes_them(uri, tmp_path):
    old, new = _write_both(uri, tmp_path, "same")
    assert old.path.startswith("client") and new.path == "bulk-sql"
    assert old.errors == [] and new.errors == [] and new.bulk_retries == 0
    client = MlflowClient(uri)
    seen = _read_back(client, new.experiment_id)
    assert seen == _read_back(client, old.experiment_id)
    assert _rows(uri, client, new.experiment_id) == _rows(uri, client, old.experiment_id)

    # what the records promised, seen through MLflow
    assert set(seen) == {"sweep", "trial-0", "trial-1", "trial-2", "odd", "kid-of-odd", "files", "bare", "user"}
    assert {n: r["status"] for n, r in seen.items() if r["status"] != FINISHED} == {
        "trial-1": FAILED, "kid-of-odd": KILLED, "files": FAILED}
    assert seen["kid-of-odd"]["tags"]["mlflow.parentRunId"] == "odd"
    assert seen["trial-2"]["tags"]["mlflow.parentRunId"] == "sweep" and "mlflow.parentRunId" not in seen["bare"]["tags"]
    assert seen["trial-0"]["tags"]["mlflow.runName"] == "trial-0" and seen["trial-0"]["tags"]["mneme.trial"] == "0"
    assert seen["user"]["user"] == "alice" and seen["bare"]["user"] == "unknown"
    odd = seen["odd"]
    assert odd["params"]["long"] == "y" * 6000 and odd["params"]["empty"] == ""
    assert odd["params"]["num"] == "5" and odd["params"]["none"] == "None"
    assert odd["history"]["loss"] == [(0, 3.0), (1, 2.0), (1, 2.5), (2, 1.0)]
    signed = {"inf": 1.7976931348623157e308, "ninf": -1.7976931348623157e308, "neg": -1.5} \
        if uri.startswith("sqlite:") else {}
    assert odd["metrics"] == {"loss": 1.0, "nan": "nan", **signed, "tie": 0.0, "int": 7.0}
    assert seen["trial-0"]["history"]["exec_time_ns"] == [(j, 1000.0 + j) for j in range(6)]
    assert seen["trial-0"]["metrics"]["exec_time_median_ns"] == 1002.5
    assert seen["files"]["artifacts"] == {"sub/dir/a.txt": "text ü".encode(), "b.bin": b"\x00\x01",
                                          "c.dat": bytes(range(256)) * 4}
    assert set(seen["trial-0"]["artifacts"]) == {"kernel.ptx", "kernel.cubin", "config.yaml", "result.json"}
    assert seen["trial-0"]["artifacts"]["kernel.cubin"] == b"\x7fELF" + bytes([0]) * 300

    # the new runs went into the store together: one transaction, one end time
    bulk_runs = [r for r in client.search_runs([new.experiment_id]) if r.info.run_name != "sweep"]
    assert len(bulk_runs) == 8 and len({r.info.end_time for r in bulk_runs}) == 1


def test_a_broken_run_does_not_lose_the_rest_of_its_batch(uri, tmp_path):
    good = [("run", f"g{i}", RunRecord(f"good-{i}", {"i": str(i)}, {"mneme.trial": str(i)}, [("x", float(i), 0)],
                                       {"out.txt": f"run {i}"}), None) for i in range(6)]
    refused = ("run", "refused", RunRecord("refused", {"k" * 300: "v"}, {}, [("x", 1.0, 0)]), None)  # MLflow's validator
    # a tag value no database driver can bind: refused by the store when the batch commits
    unbound = ("run", "unbound", RunRecord("unbound", {"p": "1"}, {"t": {"a": 1}}, [("x", 1.0, 0)], {"f.txt": "f"}), None)
    w = Writer(uri, "broken", bulk=True)
    w.handle_many(good[:2] + [refused] + good[2:4] + [unbound] + good[4:])
    assert w.path == "bulk-sql" and w.bulk_retries == 1
    assert len(w.errors) == 2 and w.errors[0].startswith("run refused:") and w.errors[1].startswith("run unbound:")
    assert w.done == 8
    client = MlflowClient(uri)
    runs = {r.info.run_name: r for r in client.search_runs([w.experiment_id])}
    assert set(runs) == {f"good-{i}" for i in range(6)} | {"refused"}  # create_run refused 'unbound' outright
    for i in range(6):
        r = runs[f"good-{i}"]
        assert r.info.status == FINISHED and r.data.params == {"i": str(i)} and r.data.metrics == {"x": float(i)}
        assert r.data.tags["mneme.trial"] == str(i)
        assert read_artifact(client, r.info.run_id, "out.txt").decode() == f"run {i}"
    assert runs["refused"].info.status == FAILED  # as MlflowClient's path leaves it: created, refused, ended FAILED
    # the files of the batch the store refused are gone; MlflowClient's path wrote the good runs' again
    root = Path(client.get_experiment(w.experiment_id).artifact_location)
    assert {p.name for p in root.iterdir()} == {runs[f"good-{i}"].info.run_id for i in range(6)}


def test_a_sweep_through_the_writer_process_uses_the_bulk_path(uri):
    with Tracker(uri, "bulk-sweep", writers=1) as tracker:
        sweep = SweepRun.start(tracker, "sweep")
        for i in range(40):
            sweep.trial(i, ExperimentConfiguration(block=dim3(32 * (1 + i % 8))), MeasurementSettings(iterations=6),
                        _experiment_kwargs(i % 5)["result"], baseline_ns=1000.0, kernel="k")
        parent = sweep.run_id
        sweep.finish(summarize=False)
    assert tracker.report["errors"] == [] and tracker.report["path"] == "bulk-sql"
    assert tracker.report["done"] == 1 + 40 + 1 + 1  # start, trials, ids, end
    client = MlflowClient(uri)
    kids = client.search_runs([tracker.experiment_id], f"tags.mlflow.parentRunId = '{parent}'", max_results=100)
    assert sorted(int(r.data.tags["mneme.trial"]) for r in kids) == list(range(40))
    assert all(r.info.status == FINISHED and r.data.metrics["verified"] == 1.0 for r in kids)
    assert client.get_run(parent).info.status == FINISHED


def test_stores_without_sql_and_the_switch_keep_to_mlflow_client(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    w = Writer(f"file://{tmp_path}/mlruns", "files")
    assert w.bulk is None and w.path.startswith("client (FileStore")
    w.handle_many([("run", "a", RunRecord("a", {"p": "1"}, {}, [("m", 2.0, 0)], {"f.txt": "hi"}), None)])
    assert w.errors == [] and w.report()["path"] == w.path
    run = MlflowClient(f"file://{tmp_path}/mlruns").search_runs([w.experiment_id])[0]
    assert run.data.params == {"p": "1"} and run.data.metrics == {"m": 2.0} and run.info.status == FINISHED
    monkeypatch.setenv("MNEME_TRACK_BULK", "0")
    assert Writer(f"sqlite:///{tmp_path}/m.db", "off").path.endswith("MNEME_TRACK_BULK=0)")


def test_trials_of_one_kernel_share_its_artifact_files(tmp_path, monkeypatch):
    """The same .ptx and .cubin logged by many trials is written once and hard-linked; small files are not."""
    import os

    monkeypatch.chdir(tmp_path)
    kernel = {"kernel.ptx": "// ptx\n" * 2000, "kernel.cubin": b"\x7fELF" + bytes(9000)}
    msgs = [("run", f"t{i}", RunRecord(f"trial-{i}", {}, {}, [("x", 1.0, 0)], {**kernel, "result.json": f"{{\"i\": {i}}}"}), None)
            for i in range(5)]
    w = Writer(f"sqlite:///{tmp_path}/mlflow.db", "links", bulk=True)
    w.handle_many(msgs[:3])
    w.handle_many(msgs[3:])  # a later batch links to the first one's files too
    assert w.path == "bulk-sql" and w.errors == []
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([w.experiment_id])
    assert len(runs) == 5
    from mlflow.utils.file_utils import local_file_uri_to_path

    where = {r.info.run_id: Path(local_file_uri_to_path(r.info.artifact_uri)) for r in runs}  # the files themselves
    stat = {name: {os.stat(where[r.info.run_id] / name).st_ino for r in runs} for name in ("kernel.ptx", "kernel.cubin", "result.json")}
    assert len(stat["kernel.ptx"]) == 1 and len(stat["kernel.cubin"]) == 1 and len(stat["result.json"]) == 5
    for r in runs:
        assert read_artifact(client, r.info.run_id, "kernel.cubin") == kernel["kernel.cubin"]
        assert read_artifact(client, r.info.run_id, "result.json").decode().startswith('{"i": ')


def test_a_metric_name_seen_before_is_still_refused_a_value_mlflow_refuses(tmp_path, monkeypatch):
    """The bulk path validates a metric name once; a later non-numeric value of that name still goes through
    MLflow's validator and is refused, as MlflowClient refuses it."""
    monkeypatch.chdir(tmp_path)
    w = Writer(f"sqlite:///{tmp_path}/mlflow.db", "names", bulk=True)
    w.handle_many([("run", "a", RunRecord("a", {}, {}, [("m", 1.0, 0), ("m", 2.0, 1)]), None),
                   ("run", "b", RunRecord("b", {}, {}, [("m", "fast", 0)]), None),
                   ("run", "c", RunRecord("c", {}, {}, [("m", 3.0, 0)]), None)])
    assert len(w.errors) == 1 and w.errors[0].startswith("run b:") and "fast" in w.errors[0]
    runs = {r.info.run_name: r for r in MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").search_runs([w.experiment_id])}
    assert runs["a"].data.metrics == {"m": 2.0} and runs["c"].data.metrics == {"m": 3.0}


def test_writers_of_one_sqlite_store_take_turns_through_one_lock_file(tmp_path):
    """CommitLock: another process waits while one holds it, and gets it the moment it is let go."""
    import subprocess
    import sys
    import time

    from mneme.track.bulk import CommitLock

    db = tmp_path / "mlflow.db"
    lock = CommitLock(str(db))
    assert CommitLock(str(tmp_path / "." / "mlflow.db")).path == lock.path != CommitLock(str(tmp_path / "other.db")).path
    code = ("import sys, time; from mneme.track.bulk import CommitLock; lock = CommitLock(sys.argv[1]); t = time.monotonic()\n"
            "with lock: print(round(time.monotonic() - t, 3))")
    with lock:
        child = subprocess.Popen([sys.executable, "-c", code, str(db)], stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert child.poll() is None  # still waiting for the lock
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0 and float(out) >= 0.5


def test_writer_connections_get_the_fast_sqlite_settings_and_report_where_time_went(tmp_path):
    """The writer process's SQLite settings (WAL, no fsync per commit, rare checkpoints, a large cache) are in
    force on MLflow's own connections; the report says how the writer spent its time."""
    import subprocess
    import sys

    code = (
        "import sys; from mneme.track.writer import _fast_sqlite, Writer, SQLITE_PRAGMAS; _fast_sqlite()\n"
        "from mneme.track.records import RunRecord\n"
        "w = Writer(sys.argv[1], 'fast', bulk=True)\n"
        "w.handle_many([('run', f'r{i}', RunRecord(f'r{i}', {'p': '1'}, {}, [('m', 1.0, 0)]), None) for i in range(3)])\n"
        "store = w.client._client._tracking_client.store\n"
        "with store.ManagedSessionMaker() as s:\n"
        "    c = s.connection()\n"
        "    got = [c.exec_driver_sql(f'PRAGMA {p.split(\"=\")[0]}').scalar() for p in SQLITE_PRAGMAS]\n"
        "print(got); print(w.report()['timing'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code, f"sqlite:///{tmp_path}/mlflow.db"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    pragmas, timing = [eval(line) for line in out.stdout.splitlines()[-2:]]
    assert pragmas == ["wal", 1, 65536, -65536]  # synchronous NORMAL is 1
    (t,) = timing
    assert t["batches"] == 1 and t["batched_runs"] == 3 and t["busy_s"] >= t["insert_s"] > 0 and "commit_lock_wait_s" in t
