"""Which launches a tuned configuration applies to, and the manifest libapply reads (docs/APPLY.md).

Every decision is made here; native/apply/apply.c only compares what the manifest tells it to:

- rule ``exact`` (default): the launch has the recorded grid, block and dynamic shared memory and the same
  bytes in every argument byte the dynamic hash covers (all but the pointer and padding bytes the recorder
  masked): it is the tuned instance. It gets the tuned grid, block and shared memory.
- rule ``scaled``: other problem sizes. The launch must have the recorded block and shared memory and, when
  the configuration specialized arguments, the recorded values of those arguments; its grid is recomputed
  from its own work as the tuner derives grids (mneme/tune/launch.py): ``work = grid * recorded block``,
  ``grid' = ceil(work / tuned block)``, per dimension. Refused (with the reason) for configurations that
  bake the launch dimensions into the code (specialize_dims) or whose grid is not the one that covers the
  recorded work; under launch safety ``conservative`` only launches whose work the tuned block divides.

A launch no entry matches runs the original kernel, untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from mneme.config import MAX_GRID_DIM, ExperimentConfiguration, dim3

MANIFEST_VERSION = 1


@dataclass
class ArgMatch:
    """Bytes `hex` must be found at byte `offset` of parameter `index`."""

    index: int
    offset: int
    data: bytes


@dataclass
class Variable:
    name: str
    size: int
    readonly: bool  # __constant__: copied in before the launch, never back


@dataclass
class Entry:
    """One tuned kernel instance, as libapply will use it."""

    kernel: str
    cubin: str
    rule: str
    rec_grid: dim3
    rec_block: dim3
    rec_shared: int
    tuned: ExperimentConfiguration
    round_up: bool = True
    param_sizes: List[int] = field(default_factory=list)
    param_offsets: List[int] = field(default_factory=list)  # in the parameter buffer (CU_LAUNCH_PARAM_BUFFER_POINTER)
    matches: List[ArgMatch] = field(default_factory=list)
    variables: List[Variable] = field(default_factory=list)
    pointers: List[Tuple[int, int]] = field(default_factory=list)  # (param, offset) of device addresses
    description: str = ""
    demangled: str = ""
    dynamic_hash: str = ""
    expected_speedup: Optional[float] = None


def covering_grid(work: Sequence[int], block: dim3) -> dim3:
    return dim3(*[max(1, -(-int(w) // int(b))) for w, b in zip(work, block)])


def scaled_refusal(config: ExperimentConfiguration, rec_grid: dim3, rec_block: dim3) -> Optional[str]:
    """Why `config` cannot serve other problem sizes (None: it can)."""
    if config.specialize_dims:
        return "the configuration bakes the launch dimensions into the code (specialize_dims)"
    work = [int(g) * int(b) for g, b in zip(rec_grid, rec_block)]
    if covering_grid(work, config.block).to_dict() != dim3.from_dict(config.grid).to_dict():
        return (f"its grid {config.grid} is not the one that covers the recorded work with block {config.block} "
                f"({covering_grid(work, config.block)})")
    return None


def scaled_grid(launch_grid: Sequence[int], rec_block: dim3, tuned_block: dim3, round_up: bool) -> Optional[dim3]:
    """The tuned grid of a launch with the recorded block (the same computation libapply does)."""
    work = [int(g) * int(b) for g, b in zip(launch_grid, rec_block)]
    if not round_up and any(w % int(b) for w, b in zip(work, tuned_block)):
        return None
    g = covering_grid(work, tuned_block)
    return None if any(v > hi for v, hi in zip(g, MAX_GRID_DIM)) else g


def param_offsets(sizes: Sequence[int], aligns: Sequence[int]) -> List[int]:
    """Byte offsets of the parameters in the launch's parameter buffer (CUDA's layout: each aligned)."""
    out, pos = [], 0
    for size, align in zip(sizes, aligns):
        a = max(1, int(align))
        pos = (pos + a - 1) // a * a
        out.append(pos)
        pos += int(size)
    return out


def unmasked_segments(value: bytes, start: int, masked: Sequence[Tuple[int, int]]) -> List[Tuple[int, bytes]]:
    """(offset in the parameter, bytes) runs of `value` (at buffer offset `start`) outside the masked ranges."""
    keep = [True] * len(value)
    for off, n in masked:
        for b in range(max(off, start), min(off + n, start + len(value))):
            keep[b - start] = False
    out: List[Tuple[int, bytes]] = []
    i = 0
    while i < len(value):
        if not keep[i]:
            i += 1
            continue
        j = i
        while j < len(value) and keep[j]:
            j += 1
        out.append((i, value[i:j]))
        i = j
    return out


def describe(e: Entry) -> str:
    t = e.tuned
    if e.rule == "exact":
        return (f"exact instance {e.dynamic_hash}: grid {e.rec_grid} block {e.rec_block} shared {e.rec_shared} -> "
                f"grid {t.grid} block {t.block} shared {t.shared_mem}")
    spec = ""
    if e.matches:
        spec = f"; only where argument(s) {sorted({m.index for m in e.matches})} have the recorded values"
    cut = "rounded up" if e.round_up else "only where the tuned block divides the work"
    return (f"any launch with block {e.rec_block} and shared {e.rec_shared}: block {t.block}, grid recomputed "
            f"from the launch's work ({cut}){spec}")


def write_manifest(entries: List[Entry], path: Path) -> Path:
    """The line format native/apply/manifest.c reads (one entry per `entry` ... `end` block)."""
    lines = [f"mneme-apply-manifest {MANIFEST_VERSION}"]
    for i, e in enumerate(entries):
        t = e.tuned
        lines += [
            f"entry {i} {e.kernel}",
            f"cubin {e.cubin}",
            f"rule {e.rule}",
            "rec " + " ".join(str(int(v)) for v in (*e.rec_grid, *e.rec_block, e.rec_shared)),
            "tuned " + " ".join(str(int(v)) for v in (*t.grid, *t.block, t.shared_mem)),
            f"round_up {1 if e.round_up else 0}",
            "params " + " ".join(str(v) for v in [len(e.param_sizes), *[x for so in zip(e.param_sizes, e.param_offsets)
                                                                        for x in so]]),
        ]
        lines += [f"match {m.index} {m.offset} {m.data.hex()}" for m in e.matches]
        lines += [f"var {v.size} {1 if v.readonly else 0} {v.name}" for v in e.variables]
        lines += [f"ptr {p} {o}" for p, o in e.pointers]
        lines.append("end")
    path.write_text("\n".join(lines) + "\n")
    return path


def entries_by_kernel(entries: List[Entry]) -> Dict[str, List[Entry]]:
    out: Dict[str, List[Entry]] = {}
    for e in entries:
        out.setdefault(e.kernel, []).append(e)
    return out
