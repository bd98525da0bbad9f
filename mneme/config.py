"""The replay configuration, the measurement settings and the experiment result.

These dataclasses are the one source of truth for what an experiment is: the CLI flags, the Hydra
structured configs and the tuner's search spaces all map onto them. This module imports nothing of
the project so that every layer can depend on it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Dict, List, Optional

#: Hardware limits of sm_70..sm_90 GPUs; `is_valid` checks against them unless told otherwise.
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)
#: Largest dynamic shared memory a block may opt into on sm_90 (227 KiB).
MAX_SHARED_MEM_SM90 = 232448

CODEGEN_METHODS = ("serial", "parallel")
#: the context limits the recorder records per instance and replay sets again, by name -> CUlimit value
CONTEXT_LIMITS = {"stack_size": 0, "printf_fifo_size": 1, "malloc_heap_size": 2, "dev_runtime_sync_depth": 3,
                  "dev_runtime_pending_launch_count": 4}

#: The one status every experiment ends in (see docs/USAGE.md for the exit codes of `mneme tune`).
STATUSES = (
    "verified",
    "failed_verification",
    "invalid_config",
    "invalid_launch",
    "compile_error",
    "runtime_error",
    "timeout",
)


@dataclass
class dim3:
    """CUDA launch dimensions."""

    x: int = 1
    y: int = 1
    z: int = 1

    def to_dict(self) -> Dict[str, int]:
        return {"x": int(self.x), "y": int(self.y), "z": int(self.z)}

    @classmethod
    def from_dict(cls, data: Any) -> "dim3":
        if isinstance(data, dim3):
            return dim3(data.x, data.y, data.z)
        if isinstance(data, (list, tuple)):
            return cls(*[int(v) for v in data])
        return cls(int(data.get("x", 1)), int(data.get("y", 1)), int(data.get("z", 1)))

    def total(self) -> int:
        return int(self.x) * int(self.y) * int(self.z)

    def __iter__(self):
        return iter((self.x, self.y, self.z))

    def __str__(self) -> str:
        return f"({self.x},{self.y},{self.z})"


def _stable_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class ExperimentConfiguration:
    """How one recorded kernel instance is recompiled and launched (the seeds' replay configuration)."""

    grid: dim3 = field(default_factory=dim3)
    block: dim3 = field(default_factory=dim3)
    shared_mem: int = 0
    specialize: bool = False
    set_launch_bounds: bool = False
    max_threads: int = 1024
    min_blocks_per_sm: int = 1
    specialize_dims: bool = False
    passes: str = "default<O3>"
    codegen_opt: int = 3
    codegen_method: str = "serial"
    prune: bool = True
    internalize: bool = True
    # code knobs (mneme/ir/knobs.py says how each reaches the code); at their defaults they change nothing
    #: 0: the compiler decides; 1: no unrolling; n: llvm.loop.unroll.count n on every loop without a pragma
    unroll: int = 0
    #: the inliner's threshold in the default<...> pipelines (0: LLVM's)
    inline_threshold: int = 0
    #: loop and SLP vectorization in the default<...> pipelines
    vectorize: bool = True
    #: floating-point contraction into FMA (LLVM's `contract`, ptxas --fmad)
    fma: bool = True
    #: fast-math flags on every floating-point instruction and flush-to-zero (results round differently)
    fast_math: bool = False
    #: ptxas -O level (-1: codegen_opt)
    ptxas_opt: int = -1
    #: ptxas --maxrregcount (0: no limit)
    max_regs: int = 0
    #: ptxas -dlcm (default load cache: '', 'ca', 'cg', 'cs')
    dlcm: str = ""
    #: ptxas --allow-expensive-optimizations true
    expensive_opts: bool = False
    #: one whole program for ptxas (False: `ptxas -c` and a device link, as a -fgpu-rdc/-rdc=true app is built)
    whole_program: bool = True
    #: IEEE single-precision division (False: div.approx, as nvcc --prec-div=false / --use_fast_math build it)
    prec_div: bool = True
    #: IEEE sqrtf (sqrt.rn, nvcc's default); False: sqrt.approx, clang's default
    prec_sqrt: bool = False
    #: every floating-point add, sub and mul may contract into FMA at code generation, as clang's
    #: -ffp-contract=fast (CUDA's default, nvcc --fmad=true) makes the backend do; False: only those whose IR allows it
    contract_all: bool = False
    #: inline the functions other translation units define (False: they stay calls, as in a separately compiled
    #: -rdc app; the record lists them, OtherUnitFunctions)
    cross_unit_inline: bool = True

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "ExperimentConfiguration":
        data = dict(data)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise KeyError(f"unknown replay configuration field(s) {unknown}; valid: {sorted(known)}")
        grid = dim3.from_dict(data.pop("grid", {}))
        block = dim3.from_dict(data.pop("block", {}))
        return cls(grid=grid, block=block, **data)

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["grid"] = self.grid.to_dict()
        d["block"] = self.block.to_dict()
        return d

    def ground(self) -> "ExperimentConfiguration":
        """Zero the launch-bounds knobs when launch bounds are off, so equal configurations hash equally."""
        if not self.set_launch_bounds:
            self.max_threads = 0
            self.min_blocks_per_sm = 0
        return self

    def grounded(self) -> "ExperimentConfiguration":
        return replace(self, grid=dim3.from_dict(self.grid), block=dim3.from_dict(self.block)).ground()

    def hash(self) -> str:
        """Stable SHA-256 over the sorted JSON of the grounded configuration (code knobs at their defaults are
        left out, so configurations written before the knobs existed keep their hashes)."""
        d = self.grounded().to_dict()
        for k, v in KNOB_DEFAULTS.items():
            if d.get(k) == v:
                d.pop(k, None)
        return _stable_hash(d)

    def problems(self, max_shared_mem: int = MAX_SHARED_MEM_SM90) -> List[str]:
        """Every reason this configuration cannot run, each phrased so the user knows what to change."""
        out: List[str] = []
        for name, d, lim in (("grid", self.grid, MAX_GRID_DIM), ("block", self.block, MAX_BLOCK_DIM)):
            for axis, v, hi in zip("xyz", d, lim):
                if int(v) < 1:
                    out.append(f"{name}.{axis}={v} must be at least 1")
                elif int(v) > hi:
                    out.append(f"{name}.{axis}={v} exceeds the limit {hi}")
        threads = self.block.total()
        if threads > MAX_THREADS_PER_BLOCK:
            out.append(f"block has {threads} threads; at most {MAX_THREADS_PER_BLOCK} are allowed")
        if self.shared_mem < 0:
            out.append(f"shared_mem={self.shared_mem} must not be negative")
        elif self.shared_mem > max_shared_mem:
            out.append(f"shared_mem={self.shared_mem} exceeds the device limit of {max_shared_mem} bytes")
        if self.set_launch_bounds:
            if self.max_threads < threads:
                out.append(
                    f"max_threads={self.max_threads} is below the block's {threads} threads "
                    "(launch bounds need max_threads >= block.x*block.y*block.z)"
                )
            if self.max_threads > MAX_THREADS_PER_BLOCK:
                out.append(f"max_threads={self.max_threads} exceeds {MAX_THREADS_PER_BLOCK}")
            if self.min_blocks_per_sm < 0:
                out.append(f"min_blocks_per_sm={self.min_blocks_per_sm} must not be negative")
        if not 0 <= self.codegen_opt <= 3:
            out.append(f"codegen_opt={self.codegen_opt} must be 0..3")
        if self.codegen_method not in CODEGEN_METHODS:
            out.append(f"codegen_method={self.codegen_method!r} must be one of {list(CODEGEN_METHODS)}")
        if not self.passes or not str(self.passes).strip():
            out.append("passes must name a pipeline, e.g. 'default<O3>'")
        if not 0 <= int(self.unroll) <= 64:
            out.append(f"unroll={self.unroll} must be 0 (compiler decides), 1 (no unrolling) or 2..64")
        if not 0 <= int(self.inline_threshold) <= 255:
            out.append(f"inline_threshold={self.inline_threshold} must be 0 (LLVM's default) .. 255")
        if not -1 <= int(self.ptxas_opt) <= 3:
            out.append(f"ptxas_opt={self.ptxas_opt} must be -1 (same as codegen_opt) or 0..3")
        if self.max_regs and not 16 <= int(self.max_regs) <= 255:
            out.append(f"max_regs={self.max_regs} must be 0 (no limit) or 16..255")
        if self.dlcm not in ("", "ca", "cg", "cs"):
            out.append(f"dlcm={self.dlcm!r} must be '', 'ca', 'cg' or 'cs'")
        return out

    def is_valid(self, max_shared_mem: int = MAX_SHARED_MEM_SM90) -> bool:
        return not self.problems(max_shared_mem)


#: the code knobs and their neutral values (see ExperimentConfiguration.hash)
KNOB_DEFAULTS = {"unroll": 0, "inline_threshold": 0, "vectorize": True, "fma": True, "fast_math": False,
                 "ptxas_opt": -1, "max_regs": 0, "dlcm": "", "expensive_opts": False, "whole_program": True,
                 "prec_div": True, "prec_sqrt": False, "contract_all": False,
                 "cross_unit_inline": True}


@dataclass
class MeasurementSettings:
    """How a configuration is measured; none of it changes the configuration hash."""

    iterations: int = 10
    warmup: int = 2
    l2_flush: bool = False
    #: before every timed run, all of the kernel's recorded memory is rewritten from replay's device copy (device
    #: to device), as a producer in the app leaves a kernel's inputs (a cudaMemcpy or the kernel before it:
    #: recently written, the last of it in L2); without it only the bytes the kernel writes are restored and
    #: each run finds what the previous one read (docs/BENCHMARKS.md, "Apply": simpleCudaGraphs' reduce)
    rewrite_inputs: bool = False
    atol: Optional[float] = None
    rtol: Optional[float] = None
    #: element type the replay-time tolerances apply to (f32, f64, f16, bf16, i32, i64, u8 ...)
    tol_type: str = "f32"
    #: target arch such as sm_90; None means the recorded one
    arch: Optional[str] = None
    #: seconds before a hung kernel is stopped by the watchdog
    timeout: float = 60.0
    #: verification (docs/VERIFY.md): replays of the recorded configuration that learn which bytes vary
    #: between identical runs (0: none; everything not annotated is compared with the recorded epilogue
    #: exactly); those bytes are then compared with (1 + verify_margin) * the observed spread, or skipped
    #: when replay shows they are scratch
    verify_runs: int = 0
    verify_margin: float = 3.0
    #: relative tolerance for float buffers (element type from the IR): outputs that only round
    #: differently under other compile settings (fast-math, FMA contraction)
    float_rtol: Optional[float] = None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "MeasurementSettings":
        return cls(**dict(data))


@dataclass
class ExperimentResult:
    """What one experiment measured; `to_dict`/`from_dict` round-trip through JSON."""

    preprocess_ir_time: float = 0.0
    opt_time: float = 0.0
    codegen_time: float = 0.0
    ptx_time: float = 0.0
    cubin_time: float = 0.0
    obj_size: int = 0
    exec_time: List[int] = field(default_factory=list)
    verified: bool = False
    executed: bool = False
    failed: bool = False
    error: str = ""
    status: str = ""
    start_time: str = ""
    end_time: str = ""
    gpu_id: int = 0
    gpu_name: str = ""
    const_mem_usage: int = 0
    local_mem_usage: int = 0
    shared_mem_usage: int = 0
    reg_usage: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_size: int = 0
    occupancy: float = 0.0
    config_hash: str = ""
    code_hash: str = ""
    fidelity: float = 0.0
    cache_hit: bool = False
    #: verification: the largest errors seen on float buffers (tolerant checks; differing elements on a
    #: failure) and, per buffer, how it was compared (mneme.record.verification.Verdict)
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    verification: str = ""
    #: instructions in the kernel's PTX (what a knob changed in the code, next to registers and spills)
    ptx_instructions: int = 0
    #: SHA-256 of the cubin's code sections (mneme.ir.codegen.binary_digest)
    binary_digest: str = ""
    #: config hash of the trial whose run this result reuses: its binary and launch were identical
    same_binary_as: str = ""

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "ExperimentResult":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def median_ns(self) -> Optional[float]:
        if not self.exec_time:
            return None
        s = sorted(self.exec_time)
        n = len(s)
        return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0
