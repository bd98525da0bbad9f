"""What a trial is worth: success, the time metric, and the values told to Optuna.

Only a verified trial has a value (on a GPU); everything else is told back as FAIL, so a trial that did not
verify can never be the best. Without a GPU, a compiled trial is a success and is ranked by registers or size.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import List, Optional, Sequence

from mneme.config import ExperimentResult
from mneme.tune.samplers import MULTI_OBJECTIVE

FAILURES = ("failed_verification", "invalid_config", "invalid_launch", "compile_error", "runtime_error", "timeout")


def succeeded(result: Optional[ExperimentResult], device_less: bool) -> bool:
    if result is None or result.failed or result.status in FAILURES:
        return False
    if device_less:
        return True
    return result.status == "verified" and bool(result.exec_time)


def metric_ns(times: Sequence[float], metric: str) -> Optional[float]:
    """mean, median or min of per-iteration times (ns)."""
    if not times:
        return None
    if metric == "mean":
        return float(statistics.fmean(times))
    if metric == "min":
        return float(min(times))
    return float(statistics.median(times))


@dataclass(frozen=True)
class Objective:
    """How results become Optuna values: primary objective, optionally registers as a second one (NSGA-II)."""

    name: str  # time | speedup | registers | size
    metric: str  # mean | median | min
    multi: bool = False

    @classmethod
    def of(cls, name: str, metric: str, sampler: str) -> "Objective":
        return cls(name, metric, sampler in MULTI_OBJECTIVE)

    @property
    def device_less(self) -> bool:
        return self.name in ("registers", "size")

    @property
    def directions(self) -> List[str]:
        first = "maximize" if self.name == "speedup" else "minimize"
        return [first, "minimize"] if self.multi else [first]

    @property
    def labels(self) -> List[str]:
        first = {"time": f"{self.metric} time (ns)", "speedup": f"speedup ({self.metric})",
                 "registers": "registers", "size": "object size (bytes)"}[self.name]
        second = "size (bytes)" if self.name == "registers" else "registers"
        return [first, second] if self.multi else [first]

    def describe(self) -> dict:
        return {"objective": self.name, "metric": self.metric, "directions": self.directions}

    def values(self, result: ExperimentResult, baseline_ns: Optional[float]) -> Optional[List[float]]:
        """The values to tell Optuna, or None when the trial failed."""
        if not succeeded(result, self.device_less):
            return None
        if self.name == "registers":
            first = float(result.reg_usage)
        elif self.name == "size":
            first = float(result.obj_size)
        else:
            t = metric_ns(result.exec_time, self.metric)
            if t is None or t <= 0:
                return None
            if self.name == "speedup":
                if not baseline_ns:
                    return None
                first = baseline_ns / t
            else:
                first = t
        if not self.multi:
            return [first]
        second = float(result.obj_size) if self.name == "registers" else float(result.reg_usage)
        return [first, second]


def speedup(baseline_ns: Optional[float], result: Optional[ExperimentResult], metric: str) -> Optional[float]:
    if not baseline_ns or result is None or not succeeded(result, False):
        return None
    t = metric_ns(result.exec_time, metric)
    return baseline_ns / t if t else None
