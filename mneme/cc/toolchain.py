"""Where clang-22, the CUDA root and mneme's headers are, and the flags that make clang behave like nvcc.

nvcc users take for granted that CCCL (`cuda/std`, cooperative groups) is on the include path, that
nvcc-only builtins exist, and that CUDA's include directory is searched for plain C++ files too. clang
gives none of that; these flags do (see docs/CC.md and TOOLCHAIN.md).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from mneme.errors import ConfigurationError

DEFAULT_ARCH = "sm_90"
_CLANG_CANDIDATES = ("clang++-22", "/usr/lib/llvm-22/bin/clang++")


def include_dir() -> Path:
    """mneme's user-facing include directory (holds mneme/tolerance.h, mneme/nvcc_compat.h, the shim).

    An installed wheel ships it as package data (mneme/include); a source checkout has native/include.
    MNEME_INCLUDE_DIR overrides both."""
    env = os.environ.get("MNEME_INCLUDE_DIR")
    pkg = Path(__file__).resolve().parent.parent
    for cand in ([Path(env)] if env else []) + [pkg / "include", pkg.parent / "native" / "include"]:
        if (cand / "mneme" / "nvcc_compat.h").is_file():
            return cand
    where = env or f"{pkg / 'include'} or {pkg.parent / 'native' / 'include'}"
    raise ConfigurationError(
        f"mneme's headers (mneme/nvcc_compat.h) are not in {where}: reinstall mneme or set MNEME_INCLUDE_DIR"
    )


def find_clang() -> str:
    """clang++-22: MNEME_CLANG, else clang++-22 on PATH, else the Debian/Ubuntu llvm-22 location."""
    env = os.environ.get("MNEME_CLANG")
    if env:
        hit = shutil.which(env)
        if not hit:
            raise ConfigurationError(f"MNEME_CLANG={env}: no such executable")
        return hit
    for cand in _CLANG_CANDIDATES:
        hit = shutil.which(cand)
        if hit:
            return hit
    raise ConfigurationError("clang++-22 not found: install it (apt-get install clang-22) or set MNEME_CLANG")


def find_cuda(explicit: Optional[str] = None) -> Path:
    """The CUDA root: --cuda-path on the command line, else CUDA_HOME, else /usr/local/cuda."""
    if explicit:
        root, origin = Path(explicit), "--cuda-path"
    elif os.environ.get("CUDA_HOME"):
        root, origin = Path(os.environ["CUDA_HOME"]), "CUDA_HOME"
    else:
        root, origin = Path("/usr/local/cuda"), "the default CUDA root"
    if not (root / "include" / "cuda_runtime.h").is_file():
        raise ConfigurationError(f"{origin} {root} has no include/cuda_runtime.h: set CUDA_HOME to a CUDA toolkit root")
    return root


def find_ld() -> str:
    hit = shutil.which("ld")
    if not hit:
        raise ConfigurationError("`ld` not found: it merges device bitcode into objects; install binutils")
    return hit


def cuda_arch_list(archs: Sequence[str]) -> str:
    """`__CUDA_ARCH_LIST__` as clang-22 (and nvcc) defines it for a compile with these architectures:
    their numbers times ten, ascending, without repeats (sm_75, sm_100a, sm_90 -> "750,900,1000");
    "" when none is an NVIDIA architecture."""
    nums = {int(m.group(1)) * 10 for a in archs if (m := re.match(r"(?:sm|compute)_(\d+)", a))}
    return ",".join(str(n) for n in sorted(nums))


@dataclass(frozen=True)
class Toolchain:
    clang: str
    cuda: Path
    include: Path

    @classmethod
    def locate(cls, cuda_path: Optional[str] = None) -> "Toolchain":
        return cls(find_clang(), find_cuda(cuda_path), include_dir())

    @property
    def clang_c(self) -> str:
        """The C driver next to clang++ (compiles .c files as C, like a CC would)."""
        base = os.path.basename(self.clang)
        sibling = os.path.join(os.path.dirname(self.clang), base.replace("clang++", "clang"))
        return sibling if os.path.exists(sibling) else self.clang

    def common_flags(self) -> List[str]:
        # -fno-crash-diagnostics: a failing ptxas or a clang crash must not leave megabytes of
        # preprocessed source and crash scripts in the temporary directory.
        return ["-isystem", str(self.include), "-Wno-unused-command-line-argument", "-fno-crash-diagnostics"]

    def host_flags(self) -> List[str]:
        """For plain C/C++ sources: CUDA's headers are on the path, as nvcc arranges for .cpp files."""
        return self.common_flags() + ["-isystem", str(self.cuda / "include")]

    def cuda_flags(self, archs: List[str]) -> List[str]:
        """For CUDA sources (host and device side)."""
        flags = ["-x", "cuda", f"--cuda-path={self.cuda}", "-Wno-unknown-cuda-version"]
        flags += [f"--cuda-gpu-arch={a}" for a in archs]
        cccl = self.cuda / "include" / "cccl"
        if cccl.is_dir():
            flags += ["-isystem", str(cccl)]
        flags += ["-idirafter", str(self.include / "mneme" / "shim")]
        flags += ["-include", str(self.include / "mneme" / "nvcc_compat.h")]
        return flags + self.common_flags()

    def ir_flags(self, arch: str, all_archs: Sequence[str] = ()) -> List[str]:
        """Device-only, pre-optimization bitcode: -O3 without running LLVM's passes, so the IR carries no
        `optnone` and replay's pipeline decides every optimization (docs/CC.md).

        The bitcode is compiled for `arch` alone, but `__CUDA_ARCH_LIST__` must be the one of the
        build's own compile (`all_archs`): CCCL names its namespaces after it
        (`cub::CUB_300001_SM_750_800_..._1200`), so with a one-arch list every CUB/Thrust kernel of
        the IR would be named differently from the kernels the app loads."""
        listed = cuda_arch_list(list(all_archs) or [arch])
        return self.cuda_flags([arch]) + [
            "--cuda-device-only", "-emit-llvm", "-c", "-O3", "-Xclang", "-disable-llvm-optzns",
            "-fno-discard-value-names", "-w",
        ] + (["-U__CUDA_ARCH_LIST__", f"-D__CUDA_ARCH_LIST__={listed}"] if listed else [])

    def cudart_flags(self, cudart: str = "shared") -> List[str]:
        """Link flags of the CUDA runtime: "shared" (with an rpath), "static" (what nvcc and CMake
        link by default, with its libdl/libpthread/librt) or "none"."""
        lib = self.cuda / "lib64"
        if cudart == "shared":
            return [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lcudart", "-ldl"]
        if cudart == "static":
            return [f"-L{lib}", "-lcudart_static", "-ldl", "-lpthread", "-lrt"]
        if cudart == "none":
            return [f"-L{lib}"]
        raise ConfigurationError(f"cudart {cudart!r}: expected shared, static or none")

    def link_flags(self) -> List[str]:
        """Shared libcudart (so LD_PRELOAD can interpose), libdl, and the offload linker that
        device-links relocatable device code (-fgpu-rdc) through nvlink."""
        return ["--offload-link", f"--cuda-path={self.cuda}"] + self.cudart_flags("shared") + [
            "-Wno-unused-command-line-argument",
        ]

    def version(self) -> tuple:
        """(major, minor) of the CUDA root, from CUDA_VERSION in include/cuda.h (e.g. 13000 -> (13, 0))."""
        try:
            text = (self.cuda / "include" / "cuda.h").read_text(errors="replace")
        except OSError:
            text = ""
        m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", text)
        if not m:
            raise ConfigurationError(f"{self.cuda}/include/cuda.h: no CUDA_VERSION: is CUDA_HOME a CUDA toolkit root?")
        v = int(m.group(1))
        return v // 1000, (v % 1000) // 10

    def env(self) -> dict:
        """clang's offload linker finds nvlink and fatbinary on PATH."""
        env = dict(os.environ)
        env["PATH"] = f"{self.cuda / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env
