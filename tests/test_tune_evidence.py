"""A trial that kills the CUDA context is evidence: its block shape (or, at the recorded shape, its compile
settings) is never proposed again in the study."""

from __future__ import annotations

import json
from pathlib import Path

from mneme.config import ExperimentConfiguration, dim3
from mneme.tune import study as st
from mneme.tune.options import EXIT_OK, TuneOptions
from mneme.tune.space import code_key, kills_context
from mneme.tune.tuner import Tuner

from test_tune_support import backend, write_record


def test_which_failures_count_as_evidence():
    assert kills_context("runtime_error", "CUDA_ERROR_ILLEGAL_ADDRESS: ... (sticky)")
    assert kills_context("runtime_error", "GPU worker 0 died (signal SIGSEGV) during run of configuration ab")
    assert kills_context("timeout", "")
    assert not kills_context("runtime_error", "abandoned: process x stopped")
    assert not kills_context("failed_verification", "CUDA_ERROR_ILLEGAL_ADDRESS")
    a = ExperimentConfiguration(grid=dim3(2), block=dim3(128), codegen_opt=2)
    b = ExperimentConfiguration(grid=dim3(4), block=dim3(64), codegen_opt=2)
    assert code_key(a) == code_key(b) != code_key(ExperimentConfiguration(block=dim3(128), codegen_opt=3))


def test_context_killers_are_not_proposed_again(tmp_path):
    record = write_record(tmp_path / "rec")  # grid 256, block 128
    out = tmp_path / "out"
    o = TuneOptions(record_db=str(record), space="quick", sampler="exhaustive", trials=8, devices=[0],
                    compile_jobs=1, backend=backend("ContextKillingBackend"), output=str(out), track=False,
                    progress=False, iterations=2, warmup=0, timeout=5.0, max_inflight=1)
    outcome = Tuner(o).run()
    assert outcome.exit_code == EXIT_OK, outcome.message
    summary = json.loads((out / "summary.json").read_text())
    assert "64x1x1" in summary["banned_shapes"]
    trials = st.load_study(st.open_storage(st.storage_url(None, str(out))), outcome.summary["study"]).get_trials()
    ran_64 = [t for t in trials if t.params.get("launch") == "64x1x1"
              and (t.user_attrs.get(st.T_RESULT) or {}).get("status") == "runtime_error"]
    assert len(ran_64) == 1  # the second 64-thread configuration (other pipeline) was refused, not run
    assert summary["trials"]["by_status"].get("runtime_error") == 1


def test_code_bans_reject_the_same_compile_settings_at_any_launch():
    from mneme.tune.presets import preset_space
    from mneme.tune.space import SpaceContext

    base = ExperimentConfiguration(grid=dim3(256), block=dim3(128))
    space = preset_space("standard", SpaceContext(base))
    params, _ = space.draw_random(__import__("random").Random(1))
    cfg, reasons = space.check(params)
    assert not reasons
    space.ban_code(cfg)
    assert any("killed the CUDA context" in r for r in space.check(params)[1])
    other = dict(params, passes="default<O1>" if params["passes"] != "default<O1>" else "default<O2>")
    assert not space.check(other)[1]
