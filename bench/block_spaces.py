"""The block-shape spaces of the Kernel Tuner side by side (bench/bench_kernel_tuner.py), defined once for
both tools so that both search exactly the same configurations. Pure Python: the Kernel Tuner worker imports
it without importing mneme.

A space is Kernel Tuner's own vocabulary: `tune_params` (block_size_x/y/z and their values) and
`restrictions` (Python expressions over those names: Kernel Tuner's string restrictions). Kernel Tuner gets
them as they are; mneme gets bench/kt_space.py's BlockSpace, which reads the same definition. Both drop blocks
above the device's 1024 threads, and both cover the work with ceil(problem size / block) blocks per dimension.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

BLOCK_NAMES = ("block_size_x", "block_size_y", "block_size_z")
MAX_THREADS = 1024

Block = Tuple[int, int, int]


@dataclass(frozen=True)
class BlockSpaceDef:
    """The values of each block dimension a space varies, and the restrictions on their combination."""

    tune_params: Dict[str, List[int]]
    restrictions: List[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        unknown = [n for n in self.tune_params if n not in BLOCK_NAMES]
        if unknown:
            raise ValueError(f"block spaces vary only {', '.join(BLOCK_NAMES)}; got {unknown}")


def pow2(lo: int, hi: int) -> List[int]:
    """The powers of two from lo to hi."""
    return [1 << k for k in range(hi.bit_length()) if lo <= 1 << k <= hi]


#: vecAdd: every multiple of a warp up to 1024 (Kernel Tuner's own vector_add example space);
#: the 2-D stencil: every power-of-two (bx, by) pair of whole warps and at most 1024 threads.
SPACES: Dict[str, BlockSpaceDef] = {
    "vecadd": BlockSpaceDef({"block_size_x": [32 * i for i in range(1, 33)]}),
    "vecadd-quick": BlockSpaceDef({"block_size_x": pow2(32, 1024)}),
    "stencil2d": BlockSpaceDef(
        {"block_size_x": pow2(1, 1024), "block_size_y": pow2(1, 1024)},
        ["block_size_x * block_size_y >= 32", "block_size_x * block_size_y <= 1024"],
    ),
    "stencil2d-quick": BlockSpaceDef(
        {"block_size_x": pow2(8, 256), "block_size_y": pow2(1, 32)},
        ["block_size_x * block_size_y >= 64", "block_size_x * block_size_y <= 1024"],
    ),
}


def space_def(name: str) -> BlockSpaceDef:
    try:
        return SPACES[name]
    except KeyError:
        raise KeyError(f"unknown block space {name!r}; choose one of {', '.join(SPACES)}") from None


def broken_restrictions(restrictions: Sequence[str], params: Dict[str, Any]) -> List[str]:
    """The restrictions `params` breaks (each a Python expression over the parameter names)."""
    env: Dict[str, Any] = {n: 1 for n in BLOCK_NAMES}
    env.update(params)
    return [r for r in restrictions if not eval(r, {"__builtins__": {}}, env)]  # noqa: S307 - our own constants


def block_of(params: Dict[str, Any]) -> Block:
    """The block a sample (or a Kernel Tuner result) stands for; a dimension it does not name is 1."""
    x, y, z = (int(params.get(n, 1)) for n in BLOCK_NAMES)
    return x, y, z


def grid_for(problem: Sequence[int], block: Sequence[int]) -> Block:
    """Kernel Tuner's grid: ceil(problem size / block size) per dimension (a missing dimension is 1)."""
    p = list(problem) + [1] * (3 - len(problem))
    x, y, z = (max(1, -(-int(w) // int(b))) for w, b in zip(p, block))
    return x, y, z


def enumerate_blocks(space: BlockSpaceDef, max_threads: int = MAX_THREADS) -> List[Block]:
    """Every block the space holds, in product order: the reference both tools are checked against."""
    names = list(space.tune_params)
    out = []
    for values in itertools.product(*(space.tune_params[n] for n in names)):
        params = dict(zip(names, values))
        block = block_of(params)
        if block[0] * block[1] * block[2] <= max_threads and not broken_restrictions(space.restrictions, params):
            out.append(block)
    return out


def shape_text(block: Sequence[int]) -> str:
    """'256x1x1', the way mneme names block shapes."""
    return "x".join(str(int(v)) for v in block)
