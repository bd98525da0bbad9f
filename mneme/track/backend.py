"""The executor backend of the Hydra app: mneme.tune's ReplayBackend, keeping the optimized IR.

Tracked runs carry the optimized .ll next to the .ptx and .cubin. The compile workers write what they
compile to the executor's cache directory, so the job that logs the run reads all three from there.
"""

from __future__ import annotations

from mneme.config import ExperimentConfiguration
from mneme.tune.worker import ReplayBackend


class TrackedBackend(ReplayBackend):
    def compile(self, config: ExperimentConfiguration):
        return self.pipeline.compile(config, keep_ll=True)
