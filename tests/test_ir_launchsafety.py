"""Launch safety read from real IR (clang-22): which launch quantities a kernel's code depends on, the block
rules that follow, and the launch candidates a preset then offers."""

from __future__ import annotations

from pathlib import Path

import llvmlite.binding as llvm
import pytest

from mneme.config import ExperimentConfiguration, dim3
from mneme.ir.launchsafety import analyze_launch
from mneme.ir.module import module_kernels
from mneme.tune.launch import launch_candidates
from mneme.tune.presets import preset_space
from mneme.tune.space import SpaceContext

from irutil import bc_dir, build  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
INCLUDES = [f"-I{EXAMPLES}", f"-I{ROOT / 'mneme' / 'include'}", "-I/usr/local/cuda/include/cccl"]


@pytest.fixture(scope="session")
def kernels(build):
    """short kernel name -> (module, mangled name) for the test kernels and the examples used here."""
    out = {}
    for src in ("launch.cu", EXAMPLES / "matmul.cu", EXAMPLES / "cooperative.cu", EXAMPLES / "vecadd.cu"):
        mod = llvm.parse_bitcode(build(src, extra=INCLUDES).read_bytes())
        for k in module_kernels(mod):
            short = next(s for s in ("bounded", "fixed256", "smallbuf", "scale2d", "pairs", "strided128", "blockPartials", "matmulStatic", "matmulDynamic",
                                     "matmulPanel", "coopSum", "vecAdd") if s in k)
            out[short] = (mod, k)
    return out


def analyze(kernels, name):
    mod, k = kernels[name]
    before = str(mod)
    f = analyze_launch(mod, k)
    assert str(mod) == before  # the module is left as it was
    return f


def test_tiled_matmul_keeps_its_recorded_block(kernels):
    f = analyze(kernels, "matmulStatic")
    assert f.reads["ntid"] == "" and f.reads["tid"] == "xy"
    assert sorted(t.shape for t in f.tiles) == [(16, 16), (16, 16)] and all(t.tid_axes == "xy" for t in f.tiles)
    rules = f.rules((16, 16, 1))
    assert set(rules.fixed) == {0, 1} and "shared array" in rules.fixed[0]
    assert rules.why((16, 16, 1)) is None
    for bad in ((32, 8, 1), (32, 32, 1), (2, 128, 1), (256, 1, 1)):
        assert rules.why(bad) is not None
    # the space the preset builds has nothing else to offer
    b = ExperimentConfiguration(grid=dim3(8, 8, 1), block=dim3(16, 16, 1))
    ctx = SpaceContext(b, launch_facts=f)
    space = preset_space("standard", ctx)
    assert list(space.shapes) == ["16x16x1"]
    assert "block.x fixed" in " ".join(space.describe()["launch_analysis"]["rules"]["lines"])


def test_tile_size_from_an_argument_still_fixes_the_block(kernels):
    f = analyze(kernels, "matmulDynamic")  # extern __shared__, tile passed in: blockDim never read
    assert f.tiles == [] and f.reads["ntid"] == ""
    assert set(f.rules((32, 32, 1)).fixed) == {0, 1}


def test_kernels_that_read_blockdim_get_covering_warp_shapes(kernels):
    f = analyze(kernels, "vecAdd")
    assert f.reads["ntid"] == "x" and not f.tiles
    rules = f.rules((256, 1, 1))
    assert not rules.fixed and rules.x_warps
    shapes = launch_candidates(dim3(64, 1, 1), dim3(256, 1, 1), allow=lambda b: rules.why(b) is None)
    assert len(shapes) > 3
    for s in shapes:
        assert s.block.x % 32 == 0 and s.grid.x * s.block.x >= 64 * 256
    f2 = analyze(kernels, "scale2d")
    r2 = f2.rules((16, 16, 1))
    assert not r2.fixed and r2.why((32, 8, 1)) is None and r2.why((8, 32, 1)) is not None
    assert r2.why((8, 32, 1), soft=False) is None  # aggressive drops only the warp rule
    assert f.tile_scale == {} and f2.tile_scale == {}  # blockIdx * blockDim: the share follows the shape


def test_a_tile_fixed_by_blockidx_times_a_constant_keeps_the_block(kernels):
    """matmulPanel reads blockDim.x/.y (its panel loop strides by them), but each block owns the 32 x 32 tile
    at blockIdx * 32 with 32 x 8 threads: on the H200, 4 of 5 standard trials that reshaped it failed."""
    p = analyze(kernels, "matmulPanel")
    assert p.reads["ntid"] == "xy" and p.tile_scale == {"x": "32", "y": "32"}
    rules = p.rules((32, 8, 1))
    assert set(rules.fixed) == {0, 1} and "blockIdx.y is multiplied by 32, never by blockDim.y" in rules.fixed[1]
    assert rules.why((32, 8, 1)) is None
    for bad in ((64, 4, 1), (32, 16, 1), (128, 2, 1)):
        assert rules.why(bad) is not None, bad
    assert p.describe()["tile_scale"] == {"x": "32", "y": "32"}
    pairs = analyze(kernels, "pairs")  # blockIdx.x * (blockDim.x * 2): derived from blockDim
    assert pairs.tile_scale == {} and not pairs.rules((256, 1, 1)).fixed
    s = analyze(kernels, "strided128")  # a grid-stride loop reads blockDim, the start assumes 128 threads
    assert s.reads["ntid"] == "x" and s.tile_scale == {"x": "128"}
    assert set(s.rules((128, 1, 1)).fixed) == {0}


def test_one_result_per_block_keeps_the_block(kernels):
    # simpleCudaGraphs' reduce on the H200: 18 of 100 trials failed verification, each a block size whose
    # per-block partial sums (outputVec[blockIdx.x]) differ from the recorded ones
    f = analyze(kernels, "blockPartials")
    assert f.reads["ntid"] == "x" and f.tile_scale == {} and f.block_outputs == "x"
    rules = f.rules((256, 1, 1))
    assert set(rules.fixed) == {0} and "blockIdx.x alone indexes a store" in rules.fixed[0]
    assert rules.why((256, 1, 1)) is None and rules.why((128, 1, 1)) is not None
    assert f.describe()["block_outputs"] == "x"
    for elementwise in ("vecAdd", "pairs", "strided128"):  # a[blockIdx * ... + threadIdx]: not one per block
        assert analyze(kernels, elementwise).block_outputs == "", elementwise


def test_compile_time_block_size_without_shared_memory(kernels):
    f = analyze(kernels, "fixed256")
    assert f.reads["ntid"] == "" and f.reads["tid"] == "x"
    rules = f.rules((256, 1, 1))
    assert set(rules.fixed) == {0} and rules.why((128, 1, 1)) is not None


def test_shared_array_caps_threads_and_launch_bounds_are_read(kernels):
    f = analyze(kernels, "smallbuf")
    assert [t.shape for t in f.tiles] == [(256,)] and f.tiles[0].tid_axes == "x"
    rules = f.rules((128, 1, 1))
    assert rules.max_threads == 256 and rules.why((512, 1, 1)) is not None and rules.why((256, 1, 1)) is None
    b = analyze(kernels, "bounded")
    assert b.max_threads == 256
    assert b.rules((128, 1, 1)).why((512, 1, 1)) is not None


def test_cooperative_kernel_keeps_its_launch(kernels):
    f = analyze(kernels, "coopSum")
    assert f.cooperative
    rules = f.rules((256, 1, 1))
    assert rules.launch_fixed and rules.why((128, 1, 1)) is not None and rules.why((256, 1, 1)) is None


def test_dry_run_on_the_recorded_matmul_prints_the_analysis(tmp_path):
    """The H200 recording of examples/matmul.cu: matmulStatic's standard space keeps its 16x16 block."""
    import json
    import subprocess
    import sys

    from mneme.record.db import RecordedExecution, find_dbs

    db = next(p for p in find_dbs(str(ROOT / "tests" / "fixtures" / "matmul"))
              if "matmulStatic" in RecordedExecution.from_json(p, check_files=False).demangled_name)
    base = [sys.executable, "-m", "mneme.cli", "tune", "-rdb", db, "--dry-run", "--no-track", "-o", str(tmp_path / "o")]
    text = subprocess.run(base, capture_output=True, text=True, check=True).stdout
    assert "launch safety from the IR" in text and "block.x fixed: blockDim.x is never read" in text
    assert "aggressive drops only the block.x warp rule" in text
    plan = json.loads(subprocess.run(base + ["--json", "--launch-safety", "aggressive"], capture_output=True, text=True,
                                     check=True).stdout)
    assert list(plan["space"]["launch"]) == ["16x16x1"]  # at every level
    assert plan["space"]["launch_analysis"]["facts"]["reads"]["tid"] == "xy"


@pytest.mark.parametrize("example,reads,recorded_x", [("vecadd", "x", 256), ("stencil2d", "xy", 16)])
def test_dry_run_on_recorded_examples_reading_blockdim_keeps_warp_shapes(tmp_path, example, reads, recorded_x):
    """The H200 recordings of examples/vecadd.cu and stencil2d.cu read blockDim: `mneme tune --dry-run` prints
    the analysis read from their IR, and every launch candidate covers the work with whole warps along x."""
    import json
    import subprocess
    import sys

    from mneme.record.db import find_dbs

    db = find_dbs(str(ROOT / "tests" / "fixtures" / example))[0]
    base = [sys.executable, "-m", "mneme.cli", "tune", "-rdb", db, "--dry-run", "--no-track", "-o", str(tmp_path / "o")]
    text = subprocess.run(base, capture_output=True, text=True, check=True).stdout
    assert "launch safety from the IR" in text and f"ntid.{reads}" in text
    assert f"block.x is the coalescing dimension (threadIdx.x is read): it stays a multiple of 32 or the recorded " \
           f"{recorded_x}" in text
    plan = json.loads(subprocess.run(base + ["--json"], capture_output=True, text=True, check=True).stdout)
    facts, b = plan["space"]["launch_analysis"]["facts"], plan["baseline"]
    assert facts["reads"]["ntid"] == reads and facts["reads"]["tid"] == reads
    work = [b["grid"][a] * b["block"][a] for a in "xyz"]
    for key, s in plan["space"]["launch"].items():
        assert s["block"]["x"] % 32 == 0 or s["block"]["x"] == recorded_x, key
        assert all(s["grid"][a] * s["block"][a] >= work[i] for i, a in enumerate("xyz")), key  # the work stays covered
    assert len(plan["space"]["launch"]) > 1  # the block is searched, not fixed
