"""The LLVM IR layer (llvmlite 0.50 = LLVM 22, nvJitLink): everything between recorded bitcode and a
cubin with its resource usage. Needs no GPU.

    link_modules -> [specialize_*] -> optimize -> emit_ptx -> link_cubin      (step by step)
    compile_kernel(linked, kernel, config, arch, static_hash, arg_values)   (all of it, cached)
"""

from mneme.ir.codegen import CubinResult, codegen, emit_ptx, link_cubin, parse_info_log
from mneme.ir.compile import CompileCache, CompiledKernel, compile_kernel, config_specialization, default_cache
from mneme.ir.hashing import canonical_ir, code_hash, static_hash
from mneme.ir.link import (
    GlobalVar,
    extract_kernel_closure,
    internalize,
    link_modules,
    module_globals,
    prune,
    undefined_symbols,
)
from mneme.ir.module import demangle, kernel_function, module_kernels, new_context, parse_module
from mneme.ir.params import PARAM_KINDS, ParamInfo, arg_names, canonical_value, kernel_params
from mneme.ir.pipeline import Pipeline, available_passes, optimize, parse_pipeline
from mneme.ir.specialize import (
    Specialization,
    make_specialization,
    set_launch_bounds,
    specialize,
    specialize_args,
    specialize_dims,
    specialize_dims_assume,
)
from mneme.ir.target import DEFAULT_PTX, target_machine

__all__ = [
    "CompileCache",
    "CompiledKernel",
    "CubinResult",
    "DEFAULT_PTX",
    "GlobalVar",
    "PARAM_KINDS",
    "ParamInfo",
    "Pipeline",
    "Specialization",
    "arg_names",
    "available_passes",
    "canonical_ir",
    "canonical_value",
    "code_hash",
    "codegen",
    "compile_kernel",
    "config_specialization",
    "default_cache",
    "demangle",
    "emit_ptx",
    "extract_kernel_closure",
    "internalize",
    "kernel_function",
    "kernel_params",
    "link_cubin",
    "link_modules",
    "make_specialization",
    "module_globals",
    "module_kernels",
    "new_context",
    "optimize",
    "parse_info_log",
    "parse_module",
    "parse_pipeline",
    "prune",
    "set_launch_bounds",
    "specialize",
    "specialize_args",
    "specialize_dims",
    "specialize_dims_assume",
    "static_hash",
    "target_machine",
    "undefined_symbols",
]
