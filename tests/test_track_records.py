"""What one experiment becomes in MLflow (pure functions, no store)."""

import json

import yaml
from irutil import bc_dir, build  # noqa: F401  (fixtures)

from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings, dim3
from mneme.track import records
from mneme.track.plots import pareto_front
from mneme.track.summary import canonical, unflatten


def _result(**kw):
    base = dict(exec_time=[100, 120, 110, 90], executed=True, verified=True, status="verified",
                reg_usage=32, local_mem_usage=8, obj_size=4096, opt_time=0.01, codegen_time=0.02)
    base.update(kw)
    return ExperimentResult(**base)


def test_params_flatten_configuration_and_settings():
    cfg = ExperimentConfiguration(grid=dim3(8, 2), block=dim3(128), passes="default<O2>")
    p = records.config_params(cfg, MeasurementSettings(iterations=7))
    assert p["replay.grid.x"] == "8" and p["replay.grid.y"] == "2" and p["replay.block.x"] == "128"
    assert p["replay.passes"] == "default<O2>"
    assert p["measure.iterations"] == "7" and p["measure.atol"] == "None"
    assert all(isinstance(v, str) for v in p.values())


def test_long_values_are_cut_to_mlflow_limits():
    cfg = ExperimentConfiguration(passes="instcombine," * 1000)
    p = records.config_params(cfg)
    assert len(p["replay.passes"]) == records.MAX_PARAM_LEN and p["replay.passes"].endswith("[truncated]")


def test_metrics_have_time_statistics_and_one_step_per_iteration():
    m = records.result_metrics(_result(), baseline_ns=210.0)
    steps = [(v, s) for k, v, s in m if k == "exec_time_ns"]
    assert steps == [(100.0, 0), (120.0, 1), (110.0, 2), (90.0, 3)]
    single = {k: v for k, v, s in m if k != "exec_time_ns"}
    assert single["exec_time_median_ns"] == 105.0
    assert single["exec_time_min_ns"] == 90.0
    assert single["exec_time_mean_ns"] == 105.0
    assert abs(single["exec_time_std_ns"] - 11.1803) < 1e-3
    assert single["speedup"] == 2.0
    assert single["registers"] == 32 and single["local_mem_bytes"] == 8 and single["obj_size_bytes"] == 4096
    assert abs(single["compile_time_s"] - 0.03) < 1e-12
    assert single["verified"] == 1.0


def test_unverified_runs_get_no_speedup_and_fail():
    r = _result(verified=False, status="failed_verification", error="out[3] differs")
    keys = {k for k, _, _ in records.result_metrics(r, baseline_ns=210.0)}
    assert "speedup" not in keys and "verified" in keys
    assert records.run_status(r) == records.FAILED


def test_compile_only_result_has_compile_metrics_and_no_verification():
    r = ExperimentResult(reg_usage=20, obj_size=1000, cubin_time=0.05, status="", executed=False)
    keys = {k for k, _, _ in records.result_metrics(r)}
    assert {"registers", "local_mem_bytes", "obj_size_bytes", "cubin_time_s", "compile_time_s"} <= keys
    assert "verified" not in keys and "exec_time_median_ns" not in keys
    assert records.run_status(r) == records.FINISHED


def test_experiment_record_carries_identity_error_and_reproducible_files():
    cfg = ExperimentConfiguration(block=dim3(64))
    r = _result(failed=True, error="ptxas: too many resources", status="compile_error", executed=False)
    rec = records.experiment_record(
        "trial-3", cfg, MeasurementSettings(), r, kernel="vecadd", static_hash="s1", dynamic_hash="d1",
        artifacts={"kernel.ptx": "// ptx", "kernel.cubin": b"\x7fELF"}, tags={"mneme.trial": 3},
    )
    assert rec.status == records.FAILED
    t = rec.tags
    assert t["mneme.config_hash"] == cfg.hash() and t["mneme.kernel"] == "vecadd"
    assert t["mneme.static_hash"] == "s1" and t["mneme.dynamic_hash"] == "d1"
    assert t["mneme.error"] == "ptxas: too many resources" and t["mneme.status"] == "compile_error"
    assert t["mneme.trial"] == "3" and t["mneme.version"] and t["mneme.git_commit"]
    assert {"mneme.gpu", "mneme.driver"} <= set(t)
    assert set(rec.artifacts) == {"kernel.ptx", "kernel.cubin", "config.yaml", "result.json"}
    replay = yaml.safe_load(rec.artifacts["config.yaml"])["replay"]
    assert ExperimentConfiguration.from_dict(replay).hash() == cfg.hash()
    assert json.loads(rec.artifacts["result.json"])["result"]["error"] == "ptxas: too many resources"
    # the YAML is cached by content: the same configuration gives the same text, another one its own
    again = records.experiment_record("trial-4", ExperimentConfiguration(block=dim3(64)), MeasurementSettings(), r)
    other = records.experiment_record("trial-5", ExperimentConfiguration(block=dim3(128)), MeasurementSettings(), r)
    assert again.artifacts["config.yaml"] == rec.artifacts["config.yaml"] != other.artifacts["config.yaml"]
    assert yaml.safe_load(other.artifacts["config.yaml"])["replay"]["block"]["x"] == 128
    assert list(yaml.safe_load(rec.artifacts["config.yaml"])["replay"]) == list(cfg.to_dict())  # field order kept
    # result.json: one top-level key per line, read back whole
    lines = rec.artifacts["result.json"].splitlines()
    assert lines[0] == "{" and lines[-1] == "}" and [ln.split('"')[1] for ln in lines[1:-1]] == \
        ["configuration", "settings", "result", "speedup", "kernel", "static_hash", "dynamic_hash"]
    assert json.loads(rec.artifacts["result.json"])["configuration"] == cfg.to_dict()


def test_best_config_round_trips_from_params():
    cfg = ExperimentConfiguration(grid=dim3(3), block=dim3(32, 2), set_launch_bounds=True, max_threads=64)
    params = records.config_params(cfg, MeasurementSettings())
    back = canonical(unflatten(params, "replay"))
    assert ExperimentConfiguration.from_dict(back).hash() == cfg.hash()
    assert list(back) == list(cfg.to_dict())  # the dataclass's field order
    assert unflatten(params, "measure")["atol"] is None


def test_pareto_front_keeps_only_undominated_points():
    pts = [(32, 100.0), (24, 120.0), (40, 90.0), (32, 130.0), (24, 125.0), (64, 95.0)]
    assert sorted(pareto_front(pts)) == [0, 1, 2]


def test_latest_metric_is_mlflows_largest_step_then_largest_value_nan_as_zero():
    from mneme.track.records import latest

    ms = [("t", 5.0, 0), ("t", 3.0, 1), ("t", 2.0, 1), ("r", float("nan"), 0), ("r", -1.0, 0), ("s", float("nan"), 2)]
    got = latest(ms, lambda m: (m[0], m[2], m[1]))
    assert got["t"] == ("t", 3.0, 1)  # step 1 beats step 0's larger value; then the larger value
    assert got["r"][1] != got["r"][1]  # NaN ranks as 0, above -1
    assert set(got) == {"t", "r", "s"}


def test_kernel_files_come_from_the_compile_cache_and_a_late_entry_is_found(build, tmp_path):
    """A trial names its kernel by code hash; the writer reads the .ll, .ptx and .cubin from the tuner's compile
    cache (real clang and llvmlite here), keeps recent ones, and never remembers an entry that was missing."""
    from mneme.ir import CompileCache, compile_kernel, link_modules, static_hash

    saxpy = "_Z5saxpyfPKfPfii"
    mod = link_modules([build("params.cu")], saxpy)
    cfg = ExperimentConfiguration(grid=dim3(4), block=dim3(128))
    ck = compile_kernel(mod, saxpy, cfg, "sm_90", static_hash(mod, saxpy), cache=False, keep_ll=True)
    result = ExperimentResult(exec_time=[1.0] * 3, executed=True, verified=True, status="verified", code_hash=ck.code_hash)
    cache_dir = tmp_path / "cache"
    before = records.experiment_record("t0", cfg, None, result, compile_cache=str(cache_dir))
    assert set(before.artifacts) == {"config.yaml", "result.json"}  # not compiled yet: no kernel files
    CompileCache(cache_dir).put(ck)
    for name in ("t1", "t2"):
        rec = records.experiment_record(name, cfg, None, result, compile_cache=str(cache_dir))
        assert rec.artifacts["kernel.ptx"] == ck.ptx and rec.artifacts["kernel.ll"] == ck.ll
        assert rec.artifacts["kernel.cubin"] == ck.cubin.cubin


def test_a_repeated_experiment_reuses_its_content_but_keeps_its_own_name_and_tags():
    """A re-suggested configuration answered with the first result: the second run is built from the first one's
    content (the writer's cost per such run), with its own name, role and trial tags; other inputs build anew."""
    records._CONTENT.clear()  # the cache is per process: other tests' runs must not fill or evict it here
    cfg, res = ExperimentConfiguration(block=dim3(96)), _result(exec_time=[900, 905, 910])
    first = records.experiment_record("trial-1", cfg, MeasurementSettings(), res, baseline_ns=1000.0, tags={"mneme.trial": 1})
    kept = len(records._CONTENT)
    again = records.experiment_record("trial-2", ExperimentConfiguration(block=dim3(96)), MeasurementSettings(),
                                      ExperimentResult.from_dict(res.to_dict()), baseline_ns=1000.0, role="dup",
                                      tags={"mneme.trial": 2, "mneme.duplicate_of": 1})
    assert len(records._CONTENT) == kept  # found, not added
    assert again.name == "trial-2" and again.tags["mneme.trial"] == "2" and again.tags["mneme.role"] == "dup"
    assert first.tags["mneme.trial"] == "1" and "mneme.duplicate_of" not in first.tags
    assert again.params == first.params and again.metrics == first.metrics and again.artifacts == first.artifacts
    again.params["replay.block.x"] = "changed"
    again.metrics.append(("x", 1.0, 0))
    assert first.params["replay.block.x"] == "96" and ("x", 1.0, 0) not in first.metrics  # copies, not shared
    other = records.experiment_record("trial-3", cfg, MeasurementSettings(), res, baseline_ns=2000.0)
    assert len(records._CONTENT) == kept + 1
    assert dict((k, v) for k, v, _ in other.metrics)["speedup"] != dict((k, v) for k, v, _ in first.metrics)["speedup"]
