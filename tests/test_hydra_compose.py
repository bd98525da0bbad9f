"""Real Hydra composition of conf/ and experiments/: every experiment, overrides, and bad input."""

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException

from hydra_plugins.mneme_plugins.experiments import CONF_DIR, EXPERIMENTS_DIR
from hydra_plugins.mneme_plugins.optuna_sweeper import OverrideSpace, param_from_override
from mneme.config import ExperimentConfiguration, dim3
from mneme.errors import ConfigurationError
from mneme.track import schema
from mneme.tune.params import CategoricalParam, IntRangeParam, RealRangeParam

EXPERIMENTS = sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.yaml"))


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def test_the_six_experiments_exist():
    assert EXPERIMENTS == ["baseline", "compile_only", "launch_search", "pipeline_search", "record", "sweep"]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes(name):
    cfg = _compose(f"+experiment={name}", "record.db=rec.json")
    assert cfg.name == name
    assert cfg.mode in schema.MODES
    choices = cfg.hydra.runtime.choices
    if name in ("sweep", "pipeline_search", "launch_search"):
        assert (choices["hydra/sweeper"], choices["hydra/launcher"]) == ("mneme_optuna", "mneme_executor")
        assert cfg.hydra.mode.name == "MULTIRUN"
        assert cfg.search_space.name == {"sweep": "standard", "pipeline_search": "compiler", "launch_search": "launch"}[name]
    if name == "compile_only":
        assert cfg.mode == "compile_only" and list(cfg.executor.devices) == [] and choices["hydra/sweeper"] == "basic"
    if name == "record":
        assert cfg.mode == "record" and cfg.tracking.enabled is False


def test_every_field_is_overridable_and_launch_fields_default_to_recorded():
    cfg = _compose("+experiment=baseline", "replay.passes='default<O2>'", "replay.block.x=128", "replay.codegen_opt=1",
                   "measure.iterations=5", "sampler=cmaes", "search_space=launch", "tracking=off", "executor.compile_jobs=3")
    recorded = ExperimentConfiguration(grid=dim3(40, 2), block=dim3(256, 1, 1), shared_mem=64)
    config = schema.configuration(cfg.replay, recorded)
    assert config.block.to_dict() == {"x": 128, "y": 1, "z": 1}
    assert config.grid.to_dict() == {"x": 40, "y": 2, "z": 1} and config.shared_mem == 64
    assert config.passes == "default<O2>" and config.codegen_opt == 1
    assert schema.settings(cfg.measure).iterations == 5
    assert cfg.sampler.name == "cmaes" and cfg.search_space.name == "launch" and cfg.tracking.enabled is False


def test_configs_map_onto_the_same_tune_options_as_the_cli():
    opts = schema.tune_options(_compose("+experiment=launch_search", "record.db=r.json", "sampler=random",
                                        "study.trials=7", "sampler.seed=3", "measure.warmup=1"))
    assert (opts.space, opts.sampler, opts.trials, opts.seed, opts.warmup) == ("launch", "random", 7, 3, 1)
    assert opts.devices is None and opts.track is True
    opts.validate()
    co = schema.tune_options(_compose("+experiment=compile_only", "record.db=r.json"))
    assert co.devices == [] and co.objective == "registers" and co.derived == []
    co.validate()
    # the sweep's study keeps the derived metrics, so its closing summary shows them as `mneme tune --derived` does
    dm = schema.tune_options(_compose("+experiment=sweep", "record.db=r.json", 'metrics=["gbps = 3 * n * 4 / time_s / 1e9"]'))
    assert dm.derived == ["gbps = 3 * n * 4 / time_s / 1e9"]
    dm.validate()


def test_sweep_overrides_carry_the_whole_configuration():
    config = ExperimentConfiguration(grid=dim3(7), block=dim3(32, 4), passes="default<O1>", set_launch_bounds=True,
                                     max_threads=256, min_blocks_per_sm=2, specialize=True)
    cfg = _compose("+experiment=baseline", *schema.overrides_for(config))
    assert schema.configuration(cfg.replay).hash() == config.hash()


def test_a_typo_fails_at_compose_time_and_the_valid_keys_are_named():
    with pytest.raises(ConfigCompositionException):
        _compose("+experiment=baseline", "replay.blok.x=3")
    with pytest.raises(ConfigCompositionException):
        _compose("+experiment=baseline", "replay.codegen_opt=fast")
    lines = schema.explain_overrides(["replay.blok.x=3", "tracking.uri=x", "study.trails=4"])
    assert len(lines) == 2
    assert "replay.blok.x" in lines[0] and "block" in lines[0] and "passes" in lines[0]
    assert "study.trails" in lines[1] and "trials" in lines[1]


def test_an_unknown_choice_lists_the_valid_ones():
    with pytest.raises(MissingConfigException) as e:
        _compose("+experiment=swep")
    assert "Available options in 'experiment'" in str(e.value) and "sweep" in str(e.value)
    with pytest.raises(MissingConfigException) as e:
        _compose("+experiment=sweep", "sampler=tpee")
    assert "cmaes" in str(e.value) and "nsga2" in str(e.value)


def test_the_app_reports_compose_errors_with_choices(tmp_path):
    p = subprocess.run([sys.executable, "-m", "mneme", "+experiment=baseline", "replay.blok=1"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 1
    assert "Key 'blok' not in 'ReplayConf'" in p.stderr
    assert "valid keys under replay: grid, block, shared_mem" in p.stderr
    assert not (tmp_path / "mlflow.db").exists()


def _param(text):
    return param_from_override(OverridesParser.create().parse_override(text))


def test_hydra_sweep_syntax_becomes_tune_parameters():
    r = _param("replay.codegen_opt=range(0,4)")
    assert isinstance(r, IntRangeParam) and (r.low, r.high, r.step) == (0, 3, 1)
    c = _param("replay.passes=choice('default<O3>','default<O1>')")
    assert isinstance(c, CategoricalParam) and c.size() == 2
    i = _param("replay.max_threads=tag(int, interval(64, 512))")
    assert isinstance(i, IntRangeParam) and (i.low, i.high) == (64, 512)
    f = _param("replay.x=tag(log, interval(0.001, 1))")
    assert isinstance(f, RealRangeParam) and f.log


def test_override_space_sets_replay_fields_and_refuses_other_keys():
    base = ExperimentConfiguration(grid=dim3(8), block=dim3(128))
    space = OverrideSpace(None, {"replay.block.x": _param("replay.block.x=choice(64,256)"),
                                 "replay.codegen_opt": _param("replay.codegen_opt=range(1,3)")}, base)
    cfg = space.derived({"replay.block.x": 64, "replay.codegen_opt": 2})
    assert cfg.block.x == 64 and cfg.codegen_opt == 2 and cfg.grid.x == 8
    assert space.size() == 4
    with pytest.raises(ConfigurationError, match="no field"):
        OverrideSpace(None, {"replay.blok": _param("replay.blok=choice(1,2)")}, base).derived({"replay.blok": 1})
