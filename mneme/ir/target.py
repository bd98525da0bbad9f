"""The NVPTX target: target machines, pass builders and the arch a module was built for."""

from __future__ import annotations

import re
from typing import Optional, Tuple

import llvmlite.binding as llvm

from mneme.errors import CompileError
from mneme.ir.module import NVPTX_TRIPLE, _init_targets

#: PTX ISA used when the IR does not name one: what clang-22 emits, and CUDA 13.0's nvJitLink accepts it.
DEFAULT_PTX = 88

_ARCH = re.compile(r"sm_(\d+)[af]?\Z")
_TARGET_CPU = re.compile(r'"target-cpu"="([^"]*)"')
_PTX_FEATURE = re.compile(r"\+ptx(\d+)")


def check_arch(arch: str) -> str:
    if not _ARCH.match(arch or ""):
        raise CompileError(f"arch {arch!r} is not an NVIDIA GPU architecture such as 'sm_90' (set --arch)")
    return arch


def target_machine(arch: str = "sm_90", opt: int = 3, ptx: Optional[int] = None) -> llvm.TargetMachine:
    """An NVPTX target machine for `arch`; codegen level `opt` (0-3) and PTX ISA `ptx` (e.g. 88)."""
    _init_targets()
    check_arch(arch)
    if not 0 <= int(opt) <= 3:
        raise CompileError(f"codegen_opt={opt} must be 0..3")
    target = llvm.Target.from_triple(NVPTX_TRIPLE)
    return target.create_target_machine(cpu=arch, features=f"+ptx{ptx or DEFAULT_PTX}", opt=int(opt))


def pass_builder(tm: llvm.TargetMachine, speed_level: int = 0) -> llvm.PassBuilder:
    return llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=speed_level))


def function_attributes(fn: llvm.ValueRef) -> str:
    """A function's attributes as one string (llvmlite yields them as bytes, group by group)."""
    return " ".join(a.decode(errors="replace") for a in fn.attributes)


def function_target(fn: llvm.ValueRef) -> Tuple[Optional[str], Optional[int]]:
    """The (arch, PTX ISA) a function was compiled for, from its "target-cpu"/"target-features"."""
    attrs = function_attributes(fn)
    cpu = _TARGET_CPU.search(attrs)
    ptx = _PTX_FEATURE.search(attrs)
    return (cpu.group(1) if cpu else None, int(ptx.group(1)) if ptx else None)
