"""Launch-geometry candidates derived from the recorded launch.

The recorded launch tells how much work each dimension holds: `work[d] = grid[d] * block[d]` threads. A
candidate keeps that work and changes how it is cut into blocks: the grid is recomputed as
`ceil(work[d] / block[d])`, so every recorded thread index still exists. Block sizes come from powers of two,
multiples and fractions of the recorded block, and divisors of the work.

How far a candidate may stray from the recording is the launch-safety level (`--launch-safety`):

- ``conservative``: the work is cut exactly (every block size divides the work, no extra threads), only the
  dimensions the recorded block spans (block > 1) change, and no block has more threads than the recorded one
  (the thread budget), so static shared arrays sized for the recorded block still fit; no block below a warp
  (unless the recorded one is). Safe for kernels without bounds checks.
- ``balanced`` (default): the grid may round up (kernels are expected to guard `if (i < n)`), only the
  dimensions the recorded block spans change, blocks are whole warps (a multiple of 32 threads, unless the
  work itself is smaller), at most 1024 threads per block, and at most twice the recorded total of threads.
- ``aggressive``: also reshapes dimensions the recorded block does not span (e.g. turns a grid of rows into
  2-D blocks), any thread count from 1 up to the hardware's 1024, no cap on extra threads.

Dynamic shared memory is kept as recorded, and scaled up in proportion when a block grows beyond the
recorded thread count (kernels that size shared memory per thread still get enough; it is never scaled down).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Set

from mneme.config import MAX_BLOCK_DIM, MAX_GRID_DIM, MAX_SHARED_MEM_SM90, MAX_THREADS_PER_BLOCK, dim3
from mneme.errors import ConfigurationError

WARP = 32


@dataclass(frozen=True)
class LaunchPolicy:
    """What one launch-safety level allows."""

    name: str
    exact: bool  # block sizes must divide the work (no extra threads)
    reshape_unspanned: bool  # may change dimensions where the recorded block is 1
    warp_multiple: bool  # threads per block a multiple of 32 (when the work allows)
    budget_recorded: bool  # thread budget = recorded threads per block (else the hardware limit)
    max_overshoot: Optional[float]  # launched threads / recorded threads, at most
    warp_floor: bool  # no block below a warp (or below the recorded block, if that is smaller)


LAUNCH_SAFETY: Dict[str, LaunchPolicy] = {
    "conservative": LaunchPolicy("conservative", True, False, False, True, 1.0, True),
    "balanced": LaunchPolicy("balanced", False, False, True, False, 2.0, True),
    "aggressive": LaunchPolicy("aggressive", False, True, False, False, None, False),
}


def launch_policy(name: str) -> LaunchPolicy:
    try:
        return LAUNCH_SAFETY[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown launch safety {name!r}; choose one of {', '.join(LAUNCH_SAFETY)}"
        ) from None


@dataclass(frozen=True)
class LaunchShape:
    """One candidate launch: block, the grid that covers the recorded work with it, and its shared memory."""

    block: dim3
    grid: dim3
    shared_mem: int

    @property
    def key(self) -> str:
        return shape_key(self.block)

    @property
    def threads(self) -> int:
        return self.block.total()


def shape_key(block: dim3) -> str:
    """The label of a block shape, e.g. '256x1x1' (also the key under which failed shapes are banned)."""
    return f"{int(block.x)}x{int(block.y)}x{int(block.z)}"


def parse_shape(key: str) -> dim3:
    try:
        x, y, z = (int(v) for v in key.split("x"))
    except ValueError:
        raise ConfigurationError(f"{key!r} is not a block shape like '256x1x1'") from None
    return dim3(x, y, z)


def divisors(n: int, limit: int) -> List[int]:
    """Divisors of n that are at most limit, ascending."""
    small, large = [], []
    for i in range(1, int(math.isqrt(n)) + 1):
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
    return [d for d in small + large[::-1] if d <= limit]


def _axis_values(recorded: int, work: int, limit: int, exact: bool) -> Set[int]:
    """Block sizes worth trying along one axis."""
    out: Set[int] = {recorded}
    p = 1
    while p <= limit:
        out.add(p)
        p *= 2
    for k in (2, 3, 4, 8):
        out.add(recorded * k)
    for k in (2, 3, 4, 8, 16):
        if recorded % k == 0:
            out.add(recorded // k)
    out.update(divisors(work, limit))
    cap = limit if exact else min(limit, 1 << max(0, (work - 1).bit_length()))
    return {v for v in out if 1 <= v <= cap and (not exact or work % v == 0)}


def launch_candidates(
    grid: dim3, block: dim3, shared_mem: int = 0, safety: str = "balanced", max_candidates: int = 128,
    max_shared_mem: int = MAX_SHARED_MEM_SM90, allow: Optional[Callable[[dim3], bool]] = None,
) -> List[LaunchShape]:
    """Candidate launches for the recorded geometry, nearest to the recorded block first (which is always
    included), at most `max_candidates` of them. `allow(block)` drops the blocks the kernel's code cannot run
    (mneme.ir.launchsafety's rules) before the list is cut."""
    policy = launch_policy(safety)
    rec_threads = block.total()
    rec_total = grid.total() * rec_threads
    work = [int(g) * int(b) for g, b in zip(grid, block)]
    budget = min(rec_threads, MAX_THREADS_PER_BLOCK) if policy.budget_recorded else MAX_THREADS_PER_BLOCK
    axes: List[List[int]] = []
    for d, (b, w) in enumerate(zip(block, work)):
        varies = (b > 1) or (policy.reshape_unspanned and w > 1)
        if not varies:
            axes.append([int(b)])
            continue
        axes.append(sorted(_axis_values(int(b), w, min(MAX_BLOCK_DIM[d], budget), policy.exact)))

    recorded = _shape(block, work, shared_mem, rec_threads, max_shared_mem)
    shapes: Dict[str, LaunchShape] = {recorded.key: recorded}
    for bx in axes[0]:
        for by in axes[1]:
            if bx * by > budget:
                break
            for bz in axes[2]:
                threads = bx * by * bz
                if threads > budget:
                    break
                if policy.warp_multiple and threads % WARP and rec_total >= WARP:
                    continue
                if policy.warp_floor and threads < min(WARP, rec_threads):
                    continue
                s = _shape(dim3(bx, by, bz), work, shared_mem, rec_threads, max_shared_mem)
                if s is None or (allow is not None and not allow(s.block)):
                    continue
                launched = s.grid.total() * threads
                if policy.max_overshoot is not None and launched > policy.max_overshoot * rec_total:
                    continue
                shapes.setdefault(s.key, s)

    def distance(s: LaunchShape):
        return (
            abs(math.log2(s.threads) - math.log2(max(rec_threads, 1))),
            sum(abs(math.log2(a) - math.log2(max(b, 1))) for a, b in zip(s.block, block)),
            s.key,
        )

    ordered = sorted(shapes.values(), key=distance)
    return ordered[: max(1, max_candidates)]


def _shape(block: dim3, work: Iterable[int], shared_mem: int, rec_threads: int, max_shared_mem: int):
    grid = dim3(*[max(1, -(-w // b)) for w, b in zip(work, block)])
    if any(g > hi for g, hi in zip(grid, MAX_GRID_DIM)):
        return None
    threads = block.total()
    shm = int(shared_mem)
    if shm and threads > rec_threads:
        shm = -(-shm * threads // rec_threads)
        if shm > max_shared_mem:
            return None
    return LaunchShape(block=block, grid=grid, shared_mem=shm)
