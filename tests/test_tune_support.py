"""Support for the tune tests: record DBs to tune, worker backends that stand in for a GPU (there is none
here), and backends that really crash or hang. Worker processes import this module by name, so it must stay
importable on its own (tests/ is on their sys.path through pytest, or PYTHONPATH for CLI subprocesses).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional, Sequence


from mneme.config import ExperimentResult

TESTS = Path(__file__).resolve().parent
MODULE = Path(__file__).stem
KERNEL = "_Z5saxpyfPKfPfi"

SAXPY_CU = r"""
__global__ void saxpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""


def backend(name: str) -> str:
    """The import path of a backend class defined here."""
    return f"{MODULE}:{name}"


def env_with_tests(extra: Optional[dict] = None) -> dict:
    """Environment for a CLI subprocess that must import this module."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra or {})
    return env


def write_record(
    directory: Path,
    grid: Sequence[int] = (256, 1, 1),
    block: Sequence[int] = (128, 1, 1),
    module: Optional[Path] = None,
    dynamic_hash: str = "d" * 16,
    n: Optional[int] = None,
    snapshots: bool = False,
) -> Path:
    """A record DB of one saxpy instance. `module` is the IR (a dummy file when None: enough for backends
    that never read it); with `snapshots`, real prologue/epilogue files (y = 2*x + y over n floats)."""
    import struct

    directory.mkdir(parents=True, exist_ok=True)
    threads = math.prod(grid) * math.prod(block)
    n = threads if n is None else n
    ir = directory / "RecordedIR_saxpy.bc"
    ir.write_bytes(Path(module).read_bytes() if module else b"BC\xc0\xde not really bitcode")
    pro, epi = directory / f"{dynamic_hash}.prologue", directory / f"{dynamic_hash}.epilogue"
    x_addr, y_addr = 0x153940000000, 0x153940000000 + (1 << 20)
    if snapshots:
        from mneme.snapshot import SnapshotType, Writer

        x = struct.pack(f"<{n}f", *[float(i % 97) for i in range(n)])
        y = struct.pack(f"<{n}f", *[1.0] * n)
        y2 = struct.pack(f"<{n}f", *[2.0 * (i % 97) + 1.0 for i in range(n)])
        packed = [struct.pack("<f", 2.0), struct.pack("<Q", x_addr), struct.pack("<Q", y_addr), struct.pack("<i", n)]
        with Writer(pro, SnapshotType.PROLOGUE) as w:
            w.blob(x_addr, x)
            w.blob(y_addr, y)
            w.args(packed)
        with Writer(epi, SnapshotType.EPILOGUE) as w:
            w.blob_epilogue(x_addr, x, x)
            w.blob_epilogue(y_addr, y2, y)
            w.args(packed)
    else:
        pro.write_bytes(b"prologue")
        epi.write_bytes(b"epilogue")
    static = "5" * 64  # a dummy module is never linked; real IR gets its real static hash (replay checks it)
    if module:
        from mneme.ir import link_modules, static_hash

        static = static_hash(link_modules([str(ir)], KERNEL), KERNEL)
    hex_args = [struct.pack("<f", 2.0).hex(), struct.pack("<Q", x_addr).hex(), struct.pack("<Q", y_addr).hex(),
                struct.pack("<i", n).hex()]
    db = {
        "SchemaVersion": 1,
        "StaticHash": static,
        "KernelName": KERNEL,
        "DemangledName": "saxpy(float, float const*, float*, int)",
        "Modules": [ir.name],
        "BinaryBlobs": [],
        "ArgNames": ["a", "x", "y", "n"],
        "ArgKinds": ["float", "ptr", "ptr", "int"],
        "Specializations": [True, False, False, True],
        "VAddr": hex(0x153940000000),
        "VASize": 4,
        "instances": {
            dynamic_hash: {
                "Args": hex_args,
                "BlockDims": dict(zip("xyz", block)),
                "GridDims": dict(zip("xyz", grid)),
                "Occurrences": 1,
                "SharedMem": 0,
                "Prologue": pro.name,
                "Epilogue": epi.name,
                "InAppTimeNs": 5000.0,
            }
        },
    }
    path = directory / "saxpy.json"
    path.write_text(json.dumps(db, indent=2))
    return path


def real_record(directory: Path, grid=(64, 1, 1), block=(128, 1, 1)) -> Path:
    """A record DB whose IR is real saxpy bitcode from clang-22, with real snapshots (skips without clang)."""
    from irutil import compile_cu

    directory.mkdir(parents=True, exist_ok=True)
    src = directory / "saxpy.cu"
    src.write_text(SAXPY_CU)
    bc = compile_cu(src, directory / "bc")
    return write_record(directory / "rec", grid=grid, block=block, module=bc, snapshots=True)


def synthetic_time(config) -> float:
    """A smooth landscape with one optimum: 256 threads per block at default<O3>, no specialization."""
    threads = config.block.total()
    t = 1000.0 + 150.0 * abs(math.log2(threads) - 8.0)
    t += {"default<O3>": 0.0, "default<O2>": 40.0, "default<O1>": 120.0}.get(config.passes, 300.0)
    t += 0.0 if config.codegen_opt == 3 else 25.0 * (3 - config.codegen_opt)
    return t


class SyntheticBackend:
    """Stands in for the GPU: times follow `synthetic_time`. Two shapes misbehave on purpose: a block of 512
    threads is the fastest but computes a wrong answer (failed_verification) and 1024 threads fail to launch
    (invalid_launch). MNEME_TEST_RUN_DELAY (seconds) slows every run, so a test can kill a study midway;
    MNEME_TEST_RUN_LOG names a file that gets one line per run (visible GPU, pid, start, end)."""

    def __init__(self, record_db, record_id, device_id, settings, cache_dir):
        self.settings = settings or {}
        self.device_id = device_id
        self.delay = float(os.environ.get("MNEME_TEST_RUN_DELAY", "0") or 0)

    def compile(self, config):
        return {"passes": config.passes, "codegen_opt": config.codegen_opt, "cache_hit": False}

    def describe(self, compiled, config):
        return ExperimentResult(status="compiled", reg_usage=16 + 8 * (3 - config.codegen_opt) + (4 if config.specialize else 0),
                                obj_size=4096 + config.block.x)

    def open(self):
        return {"gpu_name": f"synthetic (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})"}

    def run(self, compiled, config):
        start = time.monotonic()
        if self.delay:
            time.sleep(self.delay)
        log = os.environ.get("MNEME_TEST_RUN_LOG")
        if log:  # one line per run: which GPU the process saw, and when the run began and ended
            with open(log, "a") as fd:
                fd.write(f"{os.environ.get('CUDA_VISIBLE_DEVICES')} {os.getpid()} {start} {time.monotonic()}\n")
        threads = config.block.total()
        if threads == 1024:
            return ExperimentResult(status="invalid_launch", failed=True, error="too many resources requested for launch")
        t = synthetic_time(config) * (0.5 if threads == 512 else 1.0)
        iters = int(self.settings.get("iterations", 10))
        times = [int(t + (i % 3)) for i in range(iters)]
        verified = threads != 512
        return ExperimentResult(
            status="verified" if verified else "failed_verification", verified=verified, executed=True,
            failed=not verified, exec_time=times, reg_usage=20, error="" if verified else "y differs at byte 0",
        )

    def close(self):
        pass


class FailingBackend(SyntheticBackend):
    """Only the worker's first run (the baseline) verifies, and not even that with MNEME_TEST_FAIL_BASELINE=1."""

    runs = 0

    def run(self, compiled, config):
        r = super().run(compiled, config)
        FailingBackend.runs += 1
        if FailingBackend.runs == 1 and os.environ.get("MNEME_TEST_FAIL_BASELINE") != "1":
            return r
        return ExperimentResult(status="failed_verification", failed=True, executed=True, exec_time=r.exec_time,
                                error="wrong answer")


class CrashingBackend(SyntheticBackend):
    """Dies for chosen block sizes: 64 -> os._exit(3), 96 -> SIGSEGV (a real invalid read), 160 -> hangs.
    Compilation dies by SIGSEGV for codegen_opt 1."""

    def compile(self, config):
        if config.codegen_opt == 1:
            ctypes.string_at(0)
        return super().compile(config)

    def run(self, compiled, config):
        bx = config.block.x
        if bx == 64:
            os._exit(3)
        if bx == 96:
            ctypes.string_at(0)
        if bx == 160:
            time.sleep(3600)
        return super().run(compiled, config)


class BrokenDeviceBackend(SyntheticBackend):
    """A GPU worker that cannot open its device (as with a missing driver)."""

    def open(self):
        from mneme.errors import DeviceError

        raise DeviceError("cuInit failed: CUDA_ERROR_NO_DEVICE (synthetic)")


class SetupCrashBackend(SyntheticBackend):
    """A GPU worker that crashes while opening its device."""

    def open(self):
        os.kill(os.getpid(), signal.SIGSEGV)


def test_synthetic_landscape_has_the_documented_optimum():
    from mneme.config import ExperimentConfiguration, dim3

    times = {b: synthetic_time(ExperimentConfiguration(block=dim3(b))) for b in (64, 128, 256, 512)}
    assert min(times, key=times.get) == 256
    r = SyntheticBackend("", None, 0, {"iterations": 4}, None).run(None, ExperimentConfiguration(block=dim3(512)))
    assert r.status == "failed_verification" and r.exec_time and min(r.exec_time) < times[256]


if __name__ == "__main__":  # pragma: no cover - manual use: write a record DB to a directory
    print(write_record(Path(sys.argv[1])))


class ContextKillingBackend(SyntheticBackend):
    """A block of 64 threads makes an illegal address (a sticky error that kills the CUDA context); at the
    recorded block, -O2 codegen does (the compile settings are to blame there)."""

    def run(self, compiled, config):
        if config.block.total() == 64 or (config.block.total() == 128 and config.codegen_opt == 2):
            return ExperimentResult(status="runtime_error", failed=True,
                                    error="CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered (sticky)")
        return super().run(compiled, config)


class BinaryBackend(SyntheticBackend):
    """Compiles default<O2> and default<O3> to the same machine code (equal binary digests); every run is
    logged to MNEME_TEST_RUN_LOG (pipeline and block), so a test sees which configurations really ran."""

    def compile(self, config):
        import types

        same = config.passes in ("default<O2>", "default<O3>")
        return types.SimpleNamespace(binary="O23" if same else config.passes, passes=config.passes, cache_hit=False)

    def run(self, compiled, config):
        log = os.environ.get("MNEME_TEST_RUN_LOG")
        if log:
            with open(log, "a") as fd:
                fd.write(f"{config.passes} {config.block.x}\n")
        return super().run(compiled, config)
