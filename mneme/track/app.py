"""The Hydra app's job: one composed config -> one experiment (replay, compile-only or record), one run.

A job builds the same objects as the CLI: the record and instance from `record.*`, the replay
configuration from `replay.*` (launch fields left at null take the recorded values), the measurement
settings from `measure.*`. It then evaluates the configuration, unless the launcher already did so on
the AsyncReplayExecutor (`prepared`), logs the run to MLflow and returns a small dict the sweeper reads.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

from mneme.config import ExperimentConfiguration, ExperimentResult, MeasurementSettings
from mneme.errors import ConfigurationError, MnemeError
from mneme.track import schema, session
from mneme.track.naming import run_name
from mneme.track.records import kernel_artifacts

#: job number -> (future of the executor, compile cache directory), set by the executor launcher
_prepared: Dict[int, Tuple[Future, Optional[str]]] = {}


@dataclass
class Target:
    """The recorded kernel instance a config points at."""

    db: str
    record: Any  # RecordedExecution
    instance: Any  # KernelInstance
    #: the baseline's code: app-build or mneme-defaults (record.baseline; mneme.ir.appbuild)
    baseline_kind: str = "app-build"

    @property
    def kernel(self) -> str:
        return self.record.demangled_name or self.record.kernel_name

    @functools.cached_property
    def _pipeline(self):
        from mneme.replay.pipeline import ReplayPipeline

        return ReplayPipeline(self.db, self.instance.dynamic_hash, device_id=None, baseline=self.baseline_kind)

    @functools.cached_property
    def baseline(self) -> ExperimentConfiguration:
        """The recorded launch compiled as the app was built (or mneme's defaults), as `mneme replay` does."""
        return self._pipeline.baseline_config()

    @property
    def code(self):
        """Which code the baseline compiles, and why (mneme.ir.appbuild.Baseline)."""
        return self._pipeline.baseline


@functools.lru_cache(maxsize=64)
def _load(db: str, record_id: Optional[str], baseline: str = "app-build") -> Target:
    from mneme.record.db import RecordedExecution

    record = RecordedExecution.from_json(db)
    return Target(db, record, record.instance(record_id), baseline)


def target(cfg: Any) -> Target:
    if not cfg.record.db:
        raise ConfigurationError(
            "record.db is not set: pass record.db=PATH/<static-hash>.json (a record DB written by `mneme record`)"
        )
    return _load(str(Path(str(cfg.record.db)).resolve()), cfg.record.id or None,
                 str(cfg.record.get("baseline") or "app-build"))


def experiment(cfg: Any) -> Tuple[Target, ExperimentConfiguration, MeasurementSettings]:
    """What a composed config asks to run: the target, its replay configuration and the settings."""
    tgt = target(cfg)
    config = schema.configuration(cfg.replay, tgt.baseline)
    return tgt, config, schema.settings(cfg.measure)


def compile_only(cfg: Any) -> bool:
    devices = cfg.executor.devices
    return cfg.mode == "compile_only" or (devices is not None and len(devices) == 0)


# -- evaluation --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def prepared(job_num: int, future: Future, cache_dir: Optional[str]) -> Iterator[None]:
    """Hand a job its result from the executor (used by the launcher around Hydra's run_job)."""
    _prepared[job_num] = (future, cache_dir)
    try:
        yield
    finally:
        _prepared.pop(job_num, None)


def _failed(config: ExperimentConfiguration, exc: BaseException, role: str) -> ExperimentResult:
    from mneme.tune.executor import failed_result
    from mneme.tune.worker import classify

    return failed_result(config, classify(exc, role), f"{type(exc).__name__}: {exc}")


def evaluate(cfg: Any, tgt: Target, config: ExperimentConfiguration, settings: MeasurementSettings):
    """(result, compiled kernel or None) for one configuration, in this process, through the same backend
    the executor's workers use (`executor.backend`)."""
    from mneme.tune.worker import load_object

    devices = list(cfg.executor.devices or [])
    device_less = compile_only(cfg)
    backend = load_object(cfg.executor.backend)(
        record_db=tgt.db, record_id=tgt.instance.dynamic_hash, device_id=None if device_less else (devices or [0])[0],
        settings=settings.to_dict(), cache_dir=cfg.executor.cache_dir,
    )
    compiled = None
    try:
        compiled = backend.compile(config)
        if device_less:
            return backend.describe(compiled, config), compiled
        backend.open()
        return backend.run(compiled, config), compiled
    except MnemeError as e:
        return _failed(config, e, "compile" if compiled is None else "gpu"), compiled
    finally:
        backend.close()


# -- the job -----------------------------------------------------------------------------------------------
def _job() -> Tuple[int, bool]:
    """(job number, multirun?) from Hydra's runtime config."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    num = int(hc.job.num) if hc.job.get("num") is not None else 0
    return num, hc.mode == RunMode.MULTIRUN


def absolute_paths(cfg: Any) -> None:
    """Paths in the config as the user typed them, relative to where `python -m mneme` ran, even when the
    job runs in another directory (`hydra.job.chdir=true`): record.db, record.dir, a relative record.app
    program, file-based study storage and tracking URIs."""
    from hydra.utils import to_absolute_path
    from omegaconf import open_dict

    def fix(p: str) -> str:
        return to_absolute_path(p) if p and not os.path.isabs(p) else p

    with open_dict(cfg):
        if cfg.record.get("db"):
            cfg.record.db = ",".join(fix(p) for p in str(cfg.record.db).split(","))
        if cfg.record.get("dir"):
            cfg.record.dir = fix(str(cfg.record.dir))
        if cfg.record.get("app") and "/" in str(cfg.record.app[0]):
            cfg.record.app[0] = fix(str(cfg.record.app[0]))
        storage = cfg.study.get("storage")
        if storage:
            for prefix in ("journal:", "sqlite:///"):
                rest = str(storage)[len(prefix):]
                if str(storage).startswith(prefix) and rest and not rest.startswith("/") and rest != ":memory:":
                    cfg.study.storage = prefix + fix(rest)
        uri = cfg.tracking.get("uri")
        if uri and str(uri).startswith("sqlite:///") and not str(uri).startswith("sqlite:////"):
            cfg.tracking.uri = "sqlite:///" + fix(str(uri)[len("sqlite:///"):])
        elif uri and "://" not in str(uri):
            cfg.tracking.uri = fix(str(uri))


def run(cfg: Any) -> Dict[str, Any]:
    """The task function of `python -m mneme`."""
    from omegaconf import OmegaConf

    from mneme.tune.objective import metric_ns, succeeded

    absolute_paths(cfg)
    if cfg.mode == "record":
        return record(cfg)
    if cfg.mode not in schema.MODES:
        raise ConfigurationError(f"mode={cfg.mode!r} is unknown; choose one of {', '.join(schema.MODES)}")
    num, multirun = _job()
    sess = session.get(cfg.tracking, cfg.name, multirun).open()  # a bad store fails here, before the GPU
    tgt, config, settings = experiment(cfg)
    sweep = sess.sweep()
    role = cfg.tracking.role
    trial = cfg.tracking.trial if cfg.tracking.trial is not None else num
    name = run_name(tgt.kernel, config, tgt.baseline, trial, role) if sweep else ""
    ready = _prepared.get(num)
    # a job that evaluates here shows as RUNNING meanwhile (and ends KILLED if interrupted)
    key = sweep.start_trial(name, tags={"mneme.trial": trial, "mneme.role": role}) if sweep and not ready else None
    compiled, cache_dir = None, None
    if ready is not None:
        result, cache_dir = ready[0].result(), ready[1]
    else:
        result, compiled = evaluate(cfg, tgt, config, settings)
    baseline_ns = cfg.tracking.baseline_ns
    if role == "baseline" and baseline_ns is None:
        baseline_ns = metric_ns(result.exec_time, cfg.study.metric) if succeeded(result, False) else None
    derived = derived_metrics(cfg, tgt, result)
    keep = bool(cfg.tracking.artifacts)
    common = dict(
        config=config, settings=settings, result=result, baseline_ns=baseline_ns, kernel=tgt.kernel,
        static_hash=tgt.record.static_hash, dynamic_hash=tgt.instance.dynamic_hash,
        artifacts=kernel_artifacts(compiled) if keep else {}, compile_cache=cache_dir if keep else None,
        config_yaml=OmegaConf.to_yaml(cfg), tags={"mneme.mode": cfg.mode, "mneme.baseline": tgt.code.describe()},
        extra_metrics=derived,
    )
    if sweep is not None:
        sweep.trial(trial, key=key, role=role, name=name, params={"space": _space_name(cfg)}, **common)
    elif sess.enabled:
        sess.tracker.log_experiment({**common, "name": f"{cfg.name} {tgt.kernel}", "role": cfg.name},
                                    parent=sess.parent_run_id)
    line = summary_line(tgt, config, result) + "".join(f", {k}={v:.4g}" for k, v in derived.items())
    if multirun:  # the sweep shows one progress line; each job's line and full overrides go to its own log
        _job_log(line)
    else:
        print(line, flush=True)
    return {"status": result.status, "result": result.to_dict(), "config": config.to_dict(), "line": line}


def _job_log(line: str) -> None:
    """Append the job's result line and its full overrides to `mneme.log` in the job's directory."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        out = Path(hc.runtime.output_dir)
        overrides = " ".join(hc.overrides.task)
    except (ImportError, ValueError):
        print(line, file=sys.stderr, flush=True)
        return
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "mneme.log", "a") as f:
        f.write(f"overrides: {overrides}\n{line}\n")


def derived_metrics(cfg: Any, tgt: "Target", result: ExperimentResult) -> Dict[str, float]:
    """The config's `metrics` definitions evaluated on this job (ConfigurationError for a bad definition)."""
    specs = list(cfg.get("metrics") or [])
    if not specs:
        return {}
    from mneme.tune.derived import check, evaluate, parse_all, scalar_args
    from mneme.tune.objective import metric_ns

    defs = parse_all(specs)
    args = scalar_args(tgt.db, tgt.instance.dynamic_hash)  # read once per process
    check(defs, args)
    t = metric_ns(result.exec_time, cfg.study.metric) if result.exec_time else None
    return evaluate(defs, args, t)


def _space_name(cfg: Any) -> str:
    """The search space's name when an Optuna sweep chose the configuration, else ''."""
    try:
        from hydra.core.hydra_config import HydraConfig

        choices = HydraConfig.get().runtime.choices
        return str(choices.get("search_space") or "") if "mneme_optuna" in str(choices.get("hydra/sweeper", "")) else ""
    except (ImportError, ValueError):
        return ""


def summary_line(tgt: Target, config: ExperimentConfiguration, result: ExperimentResult) -> str:
    from mneme.track.records import time_stats

    stats = time_stats(result.exec_time)
    head = f"{tgt.kernel} [{config.hash()[:12]}] {result.status or ('failed' if result.failed else 'compiled')}"
    parts = [f"block={config.block} grid={config.grid} passes={config.passes} codegen_opt={config.codegen_opt}"
             + (" specialize" if config.specialize else "") + (" launch_bounds" if config.set_launch_bounds else "")
             + f" baseline={tgt.code.kind}"]
    if stats:
        parts.append(f"median={stats['median'] / 1000:.2f} µs")
    parts.append(f"regs={result.reg_usage} lmem={result.local_mem_usage} size={result.obj_size}")
    if result.error:
        parts.append(f"error: {result.error.splitlines()[0][:200]}")
    return head + ": " + ", ".join(parts)


def record(cfg: Any) -> Dict[str, Any]:
    """`+experiment=record`: run the app under the recorder (what `mneme record` does)."""
    from omegaconf import OmegaConf

    from mneme import cli

    app = [str(a) for a in OmegaConf.to_container(cfg.record.app)]
    if not app:
        raise ConfigurationError("record.app is empty: pass 'record.app=[./app, arg1, ...]'")
    args = [str(a) for a in OmegaConf.to_container(cfg.record.args)]
    code = cli.main(["record", "-rdb", str(cfg.record.dir), *args, "--", *app])
    if code != 0:
        raise MnemeError(f"`mneme record` exited with {code}")
    return {"status": "recorded", "dir": str(Path(str(cfg.record.dir)).resolve())}

