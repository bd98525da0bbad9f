"""What one experiment becomes in MLflow: params, tags, metrics and a run status.

Pure functions over the project's dataclasses, with no MLflow import, so that the search process can
turn a result into a loggable record in microseconds and hand it to the writer (see `writer.py`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import pickle
import shutil
import statistics
import subprocess
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, TypeVar, Union

from mneme import __version__
from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings
from mneme.tune.objective import speedup

#: MLflow's limits (mlflow.utils.validation); longer values are cut, the full text is in result.json.
MAX_PARAM_LEN = 6000
MAX_TAG_LEN = 8000

#: ExperimentResult field -> metric name (units in the name so plots need no legend).
RESOURCE_METRICS = {
    "preprocess_ir_time": "preprocess_time_s",
    "opt_time": "opt_time_s",
    "codegen_time": "codegen_time_s",
    "ptx_time": "ptx_time_s",
    "cubin_time": "cubin_time_s",
    "obj_size": "obj_size_bytes",
    "reg_usage": "registers",
    "local_mem_usage": "local_mem_bytes",
    "const_mem_usage": "const_mem_bytes",
    "shared_mem_usage": "shared_mem_bytes",
    "spill_stores": "spill_stores",
    "spill_loads": "spill_loads",
    "stack_size": "stack_bytes",
}
EXEC_METRIC = "exec_time_ns"
TIME_STATS = ("median", "min", "mean", "std")

#: Run states in MLflow's vocabulary.
FINISHED, FAILED, KILLED, RUNNING = "FINISHED", "FAILED", "KILLED", "RUNNING"

Metric = Tuple[str, float, int]  # (key, value, step)
Artifact = Union[bytes, str, Path]


def artifact_bytes(content: Artifact) -> bytes:
    """An artifact's content: str as UTF-8, bytes as they are, a Path's file."""
    if isinstance(content, str):
        return content.encode()
    if isinstance(content, (bytes, bytearray)):
        return bytes(content)
    return Path(content).read_bytes()


@contextlib.contextmanager
def staged(artifacts: Mapping[str, Artifact]) -> Iterator[str]:
    """A temporary directory holding the artifacts as files under their names (for `log_artifacts`)."""
    with tempfile.TemporaryDirectory(prefix="mneme-artifacts-") as tmp:
        for name, content in artifacts.items():
            dest = Path(tmp) / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(artifact_bytes(content))
        yield tmp


@dataclass
class RunRecord:
    """Everything one run gets, ready for the writer: it pickles cheaply across processes."""

    name: str
    params: Dict[str, str] = field(default_factory=dict)
    tags: Dict[str, str] = field(default_factory=dict)
    metrics: List[Metric] = field(default_factory=list)
    #: artifact file name -> content (str is text, bytes as is) or a pathlib.Path to copy
    artifacts: Dict[str, Artifact] = field(default_factory=dict)
    status: str = FINISHED
    #: when the work the run stands for began and ended (epoch ms; None: when the writer logs it)
    start_ms: Optional[int] = None
    end_ms: Optional[int] = None


_M = TypeVar("_M")


def latest(metrics: Iterable[_M], key: Callable[[_M], Tuple[str, int, float]]) -> Dict[str, _M]:
    """Per metric name, the entry MLflow reports as its latest value among entries of one timestamp: the largest
    step, then the largest value, NaN counted as 0 (as the store keeps it); `key` gives (name, step, value)."""
    out: Dict[str, _M] = {}
    ranks: Dict[str, Tuple[int, float]] = {}
    for m in metrics:
        name, step, value = key(m)
        rank = (step, 0.0 if math.isnan(value) else value)
        if name not in out or rank > ranks[name]:
            out[name], ranks[name] = m, rank
    return out


def flatten(data: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """{'grid': {'x': 1}} -> {'grid.x': 1}; lists stay values."""
    out: Dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _text(v: Any, limit: int) -> str:
    s = "None" if v is None else str(v)
    mark = "...[truncated]"
    return s if len(s) <= limit else s[: limit - len(mark)] + mark


def config_params(
    config: ExperimentConfiguration, settings: Optional[MeasurementSettings] = None
) -> Dict[str, str]:
    """The flattened replay configuration (`replay.*`) and measurement settings (`measure.*`)."""
    return _params(config.to_dict(), settings.to_dict() if settings is not None else None)


def _params(config: Dict[str, Any], settings: Optional[Dict[str, Any]]) -> Dict[str, str]:
    flat = {f"replay.{k}": v for k, v in flatten(config).items()}
    if settings is not None:
        flat.update({f"measure.{k}": v for k, v in flatten(settings).items()})
    return {k: _text(v, MAX_PARAM_LEN) for k, v in flat.items()}


def time_stats(exec_time: List[float]) -> Dict[str, float]:
    """Median, min, mean and (population) std of the timed iterations; empty when nothing ran."""
    if not exec_time:
        return {}
    xs = [float(x) for x in exec_time]
    return {
        "median": float(statistics.median(xs)),
        "min": min(xs),
        "mean": statistics.fmean(xs),
        "std": statistics.pstdev(xs) if len(xs) > 1 else 0.0,
    }


def result_metrics(
    result: ExperimentResult, baseline_ns: Optional[float] = None, metric: str = "median"
) -> List[Metric]:
    """Every metric of one experiment; each timed iteration is one step of `exec_time_ns`.

    Speedup is given only for verified runs: a wrong answer fast is no speedup.
    """
    out: List[Metric] = [(EXEC_METRIC, float(t), i) for i, t in enumerate(result.exec_time)]
    out += [(f"exec_time_{k}_ns", v, 0) for k, v in time_stats(result.exec_time).items()]
    for attr, name in RESOURCE_METRICS.items():
        out.append((name, float(getattr(result, attr) or 0), 0))
    out.append(("compile_time_s", compile_seconds(result), 0))
    if result.executed:
        out.append(("verified", 1.0 if result.verified else 0.0, 0))
        out.append(("occupancy", float(result.occupancy or 0.0), 0))
        out.append(("fidelity", float(result.fidelity or 0.0), 0))
        # the largest error verification saw on float buffers (docs/VERIFY.md): per trial, also when it passed
        out.append(("verify_max_abs_err", float(result.max_abs_err or 0.0), 0))
        out.append(("verify_max_rel_err", float(result.max_rel_err or 0.0), 0))
    s = speedup(baseline_ns, result, metric)
    if s is not None:
        out.append(("speedup", s, 0))
    out.append(("cache_hit", 1.0 if result.cache_hit else 0.0, 0))
    return [(k, v, step) for k, v, step in out if math.isfinite(v)]


def compile_seconds(result: ExperimentResult) -> float:
    """IR preprocessing + optimization + code generation (PTX and cubin, or codegen when not split)."""
    codegen = (result.ptx_time or 0) + (result.cubin_time or 0) or (result.codegen_time or 0)
    return float((result.preprocess_ir_time or 0) + (result.opt_time or 0) + codegen)


def run_status(result: ExperimentResult) -> str:
    """FINISHED for a verified run or a successful compile-only one; FAILED for anything else."""
    if result.failed or result.error:
        return FAILED
    if result.executed and not result.verified:
        return FAILED
    return FINISHED


@functools.lru_cache(maxsize=None)
def git_commit() -> str:
    """The commit of the mneme checkout this code runs from ('unknown' outside a git checkout)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


@functools.lru_cache(maxsize=None)
def gpu_environment() -> Tuple[str, str]:
    """(GPU name, driver version) from nvidia-smi; ('none', 'none') on a machine without a GPU."""
    if shutil.which("nvidia-smi") is None:
        return "none", "none"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return "none", "none"
    first = out.stdout.strip().splitlines()[:1]
    if out.returncode != 0 or not first or "," not in first[0]:
        return "none", "none"
    name, driver = (s.strip() for s in first[0].split(",", 1))
    return name, driver


def environment_tags(gpu_name: str = "", driver: str = "") -> Dict[str, str]:
    """Where a run ran: mneme version, git commit, GPU and driver."""
    smi_gpu, smi_driver = gpu_environment()
    commit = git_commit()
    return {
        "mneme.version": __version__,
        "mneme.git_commit": commit,
        "mlflow.source.git.commit": commit,
        "mneme.gpu": gpu_name or smi_gpu,
        "mneme.driver": driver or smi_driver,
    }


def result_tags(
    result: ExperimentResult,
    config: ExperimentConfiguration,
    *,
    kernel: str = "",
    static_hash: str = "",
    dynamic_hash: str = "",
) -> Dict[str, str]:
    """The identity of one experiment: hashes, kernel, status and, when it failed, the error."""
    tags = {
        "mneme.config_hash": result.config_hash or config.hash(),
        "mneme.code_hash": result.code_hash or "",
        "mneme.static_hash": static_hash,
        "mneme.dynamic_hash": dynamic_hash,
        "mneme.kernel": kernel,
        "mneme.status": result.status or ("failed" if result.failed else "compiled"),
    }
    if result.gpu_name:
        tags["mneme.gpu"] = result.gpu_name
    if result.error:
        tags["mneme.error"] = _text(result.error, MAX_TAG_LEN)
        tags["mlflow.note.content"] = _text(f"{result.status or 'failed'}: {result.error}", MAX_TAG_LEN)
    return {k: _text(v, MAX_TAG_LEN) for k, v in tags.items()}


def kernel_artifacts(compiled: Any) -> Dict[str, Artifact]:
    """The optimized IR, PTX and cubin of a compiled kernel (mneme.ir.CompiledKernel), as run artifacts."""
    if compiled is None:
        return {}
    out: Dict[str, Artifact] = {}
    # MLflow's UI previews text by file extension (txt, yaml, json, ...), not .ll/.ptx: each also as NAME.txt
    if getattr(compiled, "ll", None):
        out["kernel.ll"] = out["kernel.ll.txt"] = compiled.ll
    if getattr(compiled, "ptx", None):
        out["kernel.ptx"] = out["kernel.ptx.txt"] = compiled.ptx
    cubin = getattr(getattr(compiled, "cubin", None), "cubin", None)
    if cubin:
        out["kernel.cubin"] = bytes(cubin)
    return out


def tags_text(tags: Mapping[str, Any]) -> Dict[str, str]:
    return {str(k): _text(v, MAX_TAG_LEN) for k, v in tags.items() if v is not None}


class _Recent(OrderedDict):
    """The `limit` most recently used entries of a cache whose misses are not all worth keeping (so not
    functools.lru_cache: an incomplete answer may be complete on the next call)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def recall(self, key: Any) -> Any:
        """The entry of `key` (now the most recent), or None."""
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def keep(self, key: Any, value: Any) -> None:
        self[key] = value
        while len(self) > self.limit:
            self.popitem(last=False)


#: the kernel files of recent (compile cache, code hash) pairs: a study's trials share few code hashes
_KERNEL_FILES = _Recent(64)


def _cached_kernel_files(cache_dir: str, code_hash: str) -> Dict[str, Artifact]:
    """kernel_artifacts of a compile-cache entry, read once while it is recent (an entry never changes: its
    name is the hash of its code). A missing entry is not remembered: it may be written later."""
    key = (str(cache_dir), code_hash)
    files = _KERNEL_FILES.recall(key)
    if files is None:
        from mneme.ir.compile import CompileCache

        files = kernel_artifacts(CompileCache(cache_dir).get(code_hash))
        if files:
            _KERNEL_FILES.keep(key, files)
    return dict(files)


@functools.lru_cache(maxsize=1024)
def _config_yaml(doc: str) -> str:
    """The YAML of a JSON document, keys in their order. Cached: a study's trials repeat configurations, and
    YAML's representer costs a writer 0.3 ms per run."""
    import yaml

    # libyaml's emitter when present: the same text, several times faster than the pure-Python one
    return yaml.dump(json.loads(doc), Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)


def _json_by_key(doc: Mapping[str, Any]) -> str:
    """A JSON object with one top-level key per line. json's C encoder writes each value: with `indent` it falls
    back to the pure-Python one, 0.2 ms per run in a writer."""
    items = (f"  {json.dumps(str(k))}: {json.dumps(v, default=str)}" for k, v in doc.items())
    return "{\n" + ",\n".join(items) + "\n}\n"


#: what decides the run of an experiment apart from its name and per-trial tags, by a pickle of its inputs, for
#: recent experiments: a sampler re-suggests configurations, and mneme answers those from the study with the
#: first one's result, so most runs of a long study repeat an earlier run's content
_CONTENT = _Recent(256)


def experiment_record(
    name: str,
    config: ExperimentConfiguration,
    settings: Optional[MeasurementSettings],
    result: ExperimentResult,
    *,
    role: str = "trial",
    baseline_ns: Optional[float] = None,
    metric: str = "median",
    kernel: str = "",
    static_hash: str = "",
    dynamic_hash: str = "",
    artifacts: Optional[Mapping[str, Artifact]] = None,
    compile_cache: Optional[str] = None,
    config_yaml: Optional[str] = None,
    tags: Optional[Mapping[str, Any]] = None,
    params: Optional[Mapping[str, Any]] = None,
    extra_metrics: Optional[Mapping[str, float]] = None,
) -> RunRecord:
    """One experiment as a run: params, metrics, identity tags, and the config and result as files.

    `compile_cache` is a compile-cache directory (mneme.ir.CompileCache) that holds the kernel the
    result's code hash names: its .ll, .ptx and .cubin become artifacts (read here, in the writer).
    `config_yaml` is the composed Hydra config when there is one; otherwise the replay configuration
    and measurement settings are written, so every run can be reproduced from its artifacts.
    """
    inputs = (config, settings, result, baseline_ns, metric, kernel, static_hash, dynamic_hash, artifacts, compile_cache,
              config_yaml)
    try:
        key = pickle.dumps(inputs, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - an artifact that does not pickle: build the run without the cache
        key = b""
    content = _CONTENT.recall(key) if key else None
    if content is None:
        content, complete = _experiment_content(*inputs)
        if key and complete:
            _CONTENT.keep(key, content)
    run_params, base_tags, metrics, files, status = content
    all_tags = dict(base_tags)
    all_tags["mneme.role"] = role
    all_tags.update(tags_text(tags or {}))
    all_params = dict(run_params)
    all_params.update({str(k): _text(v, MAX_PARAM_LEN) for k, v in (params or {}).items() if v not in (None, "")})
    start, end = epoch_ms(result.start_time), epoch_ms(result.end_time)
    if start is None or end is None or end < start:
        start = end = None
    else:  # a result answered from the compile cache spans milliseconds: the trial's work is its compile and runs
        work_ms = int(compile_seconds(result) * 1000 + sum(result.exec_time or []) / 1e6)
        start = min(start, end - work_ms)
    metrics = list(metrics) + [(str(k), float(v), 0) for k, v in (extra_metrics or {}).items() if math.isfinite(v)]
    return RunRecord(name=name, params=all_params, tags=all_tags, metrics=metrics, artifacts=dict(files),
                     status=status, start_ms=start, end_ms=end)


def epoch_ms(stamp: str) -> Optional[int]:
    """An ISO-8601 time (ExperimentResult.start_time/end_time) in epoch milliseconds, None when unparsable."""
    if not stamp:
        return None
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(str(stamp)).timestamp() * 1000)
    except (TypeError, ValueError):
        return None


def _experiment_content(config, settings, result, baseline_ns, metric, kernel, static_hash, dynamic_hash, artifacts,
                        compile_cache, config_yaml):
    """(params, tags, metrics, files, status) of experiment_record, and whether it may be kept (not when the compile
    cache did not have the kernel yet: it may be written later)."""
    config_d = config.to_dict()
    settings_d = settings.to_dict() if settings is not None else None
    if config_yaml is None:
        config_yaml = _config_yaml(json.dumps({"replay": config_d, "measure": settings_d or {}}))
    body = {
        "configuration": config_d,
        "settings": settings_d,
        "result": result.to_dict(),
        "speedup": speedup(baseline_ns, result, metric),
        "kernel": kernel,
        "static_hash": static_hash,
        "dynamic_hash": dynamic_hash,
    }
    files: Dict[str, Artifact] = dict(artifacts or {})
    complete = True
    if compile_cache and result.code_hash and not files:
        files.update(_cached_kernel_files(compile_cache, result.code_hash))
        complete = bool(files)
    files["config.yaml"] = config_yaml
    files["result.json"] = _json_by_key(body)
    tags = environment_tags()
    tags.update(result_tags(result, config, kernel=kernel, static_hash=static_hash, dynamic_hash=dynamic_hash))
    params = _params(config_d, settings_d)
    if kernel:
        from mneme.track.naming import short_kernel

        params["kernel"] = _text(short_kernel(kernel), MAX_PARAM_LEN)
    if dynamic_hash:
        params["instance"] = dynamic_hash[:16]
    content = (params, tags, result_metrics(result, baseline_ns, metric), files, run_status(result))
    return content, complete
