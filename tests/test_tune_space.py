"""Search spaces: launch candidates from the recorded geometry, presets, constraints, banning, user spaces."""

from __future__ import annotations

import math

import pytest

from mneme.config import ExperimentConfiguration, dim3
from mneme.errors import ConfigurationError
from mneme.tune.launch import LAUNCH_SAFETY, launch_candidates, parse_shape, shape_key
from mneme.tune.params import CategoricalParam, IntRangeParam
from mneme.tune.presets import DEFAULT_PIPELINES, PRESETS, preset_space
from mneme.tune.space import SearchSpace, SpaceContext, build_user_space, load_space_class, parse_space_args


def ctx_for(grid=(4096, 1, 1), block=(256, 1, 1), shared=0, safety="balanced", specializable=True, pipelines=()):
    base = ExperimentConfiguration(grid=dim3(*grid), block=dim3(*block), shared_mem=shared)

    class Inst:
        specializations = [True, False, False, True] if specializable else [False, False]

    return SpaceContext(base, None, Inst(), safety, list(pipelines))


def covers(shape, grid, block):
    """The shape's grid covers the recorded work in every dimension, with less than one block to spare."""
    for g, b, sg, sb in zip(grid, block, shape.grid, shape.block):
        work = g * b
        if not (sg * sb >= work and (sg - 1) * sb < work):
            return False
    return True


@pytest.mark.parametrize("safety", list(LAUNCH_SAFETY))
@pytest.mark.parametrize("grid,block", [((4096, 1, 1), (256, 1, 1)), ((64, 64, 1), (16, 16, 1)), ((10, 1000, 1), (100, 1, 1))])
def test_candidates_cover_the_recorded_work_within_limits(safety, grid, block):
    shapes = launch_candidates(dim3(*grid), dim3(*block), 0, safety)
    assert shapes[0].key == shape_key(dim3(*block))  # the recorded launch first
    assert len({s.key for s in shapes}) == len(shapes)
    rec_threads, rec_total = math.prod(block), math.prod(grid) * math.prod(block)
    for s in shapes:
        assert covers(s, grid, block), s
        assert 1 <= s.threads <= 1024
        if safety == "conservative":
            assert s.threads <= rec_threads
            assert s.grid.total() * s.threads == rec_total  # exact: no extra threads
        if safety == "balanced" and s.key != shapes[0].key:
            assert s.threads % 32 == 0 and s.grid.total() * s.threads <= 2 * rec_total
        if safety != "aggressive":
            assert all(sb == b for sb, b in zip(s.block, block) if b == 1)  # unspanned dims stay


def test_safety_levels_widen_the_search():
    sizes = {s: len(launch_candidates(dim3(4096), dim3(256), 0, s)) for s in LAUNCH_SAFETY}
    assert sizes["conservative"] < sizes["balanced"] < sizes["aggressive"]
    keys = {s.key for s in launch_candidates(dim3(4096), dim3(256), 0, "balanced")}
    assert {"32x1x1", "64x1x1", "128x1x1", "512x1x1", "768x1x1", "1024x1x1"} <= keys
    rows = {s.key for s in launch_candidates(dim3(10, 1000, 1), dim3(100, 1, 1), 0, "aggressive")}
    assert any(parse_shape(k).y > 1 for k in rows)  # reshapes the grid's row dimension into the block


def test_shared_memory_scales_up_with_the_block_and_never_down():
    shapes = {s.key: s for s in launch_candidates(dim3(1024), dim3(128), 512, "balanced")}
    assert shapes["128x1x1"].shared_mem == 512
    assert shapes["256x1x1"].shared_mem == 1024
    assert shapes["64x1x1"].shared_mem == 512


def test_unknown_launch_safety_lists_choices():
    with pytest.raises(ConfigurationError, match="conservative, balanced, aggressive"):
        launch_candidates(dim3(8), dim3(32), 0, "reckless")


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds_and_derives_valid_configurations(name):
    space = preset_space(name, ctx_for())
    dims = space.dimensions()
    assert dims and space.name == name
    d = space.describe()
    assert d["name"] == name and set(d["dimensions"]) == set(dims)
    import random

    rng = random.Random(0)
    for _ in range(30):
        params = space.sample_random(rng)
        config, reasons = space.check(params)
        assert not reasons and config.is_valid()
        assert covers(config, (4096, 1, 1), (256, 1, 1))


def test_launch_preset_enumerates_exactly_the_candidates():
    ctx = ctx_for()
    space = preset_space("launch", ctx)
    configs = [space.derived(p) for p, _ in space.sample_exhaustive()]
    expected = launch_candidates(ctx.baseline.grid, ctx.baseline.block, 0, "balanced")
    assert len(configs) == len(expected) == space.size()
    assert {shape_key(c.block) for c in configs} == {s.key for s in expected}
    assert all(c.passes == "default<O3>" for c in configs)


def test_compiler_preset_keeps_the_launch_and_rejects_bounds_below_the_block():
    space = preset_space("compiler", ctx_for(block=(256, 1, 1), pipelines=["instcombine,sroa"]))
    dims = space.dimensions()
    assert set(dims) == {"passes", "codegen_opt", "specialize", "specialize_dims", "set_launch_bounds", "max_threads",
                         "min_blocks_per_sm", "unroll", "max_regs", "dlcm", "expensive_opts", "inline_threshold",
                         "vectorize", "fma", "fast_math", "ptxas_opt"}
    assert set(DEFAULT_PIPELINES) | {"instcombine,sroa"} == set(dims["passes"].values())
    assert dims["max_threads"].low == 256 and dims["max_threads"].high == 1024
    params = {"passes": "default<O2>", "codegen_opt": 1, "specialize": True, "specialize_dims": False,
              "set_launch_bounds": True, "max_threads": 512, "min_blocks_per_sm": 3}
    config, reasons = space.check(params)
    assert not reasons and config.block == dim3(256) and config.grid == dim3(4096)
    assert (config.max_threads, config.min_blocks_per_sm, config.codegen_opt) == (512, 3, 1)
    off = space.derived(dict(params, set_launch_bounds=False))
    assert (off.max_threads, off.min_blocks_per_sm) == (0, 0)  # grounded: the same code hashes the same
    narrow = preset_space("compiler", ctx_for(block=(64, 1, 1)))
    _, reasons = narrow.check(dict(params, max_threads=32))
    assert any("max_threads=32 is below" in r for r in reasons)


def test_specialization_is_fixed_off_when_no_argument_can_be_specialized():
    space = preset_space("standard", ctx_for(specializable=False))
    assert space.dimensions()["specialize"].size() == 1
    assert preset_space("standard", ctx_for()).dimensions()["specialize"].size() == 2


def test_standard_sets_launch_bounds_to_the_block_and_full_scales_them():
    std = preset_space("standard", ctx_for())
    c = std.derived({"launch": "512x1x1", "passes": "default<O3>", "specialize": False, "specialize_dims": True,
                     "set_launch_bounds": True, "min_blocks_per_sm": 2})
    assert (c.max_threads, c.min_blocks_per_sm, c.specialize_dims) == (512, 2, True)
    full = preset_space("full", ctx_for())
    c = full.derived({"launch": "128x1x1", "passes": "default<O3>", "codegen_opt": 3, "specialize": False,
                      "specialize_dims": False, "set_launch_bounds": True, "bounds_slack": 4, "min_blocks_per_sm": 1})
    assert c.max_threads == 512


def test_banned_shapes_are_rejected_without_running():
    space = preset_space("launch", ctx_for())
    bad = space.derived({"launch": "1024x1x1"})
    assert space.ban(bad) == "1024x1x1"
    _, reasons = space.check({"launch": "1024x1x1"})
    assert reasons and "banned" in reasons[0]
    assert all(p["launch"] != "1024x1x1" for p, _ in space.sample_exhaustive())
    assert not space.check({"launch": "256x1x1"})[1]


def test_fingerprint_changes_with_what_the_space_searches():
    a = preset_space("launch", ctx_for()).fingerprint()
    assert a == preset_space("launch", ctx_for()).fingerprint()
    assert a != preset_space("launch", ctx_for(safety="aggressive")).fingerprint()
    assert a != preset_space("launch", ctx_for(grid=(2048, 1, 1))).fingerprint()
    assert a != preset_space("quick", ctx_for()).fingerprint()


def test_unknown_preset_lists_the_choices():
    with pytest.raises(ConfigurationError) as e:
        preset_space("fastest", ctx_for())
    for name in PRESETS:
        assert name in str(e.value)


class TileSpace(SearchSpace):
    """A user space: tile sizes whose product must stay within a budget given by --space-arg."""

    name = "tiles"

    def __init__(self, ctx, budget=256, unroll=False):
        super().__init__()
        self.ctx, self.budget, self.unroll = ctx, int(budget), bool(unroll)

    def dimensions(self):
        return {"tx": IntRangeParam("tx", 8, 64, 8), "ty": IntRangeParam("ty", 1, 16), "o": CategoricalParam("o", [2, 3])}

    def derived(self, params):
        c = ExperimentConfiguration(grid=dim3(1), block=dim3(params["tx"], params["ty"]))
        c.passes = f"default<O{params['o']}>"
        return c

    def constraints(self, params):
        threads = params["tx"] * params["ty"]
        return True if threads <= self.budget else [f"{threads} threads exceed the budget {self.budget}"]


def test_user_space_from_module_with_space_args():
    args = parse_space_args(["budget=128", "unroll=true"])
    assert args == {"budget": 128, "unroll": True}
    spec = f"{__name__}:TileSpace"
    assert load_space_class(spec) is TileSpace
    space = build_user_space(spec, ctx_for(), args)
    assert space.budget == 128 and space.unroll is True
    points = list(space.sample_exhaustive())
    assert points and all(p["tx"] * p["ty"] <= 128 for p, _ in points)
    _, reasons = space.check({"tx": 64, "ty": 16, "o": 2})
    assert reasons == ["1024 threads exceed the budget 128"]
    with pytest.raises(ConfigurationError, match="MODULE:CLASS"):
        load_space_class("no_colon_here")
    with pytest.raises(ConfigurationError, match="cannot import"):
        load_space_class("no_such_module_xyz:Space")
    with pytest.raises(ConfigurationError, match="not a mneme.tune.SearchSpace"):
        load_space_class(f"{__name__}:ctx_for")
    with pytest.raises(ConfigurationError, match="KEY=VALUE"):
        parse_space_args(["novalue"])


def test_exhaustive_count_is_the_product_minus_rejected_points():
    space = build_user_space(f"{__name__}:TileSpace", ctx_for(), {"budget": 10_000})
    assert space.size() == 8 * 16 * 2 == len(list(space.sample_exhaustive()))
    tight = build_user_space(f"{__name__}:TileSpace", ctx_for(), {"budget": 64})
    expected = sum(1 for tx in range(8, 65, 8) for ty in range(1, 17) if tx * ty <= 64) * 2
    assert len(list(tight.sample_exhaustive())) == expected
