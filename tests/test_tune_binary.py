"""Configurations whose machine code and launch are identical are timed once; the copies say whose run they
reuse (real worker processes, a backend whose O2 and O3 compile to the same binary)."""

from __future__ import annotations

from mneme.config import ExperimentConfiguration, MeasurementSettings, dim3
from mneme.tune.executor import AsyncReplayExecutor

from test_tune_support import backend


def test_identical_binaries_at_the_same_launch_run_once(tmp_path, monkeypatch):
    log = tmp_path / "runs.log"
    monkeypatch.setenv("MNEME_TEST_RUN_LOG", str(log))
    ex = AsyncReplayExecutor(str(tmp_path / "rec.json"), "dyn", devices=[0], compile_jobs=1,
                             settings=MeasurementSettings(iterations=3, warmup=0, timeout=5.0),
                             log_dir=str(tmp_path / "logs"), backend=backend("BinaryBackend"))

    def cfg(passes, bx=128):
        return ExperimentConfiguration(grid=dim3(8192 // bx), block=dim3(bx), passes=passes)

    try:
        o3 = ex.evaluate(cfg("default<O3>"))
        futs = [ex.submit(c) for c in (cfg("default<O2>"), cfg("default<O1>"), cfg("default<O2>", 256))]
        o2, o1, o2_256 = [f.result(timeout=60) for f in futs]
        st = ex.stats()
    finally:
        ex.shutdown()
    runs = [line for line in log.read_text().splitlines() if line.startswith("default")]
    assert sorted(runs) == sorted(["default<O3> 128", "default<O1> 128", "default<O2> 256"])
    assert o2.same_binary_as == cfg("default<O3>").hash() and o2.config_hash == cfg("default<O2>").hash()
    assert o2.exec_time == o3.exec_time and o2.status == o3.status == "verified"
    assert not o1.same_binary_as and not o2_256.same_binary_as and not o3.same_binary_as
    assert st["same_binary"] == 1


def test_code_change_against_the_baseline():
    from mneme.config import ExperimentResult
    from mneme.tune.codechange import code_change, code_change_text

    base = ExperimentResult(reg_usage=32, ptx_instructions=420, obj_size=9000, binary_digest="a")
    trial = ExperimentResult(reg_usage=26, ptx_instructions=537, obj_size=9000, spill_stores=8, binary_digest="b")
    ch = code_change(base, trial)
    assert ch["registers"] == [32, 26] and ch["ptx_instructions"] == [420, 537] and not ch["same_code"]
    text = code_change_text(ch)
    assert "registers 32->26" in text and "PTX instructions 420->537" in text and "spills (st/ld bytes) 0/0->8/0" in text
    same = code_change(base, ExperimentResult(reg_usage=32, obj_size=9000, binary_digest="a", same_binary_as="h"))
    assert same["same_code"] and same["same_binary_as"] == "h" and code_change_text(same) == "the baseline's machine code"
    assert code_change(base, ExperimentResult(status="invalid_config")) is None
