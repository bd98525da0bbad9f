"""The processes behind the AsyncReplayExecutor: compile workers and one GPU worker per device.

Each worker builds one backend when it starts and keeps it: a compile worker links the IR once, a GPU worker
also opens its device once (context, arena, prologue) and reuses it for every experiment. The parent talks to
a worker over one pipe, one job at a time:

    parent -> worker: ("compile", job, config) | ("describe", job, config) | ("run", job, config, compiled) | ("stop",)
    worker -> parent: ("ready", info) | ("setup_error", message)
                      ("done", job, payload, recycle) | ("error", job, status, message, recycle)

`recycle` tells the parent the worker exits after this answer (a GPU worker does so after a runtime error or
a timeout, since the CUDA context may be unusable), so no job is sent to it; the parent starts a fresh one.

The backend is named by an import path ("module:Class") so tests can put in backends that really crash or
hang. A backend is constructed as Class(record_db=, record_id=, device_id=, settings=, cache_dir=) and offers
compile(config), describe(compiled, config) (a compile-only result), open() -> info, run(compiled, config),
close().
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import signal
import sys
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, Optional, Tuple

from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings

DEFAULT_BACKEND = "mneme.tune.worker:ReplayBackend"
#: statuses after which a GPU worker starts afresh, for backends that cannot say whether their context is
#: still usable (ReplayBackend can: a sticky CUDA error or a timeout poisons it)
RECYCLE_STATUSES = ("runtime_error", "timeout")


@dataclass
class WorkerSpec:
    """Everything a worker process needs to start (picklable)."""

    role: str  # "compile" or "gpu"
    name: str  # e.g. "gpu-1", "compile-3": names the log file
    backend: str
    record_db: str
    record_id: Optional[str]
    settings: Dict[str, Any] = field(default_factory=dict)
    cache_dir: Optional[str] = None
    log_path: Optional[str] = None
    #: device ordinal the backend opens (0 when the worker is pinned through CUDA_VISIBLE_DEVICES)
    device_id: Optional[int] = None
    #: CUDA_VISIBLE_DEVICES for the worker (pins it to one GPU); None leaves the environment alone
    visible: Optional[str] = None


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def load_object(path: str):
    """Import `module:attribute` (dots in the attribute walk nested names)."""
    modname, _, attr = path.partition(":")
    obj = importlib.import_module(modname)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


def classify(exc: BaseException, role: str) -> str:
    """The experiment status an exception stands for."""
    from mneme.errors import CompileError, ConfigurationError, DeviceError

    if isinstance(exc, ConfigurationError):
        return "invalid_config"
    if isinstance(exc, CompileError):
        return "compile_error"
    if isinstance(exc, DeviceError):
        return "runtime_error"
    return "compile_error" if role == "compile" else "runtime_error"


class ReplayBackend:
    """The real backend: one ReplayPipeline per worker process."""

    def __init__(self, record_db: str, record_id: Optional[str], device_id: Optional[int], settings: Dict[str, Any],
                 cache_dir: Optional[str]):
        from mneme.replay.pipeline import ReplayPipeline

        self.pipeline = ReplayPipeline(
            record_db, record_id, device_id=device_id, settings=MeasurementSettings.from_dict(settings or {}),
            cache_dir=cache_dir,
        )

    def compile(self, config: ExperimentConfiguration):
        return self.pipeline.compile(config)

    def describe(self, compiled, config: ExperimentConfiguration) -> ExperimentResult:
        """The compile-only result of a compiled kernel (status `compiled`)."""
        from mneme.replay.pipeline import COMPILED, fill_compile_metrics

        result = self.pipeline.new_result(config)
        fill_compile_metrics(result, compiled)
        result.status = COMPILED
        result.end_time = now_iso()
        return result

    def open(self) -> Dict[str, Any]:
        self.pipeline.open()
        dev = self.pipeline.device
        return {"gpu_name": getattr(dev, "name", ""), "arch": getattr(dev, "arch", "")}

    def run(self, compiled, config: ExperimentConfiguration) -> ExperimentResult:
        return self.pipeline.run(compiled, config)

    @property
    def usable(self) -> bool:
        """False once a sticky CUDA error or a timeout poisoned this process's context."""
        return self.pipeline.usable

    def close(self) -> None:
        self.pipeline.close()


def _prepare_process(spec: WorkerSpec) -> None:
    """Pin, detach from the terminal's Ctrl-C, die with the parent, and log to the worker's own file."""
    if spec.visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.visible
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the tuner
        except (OSError, AttributeError):
            pass
    if spec.log_path:
        fd = os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    faulthandler.enable()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    print(f"[{now_iso()}] {spec.name} (pid {os.getpid()}) starting; CUDA_VISIBLE_DEVICES={visible}", flush=True)


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 4000 else text[:4000] + " ..."


def _handle(backend, spec: WorkerSpec, msg: Tuple) -> Tuple[Any, bool]:
    """(payload, recycle) for one job; exceptions propagate to the caller."""
    op = msg[0]
    config = ExperimentConfiguration.from_dict(msg[2])
    if op == "compile":
        return backend.compile(config), False
    if op == "describe":
        result = backend.describe(backend.compile(config), config)
        return result.to_dict(), False
    if op == "run":
        result = backend.run(msg[3], config)
        usable = getattr(backend, "usable", None)
        recycle = (not usable) if usable is not None else result.status in RECYCLE_STATUSES
        return result.to_dict(), recycle
    raise ValueError(f"unknown request {op!r}")


#: A compile worker is replaced after this many jobs: llvmlite's pass builder leaks 75-240 KB a run
#: (measured on LLVM 22), which would otherwise grow without bound over a long study.
COMPILES_PER_WORKER = int(os.environ.get("MNEME_COMPILES_PER_WORKER", "500"))


def serve(conn, spec: WorkerSpec) -> None:
    """Worker process entry point: set up once, then answer jobs until told to stop."""
    _prepare_process(spec)
    try:
        backend = load_object(spec.backend)(
            record_db=spec.record_db, record_id=spec.record_id,
            device_id=spec.device_id if spec.role == "gpu" else None,
            settings=spec.settings, cache_dir=spec.cache_dir,
        )
        info = backend.open() if spec.role == "gpu" else {}
    except BaseException as e:  # noqa: BLE001 - every setup failure must reach the parent
        traceback.print_exc()
        conn.send(("setup_error", _error_text(e)))
        return
    conn.send(("ready", dict(info or {}, pid=os.getpid())))
    jobs = 0
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "stop":
                break
            job = msg[1]
            print(f"[{now_iso()}] job {job}: {msg[0]}", flush=True)
            jobs += 1
            try:
                payload, recycle = _handle(backend, spec, msg)
                recycle = recycle or (spec.role != "gpu" and jobs >= COMPILES_PER_WORKER)
                conn.send(("done", job, payload, recycle))
            except Exception as e:  # noqa: BLE001 - report, then decide whether this process goes on
                traceback.print_exc()
                recycle = spec.role == "gpu"
                conn.send(("error", job, classify(e, spec.role), _error_text(e), recycle))
            if recycle:
                print(f"[{now_iso()}] {spec.name} exits to be replaced after job {job}", flush=True)
                break
    finally:
        try:
            backend.close()
        except Exception:  # noqa: BLE001 - closing a broken device must not hide the real error
            traceback.print_exc()
