"""Recordings shared by the GPU tests: each example is recorded once per session with `mneme record`.

`small` runs use the examples' default sizes (what tests/fixtures holds); `big` runs are sized so that
the kernels run well past launch overhead on an H200 (>= 20 us), for fidelity and tuning tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "examples" / "bin"
MNEME = [sys.executable, "-m", "mneme.cli"]

#: name -> argv (relative to examples/bin) for the functional recordings
SMALL: Dict[str, List[str]] = {
    "vecadd": ["vecadd"],
    "stencil2d": ["stencil2d"],
    "matmul": ["matmul"],
    "reduce": ["reduce"],
    "rdc": ["rdc"],
    "structarg": ["structarg"],
    "manylaunch": ["manylaunch"],
    "ptrglobal": ["ptrglobal"],
    "pinned": ["pinned"],
    "launchex": ["launchex"],
    "cooperative": ["cooperative"],
    "shlib": ["shlib"],
    "driverapi": ["driverapi"],  # cuLaunchKernel from cudaGetDriverEntryPoint: recorded at the driver too
    "consttable": ["consttable"],  # a __constant__ table the app sets before every launch
    "devcounter": ["devcounter"],  # __device__ counters that accumulate across launches
    "halo": ["halo"],  # reads a row before its first allocation; a weak_odr template kernel (-fgpu-rdc)
    "managed": ["managed"],  # cudaMallocManaged (+ cudaMemAdvise, cudaMemPrefetchAsync): snapshotted
    "zerocopy": ["zerocopy"],  # malloc + cudaHostRegister(Mapped): snapshotted, mapped at its host address
    "streamalloc": ["streamalloc"],  # cudaMallocAsync, a pool, cudaFreeAsync, cudaMallocPitch, cudaMalloc3D
    "texture": ["texture"],  # texture/surface objects: tests/gpu/test_textures_gpu.py
    "graph": ["graph"],  # stream capture + cudaGraphLaunch: the kernel nodes recorded at the graph's first launch
    "graphupdate": ["graphupdate"],  # cudaGraphAddKernelNode + a memcpy node, cudaGraphExecKernelNodeSetParams
}
#: the apps whose launches cannot be recorded; the record must say so
UNSUPPORTED: Dict[str, List[str]] = {
    "graphmem": ["graphmem"],  # a graph with memory alloc/free nodes: launched whole, its kernels graph_opaque
}
#: sized for timing on an H200
BIG: Dict[str, List[str]] = {
    "vecadd": ["vecadd", str(1 << 24)],
    "stencil2d": ["stencil2d", "4096", "4096", "2"],
    "matmul": ["matmul", "1024"],
    "reduce": ["reduce", str(1 << 24)],
}


@dataclass
class Recording:
    name: str
    dir: Path
    argv: List[str]
    returncode: int
    stdout: str
    stderr: str

    def dbs(self) -> List[Path]:
        from mneme.record.db import find_dbs

        return [Path(p) for p in find_dbs(str(self.dir))]

    def db(self, kernel_substring: str = "") -> Path:
        from mneme.record.db import RecordedExecution

        for p in self.dbs():
            r = RecordedExecution.from_json(str(p), check_files=False)
            if kernel_substring in r.demangled_name or kernel_substring in r.kernel_name:
                return p
        raise AssertionError(f"no recorded kernel matching {kernel_substring!r} in {self.dir}: {self.stdout}\n{self.stderr}")


def run_app(argv: List[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=300, **kw)


def record(name: str, argv: List[str], root: Path, *extra: str) -> Recording:
    d = root / name
    p = subprocess.run(
        [*MNEME, "record", "-rdb", str(d), *extra, "--", str(BIN / argv[0]), *argv[1:]],
        capture_output=True, text=True, timeout=600,
    )
    return Recording(name, d, argv, p.returncode, p.stdout, p.stderr)


def _record_all(table: Dict[str, List[str]], root: Path) -> Dict[str, Recording]:
    if not BIN.is_dir():
        pytest.fail(f"{BIN} is missing: build the examples here with `make gpu-bundle` and carry examples/bin")
    return {name: record(name, argv, root) for name, argv in table.items()}


@pytest.fixture(scope="session")
def recorder():
    """`record(name, argv, root, *flags)` for tests that record example apps of their own."""
    return record


@pytest.fixture(scope="session")
def small_recordings(tmp_path_factory) -> Dict[str, Recording]:
    return _record_all(SMALL, tmp_path_factory.mktemp("rec-small"))


@pytest.fixture(scope="session")
def unsupported_recordings(tmp_path_factory) -> Dict[str, Recording]:
    return _record_all(UNSUPPORTED, tmp_path_factory.mktemp("rec-unsupported"))


@pytest.fixture(scope="session")
def big_recordings(tmp_path_factory) -> Dict[str, Recording]:
    return _record_all(BIG, tmp_path_factory.mktemp("rec-big"))


@pytest.fixture(scope="session", autouse=True)
def _gpu_present():
    if os.environ.get("MNEME_GPU_TESTS") != "1":
        return
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
    except OSError:
        pytest.fail("MNEME_GPU_TESTS=1 but libcuda.so.1 cannot be loaded: this is not a GPU machine")
