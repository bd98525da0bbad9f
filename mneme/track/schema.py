"""Hydra's structured configs, built from mneme's dataclasses, and the way back to those dataclasses.

The replay node is generated from `ExperimentConfiguration`'s fields, so a field added there is a config
key here, and a key that is not a field (a typo) fails when Hydra composes. Launch fields (grid, block
axes and shared_mem) default to None, which means "as recorded": `replay.block.x=128` changes one axis
and keeps the others. The search, study, executor and tracking nodes map onto `TuneOptions`, so the Hydra
app and `mneme tune` build the same objects.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore

from mneme.config import ExperimentConfiguration, MeasurementSettings, dim3

MODES = ("replay", "compile_only", "record")


@dataclass
class LaunchDims:
    """dim3 whose axes left at None keep the recorded value."""

    x: Optional[int] = None
    y: Optional[int] = None
    z: Optional[int] = None


def _replay_schema() -> type:
    from mneme.ir.appbuild import CODE_FIELDS

    hints = typing.get_type_hints(ExperimentConfiguration)
    spec = []
    for f in dataclasses.fields(ExperimentConfiguration):
        if hints[f.name] is dim3:
            spec.append((f.name, LaunchDims, field(default_factory=LaunchDims)))
        elif f.name == "shared_mem" or f.name in CODE_FIELDS:  # None: as recorded / as the baseline compiles it
            spec.append((f.name, Optional[hints[f.name]], field(default=None)))
        elif f.default is not dataclasses.MISSING:
            spec.append((f.name, hints[f.name], field(default=f.default)))
        else:
            spec.append((f.name, hints[f.name], field(default_factory=f.default_factory)))
    cls = dataclasses.make_dataclass("ReplayConf", spec)
    cls.__module__ = __name__
    cls.__doc__ = ("ExperimentConfiguration as a Hydra node (launch fields default to the recorded launch, the code "
                   "fields of mneme.ir.appbuild to the baseline's code: the app's build unless record.baseline says "
                   "mneme-defaults).")
    return cls


ReplayConf = _replay_schema()


@dataclass
class RecordConf:
    #: the record DB of the kernel (`<static-hash>.json` written by `mneme record`)
    db: Optional[str] = None
    #: dynamic hash of the instance to replay; None when the DB holds one instance
    id: Optional[str] = None
    #: `+experiment=record`: the application command line to run under the recorder
    app: List[str] = field(default_factory=list)
    #: `+experiment=record`: where the record DBs, IR and snapshots go
    dir: str = "records"
    #: `+experiment=record`: extra `mneme record` flags, e.g. ["--va-size", "8"]
    args: List[str] = field(default_factory=list)
    #: the baseline's code (replay.* code keys left null take it): app-build (as the app was built, recorded by
    #: `mneme cc`/`mneme nvcc`) or mneme-defaults (default<O3>, whole program)
    baseline: str = "app-build"


@dataclass
class SearchSpaceConf:
    #: a preset of mneme.tune (quick, standard, launch, compiler, full), or "params" for `params` alone
    name: str = "standard"
    launch_safety: str = "balanced"
    #: custom pipelines searched next to the default ones
    passes: List[str] = field(default_factory=list)
    pipeline_file: Optional[str] = None
    #: a user space, MODULE:CLASS (a mneme.tune.SearchSpace subclass), with its constructor arguments
    module: Optional[str] = None
    args: Dict[str, Any] = field(default_factory=dict)
    #: extra dimensions in Hydra's sweep syntax, by replay key: {replay.codegen_opt: "range(0,4)"}
    params: Dict[str, str] = field(default_factory=dict)


@dataclass
class SamplerConf:
    #: tpe, cmaes, random, grid, bruteforce, nsga2, gp, exhaustive, plain-random (mneme.tune.samplers)
    name: str = "tpe"
    seed: Optional[int] = None


@dataclass
class StudyConf:
    #: Optuna study name; None derives one from the kernel, instance and space
    name: Optional[str] = None
    #: Optuna storage URL (sqlite:///..., postgresql://..., journal:PATH); None: sqlite in the sweep dir
    storage: Optional[str] = None
    trials: int = 50
    metric: str = "median"
    #: time | speedup (on a GPU), registers | size (compile only)
    objective: str = "time"
    resume: bool = False
    #: trials asked at once; None: enough to keep the executor busy
    batch_size: Optional[int] = None


@dataclass
class ExecutorConf:
    #: GPU ordinals; None: every visible GPU; []: compile only
    devices: Optional[List[int]] = None
    compile_jobs: Optional[int] = None
    compile_timeout: float = 600.0
    run_timeout: Optional[float] = None
    cache_dir: Optional[str] = None
    #: what compiles and runs an experiment, "module:Class" (mneme.tune.worker's protocol); tests swap it
    backend: str = "mneme.track.backend:TrackedBackend"


@dataclass
class TrackingConf:
    enabled: bool = True
    #: MLflow store; None: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory
    uri: Optional[str] = None
    #: MLflow experiment the runs go to
    experiment: str = "mneme"
    #: where the MLflow writes happen: process (default), thread, inline
    writer: str = "process"
    #: writer processes for a sweep; 0: one per two CPUs, 1 to 8 (MNEME_TRACK_WRITERS overrides)
    writers: int = 0
    #: log the optimized .ll, .ptx and .cubin of every run
    artifacts: bool = True
    #: nest runs under this run (set for jobs a sweep starts in other processes)
    parent_run_id: Optional[str] = None
    #: set by the sweeper for each job: its role, Optuna trial number and the baseline time
    role: str = "trial"
    trial: Optional[int] = None
    baseline_ns: Optional[float] = None


@dataclass
class MnemeConf:
    #: names the runs and the output directories
    name: str = "replay"
    #: replay (time on a GPU), compile_only (no GPU), record (run an app under the recorder)
    mode: str = "replay"
    record: RecordConf = field(default_factory=RecordConf)
    replay: ReplayConf = field(default_factory=ReplayConf)  # type: ignore[valid-type]
    measure: MeasurementSettings = field(default_factory=MeasurementSettings)
    search_space: SearchSpaceConf = field(default_factory=SearchSpaceConf)
    sampler: SamplerConf = field(default_factory=SamplerConf)
    study: StudyConf = field(default_factory=StudyConf)
    executor: ExecutorConf = field(default_factory=ExecutorConf)
    tracking: TrackingConf = field(default_factory=TrackingConf)
    #: derived metrics over the kernel's scalar arguments and the median time, logged to MLflow and shown per job:
    #: 'metrics=["gbps = 3 * n * 4 / time_s / 1e9"]' (mneme/tune/derived.py)
    metrics: List[str] = field(default_factory=list)


def register() -> None:
    """Put the schema in Hydra's ConfigStore as `mneme_schema` (conf/config.yaml builds on it)."""
    ConfigStore.instance().store(name="mneme_schema", node=MnemeConf)


# -- back to the project's dataclasses -------------------------------------------------------------------
def _plain(node: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def configuration(replay: Any, recorded: Optional[ExperimentConfiguration] = None) -> ExperimentConfiguration:
    """The replay configuration a `replay` node stands for; None launch fields take the recorded ones."""
    data = dict(_plain(replay))
    base = recorded or ExperimentConfiguration()
    for name in ("grid", "block"):
        axes = dict(data.pop(name, None) or {})
        rec = getattr(base, name)
        data[name] = {a: (rec_v if axes.get(a) is None else int(axes[a])) for a, rec_v in zip("xyz", rec)}
    if data.get("shared_mem") is None:
        data["shared_mem"] = int(base.shared_mem)
    for name, value in list(data.items()):
        if value is None and name not in ("grid", "block"):
            data[name] = getattr(base, name)  # code fields left null: the baseline's (mneme.ir.appbuild)
    return ExperimentConfiguration.from_dict(data)


def settings(measure: Any) -> MeasurementSettings:
    return MeasurementSettings.from_dict(_plain(measure))


def overrides_for(config: ExperimentConfiguration, prefix: str = "replay") -> List[str]:
    """Command-line overrides that set every field of `config` (what a sweep hands each job)."""
    out = []
    for key, value in _flat(config.to_dict(), prefix).items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        else:
            text = str(value)
        out.append(f"{key}={text}")
    return out


def _flat(data: Dict[str, Any], prefix: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}.{k}"))
        else:
            out[f"{prefix}.{k}"] = v
    return out


def tune_options(cfg: Any, **extra: Any):
    """The `mneme tune` options this composed config asks for (mneme.tune.options.TuneOptions)."""
    from mneme.tune.options import TuneOptions

    m = settings(cfg.measure)
    space = cfg.search_space
    ex = cfg.executor
    study = cfg.study
    devices = _plain(ex.devices)
    return TuneOptions(
        record_db=str(cfg.record.db), record_id=cfg.record.id, space=space.name, sampler=cfg.sampler.name,
        trials=int(study.trials), devices=None if devices is None else [int(d) for d in devices],
        compile_jobs=ex.compile_jobs, storage=study.storage, study=study.name, metric=study.metric,
        objective=study.objective, iterations=m.iterations, warmup=m.warmup, timeout=m.timeout, l2_flush=m.l2_flush,
        rewrite_inputs=m.rewrite_inputs,
        atol=m.atol, rtol=m.rtol, tol_type=m.tol_type, verification=verification_fields(m), arch=m.arch, seed=cfg.sampler.seed, resume=bool(study.resume),
        launch_safety=space.launch_safety, passes=list(_plain(space.passes) or []), pipeline_file=space.pipeline_file,
        space_module=space.module, space_args=dict(_plain(space.args) or {}), track=bool(cfg.tracking.enabled),
        compile_timeout=float(ex.compile_timeout), run_timeout=ex.run_timeout, cache_dir=ex.cache_dir,
        backend=ex.backend, derived=[str(d) for d in _plain(cfg.get("metrics")) or []],
        baseline=str(cfg.record.get("baseline") or "app-build"), **extra,
    )


def verification_fields(m: MeasurementSettings) -> Dict[str, Any]:
    """The verification fields of the measurement settings (mneme.replay.cli.VERIFY_FLAGS names them)."""
    from mneme.replay.cli import VERIFY_FLAGS

    return {name: getattr(m, name) for _, name, _, _ in VERIFY_FLAGS}


def explain_overrides(overrides: List[str]) -> List[str]:
    """For each override whose key is not in the schema, the keys that are valid at that level.

    Hydra's own message names the bad key; this adds what the user could have meant.
    """
    from omegaconf import DictConfig, OmegaConf

    root = OmegaConf.structured(MnemeConf)
    out = []
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        if not key or key.startswith("hydra.") or key in ("experiment", "hydra") or key.startswith("-"):
            continue
        node: Any = root
        walked: List[str] = []
        for part in key.split("."):
            if not isinstance(node, DictConfig) or OmegaConf.get_type(node) is dict:
                break  # free-form nodes (search_space.args, .params) take any key
            if part not in node:
                where = ".".join(walked) or "the top level"
                valid = ", ".join(str(k) for k in node.keys())
                out.append(f"'{key}' is not a config key: valid keys under {where}: {valid}")
                break
            walked.append(part)
            node = node[part]
    return out
