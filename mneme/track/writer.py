"""The one place that talks to the MLflow store, off the search's critical path.

The search process only puts small messages on a queue; a writer (by default a separate process, so
SQLAlchemy's CPU time does not compete with the search for the GIL) creates the runs, logs them, copies
artifacts and ends the runs. Finished runs that arrive while the writer is busy are written together, in
one transaction of a SQL store (bulk.py); the rest goes through MlflowClient. Runs are named by keys
the search picks, so it never waits for a run id.

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
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

from mneme.track.bulk import LOCK_WAIT, BulkRuns, PreparedRun, retry_while_locked
from mneme.track.records import FAILED, KILLED, RUNNING, RunRecord, experiment_record, latest, staged

#: MLflow's per-call limits on log_batch.
PARAMS_TAGS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
#: how often a caller waiting for a reply checks that the writer is still alive (seconds)
POLL_S = 0.5
#: a writer process started with this flag waits for ("go",) on its input before it opens the store
GO_FLAG = "--after-go"
#: a directory: each writer process leaves a cProfile of its work there (`python -m pstats FILE`)
PROFILE_ENV = "MNEME_TRACK_PROFILE"
#: messages that make a new, finished run: the writer takes all of them waiting, up to this many, at once
BATCHED = ("run", "experiment")
MAX_BATCH = 256
#: a process transport's feeder, woken by a new run, waits this long for more before it sends (seconds)
FEED_GATHER_S = float(os.environ.get("MNEME_TRACK_GATHER_S", "0.05"))


class _Retrying:
    """An MlflowClient whose calls are retried while SQLite is locked by another writer process
    (a call that failed on the lock changed nothing, so repeating it is safe)."""

    def __init__(self, client: Any):
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return retry_while_locked(attr, *args, **kwargs)

        return call


class Writer:
    """Executes writer messages against one MLflow experiment; used by every transport below.

    New finished runs that arrive together go to a SQL store in one transaction (see bulk.py) unless
    `bulk` is False or MNEME_TRACK_BULK=0; everything else, and any batch the store refuses, goes
    through MlflowClient one call at a time.
    """

    def __init__(self, uri: str, experiment: str, bulk: Optional[bool] = None):
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
        self.end_ms: Dict[str, int] = {}  # key -> when the run's work ended (its record's end_ms)
        #: parent key or run id -> {child key: the child's row as runs.frame has it}: the sweep summary reads
        #: these instead of searching the store (2.2 s of a 3.5 s summary for 1000 runs on SQLite)
        self.children: Dict[str, Dict[str, Dict[str, Any]]] = {}
        self.parent_of: Dict[str, str] = {}
        self.errors: List[str] = []
        self.done = 0
        if bulk is None:
            bulk = os.environ.get("MNEME_TRACK_BULK", "1").strip() not in ("0", "false", "no", "off")
        self.bulk: Optional[BulkRuns] = None
        self.path = "client (bulk path off: MNEME_TRACK_BULK=0)"
        if bulk:
            self.bulk, self.path = BulkRuns.open(self.client._client, self.experiment_id)
        #: batches the store refused as a whole and that were written again run by run
        self.bulk_retries = 0
        #: where the writer's time went (seconds; in the report, so a writer that falls behind says why; the bulk
        #: path's files and inserts are in BulkRuns.seconds)
        self.timing = {"busy_s": 0.0, "prepare_s": 0.0, "batches": 0, "batched_runs": 0}

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

    def handle_many(self, msgs: List[Tuple[Any, ...]]) -> None:
        """Messages in order; consecutive new finished runs are written together."""
        t0 = time.perf_counter()
        try:
            if self.bulk is None or not self.bulk.usable_now():
                for msg in msgs:
                    self.handle(msg)
                return
            pending: List[Tuple[Tuple[Any, ...], PreparedRun]] = []
            for msg in msgs:
                t = time.perf_counter()
                prepared = self._prepare(msg)
                self.timing["prepare_s"] += time.perf_counter() - t
                if prepared is None:
                    self._write(pending)
                    pending = []
                    self.handle(msg)
                else:
                    pending.append((msg, prepared))
            self._write(pending)
        finally:
            self.timing["busy_s"] += time.perf_counter() - t0

    def _prepare(self, msg: Tuple[Any, ...]) -> Optional[PreparedRun]:
        """The rows of a new finished run, or None when the message needs MlflowClient's path."""
        if msg[0] not in BATCHED or (msg[0] == "experiment" and msg[2]):
            return None
        key, parent = msg[1], msg[3]
        try:
            record = msg[2] if msg[0] == "run" else experiment_record(**msg[4])
            prepared = self.bulk.prepare(record, self.runs.get(parent, parent) if parent else None)
        except Exception:  # noqa: BLE001 - MlflowClient's path reports it as it always did
            return None
        self.runs[key] = prepared.run_id
        self._remember(key, parent, record, prepared.run_id)
        return prepared

    def _remember(self, key: str, parent: Optional[str], record: RunRecord, run_id: str) -> None:
        """Keep the row of a child run (or update it: a started run gets its record later)."""
        parent = parent or self.parent_of.get(key)
        if not parent:
            return
        self.parent_of[key] = parent
        row = self.children.setdefault(parent, {}).setdefault(key, {"run_id": run_id})
        row.update({"run_id": run_id, "run_name": record.name, "status": record.status})
        row.update({f"params.{k}": str(v) for k, v in record.params.items()})
        row.update({f"metrics.{k}": m[1] for k, m in latest(record.metrics, lambda m: (m[0], m[2], float(m[1]))).items()})
        row.update({f"tags.{k}": v for k, v in record.tags.items()})

    def op_rows(self, parents: List[str]) -> List[Dict[str, Any]]:
        """The rows of the children of any of `parents` (keys or run ids) this writer wrote."""
        return [row for p in parents for row in self.children.get(p, {}).values()]

    def _write(self, pending: List[Tuple[Tuple[Any, ...], PreparedRun]]) -> None:
        if not pending:
            return
        try:
            self.bulk.write([p for _, p in pending])
        except Exception:  # noqa: BLE001 - one bad run must not lose the others: write them one by one
            if os.environ.get("MNEME_TRACK_DEBUG"):
                traceback.print_exc()
            self.bulk_retries += 1
            for msg, _ in pending:
                self.runs.pop(msg[1], None)
            for msg, _ in pending:
                self.handle(msg)
            return
        self.done += len(pending)
        self.timing["batches"] += 1
        self.timing["batched_runs"] += len(pending)

    def op_start(self, key: str, record: RunRecord, parent: Optional[str], resume: Optional[str]) -> str:
        if resume:
            self.client.update_run(resume, status=RUNNING)
            self.resumed.add(key)
            run_id = resume
        else:
            tags = dict(record.tags)
            if parent:
                tags["mlflow.parentRunId"] = self.runs.get(parent, parent)
            run_id = self.client.create_run(self.experiment_id, run_name=record.name, tags=tags,
                                            start_time=record.start_ms).info.run_id
            self._remember(key, parent, record, run_id)
            record = RunRecord(record.name, record.params, {}, record.metrics, record.artifacts, record.status,
                               end_ms=record.end_ms)
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
        if record.end_ms:
            self.end_ms[key] = record.end_ms
        if key in self.parent_of:
            self._remember(key, None, record, run_id)

    def _artifacts(self, run_id: str, artifacts: Dict[str, Any]) -> None:
        with staged(artifacts) as tmp:
            self.client.log_artifacts(run_id, tmp)

    def op_end(self, key: str, status: str) -> None:
        run_id = self.open.pop(key, None) or self.runs[key]
        self.client.set_terminated(run_id, status=status, end_time=self.end_ms.pop(key, None))
        if key in self.parent_of:
            self.children[self.parent_of[key]][key]["status"] = status

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
        timing = {k: round(v, 4) if isinstance(v, float) else v for k, v in self.timing.items()}
        timing["lock_sleep_s"] = round(LOCK_WAIT[0], 4)
        if self.bulk is not None:
            timing.update({k: round(v, 4) for k, v in self.bulk.seconds.items()})
            if self.bulk.commit_lock is not None:
                timing["commit_lock_wait_s"] = round(self.bulk.commit_lock.waited, 4)
        return {"errors": list(self.errors), "done": self.done, "experiment_id": self.experiment_id,
                "path": self.path, "bulk_retries": self.bulk_retries, "timing": [timing]}


def serve(inbox: "queue.Queue", reply: Callable[[tuple], None], uri: str, experiment: str) -> None:
    """The writer loop: one reply per ('sync', ...) message; a None from `inbox` means the search
    process is gone, and then the open runs end KILLED. New finished runs waiting together are
    handled as one batch, in order with everything around them."""
    try:
        writer = Writer(uri, experiment)
    except BaseException as e:  # noqa: BLE001 - anything here means the store cannot be used
        reply(("error", f"{type(e).__name__}: {e}"))
        return
    reply(("ready", writer.experiment_id))
    held: Any = _NOTHING  # a message taken out of the inbox that ended a batch
    while True:
        msg, held = (inbox.get() if held is _NOTHING else held), _NOTHING
        if msg is not None and msg[0] in BATCHED:
            batch = [msg]
            while len(batch) < MAX_BATCH:
                try:
                    msg = inbox.get_nowait()
                except queue.Empty:
                    break
                if msg is not None and msg[0] in BATCHED:
                    batch.append(msg)
                else:
                    held = msg
                    break
            writer.handle_many(batch)
        elif msg is None:
            writer.end_open(KILLED)
            return
        elif msg[0] == "sync":
            reply(("sync", msg[1], writer.handle(msg[2]) if msg[2] else None, writer.report()))
        elif msg[0] == "close":
            writer.end_open(msg[1])
            reply(("closed", writer.report()))
            return
        else:
            writer.handle(msg)


_NOTHING = object()


class InlineTransport:
    """The writer in the calling thread: for one run (`mneme replay --track`), where waiting is fine."""

    def __init__(self, uri: str, experiment: str):
        self.uri, self.experiment = uri, experiment

    def await_ready(self, timeout: float) -> None:
        self.writer = Writer(self.uri, self.experiment)
        self.experiment_id = self.writer.experiment_id

    def send(self, msg: Tuple[Any, ...]) -> None:
        self.writer.handle_many([msg])

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
                    self.join(0)  # everything is in the store; its interpreter's teardown need not hold the caller
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
        serve(self.inbox, self.replies.put, uri, experiment)

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

    def __init__(self, uri: str, experiment: str, after_go: bool = False):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mneme.track.writer", uri, experiment] + ([GO_FLAG] if after_go else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )
        self.inbox = queue.Queue()
        self.replies = queue.Queue()
        threading.Thread(target=self._feed, name="mneme-mlflow-feed", daemon=True).start()
        threading.Thread(target=self._read, name="mneme-mlflow-read", daemon=True).start()

    def _feed(self) -> None:
        """Sends every message waiting as one pickled list: one wake-up, one pickle call and one pipe write for
        many trials, which the search process's other threads would otherwise pay for in GIL hand-offs."""
        pipe = self.process.stdin
        try:
            while True:
                msgs = [self.inbox.get()]
                if msgs[0][0] in BATCHED:
                    time.sleep(FEED_GATHER_S)  # let the trials that follow join this one
                while msgs[-1][0] != "close" and len(msgs) < MAX_BATCH:
                    try:
                        msgs.append(self.inbox.get_nowait())
                    except queue.Empty:
                        break
                pickle.dump(msgs, pipe, protocol=pickle.HIGHEST_PROTOCOL)
                pipe.flush()
                if msgs[-1][0] == "close":
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
        # all start now (importing MLflow takes each a few seconds); the others open the store only after the
        # first has created (or migrated) it, when it says go
        self.members = [ProcessTransport(uri, experiment)]
        self.members += [ProcessTransport(uri, experiment, after_go=True) for _ in range(self.writers - 1)]
        self.route: Dict[str, int] = {}
        self.ids: Dict[str, str] = {}
        self._turn = 0

    def await_ready(self, timeout: float) -> None:
        try:
            self.members[0].await_ready(timeout)
            for m in self.members[1:]:
                m.send(("go",))
            for m in self.members[1:]:
                m.await_ready(timeout)
        except BaseException:
            for m in self.members:
                if m.alive():
                    m.process.kill()
            raise
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
                "experiment_id": next((r["experiment_id"] for r in reports if r.get("experiment_id")), ""),
                "path": ", ".join(sorted({r["path"] for r in reports if r.get("path")})),
                "bulk_retries": sum(r.get("bulk_retries", 0) for r in reports),
                "timing": [t for r in reports for t in r.get("timing", [])]}

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
        if msg and msg[0] == "rows":  # every writer holds the rows of the runs it wrote
            return [row for rows, _ in replies for row in (rows or [])], self._merge([r for _, r in replies])
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


def auto_writers(uri: str = "") -> int:
    """Writer processes for a sweep: MNEME_TRACK_WRITERS, else two for SQLite, else one per two CPUs, 1 to 8.

    On a SQL store one writer logs several hundred trials per second (bulk.py); through MlflowClient
    (a tracking server) about 25-30, so there a search at 100 configurations per second needs several.
    SQLite takes one writer at a time: a second one overlaps its Python work with the other's commit
    (1000 runs on 2 cores: 560/s with one, 900/s with two), more only wait on the lock (bulk.CommitLock). On the
    16-core H200 host the inserts alone cost about 1 ms per run; over 3 pairs of 1000-trial tune runs two
    writers kept 0.95 of the untracked rate, three 0.94, four 0.78."""
    env = os.environ.get("MNEME_TRACK_WRITERS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    if uri.startswith("sqlite:"):
        return 2
    return max(1, min(8, (os.cpu_count() or 1) // 2))


TRANSPORTS = {"process": ProcessTransport, "thread": ThreadTransport, "inline": InlineTransport}


def _fast_sqlite() -> None:
    """This process's SQLite connections (the MLflow store's): WAL journal, no fsync per commit, checkpoints
    only once the log holds 256 MiB, a 64 MiB page cache.

    A tracking store survives a crash of any process this way; only an OS crash may lose the last runs.
    Per-commit fsyncs otherwise make the writer fall behind a fast search. So would SQLite's default checkpoint
    every 4 MiB of log: it runs inside a commit, holding the write lock through two fsyncs (24 ms per 100 runs on
    the dev machine; on the H200 host such flushes also stall the search's own file writes). A sweep of a few
    thousand trials then checkpoints when the last connection closes, after the writer has said it is done.
    """
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _pragmas(dbapi_connection, _record):
        if type(dbapi_connection).__module__.startswith("sqlite3"):
            cur = dbapi_connection.cursor()
            for pragma in SQLITE_PRAGMAS:
                cur.execute(f"PRAGMA {pragma}")
            cur.close()


#: see _fast_sqlite
SQLITE_PRAGMAS = ("journal_mode=WAL", "synchronous=NORMAL", "wal_autocheckpoint=65536", "cache_size=-65536")


def _main(argv: List[str]) -> int:
    """Child side of ProcessTransport: pickles in on stdin, pickles out on the original stdout."""
    after_go = GO_FLAG in argv
    uri, experiment = [a for a in argv if a != GO_FLAG]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if uri.startswith("sqlite:"):
        _fast_sqlite()
    proto_in = sys.stdin.buffer
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever MLflow prints must not corrupt the protocol
    sys.stdout = sys.stderr
    inbox: "queue.Queue" = queue.Queue()
    if after_go:
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - the slow part of starting, done while waiting
        import mlflow.tracking  # noqa: F401

        try:
            first = pickle.load(proto_in)
        except (EOFError, OSError, pickle.UnpicklingError):
            return 0  # the search gave up before the store was ready
        if not first or first[0] != ("go",):
            return 2
        for msg in first[1:]:
            inbox.put(msg)

    def read() -> None:
        """Unpickles ahead of the writer, so that it sees every message already sent and can batch them
        (they come as lists: see ProcessTransport._feed)."""
        while True:
            try:
                for msg in pickle.load(proto_in):
                    inbox.put(msg)
            except Exception as e:  # noqa: BLE001 - whatever stops the reading, the writer must end its runs
                if not isinstance(e, (EOFError, OSError, pickle.UnpicklingError)):
                    traceback.print_exc()
                inbox.put(None)  # the search process is gone (or has closed)
                return

    def reply(obj: tuple) -> None:
        pickle.dump(obj, proto_out, protocol=pickle.HIGHEST_PROTOCOL)
        proto_out.flush()

    threading.Thread(target=read, name="mneme-mlflow-read", daemon=True).start()
    threading.Thread(target=_warm_plots, name="mneme-plots-import", daemon=True).start()
    profile_dir = os.environ.get(PROFILE_ENV, "").strip()
    if profile_dir:
        import cProfile

        with cProfile.Profile() as prof:
            serve(inbox, reply, uri, experiment)
        os.makedirs(profile_dir, exist_ok=True)
        prof.dump_stats(os.path.join(profile_dir, f"mneme-writer-{os.getpid()}.prof"))
    else:
        serve(inbox, reply, uri, experiment)
    _quick_exit()
    return 0


def _warm_plots() -> None:
    """Import matplotlib while the search runs: the sweep summary's plots otherwise pay for it after the
    last trial (about half a second)."""
    try:
        from mneme.track.plots import _pyplot

        _pyplot()
    except Exception:  # noqa: BLE001 - the summary imports it again and reports what fails
        pass


def _quick_exit() -> None:
    """Leave without the interpreter's teardown of MLflow's many modules (most of a second, which a
    search closing its tracker would wait for). Every run is committed by now; closing the store's
    connections first lets SQLite fold its WAL back into the database file."""
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        for engine in list(SqlAlchemyStore._engine_map.values()):
            engine.dispose()
    except Exception:  # noqa: BLE001 - an engine that cannot close leaves a WAL, which SQLite replays
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
