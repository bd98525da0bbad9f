"""The executor backend of the Hydra app: mneme.tune's ReplayBackend, keeping the optimized IR.

Tracked runs carry the optimized .ll next to the .ptx and .cubin. The compile workers write what they
compile to the executor's cache directory, so the job that logs the run reads all three from there.
"""

from __future__ import annotations

from datetime import datetime, timezone

from mneme.config import ExperimentConfiguration, ExperimentResult
from mneme.tune.worker import ReplayBackend


class TrackedBackend(ReplayBackend):
    def compile(self, config: ExperimentConfiguration):
        return self.pipeline.compile(config, keep_ll=True)

    def describe(self, compiled, config: ExperimentConfiguration) -> ExperimentResult:
        """The compile-only result of a compiled kernel: resources, size, per-stage times."""
        from mneme.replay.pipeline import COMPILED, fill_compile_metrics

        result = self.pipeline.new_result(config)
        fill_compile_metrics(result, compiled)
        result.status = COMPILED
        result.end_time = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        return result
