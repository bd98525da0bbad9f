"""libapply's launch path on the CPU, through a stand-in driver (tests/data/fakecuda: no GPU here): the app
reaches cuLaunchKernel the way cudart does (dlsym cuGetProcAddress_v2, then cuGetProcAddress), libapply swaps
the tuned kernel in where the manifest's rule matches, mirrors variables around it, falls back on a cubin
that does not load, and `mneme apply` reports what happened."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mneme.apply.manifest import Variable, write_manifest
from mneme.apply.prepare import load_tuned, prepare
from mneme.config import dim3
from mnemetest import FIXTURES, ROOT, run_mneme

VECADD = next((FIXTURES / "vecadd").glob("[0-9a-f]*.json"))
FAKE = ROOT / "tests" / "data" / "fakecuda"
CUDA_INC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
N = 16384  # the recorded n of the vecadd fixture (grid 64 x block 256)


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fake")
    flags = ["-Wall", "-Wextra", "-Werror", f"-I{CUDA_INC}"]
    (d / "plain").mkdir()
    # like the real driver (-Bsymbolic: its cuGetProcAddress hands out its own functions), and without it (its
    # references to its exports bind to libapply's cuLaunchKernel, the path of apps linked with -lcuda)
    for argv in (["cc", "-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-Bsymbolic", *flags, "-o", d / "libcuda.so.1",
                  FAKE / "fakecuda.c"],
                 ["cc", "-shared", "-fPIC", "-fvisibility=hidden", *flags, "-o", d / "plain" / "libcuda.so.1",
                  FAKE / "fakecuda.c"],
                 ["cc", *flags, "-o", d / "app", FAKE / "fakeapp.c", "-ldl"],
                 ["make", "-s", "-C", ROOT / "native" / "apply", f"OUT={d}"]):
        p = subprocess.run(list(map(str, argv)), capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
    return d


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tune") / "vecadd"
    run_mneme("tune", "-rdb", VECADD, "--space", "quick", "--devices", "none", "--objective", "registers", "--trials", 4,
              "-o", out, "--quiet", "--seed", "1", "--no-track")
    return out


def manifest(tuned, tmp_path, rule="exact", variables=(), cubin=None):
    entries, _ = prepare(load_tuned([str(tuned)], rule=rule), tmp_path / "work")
    entries[0].variables = list(variables)
    if cubin:
        entries[0].cubin = str(cubin)
    return entries[0], write_manifest(entries, tmp_path / "m.txt")


def run_app(fake, m, stats, *launches, mode="apply", driver=None, cukernel=False, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    if cukernel:
        env["FAKE_CUKERNEL"] = "1"
    env = {**env, "LD_LIBRARY_PATH": str(driver or fake), "LD_PRELOAD": str(fake / "libapply.so"),
           "MNEME_APPLY_MANIFEST": str(m), "MNEME_APPLY_STATS": str(stats), "MNEME_APPLY_MODE": mode,
           **(env_extra or {})}
    p = subprocess.run([str(fake / "app"), *map(str, launches)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "app done" in p.stdout, p.stdout + p.stderr
    return p


def launches(out: str):
    return re.findall(r"launch (0x[0-9a-f]+) grid (\d+) 1 1 block (\d+) 1 1", out)


@pytest.mark.parametrize("driver", ["symbolic", "plain"])
def test_the_exact_instance_gets_the_tuned_kernel_and_others_the_original(fake, tuned, tmp_path, driver):
    e, m = manifest(tuned, tmp_path)
    p = run_app(fake, m, tmp_path / "s.txt", 64, 256, N, 64, 256, N + 1, 10, 256, N,
                driver=fake / "plain" if driver == "plain" else fake)
    tg, tb = e.tuned.grid.x, e.tuned.block.x
    assert launches(p.stdout) == [("0x2000", str(tg), str(tb)), ("0x1000", "64", "256"), ("0x1000", "10", "256")]
    stats = (tmp_path / "s.txt").read_text()
    assert "entry 0 matched 1 applied 1 fell_back 0" in stats and "unmatched 2" in stats
    assert "hold until 1" in p.stdout  # the timed launch waited behind the host flag


def test_observe_mode_times_the_original_and_swaps_nothing(fake, tuned, tmp_path):
    e, m = manifest(tuned, tmp_path)
    p = run_app(fake, m, tmp_path / "s.txt", 64, 256, N, mode="observe")
    assert launches(p.stdout) == [("0x1000", "64", "256")]
    assert re.search(r"entry 0 matched 1 applied 0 .* timed 1 total_ns 4000", (tmp_path / "s.txt").read_text())


@pytest.mark.parametrize("mode", ["observe", "apply"])
def test_the_hold_flag_only_grows_across_timed_launches(fake, tuned, tmp_path, mode):
    # a flag reset for the next hold re-blocks a wait the GPU has not reached yet: the app hung on the H200
    e, m = manifest(tuned, tmp_path)
    p = run_app(fake, m, tmp_path / "s.txt", *([64, 256, N] * 5), mode=mode)
    assert [int(v) for v in re.findall(r"hold until (\d+)", p.stdout)] == [1, 2, 3, 4, 5]
    assert "went down" not in p.stdout


@pytest.mark.parametrize("mode", ["observe", "apply"])
@pytest.mark.parametrize("cukernel", [False, True], ids=["CUfunction", "CUkernel"])
def test_functions_are_loaded_before_their_first_held_launch(fake, tuned, tmp_path, mode, cukernel):
    # lazy loading: a launch that loads its function may wait for the context's streams, one of which the hold
    # blocks until the launch call returns (the vecadd apply run that hung on the H200)
    e, m = manifest(tuned, tmp_path)
    p = run_app(fake, m, tmp_path / "s.txt", 64, 256, N, 64, 256, N, mode=mode, cukernel=cukernel,
                env_extra={"FAKE_LAZY": "1"})
    fn = "0x2000" if mode == "apply" else ("0x1001" if cukernel else "0x1000")
    out = p.stdout
    assert f"load {fn}" in out and out.index(f"load {fn}") < out.index("hold until 1"), out
    assert "waits for the held stream" not in out and "deadlock" not in out
    assert [int(v) for v in re.findall(r"hold until (\d+)", out)] == [1, 2]
    assert "holds_broken 0" in (tmp_path / "s.txt").read_text()


def test_a_launch_that_waits_for_its_held_stream_is_released_by_the_watchdog(fake, tuned, tmp_path):
    # whatever else makes the driver wait for the held stream inside the launch: the watchdog raises the flag,
    # that launch is not timed, and later launches are not held
    e, m = manifest(tuned, tmp_path)
    import time

    t0 = time.monotonic()
    p = run_app(fake, m, tmp_path / "s.txt", *([64, 256, N] * 3), env_extra={"FAKE_LAUNCH_SYNCS": "1",
                                                                           "MNEME_APPLY_HOLD_MS": "50"})
    assert time.monotonic() - t0 < 8
    assert p.stdout.count("waits for the held stream") == 1 and "deadlock" not in p.stdout
    assert re.findall(r"hold until (\d+)", p.stdout) == ["1"]
    stats = (tmp_path / "s.txt").read_text()
    assert "holds_broken 1" in stats and re.search(r"entry 0 matched 3 applied 3 .* lost 1 timed 2", stats), stats
    assert "the watchdog released it" in p.stderr


@pytest.mark.parametrize("tuned_shape", [(64, 256), (128, 128)], ids=["same-shape", "other-shape"])
def test_a_cooperative_launch_gets_the_tuned_kernel_only_at_its_own_shape(fake, tuned, tmp_path, tuned_shape):
    # reductionMultiBlockCG's grid-synchronizing kernel went unapplied on the H200: libapply passed every
    # cooperative launch through. Its grid must stay co-resident, so only a tuned entry of the launch's shape applies
    import dataclasses

    entries, _ = prepare(load_tuned([str(tuned)]), tmp_path / "work")
    g, b = tuned_shape
    entries[0].tuned = dataclasses.replace(entries[0].tuned, grid=dim3(g, 1, 1), block=dim3(b, 1, 1))
    m = write_manifest(entries, tmp_path / "m.txt")
    p = run_app(fake, m, tmp_path / "s.txt", 64, 256, N, env_extra={"FAKE_APP_COOP": "1"})
    stats = (tmp_path / "s.txt").read_text()
    assert "coop launch" in p.stdout and "\nlaunch " not in p.stdout  # it stayed a cooperative launch
    if tuned_shape == (64, 256):
        assert launches(p.stdout) == [("0x2000", "64", "256")]
        assert "entry 0 matched 1 applied 1 fell_back 0" in stats
    else:
        assert launches(p.stdout) == [("0x1000", "64", "256")]
        assert "entry 0 matched 1 applied 0 fell_back 1" in stats
        assert "a cooperative launch keeps its shape" in p.stderr


def test_the_scaled_rule_recomputes_the_grid_from_the_launchs_work(fake, tuned, tmp_path):
    e, m = manifest(tuned, tmp_path, rule="scaled")
    assert e.rule == "scaled"
    p = run_app(fake, m, tmp_path / "s.txt", 10, 256, 5, 64, 128, N)
    tb = e.tuned.block.x
    assert launches(p.stdout) == [("0x2000", str(-(-10 * 256 // tb)), str(tb)), ("0x1000", "64", "128")]


@pytest.mark.parametrize("cukernel", [False, True], ids=["CUfunction", "CUkernel"])
def test_variables_are_mirrored_around_the_tuned_launch(fake, tuned, tmp_path, cukernel):
    e, m = manifest(tuned, tmp_path, variables=[Variable("g_count", 8, False), Variable("c_table", 16, True),
                                                Variable("g_missing", 4, False)])
    p = run_app(fake, m, tmp_path / "s.txt", 64, 256, N, cukernel=cukernel)
    lines = p.stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("launch 0x2000"))
    before, after = lines[:i], lines[i + 1:]
    # tuned module's copies (0x2xxxx) from the app's (0x3xxxx) before; only the writable one back after
    assert "copy 0x20100 <- 0x30100 8" in before and "copy 0x20200 <- 0x30200 16" in before
    assert "copy 0x30100 <- 0x20100 8" in after and not any("0x30200 <-" in line for line in after)
    assert "g_missing" not in p.stderr  # a variable the tuned module does not have (pruned) is not mirrored


def test_a_cubin_that_does_not_load_falls_back_with_a_warning(fake, tuned, tmp_path):
    bad = tmp_path / "bad.cubin"
    bad.write_bytes(b"garbage")
    e, m = manifest(tuned, tmp_path, cubin=bad)
    p = run_app(fake, m, tmp_path / "s.txt", 64, 256, N, 64, 256, N)
    assert launches(p.stdout) == [("0x1000", "64", "256")] * 2
    assert "failed to load (CUDA_ERROR_INVALID_IMAGE); the original kernel runs" in p.stderr
    assert p.stderr.count("failed to load") == 1  # warned once
    assert "matched 2 applied 0 fell_back 2" in (tmp_path / "s.txt").read_text()


def test_mneme_apply_reports_both_runs_side_by_side(fake, tuned, tmp_path):
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake), "MNEME_LIBAPPLY": str(fake / "libapply.so")}
    p = run_mneme("apply", tuned, "--workdir", tmp_path / "wd", "--rounds", 2, "--quiet", "--", fake / "app",
                  64, 256, N, env=env)
    assert p.stdout.count("app done") == 4  # 2 rounds x (observed, applied), the app's own output shown
    rep = json.loads((tmp_path / "wd" / "apply.json").read_text())
    (k,) = rep["entries"]
    assert k["matched"] == 2 and k["applied"] == 2 and k["original_ns"] == 4000 and k["tuned_ns"] == 4000
    assert k["realized"] == pytest.approx(1.0) and rep["kernels_applied"] == 1 and rep["app_ok"]
    assert set(rep) >= {"kernels_applied", "app_ok", "wall_speedup", "kernels"}
    assert "realized 1.000x" in p.stdout and "apply wall:" in p.stdout


def test_apply_track_logs_a_run_under_the_tune_sweep(fake, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "LD_LIBRARY_PATH": str(fake),
           "MNEME_LIBAPPLY": str(fake / "libapply.so")}
    out = tmp_path / "tune"
    run_mneme("tune", "-rdb", VECADD, "--space", "quick", "--devices", "none", "--objective", "registers", "--trials", 4,
              "-o", out, "--quiet", "--seed", "1", env=env)
    run_mneme("apply", out, "--track", "--workdir", tmp_path / "wd", "--quiet", "--", fake / "app", 64, 256, N, env=env)
    from mlflow import MlflowClient

    c = MlflowClient(uri)
    (exp,) = [e for e in c.search_experiments() if c.search_runs([e.experiment_id], "tags.`mneme.role` = 'apply'")]
    (sweep,) = c.search_runs([exp.experiment_id], "tags.`mneme.role` = 'sweep'")
    (run,) = c.search_runs([exp.experiment_id], "tags.`mneme.role` = 'apply'")
    assert run.data.tags["mlflow.parentRunId"] == sweep.info.run_id and run.info.status == "FINISHED"
    assert run.data.metrics["app_ok"] == 1.0 and run.data.metrics["kernels_applied"] == 1.0
    assert run.data.metrics["k0.realized"] == pytest.approx(1.0)
    assert {a.path for a in c.list_artifacts(run.info.run_id)} >= {"apply.json", "apply.txt"}
