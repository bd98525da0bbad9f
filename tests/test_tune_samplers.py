"""Samplers through ask/tell with an in-process objective: every strategy finds the optimum of a small space,
exhaustive ones visit each point once, constraint-breaking samples are told back without being evaluated."""

from __future__ import annotations

import importlib.util

import optuna
import pytest
from optuna.trial import TrialState

from mneme.config import ExperimentConfiguration, dim3
from mneme.errors import ConfigurationError
from mneme.tune.params import BoolParam, CategoricalParam, IntRangeParam, PipelineParam
from mneme.tune.samplers import EXHAUSTING, SAMPLERS, Proposer, check_sampler, make_optuna_sampler, params_key
from mneme.tune.space import SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)


class Bowl(SearchSpace):
    """block.x in 32..1024 step 32 x O1..O3 x unroll flag; the best is 256 threads at O3 without the flag.
    Odd multiples of 32 above 512 threads break the constraints."""

    name = "bowl"

    def dimensions(self):
        return {"bx": IntRangeParam("bx", 32, 1024, 32), "passes": CategoricalParam("passes", ["default<O1>", "default<O2>", "default<O3>"]),
                "flag": BoolParam("flag")}

    def derived(self, params):
        return ExperimentConfiguration(grid=dim3(64), block=dim3(params["bx"]), passes=params["passes"])

    def constraints(self, params):
        return not (params["bx"] > 512 and (params["bx"] // 32) % 2)


def cost(params) -> float:
    return abs(params["bx"] - 256) / 32 + {"default<O3>": 0, "default<O2>": 1, "default<O1>": 3}[params["passes"]] + 2 * params["flag"]


def optimize(sampler_name: str, space: SearchSpace, n: int, seed: int = 3, cost=cost):
    """The tuner's ask/tell protocol in miniature: evaluations counts what reached the objective."""
    sampler = make_optuna_sampler(sampler_name, space, seed)
    directions = ["minimize", "minimize"] if sampler_name == "nsga2" else ["minimize"]
    study = optuna.create_study(sampler=sampler, directions=directions)
    proposer = Proposer(sampler_name, space, seed)
    seen = set()
    evaluated = []
    rejected = 0
    while len(evaluated) < n:
        trial = proposer.next_trial(study, seen)
        if trial is None or getattr(sampler, "exhausted", False):
            if trial is not None:
                study.tell(trial, state=TrialState.FAIL)
            break
        params = space.sample_optuna(trial)
        _, reasons = space.check(params)
        if reasons:
            rejected += 1
            study.tell(trial, state=TrialState.FAIL)
            continue
        evaluated.append(params)
        c = cost(params)
        study.tell(trial, [c, params.get("bx", 0)] if sampler_name == "nsga2" else c)
    return study, evaluated, rejected


def test_unknown_sampler_lists_the_choices():
    with pytest.raises(ConfigurationError) as e:
        check_sampler("annealing")
    for name in SAMPLERS:
        assert name in str(e.value)


@pytest.mark.parametrize("name,modules", [("cmaes", ["cmaes"]), ("gp", ["torch", "scipy"])])
def test_optional_samplers_work_or_say_what_to_install(name, modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        with pytest.raises(ConfigurationError) as e:
            make_optuna_sampler(name, Bowl(), 0)
        assert all(m in str(e.value) for m in missing) and "pip install" in str(e.value)
    else:
        assert make_optuna_sampler(name, Bowl(), 0) is not None


@pytest.mark.parametrize("name", ["exhaustive", "grid", "bruteforce"])
def test_exhaustive_strategies_visit_every_runnable_point_once(name):
    space = Bowl()
    runnable = sum(1 for _ in space.sample_exhaustive())
    study, evaluated, rejected = optimize(name, space, n=10_000)
    keys = [params_key(p) for p in evaluated]
    assert len(keys) == len(set(keys)) == runnable
    assert min(cost(p) for p in evaluated) == 0
    if name == "exhaustive":
        assert rejected == 0  # mneme's walk skips rejected points before asking
    else:
        assert len(evaluated) + rejected == space.size()


@pytest.mark.parametrize("name", ["tpe", "random", "plain-random", "nsga2"])
def test_adaptive_and_random_samplers_find_a_good_point(name):
    study, evaluated, rejected = optimize(name, Bowl(), n=120, seed=11)
    assert len(evaluated) == 120
    best = min(cost(p) for p in evaluated)
    assert best <= 1.0, (name, best)
    assert all(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in study.trials)
    failed = sum(1 for t in study.trials if t.state == TrialState.FAIL)
    assert failed == rejected  # every rejected sample was told back, none evaluated


def test_tpe_beats_random_on_average():
    def best_of(name, seed):
        return min(cost(p) for p in optimize(name, Bowl(), n=40, seed=seed)[1])

    tpe = sum(best_of("tpe", s) for s in range(4))
    rnd = sum(best_of("random", s) for s in range(4))
    assert tpe <= rnd


def test_grid_sampler_refuses_drawn_pipelines_and_exhaustion_is_reported():
    class Drawn(Bowl):
        def dimensions(self):
            return {"passes": PipelineParam("passes", num_draws=2, passes=["sroa", "instcombine"])}

        def derived(self, params):
            return ExperimentConfiguration(passes=params["passes"])

        def constraints(self, params):
            return True

    with pytest.raises(ConfigurationError, match="bruteforce or exhaustive"):
        make_optuna_sampler("grid", Drawn(), 0)
    _, evaluated, _ = optimize("bruteforce", Drawn(), n=100, cost=lambda p: len(p["passes"]))
    assert sorted(p["passes"] for p in evaluated) == sorted(["sroa", "instcombine", "sroa,sroa", "sroa,instcombine",
                                                             "instcombine,sroa", "instcombine,instcombine"])
    assert "grid" in EXHAUSTING and "bruteforce" in EXHAUSTING
