"""Run names a person can read in MLflow's run list: the kernel and the knobs that differ from the baseline.

`vecAdd b128 O2 spec #12` is trial 12 of vecAdd at block 128, pipeline default<O2>, scalar arguments
specialized; `vecAdd baseline` is the recorded configuration. Pure functions, no MLflow import.
"""

from __future__ import annotations

import re
from typing import List, Optional

from mneme.config import ExperimentConfiguration, dim3

MAX_NAME = 120


def short_kernel(name: str) -> str:
    """`vecAdd(float const*, float*, int)` -> `vecAdd`; `void ns::k<128>(float*)` -> `ns::k<128>`."""
    if not name:
        return "kernel"
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the first '(' outside template brackets starts the argument list
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            cut = i
            break
    head = name[:cut].strip()
    if " " in head and not head.endswith(">"):
        head = head.rsplit(" ", 1)[-1]  # a return type in front
    elif " " in head:
        head = re.sub(r"^(void|int|float|double|auto)\s+", "", head)
    return head or name


def _dim(d: dim3) -> str:
    return "x".join(str(v) for v in (d.x, d.y, d.z)[: 3 if d.z != 1 else 2 if d.y != 1 else 1])


def _passes(p: str) -> str:
    m = re.fullmatch(r"default<(O[0-3s z]+)>", p.strip())
    if m:
        return m.group(1).replace(" ", "")
    return p if len(p) <= 24 else p[:21] + "..."


def knobs(config: ExperimentConfiguration, baseline: Optional[ExperimentConfiguration]) -> List[str]:
    """Short labels of the settings of `config` that differ from `baseline` (all non-defaults without one)."""
    base = baseline or ExperimentConfiguration(grid=config.grid, block=config.block)
    out: List[str] = []
    if config.block.to_dict() != base.block.to_dict():
        out.append("b" + _dim(config.block))
    if config.grid.to_dict() != base.grid.to_dict():
        out.append("g" + _dim(config.grid))
    if config.shared_mem != base.shared_mem:
        out.append(f"smem{config.shared_mem}")
    if config.passes != base.passes:
        out.append(_passes(config.passes))
    if config.codegen_opt != base.codegen_opt:
        out.append(f"cg{config.codegen_opt}")
    if config.codegen_method != base.codegen_method:
        out.append(config.codegen_method)
    if config.specialize != base.specialize:
        out.append("spec" if config.specialize else "nospec")
    if config.specialize_dims != base.specialize_dims:
        out.append("dims" if config.specialize_dims else "nodims")
    if config.set_launch_bounds and (not base.set_launch_bounds or (config.max_threads, config.min_blocks_per_sm)
                                     != (base.max_threads, base.min_blocks_per_sm)):
        out.append(f"lb{config.max_threads},{config.min_blocks_per_sm}")
    elif base.set_launch_bounds and not config.set_launch_bounds:
        out.append("nolb")
    return out


def run_name(kernel: str, config: Optional[ExperimentConfiguration], baseline: Optional[ExperimentConfiguration],
             number: Optional[int] = None, role: str = "trial") -> str:
    """`KERNEL KNOBS... #N` for a trial, `KERNEL baseline` for the baseline, cut to MAX_NAME characters."""
    k = short_kernel(kernel)
    if role == "baseline":
        return f"{k} baseline"
    parts = knobs(config, baseline) if config is not None else []
    name = " ".join([k] + (parts or ["as recorded"]))
    if number is not None and number >= 0:
        name += f" #{number}"
    return name if len(name) <= MAX_NAME else name[: MAX_NAME - 3] + "..."
