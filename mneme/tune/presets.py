"""The built-in search spaces (`--space NAME`).

- ``quick``: a few block sizes along the recorded block's main axis x {default<O3>, default<O2>}; a smoke test.
- ``launch``: every launch candidate of the recorded geometry (see mneme.tune.launch), compiled as the baseline is (the app's build).
- ``compiler``: the recorded launch; pipeline (the default ones and custom ones), codegen level 0-3,
  specialization of arguments and of launch dimensions, launch bounds with max-threads and min-blocks ranges,
  and every code knob (mneme/ir/knobs.py), FMA contraction and fast math included (these round differently:
  verified by tolerance).
- ``standard``: launch candidates with the compiler knobs that usually matter: O1-O3 (and custom pipelines),
  both specializations, launch bounds set to the block size with a min-blocks range, and the code knobs that
  keep results bit-exact: loop unroll count, ptxas register limit, default load caching, ptxas effort.
- ``full``: launch candidates and every compiler knob, including pipelines drawn pass by pass.

Parameter names are the replay-configuration field names they set, plus ``launch`` (a block shape key such as
``256x1x1``; the grid and shared memory follow from it), ``bounds_slack`` (launch-bound max threads as a
multiple of the block's threads) and, in every preset, ``code`` (app-build | mneme-defaults: the code the other
knobs apply over) where the baseline compiles the app's build and that differs from mneme's defaults.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Dict, List

from mneme.config import MAX_THREADS_PER_BLOCK, ExperimentConfiguration, dim3
from mneme.errors import ConfigurationError
from mneme.ir.appbuild import APP_BUILD, MNEME_CODE, MNEME_DEFAULTS
from mneme.tune.launch import LaunchShape, launch_candidates
from mneme.tune.params import (
    BaseParam,
    BoolParam,
    CategoricalParam,
    FixedParam,
    IntRangeParam,
    PipelineParam,
)
from mneme.tune.space import SearchSpace, SpaceContext

DEFAULT_PIPELINES = ["default<O3>", "default<O2>", "default<O1>", "default<O0>", "default<Os>", "default<Oz>"]
#: pass slots of a drawn pipeline in the `full` preset
FULL_DRAWS = 6
QUICK_SHAPES = 6

#: the field a sampled parameter sets directly
_DIRECT = ("passes", "codegen_opt", "specialize", "specialize_dims", "set_launch_bounds", "max_threads", "min_blocks_per_sm",
           "unroll", "inline_threshold", "vectorize", "fma", "fast_math", "ptxas_opt", "max_regs", "dlcm", "expensive_opts")
#: code knobs whose results round differently from the recorded build (verified by tolerance)
ROUNDING_KNOBS = ("fma", "fast_math")

UNROLLS = [0, 1, 2, 4, 8]
MAX_REGS = [0, 32, 64, 128]
DLCM = ["", "ca", "cg"]
INLINE = [0, 25, 100, 250]


def _code_knobs(all_of_them: bool) -> List[BaseParam]:
    """Code knobs that keep results bit-exact (unrolling, register limit, load caching, ptxas effort); with
    `all_of_them` also inlining, vectorization, FMA contraction, fast math and the ptxas level."""
    dims: List[BaseParam] = [
        CategoricalParam("unroll", UNROLLS),
        CategoricalParam("max_regs", MAX_REGS),
        CategoricalParam("dlcm", DLCM),
        BoolParam("expensive_opts"),
    ]
    if all_of_them:
        dims += [
            CategoricalParam("inline_threshold", INLINE),
            BoolParam("vectorize"),
            BoolParam("fma"),
            BoolParam("fast_math"),
            IntRangeParam("ptxas_opt", -1, 3),
        ]
    return dims


class PresetSpace(SearchSpace):
    """A space assembled from the recorded launch and a preset's knobs."""

    def __init__(self, ctx: SpaceContext, name: str, dims: Dict[str, BaseParam], shapes: List[LaunchShape]):
        super().__init__()
        self.ctx = ctx
        self.name = name
        self._dimensions = dims
        self.shapes = {s.key: s for s in shapes}

    def dimensions(self) -> Dict[str, BaseParam]:
        return dict(self._dimensions)

    def derived(self, params: Dict[str, Any]) -> ExperimentConfiguration:
        base = self.ctx.baseline
        cfg = replace(base, grid=dim3.from_dict(base.grid), block=dim3.from_dict(base.block))
        if params.get("code") == MNEME_DEFAULTS:  # mneme's own code as a point of the search (mneme.ir.appbuild)
            cfg = replace(cfg, **MNEME_CODE)
        if "launch" in params:
            shape = self.shapes[params["launch"]]
            cfg.block, cfg.grid, cfg.shared_mem = dim3.from_dict(shape.block), dim3.from_dict(shape.grid), shape.shared_mem
        for key in _DIRECT:
            if key in params:
                setattr(cfg, key, params[key])
        threads = cfg.block.total()
        if cfg.set_launch_bounds and "max_threads" not in params:
            cfg.max_threads = min(MAX_THREADS_PER_BLOCK, threads * int(params.get("bounds_slack", 1)))
        return cfg.ground()

    def extra_description(self) -> Dict[str, Any]:
        return {
            "baseline": self.ctx.baseline.to_dict(),
            "launch_safety": self.ctx.launch_safety,
            "launch_analysis": (None if self.ctx.launch_facts is None else
                                {"facts": self.ctx.launch_facts.describe(), "rules": self.ctx.launch_rules().describe()}),
            "launch": {
                k: {"block": s.block.to_dict(), "grid": s.grid.to_dict(), "shared_mem": s.shared_mem}
                for k, s in self.shapes.items()
            },
        }


def _shapes(ctx: SpaceContext) -> List[LaunchShape]:
    b = ctx.baseline
    return launch_candidates(b.grid, b.block, b.shared_mem, ctx.launch_safety, ctx.max_launch_candidates,
                             allow=ctx.allows_block())


def _main_axis_shapes(ctx: SpaceContext, n: int) -> List[LaunchShape]:
    """Shapes that differ from the recorded block only along its largest axis (nearest first)."""
    rec = list(ctx.baseline.block)
    axis = max(range(3), key=lambda d: rec[d])
    keep = [s for s in _shapes(ctx) if all(v == rec[d] for d, v in enumerate(s.block) if d != axis)]
    return keep[:n]


def _launch_param(shapes: List[LaunchShape]) -> BaseParam:
    keys = [s.key for s in shapes]
    return CategoricalParam("launch", keys) if len(keys) > 1 else FixedParam("launch", keys[0])


def _specialize(ctx: SpaceContext) -> BaseParam:
    return BoolParam("specialize") if ctx.specializable else FixedParam("specialize", False)


def _pipelines(ctx: SpaceContext, base: List[str]) -> List[str]:
    return list(dict.fromkeys(list(base) + list(ctx.pipelines)))


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def _quick(ctx: SpaceContext):
    shapes = _main_axis_shapes(ctx, QUICK_SHAPES)
    dims = [_launch_param(shapes), CategoricalParam("passes", _pipelines(ctx, ["default<O3>", "default<O2>"]))]
    return dims, shapes


def _launch(ctx: SpaceContext):
    shapes = _shapes(ctx)
    return [_launch_param(shapes)], shapes


def _compiler(ctx: SpaceContext):
    threads = ctx.baseline.block.total()
    lo = min(MAX_THREADS_PER_BLOCK, _round_up(max(threads, 1), 32))
    dims = [
        PipelineParam("passes", pipelines=_pipelines(ctx, DEFAULT_PIPELINES)),
        IntRangeParam("codegen_opt", 0, 3),
        _specialize(ctx),
        BoolParam("specialize_dims"),
        BoolParam("set_launch_bounds"),
        IntRangeParam("max_threads", lo, MAX_THREADS_PER_BLOCK, 32),
        IntRangeParam("min_blocks_per_sm", 1, 8),
        *_code_knobs(True),
    ]
    return dims, []


def _standard(ctx: SpaceContext):
    shapes = _shapes(ctx)
    dims = [
        _launch_param(shapes),
        CategoricalParam("passes", _pipelines(ctx, ["default<O3>", "default<O2>", "default<O1>"])),
        _specialize(ctx),
        BoolParam("specialize_dims"),
        BoolParam("set_launch_bounds"),
        IntRangeParam("min_blocks_per_sm", 1, 4),
        *_code_knobs(False),
    ]
    return dims, shapes


def _full(ctx: SpaceContext):
    shapes = _shapes(ctx)
    dims = [
        _launch_param(shapes),
        PipelineParam("passes", num_draws=FULL_DRAWS, pipelines=_pipelines(ctx, DEFAULT_PIPELINES)),
        IntRangeParam("codegen_opt", 0, 3),
        _specialize(ctx),
        BoolParam("specialize_dims"),
        BoolParam("set_launch_bounds"),
        CategoricalParam("bounds_slack", [1, 2, 4]),
        IntRangeParam("min_blocks_per_sm", 1, 8),
        *_code_knobs(True),
    ]
    return dims, shapes


PRESETS: Dict[str, Callable] = {
    "quick": _quick,
    "standard": _standard,
    "launch": _launch,
    "compiler": _compiler,
    "full": _full,
}

PRESET_HELP = {
    "quick": "a few block sizes x {O3, O2}: a smoke test",
    "standard": "launch candidates x O1-O3 x specialization x launch bounds",
    "launch": "launch candidates of the recorded geometry, compiled as the app was built",
    "compiler": "recorded launch; pipelines, codegen level, specialization, launch bounds",
    "full": "everything, including pipelines drawn pass by pass",
}


def preset_space(name: str, ctx: SpaceContext) -> PresetSpace:
    """The built-in space `name` for the kernel in `ctx`."""
    try:
        build = PRESETS[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown search space {name!r}; choose one of {', '.join(PRESETS)} (or --space-module MODULE:CLASS)"
        ) from None
    dims, shapes = build(ctx)
    code = code_param(ctx)
    if code is not None:
        dims.append(code)
    return PresetSpace(ctx, name, {p.name: p for p in dims}, shapes)


def code_param(ctx: SpaceContext):
    """`code` in {app-build, mneme-defaults} when the baseline compiles the app's build and that differs from
    mneme's defaults: the search keeps mneme's own code as a point (its knobs then apply over it)."""
    b = ctx.code
    if b is None or b.kind != APP_BUILD or not b.differs_from_mneme:
        return None
    return CategoricalParam("code", [APP_BUILD, MNEME_DEFAULTS])


def uses_pipelines(space: SearchSpace) -> bool:
    """Whether custom pipelines given by the user will be searched by this space."""
    p = space.dimensions().get("passes")
    return isinstance(p, (PipelineParam, CategoricalParam))
