"""One parent run per sweep, one child run per trial, whichever process the trial ran in.

Children name their parent by run id (the `mlflow.parentRunId` tag), so a trial logged by another
process (another `mneme tune` sharing the Optuna study, a Hydra job in a worker) nests under the same
parent when it is given that id: through `SweepRun.attach`, `tracking.parent_run_id`, or the
MNEME_MLFLOW_PARENT_RUN_ID environment variable that a sweep sets for the processes it starts.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings
from mneme.track.naming import run_name
from mneme.track.records import FINISHED, RunRecord, environment_tags, tags_text
from mneme.track.tracker import Tracker

PARENT_ENV = "MNEME_MLFLOW_PARENT_RUN_ID"
SUMMARY = "mneme.track.summary:summarize_sweep"
#: the tag that names the Tracker (one per process) that logged a child run
TRACKER_TAG = "mneme.tracker"


class SweepRun:
    """The parent run of a sweep; trials logged through it become its children."""

    def __init__(self, tracker: Tracker, key: Optional[str], run_id: str = "", metric: str = "median"):
        self.tracker = tracker
        self.key = key
        self._run_id = run_id
        self.metric = metric
        self._summarized = False
        #: the configuration trials are named against (naming.run_name): set by the baseline trial or the caller
        self.baseline_config: Optional[ExperimentConfiguration] = None
        #: params every trial of this sweep gets (e.g. the search space's name)
        self.trial_params: dict = {}

    @classmethod
    def start(
        cls,
        tracker: Tracker,
        name: str,
        *,
        params: Optional[Mapping[str, Any]] = None,
        tags: Optional[Mapping[str, Any]] = None,
        resume_run_id: Optional[str] = None,
        metric: str = "median",
    ) -> "SweepRun":
        """A new RUNNING parent run, or `resume_run_id` set RUNNING again (a resumed study)."""
        all_tags = environment_tags()
        all_tags["mneme.role"] = "sweep"
        all_tags.update(tags_text(tags or {}))
        record = RunRecord(name, {k: str(v) for k, v in (params or {}).items()}, all_tags)
        return cls(tracker, tracker.start_run(record, resume=resume_run_id or None), metric=metric)

    @classmethod
    def attach(cls, tracker: Tracker, run_id: str, metric: str = "median") -> "SweepRun":
        """A parent run owned by another process: trials nest under it, this process never ends it."""
        return cls(tracker, None, run_id=run_id, metric=metric)

    @property
    def owned(self) -> bool:
        return self.key is not None

    @property
    def run_id(self) -> str:
        """The parent's MLflow run id (waits for the writer the first time)."""
        if not self._run_id and self.key is not None:
            self._run_id = self.tracker.run_id(self.key)
        return self._run_id

    @property
    def parent(self) -> str:
        return self.key if self.key is not None else self._run_id

    def log(self, **kw: Any) -> None:
        """Params, tags or metrics (as lists of (key, value, step)) on the parent run."""
        if self.key is not None:
            self.tracker.log(self.key, RunRecord("", **kw))

    def export_env(self) -> None:
        """Let processes started from here nest their runs under this parent (until `finish`)."""
        if self.owned and self.run_id:
            os.environ[PARENT_ENV] = self.run_id

    # -- trials -----------------------------------------------------------------------------------
    def start_trial(self, name: str, tags: Optional[Mapping[str, Any]] = None) -> str:
        """A RUNNING child run, shown as in flight until `finish_trial` (or KILLED if interrupted)."""
        tags = {**(tags or {}), TRACKER_TAG: self.tracker.session}
        return self.tracker.start_run(RunRecord(name, tags=tags_text(tags)), parent=self.parent)

    def finish_trial(self, key: str, record: RunRecord) -> None:
        self.tracker.log(key, record)
        self.tracker.end_run(key, record.status)

    def trial(
        self,
        number: int,
        config: ExperimentConfiguration,
        settings: Optional[MeasurementSettings],
        result: ExperimentResult,
        *,
        key: Optional[str] = None,
        role: str = "trial",
        name: str = "",
        baseline_ns: Optional[float] = None,
        **kw: Any,
    ) -> str:
        """Log one finished trial (to `key` if it was started with `start_trial`); returns its key."""
        tags = dict(kw.pop("tags", None) or {})
        tags.setdefault("mneme.trial", number)
        tags[TRACKER_TAG] = self.tracker.session
        if role == "baseline" and self.baseline_config is None:
            self.baseline_config = config
        name = name or run_name(kw.get("kernel", ""), config, self.baseline_config, number, role)
        params = {**self.trial_params, **(kw.pop("params", None) or {})}
        kwargs = dict(
            name=name, config=config, settings=settings, result=result,
            role=role, baseline_ns=baseline_ns, metric=self.metric, tags=tags, params=params, **kw,
        )
        return self.tracker.log_experiment(kwargs, key=key, parent=self.parent)

    def finish(self, status: str = FINISHED, summarize: bool = True, title: str = "") -> None:
        """Summarize (best configuration, plots) and end the parent run, if this process owns it."""
        if self.key is None:
            return
        if self._run_id and os.environ.get(PARENT_ENV) == self._run_id:
            del os.environ[PARENT_ENV]
        if summarize:
            self.summarize(title)
        self.tracker.end_run(self.key, status)

    def summarize(self, title: str = "") -> None:
        """Counts, best configuration and plots on the parent run (once; `finish` then skips it). Call it when
        no trial of this process is still to come."""
        if self.key is None or self._summarized:
            return
        self._summarized = True
        # every writer's trials, as rows they kept while writing them (reading 1000 runs back costs seconds)
        rows = self.tracker.child_rows(self.key)
        self.tracker.call(self.key, SUMMARY, metric=self.metric, title=title, rows=rows, session=self.tracker.session)
