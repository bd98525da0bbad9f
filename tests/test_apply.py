"""mneme apply without a GPU: the wisdom file, export from a real MLflow store, the launch rules (Python and
libapply's C agree), cubin preparation with the real toolchain, libapply's build and its start in a process."""

import ctypes
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mneme.apply.manifest import (
    param_offsets, scaled_grid, scaled_refusal, unmasked_segments, write_manifest,
)
from mneme.apply.prepare import load_tuned, prepare
from mneme.apply.runner import ApplyRunner, parse_stats
from mneme.apply.wisdom import WISDOM_VERSION, read_wisdom, wisdom_schema, write_wisdom
from mneme.config import ExperimentConfiguration, dim3
from mneme.record.db import RecordedExecution
from mneme.errors import ConfigurationError
from mnemetest import FIXTURES, ROOT, run_mneme

VECADD = next((FIXTURES / "vecadd").glob("[0-9a-f]*.json"))
STENCIL = next((FIXTURES / "stencil2d").glob("[0-9a-f]*.json"))
NATIVE = ROOT / "native" / "apply"


def tune(db: Path, out: Path, *extra: str, trials: int = 4) -> Path:
    run_mneme("tune", "-rdb", db, "--space", "quick", "--devices", "none", "--objective", "registers", "--trials",
              trials, "-o", out, "--quiet", "--seed", "1", *extra)
    return out


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    return tune(VECADD, tmp_path_factory.mktemp("tune") / "vecadd", "--no-track")


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lib")
    p = subprocess.run(["make", "-s", "-C", str(NATIVE), f"OUT={out}", "all", "test-lib"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return out


# -- the wisdom file ------------------------------------------------------------------------------------
def test_tune_writes_a_wisdom_file_that_names_the_best_trial(tuned):
    w = read_wisdom(tuned / "wisdom.yaml")
    best = json.loads((tuned / "best.json").read_text())
    (k,) = w.kernels
    assert w.mneme_wisdom == WISDOM_VERSION and w.source.kind == "tune"
    assert k.kernel == "_Z6vecAddPKfS0_Pfi" and k.dynamic_hash == "e3a48e42951b7bb5"
    assert k.config == best["config"] and k.code_hash == best["result"]["code_hash"]
    assert Path(k.record.db) == VECADD.resolve() and k.rule == "exact"
    assert k.provenance.trial == best["trial"]


def test_wisdom_round_trips_yaml_and_json_with_relative_paths(tuned, tmp_path):
    w = read_wisdom(tuned / "wisdom.yaml")
    for name in ("w.yaml", "sub/w.json"):
        p = write_wisdom(w, tmp_path / name)
        raw = yaml.safe_load(p.read_text())
        assert not os.path.isabs(raw["kernels"][0]["record"]["db"])
        back = read_wisdom(p)
        assert back.kernels[0].model_dump() == w.kernels[0].model_dump()
    assert "kernels" in wisdom_schema()["properties"]


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(mneme_wisdom=99), "version 99"),
    (lambda d: d["kernels"][0]["config"]["block"].update(x=4096), "block.x=4096"),
    (lambda d: d["kernels"][0].update(rule="sometimes"), "rule"),
    (lambda d: d["kernels"][0].update(bogus=1), "bogus"),
    (lambda d: d["kernels"][0].pop("static_hash"), "static_hash"),
])
def test_invalid_wisdom_is_refused_with_the_reason(tuned, tmp_path, change, message):
    data = yaml.safe_load((tuned / "wisdom.yaml").read_text())
    change(data)
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigurationError, match=message):
        read_wisdom(p)


def test_tuned_arguments_dir_of_results_and_wisdom(tuned, tmp_path):
    parent = tuned.parent
    w = load_tuned([str(parent)])  # a directory holding tune results
    assert [k.kernel for k in w.kernels] == ["_Z6vecAddPKfS0_Pfi"]
    w2 = load_tuned([str(tuned / "wisdom.yaml"), str(tuned)], rule="scaled")
    assert len(w2.kernels) == 1 and w2.kernels[0].rule == "scaled"  # same kernel and instance: merged
    with pytest.raises(ConfigurationError, match="no mneme tune results"):
        load_tuned([str(tmp_path)])


# -- mneme export from a real MLflow store ------------------------------------------------------------------
def test_export_takes_the_best_run_of_a_tracked_compile_only_sweep(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    run_mneme("tune", "-rdb", VECADD, "--space", "quick", "--devices", "none", "--objective", "registers", "--trials", 4,
              "-o", tmp_path / "t", "--quiet", "--seed", "1", env=env)
    run_mneme("export", "--tracking-uri", uri, "-o", tmp_path / "w" / "wisdom.yaml")
    w = read_wisdom(tmp_path / "w" / "wisdom.yaml")
    (k,) = w.kernels
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(k.provenance.mlflow_run_id)
    assert run.data.tags["mneme.role"] == "trial" and run.data.tags["mneme.status"] == "compiled"
    assert run.data.tags["mlflow.parentRunId"] == k.provenance.sweep_run_id
    assert k.kernel == "_Z6vecAddPKfS0_Pfi" and k.code_hash == run.data.tags["mneme.code_hash"]
    # the lowest register count of all compiled trials
    trials = client.search_runs([run.info.experiment_id], "tags.`mneme.role` = 'trial'")
    assert run.data.metrics["registers"] == min(t.data.metrics["registers"] for t in trials)
    assert k.config["block"]["x"] == int(run.data.params["replay.block.x"])
    if k.cubin:
        assert Path(k.cubin).read_bytes()[:4] == b"\x7fELF"
    # export -> apply's preparation
    entries, notes = prepare(w, tmp_path / "work")
    assert entries and entries[0].kernel == k.kernel, notes


# -- rules ------------------------------------------------------------------------------------------------
def test_scaled_is_refused_where_the_configuration_does_not_allow_it():
    g, b = dim3(64, 1, 1), dim3(256, 1, 1)
    ok = ExperimentConfiguration(grid=dim3(128, 1, 1), block=dim3(128, 1, 1))
    assert scaled_refusal(ok, g, b) is None
    assert "specialize_dims" in scaled_refusal(ExperimentConfiguration(grid=g, block=b, specialize_dims=True), g, b)
    assert "covers" in scaled_refusal(ExperimentConfiguration(grid=dim3(7, 1, 1), block=dim3(128, 1, 1)), g, b)


def test_grid_is_recomputed_from_the_launchs_work():
    assert scaled_grid([100, 1, 1], dim3(256, 1, 1), dim3(128, 1, 1), True).to_dict() == {"x": 200, "y": 1, "z": 1}
    assert scaled_grid([3, 1, 1], dim3(100, 1, 1), dim3(128, 1, 1), True).x == 3  # ceil(300 / 128)
    assert scaled_grid([3, 1, 1], dim3(100, 1, 1), dim3(128, 1, 1), False) is None  # conservative: exact cuts only


def test_param_layout_and_unmasked_bytes():
    assert param_offsets([8, 4, 8, 2], [8, 4, 8, 2]) == [0, 8, 16, 24]
    assert param_offsets([1, 8], [1, 8]) == [0, 8]
    assert unmasked_segments(bytes(range(8)), 16, [(0, 20)]) == [(4, bytes([4, 5, 6, 7]))]
    assert unmasked_segments(b"abcd", 0, []) == [(0, b"abcd")]


def _c_match(lib, text, grid, block, shared, buf, index=0):
    out = (ctypes.c_uint32 * 3)()
    err = ctypes.create_string_buffer(512)
    g, b = (ctypes.c_uint32 * 3)(*grid), (ctypes.c_uint32 * 3)(*block)
    r = lib.mna_test_match(text.encode(), ctypes.c_size_t(index), g, b, ctypes.c_uint32(shared), buf,
                           ctypes.c_size_t(len(buf)), out, err, ctypes.c_size_t(512))
    assert r != -2, err.value.decode()
    return r, tuple(out)


@pytest.mark.parametrize("rule", ["exact", "scaled"])
def test_libapply_decides_as_the_python_rules_say(tuned, libs, tmp_path, rule):
    lib = ctypes.CDLL(str(libs / "libmnapply_test.so"))
    entries, _ = prepare(load_tuned([str(tuned)], rule=rule), tmp_path)
    (e,) = entries
    text = write_manifest(entries, tmp_path / "m.txt").read_text()
    rec = bytes.fromhex("".join(RecordedExecution.from_json(str(VECADD)).instance().args))
    rng = random.Random(5)
    for _ in range(40):
        buf = bytearray(rec)
        buf[0:24] = rng.randbytes(24)  # pointers: never compared
        grid = [rng.choice([64, 64, 1, 1000, 70000]), 1, 1]
        block = [rng.choice([256, 256, 128]), 1, 1]
        n_changed = rng.random() < 0.3
        if n_changed:
            buf[24:28] = rng.randbytes(4)
        r, out = _c_match(lib, text, grid, block, 0, bytes(buf))
        if rule == "exact":
            want = grid == [64, 1, 1] and block == [256, 1, 1] and bytes(buf[24:28]) == rec[24:28]
            assert r == int(want)
            if want:
                assert out == tuple(e.tuned.grid)
        else:
            want_g = scaled_grid(grid, e.rec_block, e.tuned.block, e.round_up) if block == [256, 1, 1] else None
            assert r == int(want_g is not None)
            if want_g is not None:
                assert out == tuple(want_g)
    # shared memory differs: never
    assert _c_match(lib, text, [64, 1, 1], [256, 1, 1], 16, rec)[0] == 0


def test_libapply_refuses_a_broken_manifest(libs):
    lib = ctypes.CDLL(str(libs / "libmnapply_test.so"))
    err = ctypes.create_string_buffer(512)
    z = (ctypes.c_uint32 * 3)()
    for text, msg in (("nonsense\n", "not a version-1"), ("mneme-apply-manifest 1\nentry 0 k\ncubin /x\n", "no 'end'"),
                      ("mneme-apply-manifest 1\nentry 0 k\nmatch 0 0 zz\nend\n", "not hex")):
        assert lib.mna_test_match(text.encode(), 0, z, z, 0, b"", 0, z, err, 512) == -2
        assert msg in err.value.decode()


# -- cubins and variables ----------------------------------------------------------------------------------
def test_prepare_rebuilds_the_cubin_from_the_recorded_ir_with_variables(tmp_path):
    out = tune(STENCIL, tmp_path / "t", "--no-track")
    w = load_tuned([str(out)])
    w.kernels[0].provenance.compile_cache = None  # not from the tune's cache: rebuilt through mneme/ir
    entries, notes = prepare(w, tmp_path / "work")
    (e,) = entries
    assert Path(e.cubin).read_bytes()[:4] == b"\x7fELF"
    assert not [n for n in notes[e.kernel] if "differs" in n], notes  # the same code hash as the tune's
    names = {v.name: v.readonly for v in e.variables}
    assert names.get("c_weights") is True and names.get("g_boundary") is False
    text = write_manifest(entries, tmp_path / "m.txt").read_text()
    assert "var 20 1 c_weights" in text and f"cubin {e.cubin}" in text


# -- libapply in a process -----------------------------------------------------------------------------------
def test_libapply_builds_with_werror_and_exports_only_the_hooks(libs):
    p = subprocess.run(["nm", "-D", "--defined-only", str(libs / "libapply.so")], capture_output=True, text=True)
    exported = {line.split()[-1] for line in p.stdout.splitlines() if " T " in line}
    # native/interpose's hooks and the launch entry points for apps linked with -lcuda, nothing else
    assert exported == {"dlsym", "dlopen", "cuGetProcAddress", "cuGetProcAddress_v2", "cuLaunchKernel", "cuLaunchKernelEx",
                        "cuLaunchCooperativeKernel"}
    assert "-Werror" in (NATIVE / "Makefile").read_text()


def test_libapply_starts_in_a_process_reads_the_manifest_and_writes_stats(tuned, libs, tmp_path):
    entries, _ = prepare(load_tuned([str(tuned)]), tmp_path)
    m = write_manifest(entries, tmp_path / "m.txt")
    stats = tmp_path / "s.txt"
    env = {**os.environ, "LD_PRELOAD": str(libs / "libapply.so"), "MNEME_APPLY_MANIFEST": str(m),
           "MNEME_APPLY_STATS": str(stats), "MNEME_APPLY_DUMP": "1"}
    p = subprocess.run([sys.executable, "-c", "print('app output')"], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and "app output" in p.stdout
    assert "entry 0 _Z6vecAddPKfS0_Pfi exact grid 64 1 1 block 256 1 1" in p.stderr
    st = parse_stats(stats.read_text(), "?", 0, 0.0)
    assert st.mode == "apply" and st.entries[0].matched == 0 and not st.warnings
    bad = tmp_path / "bad.txt"
    bad.write_text("mneme-apply-manifest 1\nentry 0 k\n")
    p = subprocess.run(["/bin/true"], env={**env, "MNEME_APPLY_MANIFEST": str(bad)}, capture_output=True, text=True)
    assert p.returncode == 0 and "nothing is applied" in p.stderr


def test_mneme_apply_runs_the_app_twice_and_reports(tuned, tmp_path, libs):
    env = {**os.environ, "MNEME_LIBAPPLY": str(libs / "libapply.so")}
    p = run_mneme("apply", tuned, "--workdir", tmp_path / "wd", "--quiet", "--", sys.executable, "-c",
                  "print('hello from the app')", env=env)
    assert p.stdout.count("hello from the app") == 2
    assert "apply vecAdd: exact instance e3a48e42951b7bb5" in p.stdout and "no launch matched" in p.stdout
    rep = json.loads((tmp_path / "wd" / "apply.json").read_text())
    assert rep["app_ok"] is True and rep["kernels_applied"] == 0 and rep["kernels"][0]["realized"] is None
    p = run_mneme("apply", tuned, "--workdir", tmp_path / "wd2", "--quiet", "--", sys.executable, "-c",
                  "raise SystemExit(3)", env=env, check=False)
    assert p.returncode == 3 and "app FAILED" in p.stdout


def test_runner_keeps_the_app_exit_status_when_no_stats_come(tmp_path, libs):
    r = ApplyRunner(tmp_path / "none.txt", tmp_path, [sys.executable, "-c", "import os; os._exit(4)"],
                    lib=libs / "libapply.so", quiet=True)
    st = r.run("apply")
    assert st.returncode == 4 and st.stats_missing and "no statistics" in st.warnings[0]


def test_a_run_past_the_app_timeout_is_killed_and_reported(tmp_path, libs):
    r = ApplyRunner(tmp_path / "none.txt", tmp_path, [sys.executable, "-c", "import time; time.sleep(30)"],
                    lib=libs / "libapply.so", quiet=True, timeout=1.0)
    st = r.run("observe")
    assert st.returncode == 124 and st.wall_s < 20 and "killed" in st.warnings[0]
