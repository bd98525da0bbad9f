"""PTX -> cubin with the CUDA toolkit's `ptxas`, as one whole program: the way clang and nvcc compile an app
built without -fgpu-rdc.

Why not only nvJitLink: nvJitLink assembles PTX as relocatable code (`ptxas -c`), which leaves shared-memory
addresses to the link and costs registers and instructions. On the H200, matmulStatic compiled that way ran
23 % slower than in the app (7552 vs 6144 bytes of SASS, same PTX) and matmulPanel used 40 registers instead
of 32. A replayed kernel is one pruned, complete module, so whole-program code is always valid for it, and it
is what the app ran. Every app built with clang or nvcc had a ptxas next to its compiler.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from mneme.errors import CompileError
from mneme.tmpfiles import pid_dir

#: Where `ptxas` is looked for after MNEME_PTXAS, in order: the CUDA roots' bin/, then PATH.
CUDA_ROOT_VARS = ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")
DEFAULT_CUDA_ROOT = "/usr/local/cuda"


def cuda_roots() -> List[str]:
    """The CUDA roots to look in, in order: $CUDA_HOME, $CUDA_PATH, $CUDA_ROOT, /usr/local/cuda."""
    return [r for r in [os.environ.get(v, "") for v in CUDA_ROOT_VARS] + [DEFAULT_CUDA_ROOT] if r]


@functools.lru_cache(maxsize=None)
def find_ptxas() -> Optional[str]:
    """The ptxas executable to use, or None when there is none."""
    explicit = os.environ.get("MNEME_PTXAS", "").strip()
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise CompileError(f"MNEME_PTXAS={explicit} is not an executable ptxas; point it at <cuda>/bin/ptxas or unset it")
        return explicit
    for root in cuda_roots():
        exe = Path(root) / "bin" / "ptxas"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    return shutil.which("ptxas")


@functools.lru_cache(maxsize=None)
def find_cudadevrt() -> Optional[str]:
    """The CUDA device runtime library (lib64/libcudadevrt.a) of the first CUDA root that has one, or None."""
    explicit = os.environ.get("MNEME_CUDADEVRT", "").strip()
    if explicit:
        if not os.path.isfile(explicit):
            raise CompileError(f"MNEME_CUDADEVRT={explicit} is not a file; point it at <cuda>/lib64/libcudadevrt.a")
        return explicit
    exe = find_ptxas()
    for root in cuda_roots() + ([str(Path(exe).resolve().parent.parent)] if exe else []):
        for lib in ("lib64", "lib", "targets/x86_64-linux/lib"):
            path = Path(root) / lib / "libcudadevrt.a"
            if path.is_file():
                return str(path)
    return None


@functools.lru_cache(maxsize=None)
def ptxas_version(exe: str) -> str:
    """`13.0.88` from `ptxas --version` ('unknown' if it does not say)."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r"V(\d+(?:\.\d+)+)", out)
    return m.group(1) if m else "unknown"


def ptxas_options(arch: str, opt: int, method: str, threads: Optional[int] = None,
                  extra: Sequence[str] = ()) -> List[str]:
    opts = ["--gpu-name", arch, f"-O{int(opt)}", "--verbose", *extra]
    if method == "parallel":
        opts += ["--split-compile", str(threads or os.cpu_count() or 1)]
    return opts


@functools.lru_cache(maxsize=None)
def find_nvlink() -> Optional[str]:
    """The nvlink next to the ptxas in use (the device linker of relocatable code), or None."""
    exe = find_ptxas()
    if exe:
        cand = Path(exe).with_name("nvlink")
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return shutil.which("nvlink")


def _device_link(tmp: Path, obj: Path, arch: str) -> Path:
    """nvlink of one relocatable object into an executable cubin (what the app's device link does)."""
    exe = find_nvlink()
    out = tmp / "linked.cubin"
    # the device runtime, for kernels that launch kernels (as the app's device link takes libcudadevrt.a)
    devrt = Path(exe).resolve().parent.parent / "lib64" / "libcudadevrt.a"
    libs = [f"-L{devrt.parent}", "-lcudadevrt"] if devrt.is_file() else []
    try:
        p = subprocess.run([exe, f"-arch={arch}", str(obj), *libs, "-o", str(out)], capture_output=True, text=True)
    except OSError as e:
        raise CompileError(f"could not run {exe}: {e}") from None
    if p.returncode != 0 or not out.is_file():
        raise CompileError(f"nvlink ({exe}) could not link the relocatable cubin for {arch} (exit {p.returncode}):\n"
                           f"{p.stderr.strip()}")
    return out


def assemble(ptx: str, arch: str, opt: int, method: str, threads: Optional[int] = None,
             extra: Sequence[str] = (), relocatable: bool = False) -> Tuple[bytes, str]:
    """(cubin, ptxas's verbose log) for `ptx`; a CompileError carries what ptxas said. `relocatable`: `ptxas -c`
    and nvlink (find_nvlink), the way an app built with relocatable device code is assembled."""
    exe = find_ptxas()
    if exe is None:
        raise CompileError(
            "no ptxas found (looked at MNEME_PTXAS, $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin and PATH); "
            "set CUDA_HOME to your CUDA toolkit, or MNEME_ASSEMBLER=nvjitlink to assemble with nvJitLink"
        )
    opts = ptxas_options(arch, opt, method, threads, extra)
    if not relocatable and method != "parallel":
        from mneme.ir import ptxcompiler

        lib = ptxcompiler.library(ptxas_version(exe))
        if lib is not None:  # the same compiler in this process: no process, no files (mneme.ir.ptxcompiler)
            try:
                return ptxcompiler.compile_ptx(lib, ptx, opts)
            except ptxcompiler.Rejected as e:
                raise _rejected(f"{exe}, in-process", arch, f"nvPTXCompilerCompile {e.code}", e.log) from None
    with pid_dir("ptxas") as tmp:  # removed on exit and Ctrl-C; reaped (mneme.tmpfiles) if this process is killed
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx)
        try:
            p = subprocess.run([exe, *opts, *(["-c"] if relocatable else []),
                                "-o", str(out), str(src)], capture_output=True, text=True)
        except OSError as e:
            raise CompileError(f"could not run {exe}: {e}") from None
        if p.returncode != 0 or not out.is_file():
            raise _rejected(exe, arch, f"exit {p.returncode}", p.stderr)
        if relocatable:
            out = _device_link(Path(tmp), out, arch)
        return out.read_bytes(), (p.stdout + p.stderr)


def _rejected(who: str, arch: str, status: str, log: str) -> CompileError:
    exe = find_ptxas()
    hint = ""
    if "Unsupported .version" in log or "not supported" in log:
        hint = (f"\n{exe} (CUDA {ptxas_version(exe)}) is older than the PTX that LLVM emits: point MNEME_PTXAS "
                "or CUDA_HOME at a newer toolkit, or set MNEME_ASSEMBLER=nvjitlink")
    return CompileError(f"ptxas ({who}) rejected the PTX for {arch} ({status}):\n{log.strip()}{hint}")


_ENTRY = re.compile(r"^ptxas info\s*: (?:Compiling entry function '([^']+)'|Function properties for (\S+))")
_USED = re.compile(r"^ptxas info\s*: Used (\d+) registers(.*)$")
#: ptxas's spill line and its user constant banks, as ptxas prints them alone or inside nvJitLink's log
SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USER_CMEM = re.compile(r"(\d+) bytes cmem\[[1-9]\d*\]")
_AMOUNT = {"barriers": re.compile(r"used (\d+) barriers"), "smem": re.compile(r"(\d+) bytes smem"),
           "lmem": re.compile(r"(\d+) bytes lmem")}


def _amount(pattern: "re.Pattern[str]", text: str) -> int:
    m = pattern.search(text)
    return int(m.group(1)) if m else 0


def parse_log(log: str, cubin: bytes = b"") -> Dict[str, Dict[str, int]]:
    """Per-function resources from `ptxas --verbose`, in CubinResult's terms (see codegen.CubinResult).

    ptxas 13 prints no constant banks; those are read from the cubin (see constant_banks).
    """
    funcs: Dict[str, Dict[str, int]] = {}
    module_cmem = 0
    current: Optional[str] = None
    for line in log.splitlines():
        m = _ENTRY.match(line)
        if m:
            current = m.group(1) or m.group(2)
            continue
        s = SPILLS.search(line)
        if s and current:
            funcs.setdefault(current, {}).update(
                stack=int(s.group(1)), spill_stores=int(s.group(2)), spill_loads=int(s.group(3)))
            continue
        u = _USED.match(line)
        if u and current:
            rest = u.group(2)
            f = funcs.setdefault(current, {})
            amounts = {k: _amount(r, rest) for k, r in _AMOUNT.items()}
            f.update(registers=int(u.group(1)), barriers=amounts["barriers"], shared_mem=amounts["smem"],
                     local_mem=amounts["lmem"] + f.get("stack", 0),
                     const_mem=sum(int(x) for x in USER_CMEM.findall(rest)))
            continue
        if line.startswith("ptxas info") and "gmem" in line:
            module_cmem += sum(int(x) for x in USER_CMEM.findall(line))
    banks = constant_banks(cubin) if cubin else {}
    user = banks.get((USER_BANK, ""), 0)
    for name, f in funcs.items():
        f.setdefault("stack", 0)
        if "registers" in f:
            own = sum(size for (bank, fn), size in banks.items() if fn == name and bank > 0)
            f["const_mem"] = f.get("const_mem") or own + user or module_cmem
            f["param_mem"] = banks.get((0, name), 0)
    return funcs


#: the bank of the program's __constant__ variables on sm_70 and later (nvJitLink's "cmem[3]")
USER_BANK = 3
_BANK = re.compile(r"^\.nv\.constant(\d+)(?:\.(.+))?$")


def constant_banks(cubin: bytes) -> Dict[Tuple[int, str], int]:
    """(bank, kernel or '' for the module) -> bytes, from the cubin's `.nv.constant<bank>[.<kernel>]` sections:
    bank 0 of a kernel is its parameters, bank 3 of the module the __constant__ variables."""
    from mneme.ir.cubinelf import sections

    out: Dict[Tuple[int, str], int] = {}
    try:
        secs = sections(cubin)
    except ValueError:  # a cubin we cannot read only loses these numbers
        return {}
    for sec in secs:
        m = _BANK.match(sec.name)
        if m:
            out[(int(m.group(1)), m.group(2) or "")] = sec.size
    return out
