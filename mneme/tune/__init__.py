"""Tuning: search spaces over replay configurations, Optuna samplers, and the asynchronous multi-GPU executor.

    space = preset_space("launch", SpaceContext(baseline))         # or a SearchSpace subclass of your own
    with AsyncReplayExecutor(record_db, record_id, devices=[0, 1]) as ex:
        result = ex.evaluate(space.derived(space.sample_random()))
    outcome = run_tune(TuneOptions(record_db, space="standard", trials=200))   # what `mneme tune` does
"""

from mneme.tune.executor import AsyncReplayExecutor, EvalFuture, visible_devices
from mneme.tune.hooks import TuneHook
from mneme.tune.launch import LAUNCH_SAFETY, LaunchShape, launch_candidates
from mneme.tune.options import TuneOptions
from mneme.tune.params import (
    BaseParam,
    BoolParam,
    CategoricalParam,
    FixedParam,
    IntRangeParam,
    PipelineParam,
    RealRangeParam,
    sample_optuna_param,
    sample_random_param,
)
from mneme.tune.presets import PRESETS, preset_space
from mneme.tune.samplers import SAMPLERS, make_optuna_sampler
from mneme.tune.space import SearchSpace, SpaceContext
from mneme.tune.tuner import TuneOutcome, Tuner, run_tune

__all__ = [
    "AsyncReplayExecutor",
    "BaseParam",
    "BoolParam",
    "CategoricalParam",
    "EvalFuture",
    "FixedParam",
    "IntRangeParam",
    "LAUNCH_SAFETY",
    "LaunchShape",
    "PRESETS",
    "PipelineParam",
    "RealRangeParam",
    "SAMPLERS",
    "SearchSpace",
    "SpaceContext",
    "TuneHook",
    "TuneOptions",
    "TuneOutcome",
    "Tuner",
    "launch_candidates",
    "make_optuna_sampler",
    "preset_space",
    "run_tune",
    "sample_optuna_param",
    "sample_random_param",
    "visible_devices",
]
