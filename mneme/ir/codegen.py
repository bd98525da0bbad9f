"""NVPTX code generation (llvmlite) and PTX -> cubin with resource usage, without a GPU.

Two assemblers (ASSEMBLERS): `ptxas`, whole-program like the app's own build and the default wherever a
CUDA toolkit is found (see mneme/ir/ptxas.py for why), and nvJitLink, in-process, relocatable code
(MNEME_ASSEMBLER=nvjitlink, or the fallback without a toolkit).

nvJitLink's `-O` takes only 0 and 3; levels 1 and 2 reach ptxas as `-Xptxas=-O<n>`. Split
compilation (`-split-compile=<threads>`) is nvJitLink's parallel method; ptxas splits the work by
function, so a module with one kernel and no calls gains little from it. Resource usage is read
from the `-verbose` info log, whose register count equals `ptxas -c`'s.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import llvmlite.binding as llvm

from mneme.config import CODEGEN_METHODS
from mneme.errors import CompileError
from mneme.ir import ptxas
from mneme.ir.target import DEFAULT_PTX, check_arch, function_target, target_machine

ASSEMBLERS = ("ptxas", "nvjitlink")


def assembler() -> str:
    """The PTX -> cubin tool of this process: MNEME_ASSEMBLER, else ptxas when a toolkit has one, else nvJitLink."""
    chosen = os.environ.get("MNEME_ASSEMBLER", "").strip().lower()
    if chosen:
        if chosen not in ASSEMBLERS:
            raise CompileError(f"MNEME_ASSEMBLER={chosen!r} must be one of {list(ASSEMBLERS)}")
        return chosen
    return "ptxas" if ptxas.find_ptxas() else "nvjitlink"


def assembler_version(name: str) -> str:
    """`ptxas13.0.88` / `nvjitlink13.0`: part of the compile cache's toolchain tag."""
    if name == "ptxas":
        exe = ptxas.find_ptxas()
        return f"ptxas{ptxas.ptxas_version(exe) if exe else 'missing'}"
    from cuda.bindings import nvjitlink

    return "nvjitlink" + ".".join(map(str, nvjitlink.version()))


def module_ptx_version(mod: llvm.ModuleRef, kernel: Optional[str] = None) -> int:
    """The PTX ISA the IR asks for ("+ptx88" in the kernel's target features), DEFAULT_PTX if none."""
    fns = [mod.get_function(kernel)] if kernel else [f for f in mod.functions if not f.is_declaration]
    for fn in fns:
        _, ptx = function_target(fn)
        if ptx:
            return ptx
    return DEFAULT_PTX


def emit_ptx(mod: llvm.ModuleRef, arch: str = "sm_90", codegen_opt: int = 3, ptx: Optional[int] = None) -> str:
    """PTX for `mod`. Codegen runs IR passes on the module, so it changes `mod`: pass a clone to keep it."""
    tm = target_machine(arch, codegen_opt, ptx or module_ptx_version(mod))
    try:
        return tm.emit_assembly(mod)
    except RuntimeError as e:
        raise CompileError(f"NVPTX code generation for {arch} failed: {e}") from None


@dataclass
class CubinResult:
    """A linked cubin and the kernel resources nvJitLink reports (bytes, per thread where it applies).

    `local_mem` is all per-thread local memory, stack frame included (local arrays and spills live
    in the frame), which is what the driver reports as CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES;
    `const_mem` counts the user's __constant__ banks, `param_mem` bank 0 (parameters, driver data).
    """

    cubin: bytes
    size: int
    registers: int = 0
    local_mem: int = 0
    const_mem: int = 0
    param_mem: int = 0
    shared_mem: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    barriers: int = 0
    info_log: str = ""
    #: the same numbers for every entry function in the cubin
    functions: Optional[Dict[str, Dict[str, int]]] = None
    #: libraries linked in beside the PTX (["cudadevrt"] for device-side launches)
    libraries: Optional[List[str]] = None


_FUNC_HEADER = re.compile(r"^info\s*: Function properties for '([^']+)':\s*$")
_FUNC_PROPS = re.compile(
    r"used (\d+) registers, used (\d+) barriers, (\d+) stack, (\d+) bytes smem, (\d+) bytes cmem\[0\]"
    r"(?:, (\d+) bytes cmem\[[1-9]\d*\])*, (\d+) bytes lmem"
)
_PTXAS_PROPS = re.compile(r"^ptxas info\s*: Function properties for (\S+)\s*$")


def parse_info_log(log: str) -> Dict[str, Dict[str, int]]:
    """Per-function resources from nvJitLink's -verbose info log."""
    funcs: Dict[str, Dict[str, int]] = {}
    lines = log.splitlines()
    # module-wide lines ("info : 4 bytes gmem, 64 bytes cmem[3]") carry the __constant__ banks
    module_cmem = sum(
        int(n)
        for line in lines
        if line.startswith("info") and "registers" not in line and "Function" not in line
        for n in ptxas.USER_CMEM.findall(line)
    )
    for i, line in enumerate(lines):
        m = _FUNC_HEADER.match(line)
        if m and i + 1 < len(lines):
            p = _FUNC_PROPS.search(lines[i + 1])
            if p:
                user_cmem = sum(int(x) for x in ptxas.USER_CMEM.findall(lines[i + 1]))
                funcs.setdefault(m.group(1), {}).update(
                    registers=int(p.group(1)), barriers=int(p.group(2)), stack=int(p.group(3)),
                    shared_mem=int(p.group(4)), param_mem=int(p.group(5)),
                    local_mem=int(p.group(7)) + int(p.group(3)),
                    const_mem=user_cmem or module_cmem,
                )
        m = _PTXAS_PROPS.match(line)
        if m and i + 1 < len(lines):
            s = ptxas.SPILLS.search(lines[i + 1])
            if s:
                funcs.setdefault(m.group(1), {}).update(
                    stack_frame=int(s.group(1)), spill_stores=int(s.group(2)), spill_loads=int(s.group(3))
                )
    return funcs


_EXTERN_FUNC = re.compile(r"^\s*\.extern\s+\.func\s+(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$%]*)", re.M)


def devrt_symbols(ptx: str) -> List[str]:
    """The CUDA device runtime functions the PTX declares but does not define (`__cudaCDP2LaunchDevice`,
    `cudaGetParameterBufferV2`, `cudaDeviceSynchronize`, ...): device-side launches and stream calls, which
    only libcudadevrt defines. Non-empty means the cubin must be linked with it (dynamic parallelism)."""
    return sorted({n for n in _EXTERN_FUNC.findall(ptx) if n.startswith(("cuda", "__cuda"))})


def nvjitlink_options(arch: str, opt: int, method: str, threads: Optional[int] = None,
                      extra: Sequence[str] = ()) -> List[str]:
    check_arch(arch)
    if not 0 <= int(opt) <= 3:
        raise CompileError(f"codegen_opt={opt} must be 0..3")
    if method not in CODEGEN_METHODS:
        raise CompileError(f"codegen_method={method!r} must be one of {list(CODEGEN_METHODS)}")
    opts = [f"-arch={arch}", "-verbose"]
    opts.append(f"-O{opt}" if opt in (0, 3) else f"-Xptxas=-O{opt}")
    if method == "parallel":
        opts.append(f"-split-compile={threads or os.cpu_count() or 1}")
    opts += [f"-Xptxas={flag}" for flag in extra]
    return opts


def _log(nj, handle, size_fn, get_fn) -> str:
    n = size_fn(handle)
    buf = bytearray(n)
    if n:
        get_fn(handle, buf)
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


def link_cubin(
    ptx: str,
    arch: str = "sm_90",
    opt: int = 3,
    method: str = "serial",
    kernel: Optional[str] = None,
    threads: Optional[int] = None,
    using: Optional[str] = None,
    extra: Sequence[str] = (),
) -> CubinResult:
    """PTX -> cubin with `using` (default: `assembler()`); resources are the kernel's (or the first entry's).
    `extra`: ptxas flags (mneme.ir.knobs.CodeKnobs.ptxas_flags); "-c" among them asks for relocatable code
    and a device link (ptxas -c + nvlink; nvJitLink always assembles that way)."""
    relocatable = "-c" in extra
    extra = [f for f in extra if f != "-c"]
    options = nvjitlink_options(arch, opt, method, threads, extra)  # also validates arch, level and method
    using = using or assembler()
    devrt = devrt_symbols(ptx)
    library = None
    if devrt:  # whole-program ptxas cannot resolve them: relocatable code linked with libcudadevrt
        library = ptxas.find_cudadevrt()
        if library is None:
            raise CompileError(
                f"the kernel calls the CUDA device runtime ({', '.join(devrt[:3])}: device-side launches) and "
                "no libcudadevrt.a was found (looked at MNEME_CUDADEVRT and lib64/ of $CUDA_HOME, $CUDA_PATH, "
                "/usr/local/cuda): set CUDA_HOME to a CUDA toolkit")
        using = "nvjitlink"
    if using == "ptxas" and relocatable and ptxas.find_nvlink() is None:
        using = "nvjitlink"  # the same ptxas -c and link, in-process
    if using == "ptxas":
        cubin, info = ptxas.assemble(ptx, arch, opt, method, threads, extra, relocatable=relocatable)
        return _result(cubin, info, ptxas.parse_log(info, cubin), kernel)
    if using != "nvjitlink":
        raise CompileError(f"unknown assembler {using!r}; choose one of {list(ASSEMBLERS)}")
    from cuda.bindings import nvjitlink as nj

    data = ptx.encode()
    # n must equal len(options): nvJitLink reads n entries and a longer count corrupts memory
    handle = nj.create(len(options), options)
    try:
        try:
            nj.add_data(handle, nj.InputType.PTX, data, len(data), "kernel.ptx")
            if library:
                nj.add_file(handle, nj.InputType.LIBRARY, library)
            nj.complete(handle)
        except nj.nvJitLinkError as e:
            err = _log(nj, handle, nj.get_error_log_size, nj.get_error_log)
            raise CompileError(f"nvJitLink rejected the PTX for {arch} ({e}):\n{err}") from None
        info = _log(nj, handle, nj.get_info_log_size, nj.get_info_log)
        size = nj.get_linked_cubin_size(handle)
        cubin = bytearray(size)
        nj.get_linked_cubin(handle, cubin)
    finally:
        nj.destroy(handle)
    res = _result(bytes(cubin), info, parse_info_log(info), kernel)
    res.libraries = ["cudadevrt"] if library else None
    return res


def _result(cubin: bytes, info: str, funcs: Dict[str, Dict[str, int]], kernel: Optional[str]) -> CubinResult:
    res = CubinResult(cubin, len(cubin), info_log=info, functions=funcs)
    entries = {name: p for name, p in funcs.items() if "registers" in p}
    props = entries.get(kernel) if kernel else next(iter(entries.values()), None)
    if props:
        for k, v in props.items():
            if hasattr(res, k):
                setattr(res, k, v)
    return res


def codegen(
    mod: llvm.ModuleRef,
    arch: str = "sm_90",
    codegen_method: str = "serial",
    codegen_opt: int = 3,
    kernel: Optional[str] = None,
) -> CubinResult:
    """PTX and cubin in one call (the seeds' codegen_object); changes `mod` like emit_ptx."""
    return link_cubin(emit_ptx(mod, arch, codegen_opt), arch, codegen_opt, codegen_method, kernel=kernel)


#: cubin sections that carry no code: the tool's command line (ptxas options), which differ for equal code
_NON_CODE_SECTIONS = (".note.nv.tkinfo",)


def binary_digest(cubin: bytes) -> str:
    """SHA-256 over the cubin's sections except the tool notes: equal digests mean the GPU runs the same code
    with the same resources, however the configurations that produced it differ."""
    import hashlib

    from mneme.ir.cubinelf import sections

    h = hashlib.sha256(b"mneme-binary-v1\0")
    try:
        secs = sorted((s.name, s.data) for s in sections(cubin) if s.name not in _NON_CODE_SECTIONS and not s.nobits)
    except ValueError:  # not an ELF we can read: the bytes themselves
        return hashlib.sha256(cubin).hexdigest()
    for name, data in secs:
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


_PTX_INSTR = re.compile(r"^\s*(?:@!?%\w+\s+)?[a-z][\w.]*(?:\s[^;]*)?;", re.M)


def ptx_instruction_count(ptx: str) -> int:
    """Instructions in PTX text (directives, labels, declarations and comments are not counted)."""
    return sum(1 for _ in _PTX_INSTR.finditer(ptx))
