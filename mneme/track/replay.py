"""`mneme replay --track`: one replay, one MLflow run.

    run_id = log_replay(pipeline, config, settings, result, compiled)

`compiled` (the CompiledKernel, compiled with keep_ll=True) gives the run its .ll, .ptx and .cubin. The
store is MLFLOW_TRACKING_URI or ./mlflow.db; to fail on a bad store before the GPU is touched, open the
tracker first with `open_replay_tracker()` and pass it as `tracker=`.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings
from mneme.track.records import kernel_artifacts
from mneme.track.tracker import DEFAULT_EXPERIMENT, Tracker


def open_replay_tracker(uri: Optional[str] = None, experiment: Optional[str] = None) -> Tracker:
    """A tracker that writes in the calling thread (one run is not worth a writer process)."""
    name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    return Tracker(uri, name, writer="inline").open()


def log_replay(
    pipeline: Any,
    config: ExperimentConfiguration,
    settings: Optional[MeasurementSettings],
    result: ExperimentResult,
    compiled: Any = None,
    *,
    tracker: Optional[Tracker] = None,
    uri: Optional[str] = None,
    experiment: Optional[str] = None,
    baseline_ns: Optional[float] = None,
    tags: Optional[Mapping[str, Any]] = None,
) -> str:
    """Log the replay as one run (FAILED with the error if it failed); returns the MLflow run id.

    `pipeline` is the ReplayPipeline that ran it (for the kernel's name and hashes).
    """
    record = pipeline.record
    tracker = tracker or open_replay_tracker(uri, experiment)
    kernel = record.demangled_name or record.kernel_name
    key = tracker.log_experiment(dict(
        name=f"replay {kernel}", config=config, settings=settings, result=result, role="replay",
        baseline_ns=baseline_ns, kernel=kernel, static_hash=record.static_hash,
        dynamic_hash=getattr(pipeline, "record_id", ""), artifacts=kernel_artifacts(compiled),
        tags={"mneme.record_db": os.path.abspath(pipeline.record_db),
              **({"mneme.baseline": pipeline.baseline.describe()} if hasattr(pipeline, "baseline") else {}),
              **(tags or {})},
    ))
    run_id = tracker.run_id(key)
    tracker.close()
    return run_id
