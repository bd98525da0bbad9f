"""The Kernel Tuner side by side without a GPU: both tools search the same set of configurations (mneme's
space through the real `mneme tune` CLI, Kernel Tuner's through its own search-space code where it is
installed), the kernel text Kernel Tuner compiles is the example's and NVRTC accepts it, the host data and
references are right, and the tables and the ratio line say which tool is ahead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(1, str(ROOT))

import bench_kernel_tuner as bkt  # noqa: E402
import benchlib  # noqa: E402
import report  # noqa: E402
from bench import block_spaces as bs  # noqa: E402
from bench.kt_space import BlockSpace, context_for  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
VECADD_DB = next((FIXTURES / "vecadd").glob("*.json"))  # 16384 elements, 64 x 256
STENCIL_DB = next((FIXTURES / "stencil2d").glob("*.json"))  # 128 x 128, 8x8 blocks of 16x16
#: a launch that covers each kernel's timing size, the way the example app launches it
TIMING_LAUNCH = {"vecadd": ((1 << 24) // 256, 256), "stencil2d": ((256, 256), (16, 16))}


def _launch(kernel):
    grid, block = TIMING_LAUNCH[kernel]
    as3 = lambda v: tuple(v) + (1,) * (3 - len(v)) if isinstance(v, tuple) else (v, 1, 1)  # noqa: E731
    return as3(grid), as3(block)


def expected_launches(space: str, problem):
    return sorted((b, bs.grid_for(problem, b)) for b in bs.enumerate_blocks(bs.space_def(space)))


# ---- the spaces ---------------------------------------------------------------------------------------

def test_each_space_holds_the_blocks_its_definition_says():
    sizes = {name: len(bs.enumerate_blocks(d)) for name, d in bs.SPACES.items()}
    assert sizes == {"vecadd": 32, "vecadd-quick": 6, "stencil2d": 51, "stencil2d-quick": 24}
    vec = bs.enumerate_blocks(bs.SPACES["vecadd"])
    assert vec[0] == (32, 1, 1) and vec[-1] == (1024, 1, 1) and all(b[0] % 32 == 0 for b in vec)
    st = bs.enumerate_blocks(bs.SPACES["stencil2d"])
    assert all(32 <= x * y <= 1024 and z == 1 for x, y, z in st)
    assert {(1, 32, 1), (32, 1, 1), (1024, 1, 1), (1, 1024, 1), (16, 16, 1)} <= set(st)
    assert (16, 1, 1) not in st and (64, 32, 1) not in st
    assert bs.broken_restrictions(["block_size_x * block_size_y <= 1024"], {"block_size_x": 64, "block_size_y": 32}) \
        == ["block_size_x * block_size_y <= 1024"]
    assert bs.grid_for((4096, 4096), (32, 4, 1)) == (128, 1024, 1) and bs.grid_for((1 << 24,), (96, 1, 1)) == (174763, 1, 1)


@pytest.mark.parametrize("kernel", ["vecadd", "stencil2d"])
@pytest.mark.parametrize("quick", [False, True])
def test_mneme_space_runs_the_definition_over_the_recorded_work(kernel, quick):
    k = bkt.KERNELS[kernel]
    space = k.quick_space if quick else k.space
    ms = BlockSpace(context_for(*_launch(kernel)), space)
    assert ms.problem[:len(k.problem)] == k.problem
    got = [(tuple(c.block), tuple(c.grid)) for c in ms.configurations()]
    assert len(got) == len(set(got)) and sorted(got) == expected_launches(space, k.problem)
    assert all(c.passes == "default<O3>" and not c.specialize and c.shared_mem == 0 for c in ms.configurations())
    assert ms.describe()["block_space"] == space and ms.size() >= len(got)


def test_kernel_tuners_own_search_space_is_the_same_set():
    pytest.importorskip("kernel_tuner")
    from kernel_tuner import util
    from kernel_tuner.searchspace import Searchspace

    for name, d in bs.SPACES.items():
        ss = Searchspace(d.tune_params, list(d.restrictions) or None, 1024)
        theirs = sorted(bs.block_of(dict(zip(d.tune_params, c))) for c in ss.list)
        assert theirs == sorted(bs.enumerate_blocks(d)), name
    for kernel, k in bkt.KERNELS.items():
        for b in bs.enumerate_blocks(bs.space_def(k.space)):
            threads, grid = util.setup_block_and_grid(k.problem, (None, None, None),
                                                      dict(zip(bs.BLOCK_NAMES, b)), util.default_block_size_names)
            assert (tuple(threads), tuple(grid)) == (b, bs.grid_for(k.problem, b)), (kernel, b)


@pytest.mark.parametrize("db,space,problem", [(VECADD_DB, "vecadd", (16384,)), (STENCIL_DB, "stencil2d-quick", (128, 128))])
def test_mneme_tune_searches_the_same_set_and_compiles_once(tmp_path, db, space, problem):
    """The real `mneme tune --space-module bench.kt_space:BlockSpace --sampler exhaustive`, compile-only."""
    n = len(bs.enumerate_blocks(bs.space_def(space)))
    out = tmp_path / "out"
    argv = bkt.mneme_command(str(db), space, n, out, 3, 1, 2, devices="none") + ["--objective", "registers"]
    run = bkt.tune_with_mneme(argv, out, timeout=240)
    assert sorted((tuple(c["block"]) for c in run["configs"])) == sorted(bs.enumerate_blocks(bs.space_def(space)))
    assert run["compiles"] == 1  # a launch-only change reuses the baseline's cubin
    assert all(c["status"] == "compiled" and "error" in c for c in run["configs"])  # no GPU: nothing verified
    assert run["best_block"] is not None and run["best_us"] is None and run["search_s"] >= 0
    assert run["command"].startswith("mneme tune -rdb") and "--space-module bench.kt_space:BlockSpace" in run["command"]
    row = bkt.tool_row("k", bkt.MNEME, run, bs.enumerate_blocks(bs.space_def(space)))
    assert row["same_space"] == "yes" and row["configs"] == n and row["ok"] == 0


def test_space_check_takes_the_recorded_work_and_refuses_another_problem():
    assert bkt.space_check(str(VECADD_DB), "vecadd", (16384,)) == {"configurations": 32, "problem": [16384, 1, 1],
                                                                   "identical": True}
    assert bkt.space_check(str(STENCIL_DB), "stencil2d", (128, 128))["configurations"] == 51
    with pytest.raises(RuntimeError, match="other launches"):
        bkt.space_check(str(VECADD_DB), "vecadd", (16400,))


def test_an_unknown_space_is_a_configuration_error_that_names_the_choices():
    from mneme.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="stencil2d-quick"):
        BlockSpace(context_for((1, 1, 1), (32, 1, 1)), "nope")


# ---- the kernels as Kernel Tuner gets them -------------------------------------------------------------

@pytest.mark.parametrize("kernel", ["vecadd", "stencil2d"])
def test_kernel_source_is_the_examples_device_code(kernel):
    k = bkt.KERNELS[kernel]
    src = bkt.kernel_source(k.example)
    text = (ROOT / "examples" / f"{k.example}.cu").read_text()
    assert src.strip() in text and f"__global__ void {k.function}(" in src
    assert "#include" not in src and "main(" not in src
    if kernel == "stencil2d":
        assert "__constant__ float c_weights[5];" in src and "__device__ float g_boundary;" in src


def test_host_arguments_and_the_references():
    np = pytest.importorskip("numpy")
    args, cmem, answer = bkt.host_arguments("vecadd", (1000,))
    assert cmem is None and [type(a).__name__ for a in args] == ["ndarray", "ndarray", "ndarray", "int32"]
    assert args[0].dtype == np.float32 and int(args[3]) == 1000 and np.array_equal(answer[2], args[0] + args[1])
    assert answer[0] is None and answer[3] is None and not args[2].any()

    args, cmem, answer = bkt.host_arguments("stencil2d", (5, 4))
    assert set(cmem) == {"c_weights", "g_boundary"} and cmem["g_boundary"].shape == (1,)
    assert (int(args[2]), int(args[3])) == (5, 4) and answer[1].shape == (20,)
    src = args[0].reshape(4, 5)
    w, bnd = bkt.STENCIL_WEIGHTS, bkt.STENCIL_BOUNDARY

    def at(x, y):
        return bnd if not (0 <= x < 5 and 0 <= y < 4) else float(src[y, x])

    naive = [[w[0] * at(x, y) + w[1] * at(x - 1, y) + w[2] * at(x + 1, y) + w[3] * at(x, y - 1) + w[4] * at(x, y + 1)
              for x in range(5)] for y in range(4)]
    assert np.allclose(answer[1].reshape(4, 5), np.array(naive), atol=1e-6, rtol=0)
    assert answer[1].dtype == np.float32
    with pytest.raises(KeyError, match="vecadd"):
        bkt.host_arguments("matmul", (4,))


def _nvrtc():
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
        return nvrtc
    except Exception:  # noqa: BLE001 - no NVRTC library here
        return None


@pytest.mark.parametrize("kernel,params", [("vecadd", {"block_size_x": 96}),
                                           ("stencil2d", {"block_size_x": 32, "block_size_y": 4})])
def test_kernel_tuner_prepares_a_source_nvrtc_compiles(kernel, params):
    pytest.importorskip("kernel_tuner")
    from kernel_tuner import core, util

    k = bkt.KERNELS[kernel]
    src = bkt.kernel_source(k.example)
    args, _, _ = bkt.host_arguments(kernel, tuple(8 for _ in k.problem))
    ks = core.KernelSource(k.function, src, "cupy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Kernel Tuner warns when the host arguments do not match the signature
        ks.check_argument_lists(k.function, args)
    with pytest.warns(UserWarning, match="does not match"):
        ks.check_argument_lists(k.function, args[:-1] + [args[-1].astype("float32")])
    block = bs.block_of(params)
    name, text, _ = ks.prepare_list_of_files(k.function, params, bs.grid_for(k.problem, block), block,
                                             util.default_block_size_names)
    assert name == k.function and src in text and f"#define block_size_x {block[0]}" in text
    nvrtc = _nvrtc()
    if nvrtc is None:
        pytest.skip("no NVRTC library here (pip install nvidia-cuda-nvrtc to compile)")
    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), b"kt.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    nvrtc.nvrtcAddNameExpression(prog, k.function.encode())
    (res,) = nvrtc.nvrtcCompileProgram(prog, 2, [b"--std=c++11", b"--gpu-architecture=sm_90"])
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    assert res == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.decode(errors="replace")
    err, lowered = nvrtc.nvrtcGetLoweredName(prog, k.function.encode())
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS and k.function.encode() in lowered


def test_kernel_tuner_results_become_plain_rows():
    np = pytest.importorskip("numpy")
    ok = bkt.kt_config({"block_size_x": 64, "block_size_y": 2, "time": np.float64(0.05), "times": [0.04, 0.06],
                        "compile_time": 120.0, "verification_time": 0, "benchmark_time": 2.5, "framework_time": 0.3,
                        "strategy_time": 0.01, "timestamp": "2026-11-29T10:00:00+00:00"})
    assert ok == {"block": [64, 2, 1], "us": pytest.approx(50.0), "times_us": [pytest.approx(40.0), pytest.approx(60.0)],
                  "compile_ms": 120.0, "verification_ms": 0.0, "benchmark_ms": 2.5, "framework_ms": 0.3, "strategy_ms": 0.01}
    json.dumps(ok)
    assert bkt.kt_config({"block_size_x": 32, "time": None})["error"] == "no time: None"
    util = pytest.importorskip("kernel_tuner.util")
    invalid = util.InvalidConfig()
    bad = bkt.kt_config({"block_size_x": 1024, "block_size_y": 2, "time": invalid, "__error__": invalid})
    assert bad == {"block": [1024, 2, 1], "error": "InvalidConfig"}


def test_a_failing_worker_is_an_error_that_names_it():
    with pytest.raises(RuntimeError, match="in the cupy worker: .*Error"):
        bkt.run_worker({"kind": "cupy", "kernel": "vecadd", "blocks": [[256, 1, 1]], "rounds": 1, "per_round": 1,
                        "warmup": 0}, timeout=120, env=dict(bkt.python_env(), CUDA_VISIBLE_DEVICES=""))


# ---- tables and the ratio line -------------------------------------------------------------------------

def _run(wall, best, configs, block_times, **kw):
    return {"wall_s": wall, "best_block": list(best), "best_us": block_times[best], "search_s": wall / 2,
            "configs": [{"block": list(b), "us": block_times[b], "times_us": [block_times[b]] * 3} for b in configs], **kw}


def test_rows_say_where_kernel_tuner_is_ahead_and_where_mneme_is():
    blocks = [(32, 1, 1), (64, 1, 1), (128, 1, 1), (256, 1, 1)]
    mt = {(32, 1, 1): 40.0, (64, 1, 1): 30.0, (128, 1, 1): 20.0, (256, 1, 1): 22.0}
    kt = {b: t * 0.9 for b, t in mt.items()}
    rows = [bkt.tool_row("vecadd", bkt.MNEME, _run(8.0, (128, 1, 1), blocks, mt, compiles=1), blocks),
            bkt.tool_row("vecadd", bkt.KT, _run(2.0, (128, 1, 1), blocks, kt, compiles=4), blocks),
            bkt.tool_row("vecadd", bkt.KT_ANSWER, _run(4.0, (128, 1, 1), blocks[:3], kt), blocks)]
    assert [r["per_s"] for r in rows] == [0.5, 2.0, 0.75]
    assert rows[0]["same_space"] == "yes" and rows[2]["same_space"] == "NO (3 vs 4)"
    assert rows[0]["best_block"] == "128x1x1" and rows[1]["best_own_us"] == pytest.approx(18.0)
    bkt.fill_common(rows, "vecadd", "best_cupy_us", {"blocks": [{"block": [128, 1, 1], "us": 19.5}]})
    assert [r["best_cupy_us"] for r in rows] == [19.5] * 3
    runs = {bkt.MNEME: {"best_block": [128, 1, 1]}, bkt.KT: {"best_block": [128, 1, 1]},
            bkt.KT_ANSWER: {"best_block": [64, 1, 1]}}
    assert bkt.common_row({"block": [128, 1, 1], "us": 19.5, "min_us": 19.0, "n": 200}, runs) == {
        "block": "128x1x1", "picked_by": "mneme, Kernel Tuner", "us": 19.5, "min_us": 19.0, "n": 200}

    st = [(16, 16, 1), (32, 8, 1), (64, 4, 1)]
    rows += [bkt.tool_row("stencil2d", bkt.MNEME, _run(5.0, (32, 8, 1), st, {st[0]: 80.0, st[1]: 70.0, st[2]: 90.0}), st),
             bkt.tool_row("stencil2d", bkt.KT, _run(10.0, (64, 4, 1), st, {st[0]: 75.0, st[1]: 72.0, st[2]: 71.0}), st)]
    bkt.fill_common(rows, "stencil2d", "best_cupy_us", {"blocks": [{"block": [32, 8, 1], "us": 70.0},
                                                                    {"block": [64, 4, 1], "us": 77.0}]})
    bkt.fill_common(rows, "stencil2d", "best_replay_us", {"blocks": [{"block": [32, 8, 1], "us": 69.0},
                                                                      {"block": [64, 4, 1], "us": 76.0}]})
    sums = [bkt.kernel_summary(k, rows) for k in ("vecadd", "stencil2d")]
    assert sums[0]["per_s"] == {"mneme": 0.5, "kt": 2.0, "ratio": 0.25, "verdict": "Kernel Tuner ahead"}
    assert sums[0]["best_cupy_us"]["verdict"] == "even" and sums[0]["per_s_vs_answer"]["ratio"] == pytest.approx(2 / 3)
    assert sums[1]["per_s"]["verdict"] == "mneme ahead" and sums[1]["best_cupy_us"]["verdict"] == "mneme ahead"
    line = bkt.ratio_line(sums)
    assert line.startswith("vecadd: configs/s mneme / KT 0.25x (Kernel Tuner ahead; vs KT + answer 0.67x)")
    assert "best time mneme / KT 1.000x (cupy events; even)" in line
    assert "stencil2d: configs/s mneme / KT 2.00x (mneme ahead), best time mneme / KT 0.909x (cupy events; mneme ahead)" in line
    text = benchlib.render_text(benchlib.table("t", bkt.MAIN_COLUMNS, rows, ident=2))
    assert "Kernel Tuner + answer" in text and "NO (3 vs 4)" in text

    fast_kt = [dict(r, best_cupy_us=None) for r in rows]  # no cupy figures: the replay ones stand in
    assert "(mneme replay; mneme ahead)" in bkt.ratio_line([bkt.kernel_summary("stencil2d", fast_kt)])
    assert bkt.ratio_line([bkt.kernel_summary("nothing", [])]) == \
        "nothing: configs/s mneme / KT - (n/a), best time mneme / KT - (common re-measurement; n/a)"


def test_per_configuration_agreement_and_rank_correlation():
    blocks = [(32, 1, 1), (64, 1, 1), (128, 1, 1), (256, 1, 1)]
    mt = {b: t for b, t in zip(blocks, (40.0, 30.0, 20.0, 22.0))}
    doubled = {b: 2 * t for b, t in mt.items()}
    same = bkt.per_config_row("vecadd", _run(1, (128, 1, 1), blocks, mt), _run(1, (128, 1, 1), blocks, doubled))
    assert same["both"] == 4 and same["ratio_median"] == pytest.approx(0.5) and same["spearman"] == pytest.approx(1.0)
    assert same["mneme_best"] == same["kt_best"] == "128x1x1"
    rev = {b: t for b, t in zip(blocks, (20.0, 22.0, 30.0, 40.0))}
    other = bkt.per_config_row("vecadd", _run(1, (128, 1, 1), blocks, mt), _run(1, (32, 1, 1), blocks[:3], rev))
    assert other["both"] == 3 and other["spearman"] == pytest.approx(-1.0) and other["kt_best"] == "32x1x1"
    assert bkt.ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    assert bkt.spearman([1.0, 2.0], [2.0, 1.0]) is None and bkt.spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None


def test_failing_rows_fail_alone_and_the_script_still_ends_with_a_ratio_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bkt, "BIN", tmp_path / "no-bin")  # no app to record; Kernel Tuner gets a backend it lacks
    rc = bkt.main(["--quick", "--only", "vecadd,bogus", "--no-kt-answer", "--kt-lang", "no-such-backend", "--out",
                   str(tmp_path / "kt.json"), "--tmp", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1 and out.rstrip().splitlines()[-1].startswith("ratio: vecadd: configs/s mneme / KT -")
    doc = json.loads((tmp_path / "kt.json").read_text())
    rows = doc["tables"][0]["rows"]
    assert [(r["kernel"], r["tool"]) for r in rows] == [("vecadd", "mneme"), ("vecadd", "Kernel Tuner"), ("bogus", "-")]
    assert all("error" in r for r in rows) and "unknown kernel" in rows[2]["error"]
    assert "recording: FileNotFoundError" in rows[0]["error"] and "in the kt worker" in rows[1]["error"]
    assert [r["method"] for r in doc["tables"][1]["rows"]] == ["cupy events", "mneme replay"]
    assert all("no tool found a best block" in r["error"] for r in doc["tables"][1]["rows"])


def test_bench_sh_has_a_kt_part_and_the_report_a_section(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    p = subprocess.run(["bash", str(ROOT / "scripts" / "bench.sh"), "nonsense"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 2 and " kt," in p.stdout
    assert "kt) run kernel_tuner" in (ROOT / "scripts" / "bench.sh").read_text()
    run = benchlib.Run(bkt.NAME, bkt.__doc__, quick=True)
    run.add(benchlib.table("t", bkt.MAIN_COLUMNS, [{"kernel": "vecadd", "tool": bkt.KT, "error": "no GPU"}], ident=2))
    run.ratio = "vecadd: configs/s mneme / KT 0.50x (Kernel Tuner ahead)"
    (tmp_path / "kernel_tuner.json").write_text(json.dumps(run.to_dict()))
    (tmp_path / "replay.json").write_text(json.dumps(benchlib.Run("replay", "R.", quick=True).to_dict()))
    md = report.render(report.load([tmp_path]))
    assert md.index("## Replay fidelity") < md.index("## Side by side with Kernel Tuner (`bench/bench_kernel_tuner.py`)")
    assert "| vecadd | Kernel Tuner | ERROR: no GPU |" in md and "Ratio: vecadd: configs/s mneme / KT 0.50x" in md
    assert "Kernel Tuner (pip kernel-tuner" in md and "Usage:" not in md
