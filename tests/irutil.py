"""Build device LLVM bitcode from the small CUDA inputs in tests/data/ir with clang-22."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

import pytest

DATA = Path(__file__).resolve().parent / "data" / "ir"
CUDA = Path(os.environ.get("CUDA_PATH", "/usr/local/cuda"))


def clang() -> str:
    exe = shutil.which("clang++-22")
    if exe is None:
        pytest.skip("clang++-22 is not installed (apt-get install clang-22)")
    return exe


def compile_cu(
    src: Path,
    out_dir: Path,
    *,
    arch: str = "sm_90",
    rdc: bool = False,
    optimize: bool = False,
    extra: Sequence[str] = (),
) -> Path:
    """Device-only bitcode of `src`, as a recording build makes it: -O3 with LLVM's passes off, names kept.

    With `optimize` clang's own -O3 pipeline runs too (what an app build without mneme produces).
    Results are reused while the source and flags are unchanged.
    """
    src = Path(src)
    shim = out_dir / "shim"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "curand_mtgp32_kernel.h").touch()
    flags = [
        "-x", "cuda", "--cuda-device-only", f"--cuda-gpu-arch={arch}", "-emit-llvm", "-c",
        f"--cuda-path={CUDA}", "-Wno-unknown-cuda-version", f"-I{shim}", "-O3", "-fno-discard-value-names",
    ]
    if not optimize:
        flags += ["-Xclang", "-disable-llvm-optzns"]
    if rdc:
        flags.append("-fgpu-rdc")
    flags += list(extra)
    key = hashlib.sha256(src.read_bytes() + "\0".join(flags).encode()).hexdigest()[:16]
    out = out_dir / f"{src.stem}-{key}.bc"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        p = subprocess.run([clang(), *flags, "-o", str(tmp), str(src)], capture_output=True, text=True)
        if p.returncode != 0:
            raise AssertionError(f"clang++-22 failed on {src}:\n{p.stderr}")
        tmp.replace(out)
    return out


@pytest.fixture(scope="session")
def bc_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ir-bc")


@pytest.fixture(scope="session")
def build(bc_dir):
    """build(name_or_path, **flags) -> Path of the bitcode (name: a file in tests/data/ir)."""

    def _build(src, **kw) -> Path:
        path = Path(src) if os.sep in str(src) else DATA / src
        return compile_cu(path, bc_dir, **kw)

    return _build
