"""Many finished runs in one transaction of MLflow's own SQL store: what lets one writer keep up with a
fast search.

Through MlflowClient a finished run costs create_run, log_batch (its own sub-transactions for params,
metrics and tags), a get_run inside log_artifacts and set_terminated: about 40 statements and six commits.
Here the rows MLflow's SqlAlchemyStore writes for exactly those calls are built in Python, checked with
MLflow's own validators, and inserted for a whole batch of runs at once through the store's session
maker and its table models. The artifacts go straight into each run's artifact directory (or through the
artifact root's repository when it is not local), before the rows, so a reader never sees a run without
its files.

This leans on MLflow internals: `SqlAlchemyStore.ManagedSessionMaker`, `mlflow.store.tracking.dbmodels.models`,
the `mlflow.utils.validation` helpers and `SqlAlchemyStore.sanitize_metric_value`, and on MLflow's table
layout, which no release promises to keep. So it runs only on the MLflow releases it was verified against
(VERIFIED_MLFLOW, where tests/test_track_bulk.py compares its rows with MlflowClient's); on any other
release, on a store that is not a SQL database, or when one of the internals is missing, `BulkRuns.open`
returns None with the reason and the writer keeps to MLflow's public API (MlflowClient.log_batch & co.),
which pyproject's range of MLflow 3 releases supports. MNEME_TRACK_BULK=0 turns it off anywhere;
MNEME_TRACK_BULK=force uses it on an unverified release (at your own risk).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import numbers
import os
import posixpath
import shutil
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from mneme.locks import FileLock
from mneme.track.records import FAILED, FINISHED, KILLED, RunRecord, artifact_bytes, latest, staged

#: MLflow releases (major.minor) whose SQL tables the bulk path was verified against
VERIFIED_MLFLOW = ("3.17",)


def verified_release(version: str) -> bool:
    return ".".join(version.split(".")[:2]) in VERIFIED_MLFLOW


#: tags MLflow's create_run treats specially; a record carrying one goes through MlflowClient instead
SPECIAL_TAGS = ("mlflow.runName",)
TERMINAL = (FINISHED, FAILED, KILLED)
#: artifacts at least this large are written once per content and hard-linked after that
LINK_MIN_BYTES = 4096
#: params remembered as valid, at most (a study has few distinct values per key)
PARAMS_SEEN_KEPT = 100_000
#: how often a transaction refused by SQLite's lock is repeated (a refused transaction changed nothing)
LOCK_ATTEMPTS = 40


#: seconds this process has slept waiting for SQLite's lock (in a writer's report: tells lock contention
#: from slow Python work when the writers fall behind)
LOCK_WAIT = [0.0]


def retry_while_locked(call, *args: Any, **kwargs: Any) -> Any:
    """`call(*args, **kwargs)`, repeated while SQLite is locked by another writer process."""
    for attempt in range(LOCK_ATTEMPTS):
        try:
            return call(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - MLflow wraps the driver's error in its own
            if "database is locked" not in str(e) or attempt == LOCK_ATTEMPTS - 1:
                raise
            pause = min(1.0, 0.02 * (attempt + 1))
            LOCK_WAIT[0] += pause
            time.sleep(pause)


class CommitLock(FileLock):
    """Takes turns at SQLite's one write lock among this host's writer processes, through flock.

    SQLite's own busy handler sleeps 1, 2, 5 ... 100 ms between looks at a held lock, so a writer that
    finds it taken idles long after it is free; the kernel wakes a flock waiter at once. The lock file is
    in the temporary directory, named by the database's path, so none is left beside the user's store; it is
    removed when unused (mneme.tmpfiles: at exit, or by the next run after a killed writer), and every acquire
    checks that the path still names the file it locked, opening it again when another process removed it.
    """

    def __init__(self, database: str):
        import atexit
        import tempfile

        from mneme import tmpfiles

        digest = hashlib.blake2b(os.path.realpath(database).encode(), digest_size=12).hexdigest()
        tmpfiles.reap()
        super().__init__(os.path.join(tempfile.gettempdir(), f"mneme-sqlite-{digest}.lock"))
        self._file()  # an unusable $TMPDIR shows here, where the caller falls back to MlflowClient's path
        atexit.register(self.close)
        #: seconds spent waiting for the other writers
        self.waited = 0.0

    def acquire(self) -> bool:
        from mneme.tmpfiles import same_file

        t = time.perf_counter()
        while True:
            super().acquire()
            if same_file(self._file(), self.path):
                break
            super().release()  # removed by a process that found it unused: lock the file now at the path
            super().close()
        self.waited += time.perf_counter() - t
        return True

    def close(self) -> None:
        """Remove the lock file if no process holds it, and close it."""
        from mneme.tmpfiles import remove_if_unlocked

        if self._fd is not None and self._pid == os.getpid() and self._threads.acquire(blocking=False):
            try:
                remove_if_unlocked(self.path, self._fd)
            finally:
                self._threads.release()
        super().close()


class NotBulk(Exception):
    """This run needs MlflowClient's own path (a special tag, an odd artifact name, a bad value...)."""


@dataclass
class PreparedRun:
    """The rows and files of one new, finished run, ready to insert."""

    run_id: str
    run: Dict[str, Any]
    tags: List[Dict[str, Any]] = field(default_factory=list)
    params: List[Dict[str, Any]] = field(default_factory=list)
    metrics: List[Dict[str, Any]] = field(default_factory=list)
    latest: List[Dict[str, Any]] = field(default_factory=list)
    files: Dict[str, bytes] = field(default_factory=dict)
    #: when the run's work ended (epoch ms), None: at insert time
    end_ms: Optional[int] = None


def _plain_name(name: Any) -> bool:
    return (isinstance(name, str) and bool(name) and not name.startswith("/") and posixpath.normpath(name) == name
            and ".." not in name.split("/") and not posixpath.basename(name).startswith(".artifact."))


class BulkRuns:
    """Writes new, finished runs of one experiment into a SQLAlchemy MLflow store, many per transaction."""

    def __init__(self, store: Any, experiment_id: str, artifact_location: str, commit_lock: Optional[CommitLock] = None):
        from mlflow.entities import SourceType
        from mlflow.entities.lifecycle_stage import LifecycleStage
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
        from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
        from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric, SqlParam, SqlRun, SqlTag
        from mlflow.tracking.metric_value_conversion_utils import convert_metric_value_to_float_if_possible
        from mlflow.utils import validation
        from mlflow.utils.uri import append_to_uri_path

        self.sessions = store.ManagedSessionMaker
        self.experiment_id = experiment_id
        self.artifact_location = artifact_location
        self.tables = [m.__table__ for m in (SqlRun, SqlTag, SqlParam, SqlMetric, SqlLatestMetric)]
        self._validate_param = validation._validate_param
        self._validate_metric = validation._validate_metric
        self._is_numeric = validation._is_numeric
        #: metric names MLflow's validator accepted; checking a name again is most of what validating costs
        self._metric_names: set = set()
        #: (key, value) params the validator accepted as they are: a study's trials repeat most of them
        self._params_seen: set = set()
        self._to_float = convert_metric_value_to_float_if_possible
        self._append = append_to_uri_path
        self._source_type = SourceType.to_string(SourceType.UNKNOWN)
        self._active = LifecycleStage.ACTIVE
        self._sanitize = store.sanitize_metric_value
        self.repo = get_artifact_repository(artifact_location)
        self.local_root = self.repo.artifact_dir if isinstance(self.repo, LocalArtifactRepository) else None
        #: content digest -> a file already written with it (trials sharing a code hash log the same kernel)
        self._written: Dict[bytes, str] = {}
        #: seconds spent writing artifact files and inserting rows (lock waits included)
        self.seconds = {"files_s": 0.0, "insert_s": 0.0}
        self.commit_lock = commit_lock

    @classmethod
    def open(cls, client: Any, experiment_id: str) -> Tuple[Optional["BulkRuns"], str]:
        """(BulkRuns, 'bulk-sql') for a SQL store, else (None, why MlflowClient's own path is used)."""
        import mlflow

        forced = os.environ.get("MNEME_TRACK_BULK", "").strip().lower() == "force"
        if not verified_release(mlflow.__version__) and not forced:
            return None, (f"client (MLflow {mlflow.__version__}: the bulk path is verified on "
                          f"{', '.join(VERIFIED_MLFLOW)} only; MNEME_TRACK_BULK=force to use it anyway)")
        try:
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            store = client._tracking_client.store
            if not isinstance(store, SqlAlchemyStore):
                return None, f"client ({type(store).__name__} is not a SQL store)"
            experiment = client.get_experiment(experiment_id)
            url = getattr(store, "db_uri", "")
            database = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
            lock = CommitLock(database) if database else None
            bulk = cls(store, experiment_id, experiment.artifact_location, lock)
        except Exception as e:  # noqa: BLE001 - any mismatch with MLflow's internals: use its client
            return None, f"client (bulk path unavailable: {type(e).__name__}: {e})"
        return bulk, "bulk-sql"

    def usable_now(self) -> bool:
        """False while MLflow would attach metrics to an active model (log_batch then writes more rows)."""
        try:
            from mlflow.tracking.fluent import get_active_model_id

            return get_active_model_id() is None
        except Exception:  # noqa: BLE001 - unknown: MlflowClient's path knows what to do
            return False

    # -- rows -------------------------------------------------------------------------------------
    def prepare(self, record: RunRecord, parent_id: Optional[str]) -> PreparedRun:
        """What create_run + log_batch + log_artifacts + set_terminated write for `record` (NotBulk if
        MLflow would treat it specially or refuse part of it: MlflowClient's path then reports that)."""
        if not record.name or any(t in record.tags for t in SPECIAL_TAGS) or record.status not in TERMINAL:
            raise NotBulk("special run")
        files = {}
        for name, content in record.artifacts.items():
            if not _plain_name(name):
                raise NotBulk(f"artifact name {name!r}")
            files[name] = artifact_bytes(content)
        run_id = uuid.uuid4().hex
        now = int(time.time() * 1000)
        tags = dict(record.tags)
        if parent_id:
            tags["mlflow.parentRunId"] = parent_id
        tags["mlflow.runName"] = record.name
        run = dict(
            run_uuid=run_id, name=record.name, source_type=self._source_type, source_name="", entry_point_name="",
            user_id=tags.get("mlflow.user", "unknown"), status=record.status, start_time=record.start_ms or now,
            end_time=None,
            deleted_time=None, source_version="", lifecycle_stage=self._active,
            artifact_uri=self._append(self.artifact_location, run_id, "artifacts"), experiment_id=int(self.experiment_id),
        )
        out = PreparedRun(run_id, run, files=files, end_ms=record.end_ms)
        out.tags = [{"key": k, "value": v, "run_uuid": run_id} for k, v in tags.items()]
        for k, v in record.params.items():
            v = str(v)  # MlflowClient.log_batch stringifies param values
            if (k, v) not in self._params_seen:
                p = self._validate_param(k, v)
                k, v = p.key, p.value
                if len(self._params_seen) < PARAMS_SEEN_KEPT:
                    self._params_seen.add((k, v))
            out.params.append({"key": k, "value": v, "run_uuid": run_id})
        seen = set()
        for k, v, step in record.metrics:
            v = self._to_float(v)
            if not (k in self._metric_names and self._is_numeric(v) and isinstance(step, numbers.Number)):
                self._validate_metric(k, v, now, step)  # the name is new, or the value or step looks wrong
                self._metric_names.add(k)
            is_nan, value = self._sanitize(v)
            row = {"key": k, "value": value, "timestamp": now, "step": step, "is_nan": is_nan, "run_uuid": run_id}
            ident = (k, now, step, value, is_nan)
            if ident in seen:
                continue
            seen.add(ident)
            out.metrics.append(row)
        out.latest = list(latest(out.metrics, lambda r: (r["key"], r["step"], r["value"])).values())
        return out

    # -- writing ----------------------------------------------------------------------------------
    def write(self, runs: List[PreparedRun]) -> None:
        """Files first, then every run's rows in one transaction; on failure nothing of `runs` is left."""
        if not runs:
            return
        try:
            t0 = time.perf_counter()
            for r in runs:
                self._files(r)
            t1 = time.perf_counter()
            with self.commit_lock or contextlib.nullcontext():
                retry_while_locked(self._insert, runs)
            self.seconds["files_s"] += t1 - t0
            self.seconds["insert_s"] += time.perf_counter() - t1
        except BaseException:
            self.discard(runs)
            raise

    def _insert(self, runs: List[PreparedRun]) -> None:
        end = int(time.time() * 1000)
        for r in runs:
            r.run["end_time"] = max(r.end_ms or end, r.run["start_time"])  # the trial's own duration when known
        rows = [[r.run for r in runs], [t for r in runs for t in r.tags], [p for r in runs for p in r.params],
                [m for r in runs for m in r.metrics], [m for r in runs for m in r.latest]]
        with self.sessions(read_only=False) as session:
            conn = session.connection()
            for table, batch in zip(self.tables, rows):
                if not batch:
                    continue
                if conn.dialect.name == "sqlite":
                    # the driver's executemany as is: SQLAlchemy's per-row parameter processing costs a writer
                    # 0.4 ms per run, and sqlite3 needs none for these columns (str, int, float, bool)
                    conn.exec_driver_sql(self._sqlite_insert(table.name, tuple(batch[0])), batch)
                else:  # PostgreSQL and others: SQLAlchemy batches the rows into multi-row INSERTs
                    session.execute(table.insert(), batch)

    @staticmethod
    @functools.lru_cache(maxsize=16)
    def _sqlite_insert(table: str, columns: Tuple[str, ...]) -> str:
        names = ", ".join(f'"{c}"' for c in columns)
        return f'INSERT INTO "{table}" ({names}) VALUES ({", ".join(":" + c for c in columns)})'

    def _files(self, r: PreparedRun) -> None:
        if not r.files:
            return
        if self.local_root is not None:
            base = os.path.join(self.local_root, r.run_id, "artifacts")
            made = set()
            for name, data in r.files.items():
                dest = os.path.join(base, name)
                folder = os.path.dirname(dest)
                if folder not in made:
                    os.makedirs(folder, exist_ok=True)
                    made.add(folder)
                self._write_file(dest, data)
            return
        with staged(r.files) as tmp:
            self.repo.log_artifacts(tmp, artifact_path=f"{r.run_id}/artifacts")

    def _write_file(self, dest: str, data: bytes) -> None:
        """A hard link to an earlier artifact with the same content, else a new file: 1000 trials of one kernel
        then write its .ll, .ptx and .cubin once, not 1000 times (each run still lists its own files)."""
        digest = hashlib.blake2b(data, digest_size=20).digest() if len(data) >= LINK_MIN_BYTES else b""
        src = self._written.get(digest) if digest else None
        if src is not None:
            try:
                os.link(src, dest)
                return
            except OSError:  # removed meanwhile, another file system, or no links there: write it
                pass
        with open(dest, "wb") as f:
            f.write(data)
        if digest:
            self._written[digest] = dest

    def discard(self, runs: List[PreparedRun]) -> None:
        """Remove the files of runs whose rows were not written (best effort for remote roots)."""
        for r in runs:
            if not r.files:
                continue
            try:
                if self.local_root is not None:
                    shutil.rmtree(os.path.join(self.local_root, r.run_id), ignore_errors=True)
                else:
                    self.repo.delete_artifacts(f"{r.run_id}/artifacts")
            except Exception:  # noqa: BLE001 - an orphaned file must not hide the real error
                pass
