"""mneme's side of the Kernel Tuner side by side: a search space over the block shapes of a definition in
bench/block_spaces.py, for `mneme tune --space-module bench.kt_space:BlockSpace --space-arg space=NAME`.

The block comes from the sample; the grid covers the recorded work (grid * block per dimension, which is the
problem size Kernel Tuner is given) with ceil(work / block) blocks, as Kernel Tuner computes it. Everything
else stays as recorded (default<O3>, no specialization), so only the launch changes between trials.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Sequence, Tuple

from bench.block_spaces import block_of, broken_restrictions, grid_for, space_def
from mneme.config import ExperimentConfiguration, dim3
from mneme.errors import ConfigurationError
from mneme.tune.params import BaseParam, CategoricalParam
from mneme.tune.space import SearchSpace, SpaceContext


def problem_of(baseline: ExperimentConfiguration) -> Tuple[int, int, int]:
    """The recorded work per dimension (grid * block)."""
    x, y, z = (int(g) * int(b) for g, b in zip(dim3.from_dict(baseline.grid), dim3.from_dict(baseline.block)))
    return x, y, z


class BlockSpace(SearchSpace):
    """The block shapes of one shared definition, each launched over the recorded work."""

    def __init__(self, ctx: SpaceContext, space: str = "vecadd"):
        super().__init__()
        try:
            self.spec = space_def(space)
        except KeyError as e:
            raise ConfigurationError(f"--space-arg space={space}: {e.args[0]}") from None
        self.ctx = ctx
        self.space_name = space
        self.name = f"kt-{space}"
        self.problem = problem_of(ctx.baseline)

    def dimensions(self) -> Dict[str, BaseParam]:
        return {n: CategoricalParam(n, list(v)) for n, v in self.spec.tune_params.items()}

    def constraints(self, params: Dict[str, Any]) -> List[str]:
        return [f"restriction {r!r} does not hold" for r in broken_restrictions(self.spec.restrictions, params)]

    def derived(self, params: Dict[str, Any]) -> ExperimentConfiguration:
        block = block_of(params)
        return replace(self.ctx.baseline, block=dim3(*block), grid=dim3(*grid_for(self.problem, block))).ground()

    def extra_description(self) -> Dict[str, Any]:
        return {"block_space": self.space_name, "restrictions": list(self.spec.restrictions),
                "problem": list(self.problem), "baseline": self.ctx.baseline.to_dict()}

    def configurations(self) -> List[ExperimentConfiguration]:
        """The configurations exhaustive search runs, in its order (no GPU, no study)."""
        return [self.derived(p) for p, _ in self.sample_exhaustive()]


def context_for(grid: Sequence[int], block: Sequence[int]) -> SpaceContext:
    """A space context from a launch alone (a recorded launch at default<O3>, without its record)."""
    return SpaceContext(ExperimentConfiguration(grid=dim3(*grid), block=dim3(*block)).ground())
