"""Where the gain comes from: the best configuration measured without each knob it changed."""

from __future__ import annotations

import json

import pytest

from mneme.config import ExperimentConfiguration, ExperimentResult, dim3
from mneme.tune.attribution import attribute, differing, without
from mneme.tune.options import EXIT_OK, TuneOptions
from mneme.tune.tuner import Tuner

from test_tune_support import backend, synthetic_time, write_record


def timed(config: ExperimentConfiguration) -> ExperimentResult:
    t = synthetic_time(config) * (0.8 if config.unroll == 4 else 1.0)
    return ExperimentResult(status="verified", verified=True, exec_time=[int(t)] * 3)


def test_removing_each_knob_finds_the_one_that_carries_the_gain():
    base = ExperimentConfiguration(grid=dim3(64), block=dim3(128))
    best = ExperimentConfiguration(grid=dim3(32), block=dim3(256), unroll=4, dlcm="cg", set_launch_bounds=True,
                                   max_threads=256, min_blocks_per_sm=2)
    assert differing(best, base) == ["launch", "launch_bounds", "unroll", "dlcm"]
    no_launch = without(best, base, "launch")
    assert no_launch.block == dim3(128) and no_launch.grid == dim3(64) and no_launch.unroll == 4
    assert without(best, base, "launch_bounds").set_launch_bounds is False
    best_ns = timed(best).exec_time[0]
    att = attribute(timed, best, best_ns, base, timed(base).exec_time[0], lambda r: float(r.exec_time[0]))
    gains = {r["knob"]: r["gain"] for r in att["groups"]}
    assert att["gain_from"] == "unroll" and gains["unroll"] == pytest.approx(1 / 0.8, rel=1e-3)
    assert gains["launch"] == pytest.approx(1150 / 1000, rel=1e-2)
    assert gains["dlcm"] == pytest.approx(1.0) and gains["launch_bounds"] == pytest.approx(1.0)


def test_the_tuner_writes_the_attribution_into_the_summary(tmp_path):
    record = write_record(tmp_path / "rec")  # block 128; the synthetic optimum is 256 threads
    out = tmp_path / "out"
    o = TuneOptions(record_db=str(record), space="launch", sampler="exhaustive", trials=7, devices=[0], compile_jobs=1,
                    backend=backend("SyntheticBackend"), output=str(out), track=False, progress=False, iterations=3,
                    warmup=0, timeout=5.0)
    outcome = Tuner(o).run()
    assert outcome.exit_code == EXIT_OK, outcome.message
    summary = json.loads((out / "summary.json").read_text())
    att = summary["attribution"]
    assert att["gain_from"] == "launch" and [r["knob"] for r in att["groups"]] == ["launch"]
    assert att["groups"][0]["gain"] == pytest.approx(summary["best"]["speedup"], rel=0.01)
    assert "gain from launch" in (out / "summary.txt").read_text()
    assert summary["trials"]["verified_fraction"] == pytest.approx(5 / 7)
