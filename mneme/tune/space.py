"""Search spaces: the tunable dimensions of one recorded kernel, how a sample becomes a replay configuration,
and which samples are worth no GPU time.

A space is three methods (the seeds' `SearchSpace`): `dimensions()` names the parameters, `derived(params)`
turns one sample into an `ExperimentConfiguration`, `constraints(params)` says whether the sample is legal
(True/False, or a list of reasons). `check()` adds what holds for every space: the configuration must be
valid on the hardware and its block shape must not be banned (a shape that failed to launch once is banned
for the rest of the study).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import itertools
import json
import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Set, Tuple, Union

from mneme.config import ExperimentConfiguration
from mneme.errors import ConfigurationError
from mneme.tune.launch import shape_key
from mneme.tune.params import BaseParam

#: Give up drawing after this many samples in a row broke the constraints.
MAX_REJECTIONS = 1000

Reasons = Union[bool, List[str], Tuple[str, ...], None]


@dataclass
class SpaceContext:
    """What a space may know about the kernel it searches: the baseline (recorded launch, compiled as the app
    was built: `code`), the record, and the user's choices that shape presets."""

    baseline: ExperimentConfiguration
    record: Any = None  # mneme.record.db.RecordedExecution
    instance: Any = None  # mneme.record.db.KernelInstance
    launch_safety: str = "balanced"
    #: custom pipelines from --passes / --pipeline-file, searched next to the default ones
    pipelines: List[str] = field(default_factory=list)
    max_launch_candidates: int = 128
    #: what the kernel's IR says about its launch (mneme.ir.launchsafety.LaunchFacts); None: not analyzed
    launch_facts: Any = None
    #: which code `baseline` compiles (mneme.ir.appbuild.Baseline); None: mneme's defaults
    code: Any = None

    def launch_rules(self):
        """The block-shape rules of the kernel's code for the recorded block (None when not analyzed)."""
        if self.launch_facts is None:
            return None
        return self.launch_facts.rules(self.baseline.block)

    def allows_block(self):
        """A predicate for launch_candidates: the IR's rules; `aggressive` drops only the block.x warp rule."""
        rules = self.launch_rules()
        if rules is None:
            return None
        soft = self.launch_safety != "aggressive"
        return lambda block: rules.why(block, soft=soft) is None

    @property
    def specializable(self) -> bool:
        """Whether any recorded argument may be specialized (integer/float scalars)."""
        specs = getattr(self.instance, "specializations", None) or getattr(self.record, "specializations", None)
        return bool(specs) and any(specs)


class SearchSpace(ABC):
    """Base of every search space (presets and user spaces alike)."""

    #: shown by --print-space and stored with the study
    name: str = "custom"

    def __init__(self) -> None:
        self.banned: Set[str] = set()
        #: compile keys (mneme.tune.executor.compile_key) whose code killed the CUDA context at the recorded launch
        self.banned_code: Set[str] = set()

    # -- what a space defines ------------------------------------------------------------------
    @abstractmethod
    def dimensions(self) -> Dict[str, BaseParam]:
        """The tunable parameters by name."""

    @abstractmethod
    def derived(self, params: Dict[str, Any]) -> ExperimentConfiguration:
        """The replay configuration one sample stands for."""

    def constraints(self, params: Dict[str, Any]) -> Reasons:
        """True when the sample may run; False or a list of reasons when it may not."""
        return True

    def extra_description(self) -> Dict[str, Any]:
        """Anything beyond the dimensions that changes what the space means (e.g. launch candidates)."""
        return {}

    # -- shared behaviour ------------------------------------------------------------------------
    def _dims(self) -> Dict[str, BaseParam]:
        dims = self.dimensions()
        for key, p in dims.items():
            if key != p.name:
                raise ConfigurationError(f"space {self.name!r}: dimension key {key!r} differs from its name {p.name!r}")
        return dims

    def ban(self, config: ExperimentConfiguration) -> str:
        """Ban the block shape of a configuration that failed to launch; returns its key."""
        key = shape_key(config.block)
        self.banned.add(key)
        return key

    def check(self, params: Dict[str, Any]) -> Tuple[Optional[ExperimentConfiguration], List[str]]:
        """(configuration, reasons it may not run); reasons is empty for a runnable sample."""
        try:
            config = self.derived(dict(params))
        except (ValueError, KeyError, TypeError, ConfigurationError) as e:
            return None, [f"cannot derive a configuration: {e}"]
        reasons = _reasons(self.constraints(dict(params)))
        reasons += config.problems()
        key = shape_key(config.block)
        if key in self.banned:
            reasons.append(f"block {key} failed to launch earlier in this study (banned)")
        if getattr(self, "banned_code", None) and code_key(config) in self.banned_code:
            reasons.append("these compile settings killed the CUDA context earlier in this study (banned)")
        return config, reasons

    def ban_code(self, config: ExperimentConfiguration) -> str:
        """Ban the compile settings of a configuration that killed the CUDA context at the recorded launch."""
        key = code_key(config)
        if not hasattr(self, "banned_code"):
            self.banned_code = set()
        self.banned_code.add(key)
        return key

    def sample_random(self, rng: Optional[random.Random] = None) -> Dict[str, Any]:
        """One runnable sample drawn without Optuna."""
        return self.draw_random(rng)[0]

    def draw_random(self, rng: Optional[random.Random] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """One runnable sample drawn without Optuna, with the Optuna params that reproduce it."""
        rng = rng or random.Random()
        dims = self._dims()
        for _ in range(MAX_REJECTIONS):
            params: Dict[str, Any] = {}
            optuna_params: Dict[str, Any] = {}
            for n, p in dims.items():
                params[n], op = p.draw(rng)
                optuna_params.update(op)
            if not self.check(params)[1]:
                return params, optuna_params
        raise ConfigurationError(
            f"space {self.name!r}: no runnable sample in {MAX_REJECTIONS} random draws; its constraints reject "
            "(almost) everything"
        )

    def sample_optuna(self, trial) -> Dict[str, Any]:
        """The sample an Optuna trial suggests (not checked: the caller tells rejected trials back)."""
        return {n: p.suggest(trial) for n, p in self._dims().items()}

    def sample_exhaustive(self, check: bool = True) -> Iterator[Tuple[Dict[str, Any], Dict[str, Any]]]:
        """Every (sample, Optuna params) of a finite space in a fixed order, skipping rejected ones."""
        dims = self._dims()
        for name, p in dims.items():
            if not p.is_finite:
                raise ConfigurationError(
                    f"space {self.name!r}: dimension {name!r} is infinite ({p.domain()}); exhaustive search needs "
                    "finite dimensions"
                )
        names = list(dims)
        for combo in itertools.product(*(list(dims[n].grid()) for n in names)):
            params = {n: v for n, (v, _) in zip(names, combo)}
            if check and self.check(params)[1]:
                continue
            optuna_params: Dict[str, Any] = {}
            for _, op in combo:
                optuna_params.update(op)
            yield params, optuna_params

    def optuna_grid(self) -> Dict[str, List[Any]]:
        """The flat grid for Optuna's GridSampler."""
        grid: Dict[str, List[Any]] = {}
        for p in self._dims().values():
            try:
                grid.update(p.optuna_grid())
            except ValueError as e:
                raise ConfigurationError(f"space {self.name!r}: {e}") from None
        return grid

    def size(self) -> float:
        """Points in the product of the dimensions (before constraints); math.inf if any is continuous."""
        n = 1.0
        for p in self._dims().values():
            n *= p.size()
        return n

    @property
    def is_finite(self) -> bool:
        return not math.isinf(self.size())

    def describe(self) -> Dict[str, Any]:
        dims = self._dims()
        size = self.size()
        return {
            "name": self.name,
            "class": f"{type(self).__module__}:{type(self).__qualname__}",
            "dimensions": {n: p.domain() for n, p in dims.items()},
            "size": None if math.isinf(size) else int(size),
            **self.extra_description(),
        }

    def fingerprint(self) -> str:
        """Changes whenever the space would search something else (the study refuses to resume then)."""
        blob = json.dumps(self.describe(), sort_keys=True, default=str, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def code_key(config: ExperimentConfiguration) -> str:
    """The compile settings of a configuration, without its launch (what a code ban keys on)."""
    d = config.grounded().to_dict()
    for k in ("grid", "block", "shared_mem"):
        d.pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:24]


#: error text of a trial that killed the CUDA context (a sticky error, a dead worker): evidence for a ban
CONTEXT_KILLERS = ("CUDA_ERROR_", "died (", "sticky", "unusable")


def kills_context(status: str, error: str) -> bool:
    """Whether a failed trial is evidence that its configuration breaks the kernel (not a passing fault)."""
    if status == "timeout":
        return True
    return status == "runtime_error" and any(k in (error or "") for k in CONTEXT_KILLERS) and "abandoned" not in error


def _reasons(value: Reasons) -> List[str]:
    if value is True or value is None:
        return []
    if value is False:
        return ["rejected by the space's constraints"]
    if isinstance(value, str):
        return [value]
    return [str(r) for r in value]


def parse_space_args(items: Iterable[str]) -> Dict[str, Any]:
    """`K=V` strings to a dict; values are read as YAML scalars (ints, floats, booleans, lists...)."""
    import yaml

    out: Dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"--space-arg {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def load_space_class(spec: str) -> type:
    """Import `package.module:ClassName` (a SearchSpace subclass)."""
    modname, sep, attr = spec.partition(":")
    if not sep or not modname or not attr:
        raise ConfigurationError(f"--space-module {spec!r}: expected MODULE:CLASS, e.g. myspaces:TileSpace")
    try:
        mod = importlib.import_module(modname)
    except ImportError as e:
        raise ConfigurationError(f"--space-module {spec!r}: cannot import {modname!r} ({e}); is it on PYTHONPATH?") from None
    obj = mod
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigurationError(f"--space-module {spec!r}: {modname} has no {attr!r}")
    if not (inspect.isclass(obj) and issubclass(obj, SearchSpace)):
        raise ConfigurationError(f"--space-module {spec!r}: {attr} is not a mneme.tune.SearchSpace subclass")
    return obj


def build_user_space(spec: str, ctx: SpaceContext, args: Dict[str, Any]) -> SearchSpace:
    """A user space: constructed as CLASS(ctx, **args) when its __init__ takes a context, else CLASS(**args)."""
    cls = load_space_class(spec)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    takes_ctx = bool(params) and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD) and (
        params[0].name in ("ctx", "context") or params[0].annotation in (SpaceContext, "SpaceContext")
    )
    try:
        space = cls(ctx, **args) if takes_ctx else cls(**args)
    except TypeError as e:
        raise ConfigurationError(f"--space-module {spec}: cannot construct it with --space-arg {args}: {e}") from None
    if not hasattr(space, "banned"):
        SearchSpace.__init__(space)
    if space.name == SearchSpace.name:
        space.name = spec
    return space
