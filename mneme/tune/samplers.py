"""Sampling strategies (`--sampler NAME`).

Every strategy hands out Optuna trials, so the study records every sample whichever strategy drew it:

- Optuna samplers (tpe, cmaes, random, grid, bruteforce, nsga2, gp) suggest through `study.ask()`;
- ``exhaustive`` walks a finite space in a fixed order and ``plain-random`` draws with Python's `random`;
  both enqueue their choice as a trial's fixed parameters, then ask for it.

CMA-ES and GP need optional packages (cmaes; torch and scipy); asking for them without the package is an
error that says what to install. CMA-ES and GP model numeric dimensions only: categorical ones (block
shapes, pipelines) fall back to independent random sampling.
"""

from __future__ import annotations

import importlib.util
import random
import warnings
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from mneme.errors import ConfigurationError
from mneme.tune.space import SearchSpace

SAMPLERS: Dict[str, str] = {
    "tpe": "Tree-structured Parzen Estimator (Optuna; default)",
    "cmaes": "CMA-ES (Optuna; needs the cmaes package; numeric dimensions only)",
    "random": "uniform random (Optuna)",
    "grid": "grid search over a flat finite space (Optuna GridSampler)",
    "bruteforce": "every point of a finite space, conditional dimensions included (Optuna BruteForceSampler)",
    "nsga2": "NSGA-II, two objectives: time and registers (Optuna)",
    "gp": "Gaussian-process Bayesian optimisation (Optuna; needs torch and scipy: pip install mneme[gp])",
    "exhaustive": "every point of a finite space in a fixed order (mneme, no Optuna sampling)",
    "plain-random": "uniform random draws with Python's random (mneme, no Optuna sampling)",
}

#: Samplers that optimise several objectives (time and registers).
MULTI_OBJECTIVE = {"nsga2"}
#: Samplers that stop once the finite space is used up.
EXHAUSTING = {"grid", "bruteforce", "exhaustive"}

_OPTIONAL = {"cmaes": (["cmaes"], "pip install cmaes"), "gp": (["torch", "scipy"], "pip install 'mneme[gp]' (torch and scipy)")}


def check_sampler(name: str) -> None:
    """Refuse unknown samplers and samplers whose optional packages are missing, naming the fix."""
    if name not in SAMPLERS:
        raise ConfigurationError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")
    if name in _OPTIONAL:
        mods, fix = _OPTIONAL[name]
        missing = [m for m in mods if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigurationError(
                f"sampler {name!r} needs the optional package(s) {', '.join(missing)}, which are not installed: "
                f"{fix}; or choose another sampler ({', '.join(s for s in SAMPLERS if s not in _OPTIONAL)})"
            )


def make_optuna_sampler(name: str, space: SearchSpace, seed: Optional[int] = None):
    """The Optuna sampler behind `name` (a RandomSampler for mneme's own strategies, which fix every param)."""
    import optuna

    check_sampler(name)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    s = optuna.samplers
    if name == "tpe":
        return s.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)
    if name == "cmaes":
        return s.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "gp":
        return s.GPSampler(seed=seed)
    if name == "nsga2":
        return s.NSGAIISampler(seed=seed)
    if name == "grid":
        grid = space.optuna_grid()
        if not grid:
            raise ConfigurationError(f"space {space.name!r} has nothing to search (every dimension is fixed)")
        return _stopless(s.GridSampler)(grid, seed=seed)
    if name == "bruteforce":
        if not space.is_finite:
            raise ConfigurationError(f"space {space.name!r} has continuous dimensions; bruteforce needs a finite space")
        return _stopless(s.BruteForceSampler)(seed=seed)
    return s.RandomSampler(seed=seed)


def _stopless(cls):
    """The sampler class, marking itself `exhausted` where it would call study.stop() (which only works inside
    study.optimize, not with ask/tell)."""

    class Stopless(cls):
        exhausted = False

        def after_trial(self, study, trial, state, values):
            try:
                super().after_trial(study, trial, state, values)
            except RuntimeError as e:
                if "stop" not in str(e).lower():
                    raise
                self.exhausted = True

    Stopless.__name__ = Stopless.__qualname__ = cls.__name__
    return Stopless


class Proposer:
    """Hands out the next Optuna trial for a strategy. `next_trial` returns None once the space is used up."""

    def __init__(self, name: str, space: SearchSpace, seed: Optional[int] = None):
        check_sampler(name)
        self.name = name
        self.space = space
        self.rng = random.Random(seed)
        self._walk: Optional[Iterator[Tuple[Dict[str, Any], Dict[str, Any]]]] = None
        if name == "exhaustive":
            self._walk = space.sample_exhaustive()

    def next_trial(self, study, seen: Set[str]):
        """A new trial; `seen` holds keys (see `params_key`) of Optuna params already in the study."""
        if self.name == "exhaustive":
            for _, optuna_params in self._walk:
                key = params_key(optuna_params)
                if key not in seen:
                    seen.add(key)
                    study.enqueue_trial(optuna_params)
                    return study.ask()
            from optuna.trial import TrialState

            # queued trials (retries of trials whose process died) still need an answer
            return study.ask() if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)) else None
        if self.name == "plain-random":
            _, optuna_params = self.space.draw_random(self.rng)
            study.enqueue_trial(optuna_params)
            return study.ask()
        return study.ask()


def params_key(params: Dict[str, Any]) -> str:
    return repr(sorted(params.items()))


def sampler_names() -> List[str]:
    return list(SAMPLERS)
