"""Translating a parsed nvcc command (mneme.cc.nvccflags) into clang-22 and host-compiler flags.

What each nvcc option becomes is listed in docs/CC.md ("mneme nvcc"). The device-code options are
applied to the device side only, as nvcc does: `--use_fast_math` = `--ftz=true --prec-div=false
--prec-sqrt=false --fmad=true` plus approximate transcendentals; host options (`-Xcompiler`, `-O`, `-g`)
reach the host side only (`-Xarch_host`), and nvcc's defaults are explicit (device `-O3`, IEEE
division and square root, which clang-22 would otherwise approximate for sqrtf).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import List, Optional, Sequence

from mneme.cc.nvccflags import Input, NvccCommand
from mneme.cc.toolchain import Toolchain
from mneme.errors import ConfigurationError

#: oldest architecture each CUDA major version builds for
MIN_ARCH = {11: 35, 12: 50, 13: 75}
#: architectures nvcc `-arch=all` means, per CUDA major version (clang-22 builds all of them)
ALL_ARCHS = {13: [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121], 12: [50, 52, 53, 60, 61, 62, 70, 72, 75, 80,
                                                                             86, 87, 89, 90]}
_ARCH_RE = re.compile(r"^(?:sm|compute|lto)_(\d+)([af]?)$")


def cuda_build_number(tc: Toolchain) -> int:
    """The third number of nvcc's version (13.0.88 -> 88) from the CUDA root's nvcc, else 0."""
    return _build_number(str(tc.cuda))


@lru_cache(maxsize=4)
def _build_number(cuda: str) -> int:
    nvcc = Path(cuda) / "bin" / "nvcc"
    if nvcc.is_file():
        try:
            out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=30).stdout
            m = re.search(r"V\d+\.\d+\.(\d+)", out)
            if m:
                return int(m.group(1))
        except (OSError, subprocess.SubprocessError):
            pass
    return 0


def cuda_version_banner(tc: Toolchain) -> str:
    """`nvcc --version` as CMake wants it (it matches "nvcc: NVIDIA (R) Cuda compiler driver" and
    V<major>.<minor>.<build>), with a line saying what this really is."""
    major, minor = tc.version()
    build = cuda_build_number(tc)
    return (
        "nvcc: NVIDIA (R) Cuda compiler driver\n"
        "Copyright (c) 2005-2025 NVIDIA Corporation (this is mneme-nvcc: nvcc's command line over clang-22)\n"
        f"Cuda compilation tools, release {major}.{minor}, V{major}.{minor}.{build}\n"
        f"Build mneme-nvcc with {tc.clang}, CUDA root {tc.cuda}"
    )


def _native_archs() -> List[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    caps = sorted({c.strip().replace(".", "") for c in out.split() if c.strip()})
    if not caps:
        raise ConfigurationError("-arch=native: no GPU found on this machine: name one, e.g. -arch=sm_90")
    return [f"sm_{c}" for c in caps]


def resolve_archs(values, major: int, written_default: Optional[str] = None) -> List[str]:
    """The real GPU architectures (sm_NN) an nvcc command line builds for, in order, without repeats.

    `-arch=sm_NN` alone means code for sm_NN plus PTX of compute_NN; `-arch=compute_NN` alone PTX only
    (clang embeds PTX with every cubin, so both become sm_NN); `-code`/`-gencode code=` lists
    (`[compute_90,sm_90]`, quoted) name the real ones; `native`, `all`, `all-major` as nvcc."""
    archs: List[str] = []
    codes = [v for k, v in values if k == "code"]
    for kind, value in values:
        if kind == "gencode":
            parts = dict(p.split("=", 1) for p in re.split(r",(?=\s*(?:arch|code)=)", value) if "=" in p)
            if "arch" not in parts:
                raise ConfigurationError(f"-gencode {value}: expected arch=compute_NN,code=sm_NN")
            code = parts.get("code", parts["arch"]).strip().strip("\"'[]")
            archs += [c.strip().strip("\"'[]") for c in code.split(",") if c.strip()]
        elif kind == "arch" and not (codes and value.startswith("compute_")):
            archs.append(value)
    archs += codes
    out: List[str] = []
    for a in archs:
        for real in _expand_arch(a, major):
            if real not in out:
                out.append(real)
    forced = os.environ.get("MNEME_NVCC_ARCH")
    if forced:
        out = [x for a in forced.split(",") for x in _expand_arch(a.strip(), major)]
    if not out:
        out = _expand_arch(written_default or f"sm_{MIN_ARCH.get(major, 75)}", major)
    for a in out:
        check_arch(a, major)
    return out


def _expand_arch(a: str, major: int) -> List[str]:
    if a == "native":
        return _native_archs()
    if a in ("all", "all-major"):
        nums = ALL_ARCHS.get(major, ALL_ARCHS[13])
        return [f"sm_{n}" for n in nums if a == "all" or n % 10 == 0 or n == 75]
    m = _ARCH_RE.match(a)
    if not m:
        raise ConfigurationError(f"{a!r} is not a GPU architecture (expected sm_NN or compute_NN, e.g. sm_90)")
    return [f"sm_{m.group(1)}{m.group(2)}"]


def check_arch(arch: str, major: int) -> None:
    num = int(re.match(r"sm_(\d+)", arch).group(1))
    low = MIN_ARCH.get(major, 75)
    if num < low:
        supported = " ".join(f"sm_{n}" for n in ALL_ARCHS.get(major, []) if n >= low)
        raise ConfigurationError(
            f"{arch}: CUDA {major} cannot build for {arch} (it supports sm_{low} and newer: {supported}); "
            f"override the build's architecture, e.g. `make ARCH=sm_90` (the Makefile's arch variable), "
            f"-arch=sm_90, or MNEME_NVCC_ARCH=sm_90 for every command"
        )


def gcc_include_dir(cc: str = "gcc") -> Optional[str]:
    try:
        out = subprocess.run([cc, "-print-file-name=include"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out if out and os.path.isdir(out) else None


class Translation:
    """The clang-22 and host-compiler command lines of one nvcc command."""

    def __init__(self, cmd: NvccCommand, tc: Toolchain):
        self.cmd = cmd
        self.tc = tc
        self.major, self.minor = tc.version()
        self.archs = resolve_archs(cmd.arch_values, self.major, os.environ.get("MNEME_CUDA_ARCH"))
        self.openmp = "-fopenmp" in cmd.host

    # ---- what nvcc -v reports -------------------------------------------------------------------
    def includes(self) -> List[str]:
        return [f"-I{self.tc.cuda / 'include'}"]

    def system_includes(self) -> List[str]:
        cccl = self.tc.cuda / "include" / "cccl"
        return ["-isystem", str(cccl)] if cccl.is_dir() else []

    def library_dirs(self) -> List[str]:
        lib = self.tc.cuda / "lib64"
        stubs = lib / "stubs"
        return ([f"-L{stubs}"] if stubs.is_dir() else []) + [f"-L{lib}"]

    def notes(self) -> List[str]:
        return [f"accepted {a}: no clang counterpart, no effect on the build" for a in self.cmd.accepted]

    # ---- compiles ---------------------------------------------------------------------------------
    def version_defines(self) -> List[str]:
        return [f"-D__CUDACC_VER_MAJOR__={self.major}", f"-D__CUDACC_VER_MINOR__={self.minor}",
                f"-D__CUDACC_VER_BUILD__={cuda_build_number(self.tc)}", "-D__NVCC_DIAG_PRAGMA_SUPPORT__=1"]

    def language(self) -> List[str]:
        return [f"-std={self.cmd.std}"] if self.cmd.std else []

    def device_flags(self) -> List[str]:
        c = self.cmd
        f: List[str] = []
        if c.device_debug:
            f += ["--cuda-noopt-device-debug", "-Xarch_device", "-g"]
        else:
            f += ["-Xarch_device", "-O0" if c.dopt is False else "-O3"]
            if c.lineinfo:
                f += ["-Xarch_device", "-gline-directives-only"]
        f.append("-fgpu-flush-denormals-to-zero" if c.ftz_on else "-fno-gpu-flush-denormals-to-zero")
        f += ["-mllvm", f"-nvptx-prec-divf32={2 if c.prec_div_on else 0}"]
        f += ["-mllvm", f"-nvptx-prec-sqrtf32={1 if c.prec_sqrt_on else 0}"]
        f += ["-mllvm", f"-nvvm-reflect-add=__CUDA_PREC_SQRT={1 if c.prec_sqrt_on else 0}"]
        f += ["-Xarch_device", "-ffp-contract=fast" if c.fmad_on else "-ffp-contract=off"]
        if c.fast_math:
            f.append("-fgpu-approx-transcendentals")
        if c.maxrregcount is not None:
            f += ["-Xcuda-ptxas", f"--maxrregcount={c.maxrregcount}"]
        for p in c.ptxas:
            f += ["-Xcuda-ptxas", p]
        if c.resource_usage:
            f += ["-Xcuda-ptxas", "-v"]
        if any(int(re.match(r"sm_(\d+)", a).group(1)) == 110 for a in self.archs):
            f.append("--cuda-feature=+ptx90")  # clang-22's default PTX ISA (8.8) lacks sm_110
        return f

    def host_side(self) -> List[str]:
        """Host-only flags of a .cu compile (clang's host side)."""
        c = self.cmd
        f: List[str] = []
        if c.opt:
            f += ["-Xarch_host", f"-O{c.opt}"]
        if c.host_debug:
            f += ["-Xarch_host", "-g"]
        for h in c.host:
            if h == "-fopenmp":
                f += self._openmp_cuda()
            elif h.startswith("-Wl,"):
                continue  # link-time only
            else:
                f += ["-Xarch_host", h]
        if c.shared and "-fPIC" not in c.host:
            f += ["-Xarch_host", "-fPIC"]
        return f

    def _openmp_cuda(self) -> List[str]:
        """clang's OpenMP code calls LLVM's libomp (__kmpc_*), which GCC's libgomp does not provide:
        with libomp installed use it, else compile against GCC's omp.h and libgomp (nvcc's choice);
        sources with OpenMP pragmas in host code then need libomp (checked in cuda_args)."""
        if self.libomp():
            return ["-Xarch_host", "-fopenmp"]
        inc = gcc_include_dir(self.cmd.ccbin or "gcc")
        # omp.h is in GCC's own include directory (searched last, on both sides: device code may include it)
        return ["-Xarch_host", "-fopenmp=libgomp"] + (["-idirafter", inc] if inc else [])

    @staticmethod
    def libomp() -> Optional[str]:
        for d in ("/usr/lib/llvm-22/lib",):
            if os.path.exists(os.path.join(d, "libomp.so")):
                return d
        return None

    def cuda_args(self, archs: Optional[Sequence[str]] = None) -> List[str]:
        """Flags of a clang-22 compile of a .cu file (after mneme cc's own; the source follows)."""
        c = self.cmd
        f = [f"--cuda-gpu-arch={a}" for a in (archs or self.archs)]
        f += ["-include", str(self.tc.include / "mneme" / "nvcc_persona.h")] + self.version_defines()
        f += c.pp + self.language() + self.device_flags() + self.host_side()
        if c.rdc or c.phase in ("dc", "dw"):
            f.append("-fgpu-rdc")
            if c.dlto_on:
                f.append("-foffload-lto")
        if c.default_stream == "per-thread":
            f.append("-fgpu-default-stream=per-thread")
        return f + self.warnings_and_deps() + ["-x", "cuda"]

    def warnings_and_deps(self) -> List[str]:
        """-Werror/-w, and the dependency-file flags of a compile (not of -E/-M, which print them)."""
        c = self.cmd
        f = (["-Werror"] if c.werror else []) + (["-w"] if c.no_warnings else [])
        return f + (c.deps if c.phase not in ("E", "M", "MM") else [])

    def check_openmp_source(self, src: Input) -> None:
        if self.openmp and src.lang == "cuda" and not self.libomp():
            try:
                text = Path(src.path).read_text(errors="replace")
            except OSError:
                return
            if re.search(r"^\s*#\s*pragma\s+omp\b", text, re.M):
                raise ConfigurationError(
                    f"{src.path}: host OpenMP pragmas in a CUDA source need LLVM's libomp with clang "
                    "(apt-get install libomp-22-dev), or move the OpenMP code to a .cpp file (compiled by gcc)"
                )

    def host_compiler(self, lang: str) -> str:
        cc = self.cmd.ccbin
        if cc and os.path.isdir(cc):
            cc = os.path.join(cc, "gcc" if lang == "c" else "g++")
        return cc or ("gcc" if lang == "c" else "g++")

    def host_compile_args(self, src: Input) -> List[str]:
        """A .c/.cpp file: the host compiler, as nvcc runs it (CUDA's include directories, __NVCC__)."""
        c = self.cmd
        f = [self.host_compiler(src.lang)]
        f += self.includes() + self.system_includes() + ["-D__NVCC__"] + self.version_defines()
        f += c.pp + self.language() + ([f"-O{c.opt}"] if c.opt else []) + (["-g"] if c.host_debug else [])
        f += [h for h in c.host if not h.startswith("-Wl,")]
        if c.shared and "-fPIC" not in c.host:
            f.append("-fPIC")
        return f + self.warnings_and_deps() + ["-x", "c" if src.lang == "c" else "c++"]

    # ---- links ------------------------------------------------------------------------------------
    def host_linker(self) -> List[str]:
        cc = self.host_compiler("c++")
        return [shutil.which(cc) or cc]

    def host_link_flags(self) -> List[str]:
        f = list(self.cmd.host)
        if self.openmp and self.libomp():
            f += [f"-L{self.libomp()}", f"-Wl,-rpath,{self.libomp()}", "-lomp"]
        return f + (["-shared"] if self.cmd.shared else [])

    def link_args(self, objs: Sequence[str]) -> List[str]:
        return list(objs) + self.cmd.link

    def cudart(self) -> str:
        return os.environ.get("MNEME_NVCC_CUDART") or self.cmd.cudart

    def runtime_libs(self) -> List[str]:
        lib = self.tc.cuda / "lib64"
        f = self.library_dirs()
        if self.cmd.cudadevrt == "static" and (lib / "libcudadevrt.a").exists():
            f.append("-lcudadevrt")
        cudart = self.cudart()
        if cudart == "static":
            f += ["-lcudart_static", "-lrt", "-lpthread", "-ldl"]
        elif cudart == "shared":
            f += [f"-Wl,-rpath,{lib}", "-lcudart", "-ldl"]
        elif cudart != "none":
            raise ConfigurationError(f"MNEME_NVCC_CUDART={cudart}: expected static, shared or none")
        return f
