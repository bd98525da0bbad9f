"""`mneme tune` on a real GPU: 100 trials of vecAdd over the `launch` preset and 100 trials of the 2-D stencil over
the `compiler` preset; the executor's GPU workers (device opened once, results naming their GPU); and, where a
host has two GPUs, one worker per GPU and two tuning processes sharing one study."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mneme.config import STATUSES, ExperimentConfiguration, MeasurementSettings

pytestmark = pytest.mark.gpu

MNEME = [sys.executable, "-m", "mneme.cli"]


def tune(db: Path, out: Path, *args: str, timeout: int = 1800):
    argv = [*MNEME, "tune", "-rdb", str(db), "--no-track", "--quiet", "--json", "-o", str(out), *map(str, args)]
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    assert p.stdout.strip().startswith("{"), f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    summary = json.loads(p.stdout)
    print(f"\n{' '.join(argv[3:])}\nexit {p.returncode} in {took:.1f} s")
    print((out / "summary.txt").read_text() if (out / "summary.txt").exists() else p.stderr[-2000:])
    print(f"executor: {summary.get('executor')}")
    return p, summary


def trial_rows(out: Path):
    return [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]


def check_study(out: Path, summary: dict, n: int, devices=(0,)) -> list:
    assert summary["exit_code"] == 0, summary.get("message")
    assert summary["baseline"]["status"] == "verified", summary["baseline"]
    assert summary["trials"]["counted"] == n
    rows = trial_rows(out)
    counted = [r for r in rows if r["flag"] not in ("rejected", "surplus", "retried")]
    assert len(counted) == n
    for r in counted:
        res = r["result"]
        assert res and res["status"] in STATUSES, r
        if res["executed"]:
            assert res["gpu_id"] in devices and res["gpu_name"], res  # every result names the GPU it ran on
        if res["status"] == "verified":
            assert res["verified"] and len(res["exec_time"]) == 10 and min(res["exec_time"]) > 0
    best = summary["best"]
    assert best is not None and best["status"] == "verified"
    by_number = {r["number"]: r for r in rows}
    assert by_number[best["number"]]["result"]["verified"]  # a trial that did not verify is never the best
    verified_times = [r["result"]["exec_time"] for r in counted if r["result"]["status"] == "verified"]
    med = sorted(sorted(t)[len(t) // 2] for t in verified_times)
    assert best["metric_ns"] <= med[0] * 1.001  # the best is the fastest verified trial (median metric)
    for f in ("best.json", "best.yaml", "best.sh", "best.md", "verified.csv", "summary.json", "space.json", "baseline.json"):
        assert (out / f).is_file(), f
    return counted


def test_tune_vecadd_over_the_launch_preset(big_recordings, tmp_path):
    db = big_recordings["vecadd"].db("vecAdd")
    out = tmp_path / "vecadd-launch"
    p, s = tune(db, out, "--space", "launch", "--sampler", "tpe", "--trials", 100, "--devices", 0, "--seed", 1)
    assert p.returncode == 0, p.stderr
    counted = check_study(out, s, 100)
    # the recorded launch is one of the candidates: the best is at least as fast, up to timing noise
    assert s["best"]["speedup"] >= 0.97
    blocks = {json.dumps(r["config"]["block"]) for r in counted}
    assert len(blocks) >= 4  # the launch geometry really was searched
    assert s["executor"]["statuses"].get("verified", 0) >= 4
    assert "--block-dim-x" in s["best"]["replay_command"]


def test_tune_stencil_over_the_compiler_preset(big_recordings, tmp_path):
    db = big_recordings["stencil2d"].db("stencil")
    out = tmp_path / "stencil-compiler"
    p, s = tune(db, out, "--space", "compiler", "--sampler", "tpe", "--trials", 100, "--devices", 0,
                "--compile-jobs", 8, "--seed", 2)
    assert p.returncode == 0, p.stderr
    counted = check_study(out, s, 100)
    codes = {r["result"]["code_hash"] for r in counted if r["result"]["code_hash"]}
    assert len(codes) >= 10  # many distinct compilations...
    launches = {json.dumps([r["config"]["grid"], r["config"]["block"]]) for r in counted}
    assert len(launches) == 1  # ...of the recorded launch
    assert s["best"]["speedup"] >= 0.9


def test_gpu_worker_opens_its_device_once_and_reuses_it(big_recordings, tmp_path):
    from mneme.tune.executor import AsyncReplayExecutor
    from mneme.tune.tuner import recorded_baseline

    db = big_recordings["vecadd"].db("vecAdd")
    base = recorded_baseline(str(db), None)
    configs = []
    for bx in (64, 128, 256, 512, 1024):
        grid = (base.grid.x * base.block.x + bx - 1) // bx
        configs.append(ExperimentConfiguration.from_dict(dict(base.to_dict(), block={"x": bx}, grid={"x": grid})))
    with AsyncReplayExecutor(str(db), None, devices=[0], compile_jobs=4, settings=MeasurementSettings(iterations=5),
                             log_dir=str(tmp_path / "logs")) as ex:
        first = ex.evaluate(base)
        rs = [f.result(timeout=600) for f in [ex.submit(c) for c in configs * 4]]
        st = ex.stats()
    assert first.status == "verified" and first.gpu_id == 0 and first.gpu_name
    assert all(r.status == "verified" for r in rs), [(r.status, r.error) for r in rs if r.status != "verified"]
    gpu = [w for w in st["workers"] if w["role"] == "gpu"][0]
    # one device setup for every experiment; identical machine code at the same launch runs once (the
    # executor's dedupe): the baseline's launch (block 256) and the five shapes are the only GPU jobs
    distinct = {(c.block.x, c.grid.x) for c in [base, *configs]}
    assert gpu["starts"] == 1 and gpu["jobs"] == len(distinct), (gpu, distinct)
    assert sum(bool(r.same_binary_as) for r in rs) >= len(rs) - len(distinct), [r.same_binary_as for r in rs]
    assert st["compiles"] == 1  # launch-only variants share one cubin


def _two_gpus():
    from mneme.tune.executor import visible_devices

    if len(visible_devices()) < 2:
        pytest.skip("needs two GPUs (a nvidia-h200-x2 machine)")


@pytest.mark.multigpu
def test_one_worker_per_gpu_uses_both(big_recordings, tmp_path):
    _two_gpus()
    db = big_recordings["vecadd"].db("vecAdd")
    out = tmp_path / "two-gpus"
    p, s = tune(db, out, "--space", "launch", "--sampler", "random", "--trials", 60, "--devices", "0,1", "--seed", 3)
    assert p.returncode == 0, p.stderr
    counted = check_study(out, s, 60, devices=(0, 1))
    used = collections.Counter(r["result"]["gpu_id"] for r in counted if r["result"]["executed"] and not r["duplicate_of"])
    assert set(used) == {0, 1}, used


@pytest.mark.multigpu
def test_two_processes_each_on_its_gpu_share_one_journal_study(big_recordings, tmp_path):
    _two_gpus()
    db = big_recordings["vecadd"].db("vecAdd")
    journal = tmp_path / "study.journal"
    procs = [subprocess.Popen([*MNEME, "tune", "-rdb", str(db), "--space", "standard", "--sampler", "tpe",
                               "--trials", "60", "--devices", str(d), "--storage", f"journal:{journal}", "--study",
                               "shared", "--resume", "--seed", str(d), "--no-track", "--quiet", "-o", str(tmp_path / f"p{d}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for d in (0, 1)]
    for pr in procs:
        out, err = pr.communicate(timeout=1800)
        assert pr.returncode == 0, err
    rows = trial_rows(tmp_path / "p0")
    counted = [r for r in rows if r["flag"] not in ("rejected", "surplus", "retried")]
    assert len(counted) == 60
    ran = collections.Counter(r["config_hash"] for r in counted if r["duplicate_of"] is None)
    assert max(ran.values()) == 1  # no configuration ran twice
    assert {r["result"]["gpu_id"] for r in counted if r["result"]["executed"]} == {0, 1}
    assert len({r["owner"] for r in counted}) == 2


def _launches(base: ExperimentConfiguration, blocks) -> list:
    """The recorded configuration with other 1-D blocks, the grid recomputed to cover the same work."""
    out = []
    for bx in blocks:
        grid = (base.grid.x * base.block.x + bx - 1) // bx
        out.append(ExperimentConfiguration.from_dict(dict(base.to_dict(), block={"x": bx}, grid={"x": grid})))
    return out


@pytest.mark.multigpu
def test_a_worker_crash_on_one_gpu_leaves_the_other_working(big_recordings, tmp_path, monkeypatch):
    """Real replays on GPUs 0 and 1; the worker on GPU 1 dies (os._exit) on its first 64-thread block and is
    respawned on GPU 1, while GPU 0 goes on."""
    _two_gpus()
    from mneme.tune.executor import AsyncReplayExecutor
    from mneme.tune.tuner import recorded_baseline

    db = big_recordings["vecadd"].db("vecAdd")
    base = recorded_baseline(str(db), None)
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", here + ":" + os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # workers are then pinned to "0" and "1"
    monkeypatch.setenv("MNEME_TEST_CRASH_MARK", str(tmp_path / "crashed"))
    with AsyncReplayExecutor(str(db), None, devices=[0, 1], compile_jobs=4, settings=MeasurementSettings(iterations=5),
                             log_dir=str(tmp_path / "logs"), backend="crashing_backend:CrashOnGpuOneBackend") as ex:
        rs = [f.result(timeout=600) for f in [ex.submit(c) for c in _launches(base, (64, 128, 256, 512) * 8)]]
        st = ex.stats()
    crashed = [r for r in rs if r.status != "verified"]
    assert len(crashed) == 1 and crashed[0].status == "runtime_error" and "died" in crashed[0].error, \
        [(r.status, r.error) for r in crashed]
    assert (tmp_path / "crashed").is_file()  # the crash really happened in the worker on GPU 1
    used = collections.Counter(r.gpu_id for r in rs if r.status == "verified")
    assert set(used) == {0, 1}, used  # GPU 1's worker was respawned and worked again
    assert st["crashes"] == 1 and st["respawns"] >= 1
