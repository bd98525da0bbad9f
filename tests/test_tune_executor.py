"""AsyncReplayExecutor with real worker processes: backends that really crash (os._exit, SIGSEGV) and really
hang, several devices, the compile cache, device-less compile-only results, clean shutdown."""

from __future__ import annotations

import time

import pytest

from mneme.config import ExperimentConfiguration, MeasurementSettings, dim3
from mneme.tune.executor import NO_GPU, AsyncReplayExecutor, compile_key, pinned_visible

from test_tune_support import backend

SETTINGS = MeasurementSettings(iterations=3, warmup=0, timeout=1.0)


def cfg(bx: int, **kw) -> ExperimentConfiguration:
    return ExperimentConfiguration(grid=dim3(max(1, 8192 // bx)), block=dim3(bx), **kw)


def make(tmp_path, name="SyntheticBackend", devices=(0,), compile_jobs=1, **kw) -> AsyncReplayExecutor:
    return AsyncReplayExecutor(
        str(tmp_path / "rec.json"), "dyn", devices=list(devices), compile_jobs=compile_jobs, settings=SETTINGS,
        log_dir=str(tmp_path / "logs"), backend=backend(name), **kw,
    )


def assert_all_stopped(ex: AsyncReplayExecutor) -> None:
    assert all(w.process is None or not w.process.is_alive() for w in ex._workers)
    assert not ex._thread.is_alive()


def test_crashing_and_hanging_runs_fail_alone_and_workers_come_back(tmp_path):
    ex = make(tmp_path, "CrashingBackend", run_timeout=3.0)
    try:
        futures = {bx: ex.submit(cfg(bx)) for bx in (128, 64, 256, 96, 32, 160, 512, 128)}
        results = {bx: f.result(timeout=120) for bx, f in futures.items()}
        assert results[64].status == "runtime_error" and "exit code 3" in results[64].error
        assert results[96].status == "runtime_error" and "SIGSEGV" in results[96].error
        assert results[160].status == "timeout" and "no answer within 3 s" in results[160].error
        for bx in (128, 256, 32):
            assert results[bx].status == "verified" and results[bx].exec_time, results[bx]
        assert results[512].status == "failed_verification"
        for r in results.values():
            assert r.gpu_id == 0 and r.config_hash
        after = ex.evaluate(cfg(256))  # the search goes on after all of that
        assert after.status == "verified"
        st = ex.stats()
        assert st["crashes"] == 2 and st["timeouts"] == 1 and st["respawns"] == 3
        gpu = [w for w in st["workers"] if w["role"] == "gpu"][0]
        assert gpu["starts"] == 4 and gpu["state"] in ("idle", "starting")
    finally:
        ex.shutdown()
    assert_all_stopped(ex)
    log = (tmp_path / "logs" / "gpu-0.log").read_text()
    assert log.count("starting") == 4 and "Segmentation fault" in log  # faulthandler wrote the crash down


def test_a_compiler_crash_fails_its_configurations_once(tmp_path):
    ex = make(tmp_path, "CrashingBackend")
    try:
        bad = [ex.submit(cfg(bx, codegen_opt=1)) for bx in (128, 256)]  # one compile key: compiled (crashed) once
        good = ex.submit(cfg(128, codegen_opt=2))
        rs = [f.result(timeout=60) for f in bad]
        assert all(r.status == "compile_error" and "SIGSEGV" in r.error and r.gpu_id == NO_GPU for r in rs)
        assert good.result(timeout=60).status == "verified"
        again = ex.evaluate(cfg(64, codegen_opt=1))
        assert again.status == "compile_error"  # answered from what the executor knows, no second crash
        assert ex.stats()["crashes"] == 1
    finally:
        ex.shutdown()
    assert_all_stopped(ex)


def test_several_gpus_each_run_one_experiment_at_a_time(tmp_path, monkeypatch):
    log = tmp_path / "runs.log"
    monkeypatch.setenv("MNEME_TEST_RUN_LOG", str(log))
    monkeypatch.setenv("MNEME_TEST_RUN_DELAY", "0.05")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ex = make(tmp_path, devices=(0, 1, 2), compile_jobs=2)
    try:
        results = [f.result(timeout=120) for f in [ex.submit(cfg(32 * (1 + i % 8))) for i in range(24)]]
    finally:
        ex.shutdown()
    assert {r.gpu_id for r in results} == {0, 1, 2}  # every GPU was used, and each result names its GPU
    for r in results:
        assert f"CUDA_VISIBLE_DEVICES={r.gpu_id}" in r.gpu_name  # the worker saw only its own GPU
    runs = {}
    for line in log.read_text().splitlines():
        dev, pid, start, end = line.split()
        runs.setdefault(dev, []).append((float(start), float(end)))
    assert sorted(runs) == ["0", "1", "2"] and sum(map(len, runs.values())) == 24
    for spans in runs.values():  # never two timed runs on one GPU at once
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    assert_all_stopped(ex)


def test_identical_code_is_compiled_once(tmp_path):
    ex = make(tmp_path, compile_jobs=2)
    try:
        launch_only = [ex.submit(cfg(bx)) for bx in (32, 64, 128, 256, 512, 32)]
        dims = [ex.submit(cfg(bx, specialize_dims=True)) for bx in (32, 64, 32)]
        rs = [f.result(timeout=60) for f in launch_only + dims]
        st = ex.stats()
    finally:
        ex.shutdown()
    assert st["compiles"] == 1 + 2  # one for the launch-only variants, one per distinct specialized geometry
    assert st["memo_hits"] == 5 + 1
    assert [r.cache_hit for r in rs[:6]] == [False] + [True] * 5
    assert st["cache_hit_rate"] == pytest.approx(6 / 9)
    assert compile_key(cfg(32), "sm_90") == compile_key(cfg(1024), "sm_90")
    assert compile_key(cfg(32, specialize_dims=True), "sm_90") != compile_key(cfg(64, specialize_dims=True), "sm_90")
    assert compile_key(cfg(32), "sm_90") != compile_key(cfg(32), "sm_80")


def test_invalid_configurations_never_reach_a_worker(tmp_path):
    ex = make(tmp_path)
    try:
        r = ex.evaluate(ExperimentConfiguration(block=dim3(2048)))
        lb = ex.evaluate(cfg(256, set_launch_bounds=True, max_threads=128))
        st = ex.stats()
    finally:
        ex.shutdown()
    assert r.status == "invalid_config" and "2048" in r.error and r.gpu_id == NO_GPU
    assert lb.status == "invalid_config" and "max_threads=128" in lb.error
    assert st.get("compiles", 0) == 0


def test_a_device_that_cannot_open_fails_its_jobs_with_the_reason(tmp_path):
    ex = make(tmp_path, "BrokenDeviceBackend")
    try:
        r = ex.evaluate(cfg(128))
        errors = ex.worker_errors()
    finally:
        ex.shutdown()
    assert r.status == "runtime_error" and "CUDA_ERROR_NO_DEVICE" in r.error
    assert errors and "GPU worker 0" in errors[0]
    assert_all_stopped(ex)


def test_a_worker_that_crashes_while_starting_is_given_up_after_three_tries(tmp_path):
    ex = make(tmp_path, "SetupCrashBackend")
    try:
        r = ex.evaluate(cfg(128))
    finally:
        ex.shutdown()
    assert r.status == "runtime_error" and "crashed while starting" in r.error and "3 times" in r.error


def test_a_crash_on_one_gpu_leaves_the_other_working(tmp_path, monkeypatch):
    monkeypatch.setenv("MNEME_TEST_RUN_DELAY", "0.05")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ex = make(tmp_path, "CrashingBackend", devices=(0, 1))
    try:
        first = [f.result(timeout=120) for f in [ex.submit(cfg(bx)) for bx in (64, 128, 64, 256, 32, 64)]]
        deadline = time.monotonic() + 60
        while any(w["state"] != "idle" for w in ex.stats()["workers"]) and time.monotonic() < deadline:
            time.sleep(0.1)  # replaced workers come back
        later = [f.result(timeout=120) for f in [ex.submit(cfg(bx)) for bx in (128, 256, 32, 128, 256, 32, 128, 256)]]
        st = ex.stats()
    finally:
        ex.shutdown()
    crashed = [r for r in first if r.config_hash == cfg(64).hash()]
    assert len(crashed) == 3 and all(r.status == "runtime_error" and "died" in r.error for r in crashed)
    assert all(r.status == "verified" for r in first if r not in crashed)
    assert st["crashes"] == 3
    assert {r.gpu_id for r in later} == {0, 1} and all(r.status == "verified" for r in later)
    for r in later:  # a replaced worker is pinned to its own GPU again
        assert f"CUDA_VISIBLE_DEVICES={r.gpu_id}" in r.gpu_name


def test_device_less_mode_returns_compile_only_results(tmp_path):
    ex = make(tmp_path, devices=(), compile_jobs=2)
    try:
        rs = [f.result(timeout=60) for f in [ex.submit(cfg(bx, codegen_opt=co)) for co in (3, 2) for bx in (128, 256)]]
        st = ex.stats()
    finally:
        ex.shutdown()
    assert ex.device_less
    assert all(r.gpu_id == NO_GPU and not r.exec_time and r.reg_usage > 0 for r in rs)
    assert rs[0].reg_usage < rs[2].reg_usage  # lower codegen level, more registers (the synthetic model)
    assert [r.cache_hit for r in rs] == [False, True, False, True]
    assert st["compiles"] == 2 and not any(w["role"] == "gpu" for w in st["workers"])


def test_compile_workers_are_replaced_after_their_quota_of_jobs(tmp_path, monkeypatch):
    # llvmlite leaks a little per pass-builder run: long studies must not grow a compile worker forever
    monkeypatch.setenv("MNEME_COMPILES_PER_WORKER", "2")
    ex = make(tmp_path, devices=(), compile_jobs=1)
    try:
        rs = [ex.submit(cfg(bx, codegen_opt=co)).result(timeout=60) for co in (3, 2, 1) for bx in (128,)]
        st = ex.stats()
    finally:
        ex.shutdown()
    assert all(r.reg_usage > 0 for r in rs)
    (w,) = [w for w in st["workers"] if w["role"] != "gpu"]
    assert w["starts"] >= 2, st


def test_shutdown_with_cancel_stops_hung_work_quickly(tmp_path):
    ex = make(tmp_path, "CrashingBackend", run_timeout=600)
    hung = ex.submit(cfg(160))
    queued = ex.submit(cfg(128))
    time.sleep(1.5)
    t0 = time.monotonic()
    ex.shutdown(cancel_futures=True)
    assert time.monotonic() - t0 < 20
    assert hung.cancelled() or hung.done()
    assert queued.done()
    assert_all_stopped(ex)
    with pytest.raises(RuntimeError):
        ex.submit(cfg(128))


def test_pinning_maps_ordinals_through_an_existing_visible_list(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert pinned_visible(1) == "5"
    from mneme.errors import DeviceError

    with pytest.raises(DeviceError, match="shows 2 GPU"):
        pinned_visible(2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert pinned_visible(7) == "7"


# -- the real replay pipeline, compile only (no GPU here) ----------------------------------------------------
@pytest.fixture(scope="module")
def saxpy_db(tmp_path_factory):
    from test_tune_support import real_record

    return real_record(tmp_path_factory.mktemp("saxpy"))


def test_device_less_executor_compiles_the_real_kernel(tmp_path, saxpy_db):
    from mneme.replay.pipeline import COMPILED

    cache = tmp_path / "cubins"
    configs = [cfg(bx, codegen_opt=co) for co in (3, 0) for bx in (128, 256)]
    configs += [cfg(128, specialize=True), cfg(128, set_launch_bounds=True, max_threads=128, min_blocks_per_sm=4),
                cfg(128, passes="instcombine,sroa,simplifycfg"), cfg(128, passes="default<O3>,nosuchpass")]
    ex = AsyncReplayExecutor(str(saxpy_db), None, devices=[], compile_jobs=2, settings=SETTINGS, cache_dir=str(cache),
                             log_dir=str(tmp_path / "logs"))
    try:
        rs = [f.result(timeout=300) for f in [ex.submit(c) for c in configs]]
        st = ex.stats()
    finally:
        ex.shutdown()
    ok, bad = rs[:-1], rs[-1]
    assert all(r.status == COMPILED and r.reg_usage > 0 and r.obj_size > 0 and r.code_hash for r in ok), ok
    assert rs[0].code_hash == rs[1].code_hash and rs[1].cache_hit  # a launch change compiles to the same code
    assert rs[0].code_hash != rs[2].code_hash  # codegen level changes the code
    assert len({r.code_hash for r in ok}) == 5
    assert bad.status == "compile_error" and "nosuchpass" in bad.error
    assert st["compiles"] == 6 and st["memo_hits"] == 2

    # a second executor finds every cubin in the shared on-disk cache
    ex2 = AsyncReplayExecutor(str(saxpy_db), None, devices=[], compile_jobs=2, settings=SETTINGS, cache_dir=str(cache),
                              log_dir=str(tmp_path / "logs2"))
    try:
        again = [f.result(timeout=300) for f in [ex2.submit(c) for c in configs[:-1]]]
        st2 = ex2.stats()
    finally:
        ex2.shutdown()
    assert [r.code_hash for r in again] == [r.code_hash for r in ok]
    assert all(r.cache_hit for r in again) and st2["disk_hits"] == 5
