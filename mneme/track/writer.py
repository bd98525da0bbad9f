"""The one place that talks to the MLflow store, off the search's critical path.

The search process only puts small messages on a queue; a writer (by default a separate process, so
SQLAlchemy's CPU time does not compete with the search for the GIL) creates the runs, logs them with
`MlflowClient.log_batch`, copies artifacts and ends the runs. Runs are named by keys the search picks,
so it never waits for a run id.

A writer never leaves a run RUNNING: on `close` it ends every open run with the status it is given,
and if the search process dies without closing (SIGKILL, a crash) the writer process sees its input
pipe close and ends the open runs as KILLED.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from mneme.track.records import FAILED, KILLED, RUNNING, RunRecord, experiment_record

#: MLflow's per-call limits on log_batch.
PARAMS_TAGS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
#: how often a caller waiting for a reply checks that the writer is still alive (seconds)
POLL_S = 0.5


class _Retrying:
    """An MlflowClient whose calls are retried while SQLite is locked by another writer process
    (a call that failed on the lock changed nothing, so repeating it is safe)."""

    ATTEMPTS = 40

    def __init__(self, client: Any):
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            for attempt in range(self.ATTEMPTS):
                try:
                    return attr(*args, **kwargs)
                except Exception as e:  # noqa: BLE001 - MLflow wraps the driver's error in its own
                    if "database is locked" not in str(e) or attempt == self.ATTEMPTS - 1:
                        raise
                    time.sleep(min(1.0, 0.02 * (attempt + 1)))

        return call


class Writer:
    """Executes writer messages against one MLflow experiment; used by every transport below."""

    def __init__(self, uri: str, experiment: str):
        from mlflow import MlflowClient

        self.client = _Retrying(MlflowClient(tracking_uri=uri))
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            self.experiment_id = self.client.create_experiment(experiment)
        else:
            if exp.lifecycle_stage != "active":
                self.client.restore_experiment(exp.experiment_id)
            self.experiment_id = exp.experiment_id
        self.runs: Dict[str, str] = {}  # key -> MLflow run id
        self.open: Dict[str, str] = {}  # key -> run id, runs this writer started and has not ended
        self.resumed: set = set()
        self.errors: List[str] = []
        self.done = 0

    # -- messages ------------------------------------------------------------------------------
    def handle(self, msg: Tuple[Any, ...]) -> Any:
        op, args = msg[0], msg[1:]
        try:
            return getattr(self, f"op_{op}")(*args)
        except Exception as e:  # a bad run must not stop the writer: report it at close
            self.errors.append(f"{op} {args[0] if args else ''}: {type(e).__name__}: {e}")
            if os.environ.get("MNEME_TRACK_DEBUG"):
                traceback.print_exc()
            return None
        finally:
            self.done += 1

    def op_start(self, key: str, record: RunRecord, parent: Optional[str], resume: Optional[str]) -> str:
        if resume:
            self.client.update_run(resume, status=RUNNING)
            self.resumed.add(key)
            run_id = resume
        else:
            tags = dict(record.tags)
            if parent:
                tags["mlflow.parentRunId"] = self.runs.get(parent, parent)
            run_id = self.client.create_run(self.experiment_id, run_name=record.name, tags=tags).info.run_id
            record = RunRecord(record.name, record.params, {}, record.metrics, record.artifacts, record.status)
        self.runs[key] = run_id
        self.open[key] = run_id
        self.op_log(key, record)
        return run_id

    def op_log(self, key: str, record: RunRecord) -> None:
        from mlflow.entities import Metric, Param, RunTag

        run_id = self.runs[key]
        now = int(time.time() * 1000)
        params = [Param(k, v) for k, v in record.params.items()]
        if params and key in self.resumed:  # MLflow params are write-once; a resumed run keeps its own
            existing = self.client.get_run(run_id).data.params
            params = [p for p in params if p.key not in existing]
        tags = [RunTag(k, v) for k, v in record.tags.items()]
        metrics = [Metric(k, v, now, step) for k, v, step in record.metrics]
        while params or tags or metrics:
            self.client.log_batch(
                run_id,
                params=params[:PARAMS_TAGS_PER_BATCH],
                tags=tags[:PARAMS_TAGS_PER_BATCH],
                metrics=metrics[:METRICS_PER_BATCH],
            )
            params, tags = params[PARAMS_TAGS_PER_BATCH:], tags[PARAMS_TAGS_PER_BATCH:]
            metrics = metrics[METRICS_PER_BATCH:]
        if record.artifacts:
            self._artifacts(run_id, record.artifacts)

    def _artifacts(self, run_id: str, artifacts: Dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory(prefix="mneme-artifacts-") as tmp:
            for name, content in artifacts.items():
                dest = Path(tmp) / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, str):
                    content = content.encode()
                dest.write_bytes(content if isinstance(content, (bytes, bytearray)) else Path(content).read_bytes())
            self.client.log_artifacts(run_id, tmp)

    def op_end(self, key: str, status: str) -> None:
        run_id = self.open.pop(key, None) or self.runs[key]
        self.client.set_terminated(run_id, status=status)

    def op_run(self, key: str, record: RunRecord, parent: Optional[str]) -> str:
        """A whole run in one message: start, log, end (what a finished trial needs)."""
        logged = False
        try:
            self.op_start(key, record, parent, None)
            logged = True
        finally:
            self._end_logged(key, record.status if logged else FAILED)
        return self.runs[key]

    def _end_logged(self, key: str, status: str) -> None:
        """End a run whose logging was attempted (FAILED when the logging itself raised)."""
        if key in self.open:
            self.op_end(key, status)

    def op_experiment(self, key: str, started: bool, parent: Optional[str], kwargs: Dict[str, Any]) -> str:
        """Build an experiment's run here, off the search's critical path (see records.experiment_record)."""
        record = experiment_record(**kwargs)
        if not started:
            return self.op_run(key, record, parent)
        logged = False
        try:
            self.op_log(key, record)
            logged = True
        finally:
            self._end_logged(key, record.status if logged else FAILED)
        return self.runs[key]

    def op_call(self, key: str, func: str, kwargs: Dict[str, Any]) -> Any:
        """Run `module:function(client, run_id, **kwargs)` here (the sweep summary with its plots)."""
        import importlib

        modname, fname = func.split(":")
        return getattr(importlib.import_module(modname), fname)(self.client, self.runs[key], **kwargs)

    def op_ids(self, keys: List[str]) -> Dict[str, str]:
        return {k: self.runs.get(k, "") for k in keys}

    def end_open(self, status: str) -> None:
        for key in list(self.open):
            self.handle(("end", key, status))

    def report(self) -> Dict[str, Any]:
        return {"errors": list(self.errors), "done": self.done, "experiment_id": self.experiment_id}


def serve(next_message: Callable[[], Optional[tuple]], reply: Callable[[tuple], None], uri: str, experiment: str) -> None:
    """The writer loop: one reply per ('sync', ...) message; `next_message` returns None when the
    search process is gone, and then the open runs end KILLED."""
    try:
        writer = Writer(uri, experiment)
    except BaseException as e:  # noqa: BLE001 - anything here means the store cannot be used
        reply(("error", f"{type(e).__name__}: {e}"))
        return
    reply(("ready", writer.experiment_id))
    while True:
        msg = next_message()
        if msg is None:
            writer.end_open(KILLED)
            return
        if msg[0] == "sync":
            reply(("sync", msg[1], writer.handle(msg[2]) if msg[2] else None, writer.report()))
        elif msg[0] == "close":
            writer.end_open(msg[1])
            reply(("closed", writer.report()))
            return
        else:
            writer.handle(msg)


class InlineTransport:
    """The writer in the calling thread: for one run (`mneme replay --track`), where waiting is fine."""

    def __init__(self, uri: str, experiment: str):
        self.uri, self.experiment = uri, experiment

    def await_ready(self, timeout: float) -> None:
        self.writer = Writer(self.uri, self.experiment)
        self.experiment_id = self.writer.experiment_id

    def send(self, msg: Tuple[Any, ...]) -> None:
        self.writer.handle(msg)

    def request(self, msg: Tuple[Any, ...], timeout: Optional[float] = None) -> Tuple[Any, Dict[str, Any]]:
        return (self.writer.handle(msg) if msg else None), self.writer.report()

    def close(self, status: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        if not hasattr(self, "writer"):
            return {}
        self.writer.end_open(status)
        return self.writer.report()


class _QueueTransport:
    """Sends through an unbounded queue (never blocks the search), waits on a reply queue."""

    inbox: "queue.Queue"
    replies: "queue.Queue"

    def await_ready(self, timeout: float) -> None:
        """Wait for the writer to open the store; raises RuntimeError with the store's complaint."""
        self._tokens = 0
        kind, value = self._reply(timeout, "start")
        if kind == "error":
            raise RuntimeError(value)
        self.experiment_id = value

    def _reply(self, timeout: Optional[float], what: str) -> Tuple[Any, ...]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self.replies.get(timeout=POLL_S)
            except queue.Empty:
                if not self.alive():
                    try:
                        return self.replies.get_nowait()
                    except queue.Empty:
                        raise RuntimeError(f"the MLflow writer died before it answered ({what})") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"the MLflow writer did not answer within {timeout:.0f} s ({what})") from None

    def send(self, msg: Tuple[Any, ...]) -> None:
        self.inbox.put(msg)

    def request(self, msg: Tuple[Any, ...], timeout: Optional[float] = None) -> Tuple[Any, Dict[str, Any]]:
        self._tokens += 1
        self.inbox.put(("sync", self._tokens, msg))
        while True:
            reply = self._reply(timeout, msg[0] if msg else "sync")
            if reply[0] == "sync" and reply[1] == self._tokens:
                return reply[2], reply[3]

    def close(self, status: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        self.inbox.put(("close", status))
        return self.close_sent(timeout)

    def close_sent(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Wait for the writer to answer a close already sent (all its work is in the store then)."""
        try:
            while True:
                reply = self._reply(timeout, "close")
                if reply[0] == "closed":
                    self.join(0.2)  # it is exiting; its interpreter's teardown need not hold the caller
                    return reply[1]
        except BaseException:
            self.join(10.0)
            raise


class ThreadTransport(_QueueTransport):
    """The writer in a daemon thread of this process."""

    def __init__(self, uri: str, experiment: str):
        self.thread = threading.Thread(target=self._serve, args=(uri, experiment), name="mneme-mlflow", daemon=True)
        self.inbox = queue.Queue()
        self.replies = queue.Queue()
        self.thread.start()

    def _serve(self, uri: str, experiment: str) -> None:
        serve(self.inbox.get, self.replies.put, uri, experiment)

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: Optional[float]) -> None:
        self.thread.join(timeout)


class ProcessTransport(_QueueTransport):
    """The writer in its own process (`python -m mneme.track.writer`), fed pickles through a pipe.

    A plain subprocess rather than multiprocessing, so the caller's __main__ is never re-imported;
    its own session, so Ctrl-C and group signals reach only the search, which then closes the runs.
    A feeder thread does the pipe writes, so a slow store never blocks the search.
    """

    def __init__(self, uri: str, experiment: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mneme.track.writer", uri, experiment],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )
        self.inbox = queue.Queue()
        self.replies = queue.Queue()
        threading.Thread(target=self._feed, name="mneme-mlflow-feed", daemon=True).start()
        threading.Thread(target=self._read, name="mneme-mlflow-read", daemon=True).start()

    def _feed(self) -> None:
        pipe = self.process.stdin
        try:
            while True:
                msg = self.inbox.get()
                pickle.dump(msg, pipe, protocol=pickle.HIGHEST_PROTOCOL)
                pipe.flush()
                if msg[0] == "close":
                    pipe.close()
                    return
        except (BrokenPipeError, OSError, ValueError):
            return

    def _read(self) -> None:
        while True:
            try:
                self.replies.put(pickle.load(self.process.stdout))
            except (EOFError, OSError, pickle.UnpicklingError):
                return

    def alive(self) -> bool:
        return self.process.poll() is None

    def join(self, timeout: Optional[float]) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            if timeout is not None and timeout >= 1.0:
                self.process.kill()
                self.process.wait()


class WriterPool:
    """Several writer processes, each owning the runs it started (SQLite serializes only the commits;
    the ORM work around them, which dominates, runs in parallel). A child whose parent run lives in
    another writer is sent the parent's run id, asked for once."""

    #: position of the parent argument in the messages that create a run
    PARENT_AT = {"start": 3, "run": 3, "experiment": 3}

    def __init__(self, uri: str, experiment: str, writers: int):
        self.uri, self.experiment, self.writers = uri, experiment, max(1, writers)
        self.members = [ProcessTransport(uri, experiment)]
        self.route: Dict[str, int] = {}
        self.ids: Dict[str, str] = {}
        self._turn = 0

    def await_ready(self, timeout: float) -> None:
        # the first writer creates (or migrates) the store alone; the others start on a ready one
        self.members[0].await_ready(timeout)
        self.members += [ProcessTransport(self.uri, self.experiment) for _ in range(self.writers - 1)]
        for m in self.members[1:]:
            m.await_ready(timeout)
        self.experiment_id = self.members[0].experiment_id

    def _member_for(self, key: str) -> int:
        if key not in self.route:
            self.route[key] = self._turn % len(self.members)
            self._turn += 1
        return self.route[key]

    def send(self, msg: Tuple[Any, ...]) -> None:
        op, key = msg[0], msg[1]
        target = self._member_for(key)
        at = self.PARENT_AT.get(op)
        if at is not None and len(self.members) > 1:
            parent = msg[at]
            if parent in self.route and self.route[parent] != target:
                if parent not in self.ids:
                    self.ids.update(self.members[self.route[parent]].request(("ids", [parent]))[0] or {})
                msg = msg[:at] + (self.ids.get(parent) or parent,) + msg[at + 1:]
        self.members[target].send(msg)

    @staticmethod
    def _merge(reports: List[Dict[str, Any]]) -> Dict[str, Any]:
        return {"errors": [e for r in reports for e in r.get("errors", [])], "done": sum(r.get("done", 0) for r in reports),
                "experiment_id": next((r["experiment_id"] for r in reports if r.get("experiment_id")), "")}

    def request(self, msg: Tuple[Any, ...], timeout: Optional[float] = None) -> Tuple[Any, Dict[str, Any]]:
        if msg and msg[0] == "ids":
            out: Dict[str, str] = {}
            reports = []
            for i, m in enumerate(self.members):
                keys = [k for k in msg[1] if self.route.get(k, 0) == i]
                if keys:
                    ids, rep = m.request(("ids", keys), timeout)
                    out.update(ids or {})
                    reports.append(rep)
            return out, self._merge(reports)
        replies = [m.request(msg, timeout) for m in self.members]
        return replies[0][0], self._merge([r for _, r in replies])

    def close(self, status: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        reports = []
        for m in self.members:
            m.send(("close", status))
        for m in self.members:
            try:
                reports.append(m.close_sent(timeout))
            except (RuntimeError, TimeoutError) as e:
                reports.append({"errors": [str(e)]})
        return self._merge(reports)


def auto_writers() -> int:
    """Writer processes for a sweep: MNEME_TRACK_WRITERS, else one per two CPUs, 1 to 8.

    One writer logs about 25-30 trials per second (MLflow's ORM work dominates, not SQLite's commits),
    so a search at 100 configurations per second needs several to keep the drain at its end short."""
    env = os.environ.get("MNEME_TRACK_WRITERS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, min(8, (os.cpu_count() or 1) // 2))


TRANSPORTS = {"process": ProcessTransport, "thread": ThreadTransport, "inline": InlineTransport}


def _fast_sqlite() -> None:
    """WAL journal and no fsync per commit for this process's SQLite connections (the MLflow store's).

    A tracking store survives a crash of any process this way; only an OS crash may lose the last
    runs. Per-commit fsyncs otherwise make the writer fall behind a fast search.
    """
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _pragmas(dbapi_connection, _record):
        if type(dbapi_connection).__module__.startswith("sqlite3"):
            cur = dbapi_connection.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()


def _main(argv: List[str]) -> int:
    """Child side of ProcessTransport: pickles in on stdin, pickles out on the original stdout."""
    uri, experiment = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if uri.startswith("sqlite:"):
        _fast_sqlite()
    proto_in = sys.stdin.buffer
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever MLflow prints must not corrupt the protocol
    sys.stdout = sys.stderr

    def next_message() -> Optional[tuple]:
        try:
            return pickle.load(proto_in)
        except (EOFError, OSError, pickle.UnpicklingError):
            return None  # the search process is gone without closing

    def reply(obj: tuple) -> None:
        pickle.dump(obj, proto_out, protocol=pickle.HIGHEST_PROTOCOL)
        proto_out.flush()

    serve(next_message, reply, uri, experiment)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
