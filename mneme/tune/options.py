"""What one tuning run is asked to do (the CLI flags and the Hydra configs both build a TuneOptions)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from mneme.config import MeasurementSettings
from mneme.errors import ConfigurationError
from mneme.tune.worker import DEFAULT_BACKEND

METRICS = ("mean", "median", "min")
#: time and speedup need a GPU; registers and size rank compile-only results
OBJECTIVES = ("time", "speedup", "registers", "size")

# Exit codes of `mneme tune` (also listed in its --help).
EXIT_OK = 0
EXIT_USAGE = 2  # bad flags, unknown space/sampler, unreadable record, a study that cannot be resumed
EXIT_ALL_FAILED = 3  # not one trial succeeded (verified on a GPU; compiled, without one)
EXIT_BASELINE_FAILED = 4  # the recorded configuration itself did not verify: nothing to compare against
EXIT_NO_DEVICE = 5  # no GPU worker could start (driver, device or arena problem)
EXIT_INTERRUPTED = 130

EXIT_CODES = {
    EXIT_OK: "ok: the study finished and at least one trial succeeded (or --baseline-only/--dry-run succeeded)",
    1: "internal error (a bug: the traceback says where); the study can be resumed",
    EXIT_USAGE: "usage or configuration error (bad flag, unknown space or sampler, unreadable record, refused resume)",
    EXIT_ALL_FAILED: "every trial failed",
    EXIT_BASELINE_FAILED: "the baseline (recorded configuration, compiled as the app was built) failed",
    EXIT_NO_DEVICE: "no GPU worker could start",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); the study can be resumed with --resume",
}


@dataclass
class TuneOptions:
    record_db: str
    record_id: Optional[str] = None
    space: str = "standard"
    sampler: str = "tpe"
    trials: int = 100
    #: GPU ordinals; None = every visible GPU; [] = compile only (no GPU)
    devices: Optional[List[int]] = None
    compile_jobs: Optional[int] = None
    storage: Optional[str] = None
    study: Optional[str] = None
    metric: str = "median"
    objective: str = "time"
    iterations: int = 10
    warmup: int = 2
    timeout: float = 60.0
    l2_flush: bool = False
    rewrite_inputs: bool = False
    atol: Optional[float] = None
    rtol: Optional[float] = None
    tol_type: str = "f32"
    #: the verification fields of MeasurementSettings (verify_runs, verify_margin, float_rtol; docs/VERIFY.md)
    verification: Dict[str, Any] = field(default_factory=dict)
    arch: Optional[str] = None
    seed: Optional[int] = None
    resume: bool = False
    baseline_only: bool = False
    launch_safety: str = "balanced"
    passes: List[str] = field(default_factory=list)
    pipeline_file: Optional[str] = None
    space_module: Optional[str] = None
    space_args: Dict[str, Any] = field(default_factory=dict)
    output: Optional[str] = None
    track: bool = True
    #: advanced: executor and study housekeeping
    compile_timeout: float = 600.0
    run_timeout: Optional[float] = None
    stale_after: float = 120.0
    max_inflight: Optional[int] = None
    backend: str = DEFAULT_BACKEND
    cache_dir: Optional[str] = None
    progress: bool = True
    #: after the search, measure the best configuration without each of its knobs (mneme.tune.attribution)
    attribute: bool = True
    #: derived metrics, `NAME = EXPRESSION` over the kernel's scalar arguments and the time (mneme.tune.derived)
    derived: List[str] = field(default_factory=list)
    #: the baseline's code: "app-build" (as the app was built, mneme.ir.appbuild) or "mneme-defaults"
    baseline: str = "app-build"

    def settings(self) -> MeasurementSettings:
        return MeasurementSettings(
            iterations=self.iterations, warmup=self.warmup, l2_flush=self.l2_flush,
            rewrite_inputs=self.rewrite_inputs, atol=self.atol, rtol=self.rtol,
            tol_type=self.tol_type, arch=self.arch, timeout=self.timeout, **self.verification,
        )

    @property
    def device_less(self) -> bool:
        return self.devices is not None and len(self.devices) == 0

    def validate(self) -> None:
        if self.metric not in METRICS:
            raise ConfigurationError(f"unknown metric {self.metric!r}; choose one of {', '.join(METRICS)}")
        if self.objective not in OBJECTIVES:
            raise ConfigurationError(f"unknown objective {self.objective!r}; choose one of {', '.join(OBJECTIVES)}")
        if self.device_less and self.objective in ("time", "speedup"):
            raise ConfigurationError(
                f"--objective {self.objective} needs a GPU; without devices (--devices none) rank compile-only "
                "results with --objective registers or size"
            )
        if not self.device_less and self.objective in ("registers", "size"):
            raise ConfigurationError(f"--objective {self.objective} ranks compile-only results; use it with --devices none")
        if self.trials < 0:
            raise ConfigurationError(f"--trials {self.trials}: must not be negative")
        if self.iterations < 1 or self.warmup < 0:
            raise ConfigurationError("--iterations must be at least 1 and --warmup at least 0")
        if self.timeout <= 0:
            raise ConfigurationError(f"--timeout {self.timeout}: must be positive (seconds)")
        from mneme.tune.derived import parse_all

        parse_all(self.derived)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)
