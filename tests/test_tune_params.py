"""Tunable parameters: domains, sizes, enumeration, random draws and Optuna suggestions agree."""

from __future__ import annotations

import math
import random

import optuna
import pytest

from mneme.tune.params import (
    DRAWN,
    SKIP,
    BoolParam,
    CategoricalParam,
    FixedParam,
    IntRangeParam,
    PipelineParam,
    RealRangeParam,
    sample_optuna_param,
    sample_random_param,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

PASSES = ["instcombine", "loop-rotate", "sroa"]


def replay_in_trial(param, optuna_params):
    """What `param.suggest` returns in a trial whose parameters were fixed to `optuna_params`."""
    study = optuna.create_study()
    study.enqueue_trial(optuna_params)
    trial = study.ask()
    value = param.suggest(trial)
    study.tell(trial, 0.0)
    return value, dict(trial.params)


def test_int_range_domain_size_and_values():
    p = IntRangeParam("max_threads", 32, 1000, step=32)
    assert p.high == 992  # lowered to the last reachable value
    values = list(p.values())
    assert values[0] == 32 and values[-1] == 992 and len(values) == p.size() == 31
    assert all(v % 32 == 0 for v in values)
    rng = random.Random(1)
    assert all(sample_random_param(p, rng) in values for _ in range(200))
    with pytest.raises(ValueError):
        IntRangeParam("x", 5, 1)
    with pytest.raises(ValueError):
        IntRangeParam("x", 1, 5, step=0)


def test_real_range_is_infinite_unless_stepped():
    p = RealRangeParam("alpha", 0.5, 2.0)
    assert math.isinf(p.size()) and not p.is_finite
    with pytest.raises(ValueError, match="cannot be enumerated"):
        list(p.grid())
    rng = random.Random(2)
    assert all(0.5 <= p.sample_random(rng) <= 2.0 for _ in range(100))
    stepped = RealRangeParam("alpha", 0.0, 1.0, step=0.25)
    assert list(stepped.values()) == [0.0, 0.25, 0.5, 0.75, 1.0] and stepped.size() == 5
    with pytest.raises(ValueError):
        RealRangeParam("alpha", 0.0, 1.0, log=True)


def test_categorical_bool_fixed():
    c = CategoricalParam("passes", ["default<O3>", "default<O2>"])
    assert c.size() == 2 and list(c.values()) == ["default<O3>", "default<O2>"]
    b = BoolParam("specialize")
    assert set(b.values()) == {True, False} and b.domain() == {"type": "bool"}
    f = FixedParam("launch", "256x1x1")
    assert f.size() == 1 and list(f.grid()) == [("256x1x1", {})]
    with pytest.raises(ValueError):
        CategoricalParam("empty", [])
    with pytest.raises(ValueError, match="duplicate"):
        CategoricalParam("dup", [1, 1])


def test_categorical_with_values_optuna_cannot_store_travels_by_label():
    p = CategoricalParam("tile", [(8, 8), (16, 4)])
    for value, params in p.grid():
        assert replay_in_trial(p, params)[0] == value
    assert p.domain()["choices"] == ["(8, 8)", "(16, 4)"]


@pytest.mark.parametrize("param", [
    IntRangeParam("i", 0, 9, 3),
    RealRangeParam("r", 1.0, 8.0, log=True),
    CategoricalParam("c", ["a", "b", "c"]),
    BoolParam("b"),
    PipelineParam("p", num_draws=3, pipelines=["default<O3>"], passes=PASSES),
])
def test_random_draws_replay_through_optuna(param):
    """A draw's Optuna params make a trial suggest exactly the drawn value (how mneme's own strategies
    record their samples in the study)."""
    rng = random.Random(7)
    for _ in range(30):
        value, params = param.draw(rng)
        got, stored = replay_in_trial(param, params)
        assert got == pytest.approx(value) if isinstance(value, float) else got == value
        assert stored == params


def test_pipeline_param_enumeration_matches_size():
    p = PipelineParam("passes", num_draws=2, pipelines=["default<O3>", "default<O1>"], passes=PASSES)
    grid = list(p.grid())
    assert len(grid) == p.size() == 2 + 3 + 3 * 3
    values = [v for v, _ in grid]
    assert len(set(values)) == len(values)
    assert "loop-rotate,sroa" in values and "default<O1>" in values
    for v, params in grid:
        assert replay_in_trial(p, params)[0] == v
    drawn = dict(grid)["sroa"]
    assert drawn == {"passes": DRAWN, "passes.0": "sroa", "passes.1": SKIP}


def test_pipeline_param_of_named_pipelines_only_is_a_flat_grid():
    p = PipelineParam("passes", pipelines=["default<O3>", "default<O2>"])
    assert p.size() == 2 and p.optuna_grid() == {"passes": ["default<O3>", "default<O2>"]}
    drawn = PipelineParam("passes", num_draws=2, passes=PASSES)
    with pytest.raises(ValueError, match="bruteforce or exhaustive"):
        drawn.optuna_grid()
    with pytest.raises(ValueError):
        PipelineParam("passes")


def test_pipeline_param_draws_from_available_passes_and_yields_valid_pipelines():
    from mneme.ir import available_passes, parse_pipeline

    p = PipelineParam("passes", num_draws=4)
    assert p.available_passes == sorted(available_passes()) and len(p.available_passes) > 10
    assert p.size() == sum(len(p.available_passes) ** k for k in range(1, 5))
    rng = random.Random(3)
    for _ in range(25):
        text = p.sample_random(rng)
        assert 1 <= len(text.split(",")) <= 4
        assert parse_pipeline(text).canonical == text


def test_optuna_suggestions_stay_in_the_domain():
    params = [IntRangeParam("i", 2, 20, 2), CategoricalParam("c", ["x", "y"]), BoolParam("b"), FixedParam("f", 7),
              RealRangeParam("r", 0.1, 0.2), PipelineParam("p", num_draws=2, pipelines=["default<O2>"], passes=PASSES)]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(40):
        trial = study.ask()
        values = {p.name: sample_optuna_param(trial, p) for p in params}
        study.tell(trial, 1.0)
        assert values["i"] in range(2, 21, 2) and values["c"] in ("x", "y") and values["b"] in (True, False)
        assert values["f"] == 7 and 0.1 <= values["r"] <= 0.2
        assert values["p"] == "default<O2>" or set(values["p"].split(",")) <= set(PASSES)
