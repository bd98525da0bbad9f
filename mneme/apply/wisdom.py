"""The wisdom file: which tuned configuration each kernel gets, and where it came from (docs/APPLY.md).

    mneme_wisdom: 1
    created: 2026-12-02T16:00:00+00:00
    source: {kind: tune, path: mneme-tune/vecadd}
    kernels:
      - kernel: _Z6vecAddPKfS0_Pfi
        static_hash: a9cf...
        dynamic_hash: e3a48e42951b7bb5
        rule: exact            # or: scaled (other problem sizes, where the configuration allows it)
        config: {grid: ..., block: ..., passes: default<O3>, ...}   # mneme.config.ExperimentConfiguration
        code_hash: 5f0c...
        expected_speedup: 1.21
        record: {db: ../rec/a9cf....json, dynamic_hash: e3a48e42951b7bb5}
        ...

The schema is a pydantic model (validated on read and on write); `wisdom_schema()` is its JSON schema.
This module imports only mneme.config and mneme.errors, so `mneme tune`'s report (a lower layer than
`mneme apply`) can write wisdom files with it.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mneme.config import ExperimentConfiguration
from mneme.errors import ConfigurationError

WISDOM_VERSION = 1
RULES = ("exact", "scaled")
#: file names the tune report writes into its results directory
WISDOM_NAME = "wisdom.yaml"


class RecordRef(BaseModel):
    """The record the configuration was tuned on."""

    model_config = ConfigDict(extra="forbid")
    db: str = Field(description="record DB file (<static-hash>.json); relative paths mean the wisdom file's directory")
    dynamic_hash: str = Field(description="the tuned instance")


class Provenance(BaseModel):
    """Where the configuration was found (whatever is known)."""

    model_config = ConfigDict(extra="allow")
    study: Optional[str] = None
    trial: Optional[int] = None
    tune_dir: Optional[str] = None
    mlflow_run_id: Optional[str] = None
    sweep_run_id: Optional[str] = None
    tracking_uri: Optional[str] = None
    launch_safety: Optional[str] = None
    compile_cache: Optional[str] = None


class KernelWisdom(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kernel: str = Field(description="mangled kernel name, as the app's module names it")
    demangled: str = ""
    static_hash: str = Field(min_length=1)
    dynamic_hash: str = Field(min_length=1, description="the instance the configuration was tuned on")
    rule: Literal["exact", "scaled"] = "exact"
    config: Dict[str, Any] = Field(description="mneme.config.ExperimentConfiguration.to_dict()")
    config_hash: str = ""
    code_hash: str = ""
    arch: Optional[str] = None
    expected_speedup: Optional[float] = Field(default=None, gt=0)
    baseline_ns: Optional[float] = None
    tuned_ns: Optional[float] = None
    record: RecordRef
    cubin: Optional[str] = Field(default=None, description="a prebuilt cubin; relative paths mean the wisdom file's directory")
    provenance: Provenance = Field(default_factory=Provenance)

    @field_validator("config")
    @classmethod
    def _valid_config(cls, v: Dict[str, Any]) -> Dict[str, Any]:
        try:
            c = ExperimentConfiguration.from_dict(v)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a replay configuration: {e}") from None
        problems = c.problems()
        if problems:
            raise ValueError("invalid replay configuration: " + "; ".join(problems))
        return c.to_dict()

    def configuration(self) -> ExperimentConfiguration:
        return ExperimentConfiguration.from_dict(self.config)


class Source(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: Literal["tune", "mlflow", "merge", "manual"]
    path: Optional[str] = None
    run_id: Optional[str] = None


class Wisdom(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mneme_wisdom: int = Field(description="format version")
    created: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    source: Source
    kernels: List[KernelWisdom] = Field(default_factory=list)

    @field_validator("mneme_wisdom")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != WISDOM_VERSION:
            raise ValueError(f"wisdom format version {v} is not supported (this mneme reads version {WISDOM_VERSION})")
        return v

    def by_kernel(self) -> Dict[str, List[KernelWisdom]]:
        out: Dict[str, List[KernelWisdom]] = {}
        for k in self.kernels:
            out.setdefault(k.kernel, []).append(k)
        return out


def wisdom_schema() -> Dict[str, Any]:
    """The JSON schema of a wisdom file (docs/APPLY.md shows it)."""
    return Wisdom.model_json_schema()


def _errors(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in e.errors())


def validate(data: Any, where: str = "wisdom") -> Wisdom:
    try:
        return Wisdom.model_validate(data)
    except ValidationError as e:
        raise ConfigurationError(f"{where}: not a valid wisdom file ({_errors(e)}); see docs/APPLY.md") from None


def read_wisdom(path: Union[str, Path]) -> Wisdom:
    """Read and validate a wisdom file (YAML or JSON); relative paths in it are made absolute."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigurationError(f"wisdom file {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text())  # JSON is YAML
    except yaml.YAMLError as e:
        raise ConfigurationError(f"{p}: neither YAML nor JSON ({e})") from None
    if not isinstance(data, dict) or "mneme_wisdom" not in data:
        raise ConfigurationError(f"{p}: not a wisdom file (no 'mneme_wisdom' version key); see docs/APPLY.md")
    w = validate(data, str(p))
    base = p.resolve().parent
    for k in w.kernels:
        k.record.db = str((base / k.record.db).resolve()) if not os.path.isabs(k.record.db) else k.record.db
        if k.cubin and not os.path.isabs(k.cubin):
            k.cubin = str((base / k.cubin).resolve())
    return w


def write_wisdom(w: Wisdom, path: Union[str, Path]) -> Path:
    """Validate and write (YAML for .yaml/.yml, else JSON); paths are stored relative to the file's directory."""
    import yaml

    p = Path(path)
    w = validate(w.model_dump(mode="json"), str(p))
    base = p.resolve().parent
    for k in w.kernels:
        k.record.db = os.path.relpath(os.path.realpath(k.record.db), base)
        if k.cubin:
            k.cubin = os.path.relpath(os.path.realpath(k.cubin), base)
    data = w.model_dump(mode="json", exclude_none=True)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + f".tmp{os.getpid()}")
    if p.suffix in (".yaml", ".yml"):
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    else:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, p)
    return p


def merge(items: List[Wisdom]) -> Wisdom:
    """One wisdom of several; a later entry for the same kernel and instance replaces an earlier one."""
    seen: Dict[tuple, KernelWisdom] = {}
    for w in items:
        for k in w.kernels:
            seen[(k.kernel, k.dynamic_hash)] = k
    return Wisdom(mneme_wisdom=WISDOM_VERSION, source=Source(kind="merge"), kernels=list(seen.values()))


# -- from a tune results directory (mneme/tune/report.py writes it) ---------------------------------
def from_tune_results(out_dir: Union[str, Path], rule: str = "exact") -> Wisdom:
    """The wisdom of one `mneme tune` results directory (config.json + best.json [+ summary.json])."""
    d = Path(out_dir)
    cfg_p, best_p = d / "config.json", d / "best.json"
    if not cfg_p.is_file():
        raise ConfigurationError(f"{d}: not a mneme tune results directory (no config.json)")
    if not best_p.is_file():
        raise ConfigurationError(f"{d}: the study found no successful configuration (no best.json); nothing to apply")
    cfg = json.loads(cfg_p.read_text())
    best = json.loads(best_p.read_text())
    return Wisdom(mneme_wisdom=WISDOM_VERSION, source=Source(kind="tune", path=str(d.resolve())),
                  kernels=[kernel_from_tune(cfg, best, d, rule)])


def kernel_from_tune(cfg: Dict[str, Any], best: Dict[str, Any], out_dir: Path, rule: str = "exact") -> KernelWisdom:
    rec = cfg.get("record") or {}
    opts = cfg.get("options") or {}
    db = rec.get("db") or opts.get("record_db")
    if not db:
        raise ConfigurationError(f"{out_dir}/config.json names no record DB")
    db_path = Path(db)
    if not db_path.is_absolute():  # tune stores what the user typed, relative to where they ran it
        cands = [Path.cwd() / db_path, out_dir / db_path]
        db_path = next((c for c in cands if c.exists()), cands[0])
    result = best.get("result") or {}
    base = best.get("baseline_ns")
    tuned = best.get("metric_ns")
    cache = opts.get("cache_dir") or str(out_dir / "cache")
    return KernelWisdom(
        kernel=rec.get("kernel") or "", demangled=rec.get("demangled") or "", static_hash=rec.get("static_hash") or "",
        dynamic_hash=rec.get("dynamic_hash") or opts.get("record_id") or "", rule=rule, config=best["config"],
        config_hash=best.get("config_hash") or "", code_hash=result.get("code_hash") or "",
        arch=opts.get("arch") or rec.get("arch"), expected_speedup=best.get("speedup"), baseline_ns=base, tuned_ns=tuned,
        record=RecordRef(db=str(db_path.resolve()), dynamic_hash=rec.get("dynamic_hash") or opts.get("record_id") or ""),
        provenance=Provenance(study=cfg.get("study"), trial=best.get("trial"), tune_dir=str(out_dir.resolve()),
                              launch_safety=opts.get("launch_safety"), compile_cache=str(Path(cache).resolve())),
    )
