"""AsyncReplayExecutor: evaluate many replay configurations of one recorded kernel, fast and safely.

- Compilation (IR -> PTX -> cubin, no GPU) runs in `compile_jobs` worker processes.
- Timed runs go to one GPU worker process per device; a GPU runs one experiment at a time, so two timed
  kernels never share a GPU. Each GPU worker opens its device, arena and prologue once and keeps them.
- Configurations that compile to the same code share one compilation: the executor keeps the compiled
  kernels it has seen (keyed by the fields that reach the compiler), and the pipeline's on-disk cache under
  `cache_dir` (keyed by code hash) is shared by every worker.
- Configurations whose cubins hold the same machine code (mneme.ir.codegen.binary_digest) at the same launch
  are timed once: the others get a copy of that result with `same_binary_as` naming the configuration that ran.
- A worker that crashes or stops answering fails only the job it was running (runtime_error or timeout,
  with the reason) and is replaced; the other jobs go on.
- Without devices (`devices=[]`) the executor returns compile-only results: resources, size, compile times.

All bookkeeping happens in one dispatcher thread that waits on the workers' pipes and process sentinels;
`submit` only hands a job over. Workers start with the 'spawn' method (CUDA does not survive fork).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import queue
import signal
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings
from mneme.errors import ConfigurationError, DeviceError
from mneme.tune.worker import DEFAULT_BACKEND, WorkerSpec, now_iso, serve

#: a worker that crashes this often in a row while starting is given up
MAX_SETUP_FAILURES = 3
#: result.gpu_id of experiments that never reached a GPU
NO_GPU = -1


class EvalFuture(Future):
    """The future result (an ExperimentResult) of one submitted configuration."""

    def __init__(self, job_id: int, config: ExperimentConfiguration):
        super().__init__()
        self.job_id = job_id
        self.config = config


def compile_key(config: ExperimentConfiguration, arch: Optional[str]) -> str:
    """What decides the compiled code: launch geometry only matters when dimensions are specialized."""
    d = config.grounded().to_dict()
    d.pop("shared_mem", None)
    if not d.get("specialize_dims"):
        d.pop("grid", None)
        d.pop("block", None)
    d["arch"] = arch
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def visible_devices() -> List[int]:
    """Ordinals of the GPUs this process can see (empty without a driver or a GPU)."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return []
        err, n = driver.cuDeviceGetCount()
        return list(range(int(n))) if int(err) == 0 else []
    except Exception:  # noqa: BLE001 - no libcuda, no GPU: both mean "none visible"
        return []


def pinned_visible(device: int) -> str:
    """CUDA_VISIBLE_DEVICES that shows a worker only `device` (an ordinal among the GPUs visible here)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return str(device)
    items = [s.strip() for s in env.split(",") if s.strip()]
    if not 0 <= device < len(items):
        raise DeviceError(
            f"GPU {device} was asked for, but CUDA_VISIBLE_DEVICES={env!r} shows {len(items)} GPU(s) "
            f"(ordinals 0..{len(items) - 1})"
        )
    return items[device]


def failed_result(config: ExperimentConfiguration, status: str, error: str, gpu_id: int = NO_GPU) -> ExperimentResult:
    t = now_iso()
    return ExperimentResult(
        status=status, failed=True, error=error, config_hash=config.hash(), gpu_id=gpu_id, start_time=t, end_time=t,
    )


def _exit_text(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


@dataclass
class _Job:
    id: int
    config: ExperimentConfiguration
    future: EvalFuture
    key: str = ""
    compiled: Any = None
    memo_hit: bool = False
    #: (binary digest, grid, block, shared memory) when this job is the one whose run others reuse
    run_key: Optional[Tuple] = None


@dataclass
class _Compiled:
    """What the executor knows about one compile key."""

    state: str = "pending"  # pending | ok | error
    compiled: Any = None
    result: Optional[Dict[str, Any]] = None  # device-less: the compile-only result
    status: str = ""
    error: str = ""
    waiters: List[_Job] = field(default_factory=list)


class _Worker:
    def __init__(self, role: str, index: int, spec: WorkerSpec, device: Optional[int] = None):
        self.role = role
        self.index = index
        self.spec = spec
        self.device = device
        self.process = None
        self.conn = None
        self.state = "new"  # new | starting | idle | busy | retiring | broken
        self.job: Optional[Tuple[str, _Job]] = None
        self.deadline = float("inf")
        self.failures = 0
        self.info: Dict[str, Any] = {}
        self.error = ""
        self.busy_since = 0.0
        self.busy_s = 0.0
        self.jobs_done = 0
        self.starts = 0
        self.eof = False

    @property
    def label(self) -> str:
        return f"GPU worker {self.device}" if self.role == "gpu" else f"compile worker {self.index}"


class AsyncReplayExecutor:
    """Asynchronous evaluation of replay configurations on GPU worker processes (see the module docstring).

    `devices=None` uses every visible GPU; `devices=[]` compiles only. `backend` names the class the workers
    build ("module:Class", see mneme.tune.worker); tests use it to put in workers that crash or hang.
    """

    def __init__(
        self,
        record_db: str,
        record_id: Optional[str] = None,
        devices: Optional[Sequence[int]] = None,
        compile_jobs: Optional[int] = None,
        settings: Optional[MeasurementSettings] = None,
        cache_dir: Optional[str] = None,
        log_dir: Optional[str] = None,
        backend: str = DEFAULT_BACKEND,
        start_method: str = "spawn",
        compile_timeout: float = 600.0,
        run_timeout: Optional[float] = None,
        setup_timeout: float = 600.0,
        memo_size: int = 512,
        pin: str = "env",
    ):
        if start_method not in ("spawn", "forkserver"):
            raise ConfigurationError(
                f"start_method {start_method!r}: use 'spawn' or 'forkserver' (CUDA does not survive fork)"
            )
        if pin not in ("env", "ordinal"):
            raise ConfigurationError(f"pin {pin!r}: use 'env' (CUDA_VISIBLE_DEVICES per worker) or 'ordinal'")
        self.settings = settings or MeasurementSettings()
        if devices is None:
            devices = visible_devices()
            if not devices:
                raise DeviceError("no GPU is visible (no driver or no device); pass devices=[] to compile only")
        self.devices = [int(d) for d in devices]
        if len(set(self.devices)) != len(self.devices):
            raise ConfigurationError(f"devices {self.devices} name a GPU twice; one worker per GPU")
        self.compile_jobs = int(compile_jobs or os.cpu_count() or 1)
        if self.compile_jobs < 1:
            raise ConfigurationError("compile_jobs must be at least 1")
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="mneme-workers-")
        os.makedirs(self.log_dir, exist_ok=True)
        self.compile_timeout = float(compile_timeout)
        s = self.settings
        self.run_timeout = float(run_timeout) if run_timeout else s.timeout * (s.iterations + s.warmup + 2) + 30.0
        self.setup_timeout = float(setup_timeout)
        self.memo_size = int(memo_size)
        self._ctx = mp.get_context(start_method)

        base = dict(backend=backend, record_db=str(record_db), record_id=record_id, settings=s.to_dict(),
                    cache_dir=cache_dir)
        self._workers: List[_Worker] = []
        for i in range(self.compile_jobs):
            log = os.path.join(self.log_dir, f"compile-{i}.log")
            self._workers.append(_Worker("compile", i, WorkerSpec(role="compile", name=f"compile-{i}", log_path=log, **base)))
        for i, d in enumerate(self.devices):
            visible = pinned_visible(d) if pin == "env" else None
            spec = WorkerSpec(
                role="gpu", name=f"gpu-{d}", log_path=os.path.join(self.log_dir, f"gpu-{d}.log"),
                device_id=0 if pin == "env" else d, visible=visible, **base,
            )
            self._workers.append(_Worker("gpu", i, spec, device=d))

        self._ids = itertools.count()
        self._inbox: "queue.SimpleQueue[_Job]" = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._compile_q: Deque[Tuple[str, _Job]] = collections.deque()
        self._run_q: Deque[_Job] = collections.deque()
        self._memo: "collections.OrderedDict[str, _Compiled]" = collections.OrderedDict()
        #: run key -> {"first": job, "result": ExperimentResult | None, "waiters": [jobs]}
        self._timed: "collections.OrderedDict[Tuple, Dict[str, Any]]" = collections.OrderedDict()
        self._closing = False
        self._cancel = False
        self._closed = False
        self._fatal: Optional[BaseException] = None
        self._stats: "collections.Counter[str]" = collections.Counter()
        self._statuses: "collections.Counter[str]" = collections.Counter()
        self._stats_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="mneme-executor", daemon=True)
        self._thread.start()

    # -- public API ----------------------------------------------------------------------------
    @property
    def device_less(self) -> bool:
        return not self.devices

    def submit(self, config: ExperimentConfiguration) -> EvalFuture:
        """Queue one configuration; the future resolves to its ExperimentResult (failures included)."""
        if self._closing:
            raise RuntimeError("the executor is shut down")
        if self._fatal is not None:
            raise RuntimeError(f"the executor stopped: {self._fatal!r}")
        config = ExperimentConfiguration.from_dict(config.to_dict())
        job = _Job(next(self._ids), config, EvalFuture(0, config))
        job.future.job_id = job.id
        with self._stats_lock:
            self._stats["submitted"] += 1
        problems = config.problems()
        if problems:
            self._resolve(job, failed_result(config, "invalid_config", "; ".join(problems)))
            return job.future
        self._inbox.put(job)
        self._wake()
        return job.future

    def evaluate(self, config: ExperimentConfiguration) -> ExperimentResult:
        """Submit and wait."""
        return self.submit(config).result()

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Stop the workers. With wait, queued jobs finish first; with cancel_futures they are cancelled."""
        if self._closed:
            return
        self._closing = True
        self._cancel = self._cancel or cancel_futures
        self._wake()
        if wait or cancel_futures:
            self._thread.join()
            self._closed = True
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def __enter__(self) -> "AsyncReplayExecutor":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)

    def stats(self) -> Dict[str, Any]:
        """Counters: submitted, completed, statuses, compiles, cache hits, crashes, timeouts, per-GPU load."""
        with self._stats_lock:
            st: Dict[str, Any] = dict(self._stats)
            st["statuses"] = dict(self._statuses)
        compiles = st.get("compiles", 0)
        hits = st.get("memo_hits", 0) + st.get("disk_hits", 0)
        lookups = st.get("memo_hits", 0) + compiles
        st["cache_hit_rate"] = hits / lookups if lookups else 0.0
        st["workers"] = [
            {"role": w.role, "device": w.device, "state": w.state, "starts": w.starts, "jobs": w.jobs_done,
             "busy_s": round(w.busy_s, 3), "error": w.error, "info": w.info}
            for w in self._workers
        ]
        return st

    def gpu_busy_s(self) -> float:
        """Seconds the GPU workers have spent on jobs so far (running ones counted up to now)."""
        now = time.monotonic()
        return sum(w.busy_s + (now - w.busy_since if w.job is not None else 0.0)
                   for w in self._workers if w.role == "gpu")

    def worker_errors(self) -> List[str]:
        return [f"{w.label}: {w.error}" for w in self._workers if w.state == "broken"]

    # -- dispatcher thread -------------------------------------------------------------------------
    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _loop(self) -> None:
        try:
            for w in self._workers:
                self._start(w)
            while True:
                self._take_submissions()
                if self._cancel:
                    self._cancel_all()
                self._assign()
                if self._closing and self._drained():
                    break
                self._wait()
        except BaseException as e:  # noqa: BLE001 - never leave futures hanging
            self._fatal = e
            self._fail_everything(f"the executor stopped: {e!r}")
        finally:
            self._stop_workers()

    def _wait(self) -> None:
        handles: List[Any] = [self._wake_r]
        by_conn: Dict[int, _Worker] = {}
        by_sentinel: Dict[int, _Worker] = {}
        for w in self._workers:
            if w.process is None or w.state in ("broken", "new"):
                continue
            if not w.eof:
                handles.append(w.conn)
                by_conn[id(w.conn)] = w
            handles.append(w.process.sentinel)
            by_sentinel[w.process.sentinel] = w
        deadline = min([w.deadline for w in self._workers] + [float("inf")])
        timeout = max(0.0, min(1.0, deadline - time.monotonic()))
        exits = []
        for h in mpc.wait(handles, timeout):
            if isinstance(h, int) and h == self._wake_r:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
            elif isinstance(h, int):
                exits.append(by_sentinel[h])
            else:
                self._receive(by_conn[id(h)])
        for w in exits:
            self._on_exit(w)
        self._check_deadlines()

    # -- workers -------------------------------------------------------------------------------------
    def _start(self, w: _Worker) -> None:
        if self._closing and self._cancel:
            return
        parent, child = self._ctx.Pipe(duplex=True)
        w.process = self._ctx.Process(target=serve, args=(child, w.spec), name=w.spec.name, daemon=True)
        w.process.start()
        child.close()
        w.conn = parent
        w.eof = False
        w.state = "starting"
        w.job = None
        w.deadline = time.monotonic() + self.setup_timeout
        w.starts += 1
        if w.starts > 1:
            self._stats["respawns"] += 1

    def _receive(self, w: _Worker) -> None:
        while w.conn is not None:
            try:
                if not w.conn.poll(0):
                    return
                msg = w.conn.recv()
            except (EOFError, OSError):
                w.eof = True  # the sentinel reports the exit
                return
            self._on_message(w, msg)

    def _on_message(self, w: _Worker, msg: Tuple) -> None:
        kind = msg[0]
        if kind == "ready":
            w.state, w.info, w.failures, w.deadline = "idle", dict(msg[1]), 0, float("inf")
            return
        if kind == "setup_error":
            w.state, w.error, w.deadline = "broken", str(msg[1]), float("inf")
            self._fail_if_no_workers()
            return
        if w.job is None:
            return
        op, job = w.job
        w.job = None
        w.deadline = float("inf")
        w.busy_s += time.monotonic() - w.busy_since
        w.jobs_done += 1
        recycle = bool(msg[-1])
        w.state = "retiring" if recycle else "idle"
        if kind == "done":
            self._done(w, op, job, msg[2])
        else:
            self._errored(w, op, job, str(msg[2]), str(msg[3]))

    def _on_exit(self, w: _Worker) -> None:
        self._receive(w)  # an answer sent just before exiting still counts
        self._reap(w, grace=5)
        code = w.process.exitcode
        if w.job is not None:
            op, job = w.job
            w.job = None
            w.busy_s += time.monotonic() - w.busy_since
            self._stats["crashes"] += 1
            log = w.spec.log_path
            self._errored(
                w, op, job, self._crash_status(w),
                f"{w.label} died ({_exit_text(code)}) during {op} of configuration {job.config.hash()[:12]}; "
                f"it was replaced (log: {log})",
            )
        elif w.state == "starting":
            w.failures += 1
            if w.failures >= MAX_SETUP_FAILURES:
                w.state = "broken"
                w.error = f"crashed while starting ({_exit_text(code)}), {w.failures} times; see {w.spec.log_path}"
                self._fail_if_no_workers()
                return
        if w.state == "broken":
            return
        w.state = "new"
        if not (self._closing and self._drained()):
            self._start(w)

    def _crash_status(self, w: _Worker) -> str:
        return "runtime_error" if w.role == "gpu" else "compile_error"

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for w in self._workers:
            if w.deadline > now or w.process is None:
                continue
            starting = w.state == "starting"
            self._reap(w, grace=0)
            w.deadline = float("inf")
            self._stats["timeouts"] += 1
            if w.job is not None:
                op, job = w.job
                w.job = None
                w.busy_s += now - w.busy_since
                limit = self.run_timeout if op == "run" else self.compile_timeout
                self._errored(
                    w, op, job, "timeout",
                    f"{w.label} gave no answer within {limit:g} s during {op} of configuration "
                    f"{job.config.hash()[:12]}; it was killed and replaced",
                )
            elif starting:
                w.failures += 1
                if w.failures >= MAX_SETUP_FAILURES:
                    w.state, w.error = "broken", f"did not start within {self.setup_timeout:g} s, {w.failures} times"
                    self._fail_if_no_workers()
                    continue
            w.state = "new"
            self._start(w)

    def _send(self, w: _Worker, op: str, job: _Job) -> bool:
        msg: Tuple = (op, job.id, job.config.to_dict())
        if op == "run":
            msg = msg + (job.compiled,)
        try:
            w.conn.send(msg)
        except (BrokenPipeError, EOFError, OSError):
            return False
        w.state, w.job, w.busy_since = "busy", (op, job), time.monotonic()
        w.deadline = w.busy_since + (self.run_timeout if op == "run" else self.compile_timeout)
        return True

    def _stop_workers(self) -> None:
        for w in self._workers:
            if w.process is not None and w.process.is_alive():
                try:
                    w.conn.send(("stop",))
                except (BrokenPipeError, EOFError, OSError):
                    pass
        for w in self._workers:
            if w.process is not None:
                self._reap(w, grace=10)

    @staticmethod
    def _reap(w: _Worker, grace: float) -> None:
        """Give the worker's process `grace` seconds to exit, kill it if it has not, and close its pipe."""
        if grace > 0:
            w.process.join(timeout=grace)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(timeout=5)
        try:
            w.conn.close()
        except OSError:
            pass

    # -- jobs ------------------------------------------------------------------------------------------
    def _take_submissions(self) -> None:
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return
            job.key = compile_key(job.config, self.settings.arch)
            entry = self._memo.get(job.key)
            if entry is None:
                entry = self._memo[job.key] = _Compiled(waiters=[job])
                self._compile_q.append(("describe" if self.device_less else "compile", job))
                self._evict()
                continue
            self._memo.move_to_end(job.key)
            job.memo_hit = True
            self._stats["memo_hits"] += 1
            if entry.state == "pending":
                entry.waiters.append(job)
            elif entry.state == "error":
                self._resolve(job, failed_result(job.config, entry.status, entry.error))
            elif self.device_less:
                self._resolve(job, self._copy_result(entry.result, job, cache_hit=True))
            else:
                job.compiled = entry.compiled
                self._queue_run(job)

    def _queue_run(self, job: _Job) -> None:
        """Queue a compiled job's run, unless the same machine code at the same launch ran (or runs) already."""
        digest = getattr(job.compiled, "binary", "") or ""
        if not digest:
            self._run_q.append(job)
            return
        c = job.config
        key = (digest, tuple(int(v) for v in c.grid), tuple(int(v) for v in c.block), int(c.shared_mem))
        entry = self._timed.get(key)
        if entry is None:
            self._timed[key] = {"first": job, "result": None, "waiters": []}
            job.run_key = key
            self._run_q.append(job)
            while len(self._timed) > 8 * self.memo_size:
                old = next(iter(self._timed))
                if self._timed[old]["result"] is None:
                    break
                del self._timed[old]
        elif entry["result"] is None:
            entry["waiters"].append(job)
        else:
            self._resolve(job, self._reused(entry, job))

    def _reused(self, entry: Dict[str, Any], job: _Job) -> ExperimentResult:
        result = ExperimentResult.from_dict(entry["result"].to_dict())
        result.config_hash = job.config.hash()
        result.same_binary_as = entry["first"].config.hash()
        result.cache_hit = True
        with self._stats_lock:
            self._stats["same_binary"] += 1
        return result

    def _evict(self) -> None:
        while len(self._memo) > self.memo_size:
            for key, entry in self._memo.items():
                if entry.state != "pending":
                    del self._memo[key]
                    break
            else:
                return

    def _assign(self) -> None:
        for w in self._workers:
            if w.state != "idle":
                continue
            q = self._compile_q if w.role == "compile" else self._run_q
            while q:
                item = q.popleft()
                op, job = item if w.role == "compile" else ("run", item)
                if self._send(w, op, job):
                    break
                q.appendleft(item)  # the worker is gone; its sentinel will say so
                w.state = "retiring"
                break
        self._fail_if_no_workers()

    def _done(self, w: _Worker, op: str, job: _Job, payload: Any) -> None:
        if op == "run":
            result = ExperimentResult.from_dict(payload)
            self._finish_run(w, job, result)
            return
        self._stats["compiles"] += 1
        entry = self._memo.get(job.key)
        waiters = entry.waiters if entry is not None else [job]
        if op == "describe":
            if payload.get("cache_hit"):
                self._stats["disk_hits"] += 1
            if entry is not None:
                entry.state, entry.result, entry.waiters = "ok", payload, []
            for j in waiters:
                self._resolve(j, self._copy_result(payload, j, cache_hit=j.memo_hit or bool(payload.get("cache_hit"))))
            return
        if getattr(payload, "cache_hit", False):
            self._stats["disk_hits"] += 1
        if entry is not None:
            entry.state, entry.compiled, entry.waiters = "ok", payload, []
        for j in waiters:
            j.compiled = payload
            self._queue_run(j)

    def _errored(self, w: _Worker, op: str, job: _Job, status: str, message: str) -> None:
        if op == "run":
            self._finish_run(w, job, failed_result(job.config, status, message, gpu_id=w.device))
            return
        self._stats["compiles"] += 1
        entry = self._memo.get(job.key)
        waiters = entry.waiters if entry is not None else [job]
        if entry is not None:
            entry.state, entry.status, entry.error, entry.waiters = "error", status, message, []
        for j in waiters:
            self._resolve(j, failed_result(j.config, status, message))

    def _finish_run(self, w: _Worker, job: _Job, result: ExperimentResult) -> None:
        result.gpu_id = w.device
        result.gpu_name = result.gpu_name or str(w.info.get("gpu_name", ""))
        result.config_hash = result.config_hash or job.config.hash()
        result.cache_hit = bool(result.cache_hit or job.memo_hit)
        self._stats[f"runs_gpu{w.device}"] += 1
        self._resolve(job, result)
        entry = self._timed.get(job.run_key) if job.run_key else None
        if entry is not None and entry["first"] is job:
            entry["result"] = result
            waiters, entry["waiters"] = entry["waiters"], []
            for j in waiters:
                self._resolve(j, self._reused(entry, j))

    def _copy_result(self, payload: Dict[str, Any], job: _Job, cache_hit: bool) -> ExperimentResult:
        result = ExperimentResult.from_dict(payload)
        result.config_hash = job.config.hash()
        result.gpu_id = NO_GPU
        result.cache_hit = cache_hit
        return result

    def _resolve(self, job: _Job, result: ExperimentResult) -> None:
        if not result.status and result.failed:
            result.status = "runtime_error"
        with self._stats_lock:
            self._statuses[result.status] += 1
            self._stats["completed"] += 1
        if not job.future.done():
            try:
                job.future.set_result(result)
            except Exception:  # noqa: BLE001 - cancelled meanwhile
                pass

    def _fail_if_no_workers(self) -> None:
        for role, q in (("compile", self._compile_q), ("gpu", self._run_q)):
            group = [w for w in self._workers if w.role == role]
            if not group or not q or any(w.state != "broken" for w in group):
                continue
            why = "; ".join(f"{w.label}: {w.error}" for w in group)
            while q:
                item = q.popleft()
                op, job = item if role == "compile" else ("run", item)
                status = "runtime_error" if role == "gpu" else "compile_error"
                if op == "run":
                    self._resolve(job, failed_result(job.config, status, f"no {role} worker could start ({why})"))
                else:
                    self._errored(group[0], op, job, status, f"no {role} worker could start ({why})")

    def _drained(self) -> bool:
        return (
            self._inbox.empty() and not self._compile_q and not self._run_q
            and all(w.job is None for w in self._workers)
            and not any(e.state == "pending" and e.waiters for e in self._memo.values())
        )

    def _cancel_all(self) -> None:
        for q in (self._compile_q, self._run_q):
            while q:
                item = q.popleft()
                job = item[1] if isinstance(item, tuple) else item
                job.future.cancel()
        for entry in self._memo.values():
            for j in entry.waiters:
                j.future.cancel()
            entry.waiters = []
            if entry.state == "pending":
                entry.state, entry.status, entry.error = "error", "runtime_error", "cancelled"
        for timed in self._timed.values():
            for j in timed["waiters"]:
                j.future.cancel()
            timed["waiters"] = []
        for w in self._workers:
            if w.job is not None and w.process is not None:
                w.job[1].future.cancel()
                w.job = None
                w.process.kill()
                w.state = "broken"
                w.error = "stopped"
        self._memo.clear()

    def _fail_everything(self, why: str) -> None:
        jobs = [j for _, j in self._compile_q] + list(self._run_q)
        jobs += [w.job[1] for w in self._workers if w.job is not None]
        jobs += [j for e in self._memo.values() for j in e.waiters]
        jobs += [j for e in self._timed.values() for j in e["waiters"]]
        while True:
            try:
                jobs.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for j in jobs:
            self._resolve(j, failed_result(j.config, "runtime_error", why))
