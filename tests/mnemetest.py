"""Helpers the tests import (conftest.py cannot be imported by name: tests/gpu has its own)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MNEME = [sys.executable, "-m", "mneme.cli"]
FIXTURES = ROOT / "tests" / "fixtures"
CUDA = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
#: how the CPU tests build their small C stand-ins (fake drivers, probes) against the CUDA headers
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{CUDA / 'include'}"]


def cc(*args: str) -> None:
    """Compiles with the system C compiler and CFLAGS; a failure shows the compiler's messages."""
    p = subprocess.run(["cc", *CFLAGS, *args], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def build_standin(d: Path, data: Path, app: str) -> Path:
    """A stand-in driver (data/fake_libcuda.c as d/fake/libcuda.so.1) and the app that talks to it
    (data/<app>.c as d/<app>); returns d."""
    (d / "fake").mkdir()
    cc("-fPIC", "-shared", "-o", str(d / "fake" / "libcuda.so.1"), str(data / "fake_libcuda.c"))
    cc("-o", str(d / app), str(data / f"{app}.c"), "-ldl")
    return d


def run_mneme(*args, check=True, **kw) -> subprocess.CompletedProcess:
    """Run the `mneme` CLI in a subprocess, as a user would."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    p = subprocess.run([*MNEME, *map(str, args)], **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"mneme {' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def read_artifact(client, run_id: str, name: str) -> bytes:
    """An MLflow artifact's bytes. Without a destination MLflow downloads into a fresh temporary directory that
    nobody removes (thousands had piled up in /tmp from the tests), so it goes into one removed here."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mneme-test-artifact-") as d:
        return Path(client.download_artifacts(run_id, name, d)).read_bytes()


def free_range(size: int, align: int) -> int:
    """An address (a multiple of `align`) where `size` bytes of this process's address space are unmapped now:
    inside an anonymous mapping the kernel placed, unmapped again."""
    import ctypes
    import mmap

    m = mmap.mmap(-1, size + align)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    m.close()
    return -(-addr // align) * align
