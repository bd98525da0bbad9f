"""MLflow tracking of `mneme tune` through the tuner's observer hook (mneme.tune.hooks).

`make_hook(options)` is called before the tuner starts, so a store that cannot be used stops
`mneme tune` before any GPU work (ConfigurationError, exit code 2). The parent run of a study is found
again by the study's name and storage, so a resumed study, or a second process sharing it, logs its
trials under the same parent.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional

from mneme.config import ExperimentConfiguration, ExperimentResult
from mneme.track.records import FAILED, FINISHED, KILLED
from mneme.track.runs import quote
from mneme.track.sweep import SweepRun
from mneme.track.tracker import DEFAULT_EXPERIMENT, Tracker

#: files of the tuner's results directory that the parent run keeps
RESULT_FILES = ("summary.json", "summary.txt", "best.json", "best.yaml", "best.sh", "best.md", "verified.csv", "compiled.csv")
#: exit codes of `mneme tune` (mneme.tune.options) that mean the run was stopped, not that it failed
INTERRUPTED_EXIT = 130


def make_hook(options: Any) -> Optional["MlflowTuneHook"]:
    """The hook for TuneOptions `options`, or None when tracking is off (`--no-track`)."""
    if not getattr(options, "track", True):
        return None
    tracker = Tracker(
        getattr(options, "tracking_uri", None),
        getattr(options, "experiment", None) or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT,
        writers=0,
    ).open()
    return MlflowTuneHook(tracker, metric=getattr(options, "metric", "median"))


def find_sweep_run(tracker: Tracker, study: str, storage: str) -> Optional[str]:
    """The parent run earlier processes made for this study, if any."""
    from mlflow import MlflowClient

    client = MlflowClient(tracker.uri)
    flt = (f"tags.`mneme.role` = 'sweep' and tags.`mneme.study` = {quote(study)} "
           f"and tags.`mneme.study_storage` = {quote(storage)}")
    found = client.search_runs([tracker.experiment_id], filter_string=flt, order_by=["attributes.start_time ASC"], max_results=1)
    return found[0].info.run_id if found else None


class MlflowTuneHook:
    """One parent run per study; the baseline and every trial as child runs."""

    def __init__(self, tracker: Tracker, metric: str = "median"):
        self.tracker = tracker
        self.metric = metric
        self.sweep: Optional[SweepRun] = None
        self.info: Dict[str, Any] = {}
        self.baseline_ns: Optional[float] = None
        self.resumed_run = False
        self._summary: Optional[threading.Thread] = None
        self._summary_error: Optional[BaseException] = None
        self._derived: Optional[tuple] = None  # (definitions, the kernel's scalar arguments)

    def _record_tags(self) -> Dict[str, Any]:
        """What every run of the study shares: the kernel's identity, and where its compiled code is."""
        rec = self.info.get("record") or {}
        opts = self.info.get("options") or {}
        cache = opts.get("cache_dir") or str(Path(self.info.get("output") or ".") / "cache")
        return {"kernel": rec.get("kernel", ""), "dynamic_hash": rec.get("dynamic_hash", ""),
                "static_hash": rec.get("static_hash", ""), "compile_cache": cache}

    def on_start(self, info: Dict[str, Any]) -> None:
        self.info = info
        opts = info.get("options") or {}
        rec = info.get("record") or {}
        existing = find_sweep_run(self.tracker, info["study"], info["storage"]) if info.get("resumed") else None
        self.resumed_run = existing is not None
        params = {k: opts.get(k) for k in ("space", "sampler", "trials", "objective", "metric", "seed", "iterations",
                                          "warmup", "launch_safety", "devices", "compile_jobs") if k in opts}
        params["record_db"] = rec.get("db", opts.get("record_db", ""))
        self.sweep = SweepRun.start(
            self.tracker, info["study"], params=params, resume_run_id=existing, metric=self.metric,
            tags={"mneme.study": info["study"], "mneme.study_storage": info["storage"], "mneme.kernel": rec.get("kernel", ""),
                  "mneme.dynamic_hash": rec.get("dynamic_hash", ""), "mneme.space": (info.get("space") or {}).get("name", ""),
                  "mneme.sampler": info.get("sampler", ""), "mneme.output": info.get("output", "")},
        )
        self.sweep.trial_params = {"space": (info.get("space") or {}).get("name", "")}
        self.sweep.export_env()
        if opts.get("derived"):
            from mneme.tune.derived import check, parse_all, scalar_args

            defs = parse_all(opts["derived"])
            args = scalar_args(rec.get("db", opts.get("record_db", "")), rec.get("dynamic_hash") or None)
            check(defs, args)
            self._derived = (defs, args)

    def _extra(self, result: ExperimentResult) -> Dict[str, Any]:
        """The derived metrics of a result, as extra MLflow metrics."""
        if self._derived is None:
            return {}
        from mneme.tune.derived import evaluate
        from mneme.tune.objective import metric_ns

        t = metric_ns(result.exec_time, self.metric) if result.exec_time else None
        return {"extra_metrics": evaluate(*self._derived, t)}

    def on_baseline(self, config: ExperimentConfiguration, result: ExperimentResult, metric_ns: Optional[float]) -> None:
        self.baseline_ns = metric_ns
        if self.sweep is not None:
            self.sweep.baseline_config = config  # trials are named by what differs from it
        if self.sweep is None or self.resumed_run:
            return  # a resumed study's baseline run exists already
        self.sweep.trial(-1, config, None, result, role="baseline", baseline_ns=metric_ns,
                         **self._record_tags(), **self._extra(result))

    def on_trial(self, trial: Dict[str, Any]) -> None:
        if self.sweep is None or trial.get("config") is None:
            return
        tags = {"mneme.optuna_params": trial.get("params")}
        if trial.get("duplicate_of") is not None:
            tags["mneme.duplicate_of"] = trial["duplicate_of"]
        self.sweep.trial(trial["number"], trial["config"], None, trial["result"], baseline_ns=self.baseline_ns,
                         tags=tags, **self._record_tags(), **self._extra(trial["result"]))

    def on_search_end(self, info: Dict[str, Any]) -> None:
        """Summarize while the tuner stops its workers and writes its results: the writers drain their backlog
        and draw the plots in that time instead of after it (the tuner sends nothing until on_end joins)."""
        if self.sweep is None or not self.sweep.owned:
            return
        title = self.info.get("study", "")
        self._summary = threading.Thread(target=self._summarize, args=(title,), name="mneme-mlflow-summary", daemon=True)
        self._summary.start()

    def _summarize(self, title: str) -> None:
        try:
            self.sweep.summarize(title)
            self.tracker.flush()
        except BaseException as e:  # noqa: BLE001 - reported by on_end, in the tuner's thread
            self._summary_error = e

    def on_end(self, summary: Dict[str, Any]) -> None:
        t0 = time.perf_counter()
        if self._summary is not None:
            self._summary.join()
            self._summary = None
            if self._summary_error is not None:
                print(f"mneme tune: warning: the sweep summary failed ({self._summary_error!r})", file=sys.stderr)
        # what the end of the study waited for (in the --json summary): tells a slow store from a slow summary
        summary["tracking"] = {"summary_wait_s": time.perf_counter() - t0}
        if self.sweep is None:
            self.tracker.close()
            return
        code = int(summary.get("exit_code", 0) or 0)
        status = FINISHED if code == 0 else KILLED if code == INTERRUPTED_EXIT else FAILED
        out_dir = Path(summary.get("out_dir") or self.info.get("output") or ".")
        files = {name: (out_dir / name) for name in RESULT_FILES if (out_dir / name).is_file()}
        self.sweep.log(tags={"mneme.exit_code": str(code), "mneme.message": str(summary.get("message", ""))},
                       artifacts={f"results/{n}": p for n, p in files.items()})
        self.sweep.finish(status, title=self.info.get("study", ""))
        t1 = time.perf_counter()
        report = self.tracker.close(status)
        summary["tracking"].update(close_s=time.perf_counter() - t1, runs_written=report.get("done"),
                                   errors=len(report.get("errors", [])), writer_timing=report.get("timing", []),
                                   **self.tracker.stats())

