"""The MLflow side of one Hydra invocation: one tracker, and for a multirun one parent run.

Whoever needs it first (the sweeper, the launcher or the first job) opens it, so a store that cannot be
used fails the invocation before any job touches a GPU (Hydra only warns when a callback raises, so the
check cannot live in a callback). The TrackingCallback closes it when the run or multirun ends; if the
process is interrupted first, the tracker ends the open runs KILLED.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any, Dict, Optional

from mneme.track.records import FINISHED
from mneme.track.sweep import PARENT_ENV, SweepRun
from mneme.track.tracker import Tracker

_current: Optional["TrackingSession"] = None


class TrackingSession:
    def __init__(self, tracking: Any, name: str, multirun: bool):
        self.multirun = multirun
        self.name = name
        self.enabled = bool(tracking.enabled)
        # one run is not worth a writer process; a sweep's trials are
        writer = tracking.writer if multirun else "inline"
        self.tracker = Tracker(tracking.uri, tracking.experiment, enabled=self.enabled, writer=writer,
                               writers=int(tracking.writers))
        self.parent_run_id = tracking.parent_run_id or os.environ.get(PARENT_ENV) or None
        self._sweep: Optional[SweepRun] = None

    def start(self) -> "TrackingSession":
        """Check the store's address and start the writer; `open` waits for it."""
        self.tracker.start()
        return self

    def open(self) -> "TrackingSession":
        self.tracker.open()
        return self

    def sweep(self) -> Optional[SweepRun]:
        """The parent run of this multirun (started on first use; None for a single run or without tracking)."""
        if self._sweep is None and self.multirun and self.enabled:
            self.begin_sweep()
        return self._sweep

    def begin_sweep(self, **start: Any) -> Optional[SweepRun]:
        """Start the parent run of a (new) sweep, ending the previous one; `start` as for SweepRun.start."""
        if not self.multirun or not self.enabled:
            return None
        self.open()
        if self._sweep is not None:
            self._sweep.finish(FINISHED, title=self.name)
        if self.parent_run_id and not start.get("resume_run_id"):
            self._sweep = SweepRun.attach(self.tracker, self.parent_run_id)
        else:
            start["tags"] = {"mneme.experiment": self.name, **(start.get("tags") or {})}
            name = start.pop("name", None) or f"{self.name}-{datetime.now():%Y%m%d-%H%M%S}"
            self._sweep = SweepRun.start(self.tracker, name, **start)
        self._sweep.export_env()
        return self._sweep

    def close(self, status: str = FINISHED, summarize: bool = True) -> Dict[str, Any]:
        global _current
        if self._sweep is not None:
            self._sweep.finish(status, summarize=summarize, title=self.name)
            self._sweep = None
        report = self.tracker.close(status)
        if _current is self:
            _current = None
        return report


def current() -> Optional[TrackingSession]:
    return _current


def get(tracking: Any, name: str, multirun: bool) -> TrackingSession:
    """The session of this invocation, created (not yet opened) on first call."""
    global _current
    if _current is None:
        _current = TrackingSession(tracking, name, multirun)
    return _current


def close(status: str = FINISHED) -> None:
    if _current is not None:
        _current.close(status)
