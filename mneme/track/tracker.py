"""The search process's handle on MLflow: every call returns at once, the writer does the work.

`Tracker.open()` checks the store and starts the writer before anything touches a GPU, so a bad store
fails the sweep up front. Closing ends every run still open; leaving the `with` block through Ctrl-C
or SIGTERM ends them KILLED, through an exception FAILED, so an interrupted sweep never leaves a run
RUNNING.
"""

from __future__ import annotations

import atexit
import itertools
import os
import signal
import sys
import threading
import time
import uuid
from typing import Any, Dict, Iterable, List, Optional

from mneme.errors import ConfigurationError
from mneme.track.records import FAILED, FINISHED, KILLED, RunRecord
from mneme.track.store import check_store, resolve_uri
from mneme.track.writer import TRANSPORTS, WriterPool, auto_writers

DEFAULT_EXPERIMENT = "mneme"


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C so that `finally` blocks end the runs."""


def _raise_interrupted(signum, frame):  # noqa: ARG001 - signal handler signature
    raise Interrupted(f"signal {signum}")


class Tracker:
    """Starts, logs and ends MLflow runs through a writer (`process`, `thread` or `inline`)."""

    _ids = itertools.count()

    def __init__(
        self,
        uri: Optional[str] = None,
        experiment: str = DEFAULT_EXPERIMENT,
        *,
        enabled: bool = True,
        writer: str = "process",
        writers: int = 1,
        start_timeout: float = 120.0,
        close_timeout: Optional[float] = None,
    ):
        if writer not in TRANSPORTS:
            raise ConfigurationError(f"tracking writer {writer!r} is unknown; choose one of {sorted(TRANSPORTS)}")
        self.enabled = enabled
        self.uri = resolve_uri(uri) if enabled else ""
        self.experiment = experiment
        self.writer = writer
        #: writer processes (the process writer only); 0: auto (see writer.auto_writers)
        self.writers = auto_writers(self.uri) if writers == 0 else max(1, int(writers))
        self.start_timeout = start_timeout
        self.close_timeout = close_timeout
        self.experiment_id = ""
        self.report: Dict[str, Any] = {}
        self._transport = None
        self._starting = None
        self._lock = threading.Lock()
        self._prefix = f"{os.getpid()}-{next(Tracker._ids)}"
        #: tags this tracker's child runs (mneme.tracker), so a summary can tell its own from other processes'
        self.session = uuid.uuid4().hex
        self._keys = itertools.count()
        self._old_sigterm = None
        self._send_seconds = 0.0
        self._messages = 0

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> "Tracker":
        """Check the store's address and start the writer without waiting for it (see `open`)."""
        if not self.enabled or self._transport is not None or self._starting is not None:
            return self
        check_store(self.uri)
        if self.writer == "process" and self.writers > 1:
            self._starting = WriterPool(self.uri, self.experiment, self.writers)
        else:
            self._starting = TRANSPORTS[self.writer](self.uri, self.experiment)
        return self

    def open(self) -> "Tracker":
        """Start the writer and wait until it has opened the store; ConfigurationError names a bad store."""
        if not self.enabled or self._transport is not None:
            return self
        self.start()
        transport, self._starting = self._starting, None
        try:
            transport.await_ready(self.start_timeout)
        except Exception as e:  # noqa: BLE001 - any failure to open the store is the user's setting
            raise ConfigurationError(
                f"MLflow store {self.uri} cannot be used ({e}); fix tracking.uri / MLFLOW_TRACKING_URI or turn "
                "tracking off (tracking.enabled=false, --no-track)"
            ) from None
        self._transport = transport
        self.experiment_id = transport.experiment_id
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self._old_sigterm = signal.signal(signal.SIGTERM, _raise_interrupted)
        atexit.register(self._at_exit)
        return self

    def close(self, status: str = FINISHED) -> Dict[str, Any]:
        """End every open run with `status`, wait for the writer to finish, report its errors."""
        if self._transport is None and self._starting is None:
            return self.report
        transport = self._transport or self._starting
        self._transport = self._starting = None
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None
        atexit.unregister(self._at_exit)
        try:
            with self._lock:  # after a request another thread has in flight (a sweep's summary)
                self.report = transport.close(status, self.close_timeout)
        except (RuntimeError, TimeoutError) as e:
            self.report = {"errors": [str(e)]}
        for err in self.report.get("errors", [])[:20]:
            print(f"mneme: MLflow: {err}", file=sys.stderr)
        return self.report

    def _at_exit(self) -> None:
        self.close(KILLED)

    def __enter__(self) -> "Tracker":
        return self.open()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close(FINISHED)
        elif issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            self.close(KILLED)
        else:
            self.close(FAILED)

    @property
    def active(self) -> bool:
        return self._transport is not None

    # -- runs -------------------------------------------------------------------------------------
    def _send(self, msg) -> None:
        if self._transport is None:
            return
        t = time.perf_counter()
        self._transport.send(msg)
        self._send_seconds += time.perf_counter() - t
        self._messages += 1

    def new_key(self) -> str:
        return f"{self._prefix}-{next(self._keys)}"

    def start_run(self, record: RunRecord, parent: Optional[str] = None, resume: Optional[str] = None) -> str:
        """A RUNNING run (a new one, or `resume`, an existing run id); `parent` is a key or a run id."""
        key = self.new_key()
        self._send(("start", key, record, parent, resume))
        return key

    def log(self, key: str, record: RunRecord) -> None:
        self._send(("log", key, record))

    def end_run(self, key: str, status: str = FINISHED) -> None:
        self._send(("end", key, status))

    def log_run(self, record: RunRecord, parent: Optional[str] = None) -> str:
        """A whole finished run in one message: what a completed trial costs the search."""
        key = self.new_key()
        self._send(("run", key, record, parent))
        return key

    def log_experiment(self, kwargs: Dict[str, Any], key: Optional[str] = None, parent: Optional[str] = None) -> str:
        """One finished experiment; the writer builds its run from `records.experiment_record(**kwargs)`.

        With `key` (from `start_run`) the run exists and is completed; without, a new run is made.
        """
        started = key is not None
        key = key or self.new_key()
        self._send(("experiment", key, started, parent, kwargs))
        return key

    def call(self, key: str, func: str, **kwargs: Any) -> None:
        """Run `module:function(client, run_id, **kwargs)` in the writer, in order with the logging."""
        self._send(("call", key, func, kwargs))

    def run_ids(self, keys: Iterable[str], timeout: Optional[float] = 600.0) -> Dict[str, str]:
        """MLflow run ids of the given keys (waits until the writer has caught up)."""
        keys = list(keys)
        if self._transport is None:
            return {k: "" for k in keys}
        with self._lock:
            ids, self.report = self._transport.request(("ids", keys), timeout)
        return ids or {k: "" for k in keys}

    def run_id(self, key: str) -> str:
        return self.run_ids([key])[key]

    def child_rows(self, key: str, timeout: Optional[float] = 600.0) -> Optional[List[Dict[str, Any]]]:
        """The children of run `key` as runs.frame rows, from the writers' memory (waits for them to catch up);
        None without a writer."""
        if self._transport is None:
            return None
        parents = [key] + [i for i in self.run_ids([key], timeout).values() if i]
        with self._lock:
            rows, self.report = self._transport.request(("rows", parents), timeout)
        return rows

    def flush(self, timeout: Optional[float] = 600.0) -> Dict[str, Any]:
        """Wait until everything sent so far is in the store; returns the writer's report."""
        if self._transport is not None:
            with self._lock:
                _, self.report = self._transport.request((), timeout)
        return self.report

    def stats(self) -> Dict[str, Any]:
        """What tracking cost the caller: messages sent and seconds spent sending them."""
        return {"messages": self._messages, "send_seconds": self._send_seconds, "writer": self.writer,
                "writers": self.writers if self.writer == "process" else 1}

