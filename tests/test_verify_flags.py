"""The verification settings have one source of truth (MeasurementSettings) and reach it the same way
from `mneme replay`, `mneme tune` and the Hydra config (measure.*)."""

import argparse
from dataclasses import fields

from hydra import compose, initialize_config_dir

from hydra_plugins.mneme_plugins.experiments import CONF_DIR
from mneme.config import MeasurementSettings
from mneme.replay import cli as replay_cli
from mneme.track import schema
from mneme.tune import cli as tune_cli

ARGV = ["--verify-runs", "3", "--verify-margin", "0.5", "--float-rtol", "1e-6"]


def test_every_verify_flag_is_a_measurement_field():
    names = {f.name for f in fields(MeasurementSettings)}
    assert [name for _, name, _, _ in replay_cli.VERIFY_FLAGS] == ["verify_runs", "verify_margin", "float_rtol"]
    assert all(name in names for _, name, _, _ in replay_cli.VERIFY_FLAGS)
    d = MeasurementSettings()
    assert (d.verify_runs, d.verify_margin, d.float_rtol) == (0, 3.0, None)


def test_mneme_replay_flags_set_the_settings():
    p = argparse.ArgumentParser()
    replay_cli.add_arguments(p)
    s = replay_cli.settings_from_args(p.parse_args(["-rdb", "r.json", *ARGV]))
    assert (s.verify_runs, s.verify_margin, s.float_rtol) == (3, 0.5, 1e-6)
    s = replay_cli.settings_from_args(p.parse_args(["-rdb", "r.json"]))
    assert (s.verify_runs, s.verify_margin, s.float_rtol) == (0, 3.0, None)


def test_mneme_tune_flags_reach_the_trials_settings():
    p = argparse.ArgumentParser()
    tune_cli.add_arguments(p)
    opts = tune_cli.options_from_args(p.parse_args(["-rdb", "r.json", *ARGV]))
    s = opts.settings()
    assert (s.verify_runs, s.verify_margin, s.float_rtol) == (3, 0.5, 1e-6)
    assert tune_cli.options_from_args(p.parse_args(["-rdb", "r.json"])).settings().verify_runs == 0


def test_the_hydra_config_sets_the_same_fields():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=launch_search", "record.db=r.json", "measure.verify_runs=2",
                                           "measure.float_rtol=1e-5"])
    s = schema.settings(cfg.measure)
    assert (s.verify_runs, s.verify_margin, s.float_rtol) == (2, 3.0, 1e-5)
    t = schema.tune_options(cfg).settings()
    assert (t.verify_runs, t.verify_margin, t.float_rtol) == (2, 3.0, 1e-5)


def test_each_trial_logs_the_verification_error():
    from mneme.config import ExperimentResult
    from mneme.track import records

    r = ExperimentResult(executed=True, verified=True, status="verified", exec_time=[100], max_abs_err=2.5e-7,
                         max_rel_err=1.5e-8, verification="verified (1 buffers; ...)")
    m = {k: v for k, v, _ in records.result_metrics(r)}
    assert m["verify_max_abs_err"] == 2.5e-7 and m["verify_max_rel_err"] == 1.5e-8
    assert ExperimentResult.from_dict(r.to_dict()).verification.startswith("verified")
