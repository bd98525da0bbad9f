"""Tunable parameters: each knows its domain, how to draw from it (Python's random or an Optuna trial),
how to enumerate it when it is finite, and how big it is.

Enumeration yields `(value, optuna_params)` pairs: the value goes into the search space, the Optuna params are
what a trial would have suggested to produce it. That lets exhaustive and plain-random strategies write their
choices into an Optuna study (as enqueued trials), so the study stays the one record of what was tried.
"""

from __future__ import annotations

import itertools
import math
import random
from abc import ABC, abstractmethod
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

#: Optuna accepts only these types as categorical choices.
_OPTUNA_SCALARS = (type(None), bool, int, float, str)

Grid = Iterator[Tuple[Any, Dict[str, Any]]]


class BaseParam(ABC):
    """One tunable dimension; `name` is also the Optuna parameter name."""

    def __init__(self, name: str):
        if not name:
            raise ValueError("a parameter needs a name")
        self.name = name

    @abstractmethod
    def domain(self) -> Dict[str, Any]:
        """A JSON-able description of the domain (shown by --print-space, part of the space fingerprint)."""

    def sample_random(self, rng: random.Random) -> Any:
        """One value drawn uniformly, without Optuna."""
        return self.draw(rng)[0]

    def draw(self, rng: random.Random) -> Tuple[Any, Dict[str, Any]]:
        """One value drawn uniformly with the Optuna params that reproduce it in a trial."""
        value = self._draw_value(rng)
        return value, self.optuna_params(value)

    def _draw_value(self, rng: random.Random) -> Any:
        raise NotImplementedError

    def optuna_params(self, value: Any) -> Dict[str, Any]:
        """The Optuna params under which `suggest` returns `value`."""
        return {self.name: value}

    @abstractmethod
    def suggest(self, trial) -> Any:
        """One value suggested by an Optuna trial (fixed params of an enqueued trial come back as given)."""

    @abstractmethod
    def grid(self) -> Grid:
        """Every value with the Optuna params that produce it; ValueError where the domain is infinite."""

    @abstractmethod
    def size(self) -> float:
        """How many values the domain holds (math.inf for continuous ranges)."""

    @property
    def is_finite(self) -> bool:
        return not math.isinf(self.size())

    def values(self) -> Iterator[Any]:
        for value, _ in self.grid():
            yield value

    def optuna_grid(self) -> Dict[str, List[Any]]:
        """The flat {optuna name: choices} map Optuna's GridSampler needs; ValueError where that cannot exist."""
        raise ValueError(f"parameter {self.name!r} ({type(self).__name__}) has no flat grid for the grid sampler")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.domain()})"


class FixedParam(BaseParam):
    """A dimension held at one value: it stays visible in the space without being searched."""

    def __init__(self, name: str, value: Any):
        super().__init__(name)
        self.value = value

    def domain(self) -> Dict[str, Any]:
        return {"type": "fixed", "value": self.value}

    def _draw_value(self, rng: random.Random) -> Any:
        return self.value

    def optuna_params(self, value: Any) -> Dict[str, Any]:
        return {}

    def suggest(self, trial) -> Any:
        return self.value

    def grid(self) -> Grid:
        yield self.value, {}

    def size(self) -> float:
        return 1

    def optuna_grid(self) -> Dict[str, List[Any]]:
        return {}


class CategoricalParam(BaseParam):
    """An explicit finite set of choices. Choices Optuna cannot store (tuples, objects) travel by label."""

    def __init__(self, name: str, choices: Sequence[Any]):
        super().__init__(name)
        choices = list(choices)
        if not choices:
            raise ValueError(f"CategoricalParam {name!r} needs at least one choice")
        self.choices: List[Any] = choices
        if all(isinstance(c, _OPTUNA_SCALARS) for c in choices):
            self._labels: List[Any] = list(choices)
        else:
            self._labels = [repr(c) for c in choices]
        if len(set(map(repr, self._labels))) != len(self._labels):
            raise ValueError(f"CategoricalParam {name!r} has duplicate choices: {choices}")

    def domain(self) -> Dict[str, Any]:
        return {"type": "categorical", "choices": list(self._labels)}

    def _draw_value(self, rng: random.Random) -> Any:
        return rng.choice(self.choices)

    def optuna_params(self, value: Any) -> Dict[str, Any]:
        for choice, label in zip(self.choices, self._labels):
            if choice == value and type(choice) is type(value):
                return {self.name: label}
        raise ValueError(f"{value!r} is not a choice of {self.name!r} ({self.choices})")

    def suggest(self, trial) -> Any:
        label = trial.suggest_categorical(self.name, self._labels)
        return self.choices[self._labels.index(label)]

    def grid(self) -> Grid:
        for choice, label in zip(self.choices, self._labels):
            yield choice, {self.name: label}

    def size(self) -> float:
        return len(self.choices)

    def optuna_grid(self) -> Dict[str, List[Any]]:
        return {self.name: list(self._labels)}


class BoolParam(CategoricalParam):
    """True or False."""

    def __init__(self, name: str):
        super().__init__(name, [True, False])

    def domain(self) -> Dict[str, Any]:
        return {"type": "bool"}


class IntRangeParam(BaseParam):
    """The integers low, low+step, ..., up to high (high is lowered to the last reachable value)."""

    def __init__(self, name: str, low: int, high: int, step: int = 1):
        super().__init__(name)
        low, high = int(low), int(high)
        if step is None or int(step) <= 0:
            raise ValueError(f"IntRangeParam {name!r}: step must be a positive integer, got {step!r}")
        if low > high:
            raise ValueError(f"IntRangeParam {name!r}: low={low} is above high={high}")
        self.step = int(step)
        self.low = low
        self.high = low + (high - low) // self.step * self.step

    def domain(self) -> Dict[str, Any]:
        return {"type": "int", "low": self.low, "high": self.high, "step": self.step}

    def _draw_value(self, rng: random.Random) -> int:
        return self.low + rng.randrange(int(self.size())) * self.step

    def suggest(self, trial) -> int:
        return int(trial.suggest_int(self.name, self.low, self.high, step=self.step))

    def grid(self) -> Grid:
        for v in range(self.low, self.high + 1, self.step):
            yield v, {self.name: v}

    def size(self) -> float:
        return (self.high - self.low) // self.step + 1

    def optuna_grid(self) -> Dict[str, List[Any]]:
        return {self.name: list(range(self.low, self.high + 1, self.step))}


class RealRangeParam(BaseParam):
    """A real interval [low, high]; continuous unless a step makes it a finite lattice."""

    def __init__(self, name: str, low: float, high: float, step: Optional[float] = None, log: bool = False):
        super().__init__(name)
        low, high = float(low), float(high)
        if low > high:
            raise ValueError(f"RealRangeParam {name!r}: low={low} is above high={high}")
        if step is not None and step <= 0:
            raise ValueError(f"RealRangeParam {name!r}: step must be positive, got {step}")
        if log and (low <= 0 or step is not None):
            raise ValueError(f"RealRangeParam {name!r}: a log scale needs low > 0 and no step")
        self.low, self.high, self.step, self.log = low, high, step, log

    def domain(self) -> Dict[str, Any]:
        return {"type": "real", "low": self.low, "high": self.high, "step": self.step, "log": self.log}

    def _points(self) -> int:
        return int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1

    def _draw_value(self, rng: random.Random) -> float:
        if self.step is not None:
            return self.low + rng.randrange(self._points()) * self.step
        if self.log:
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(self.low, self.high)

    def suggest(self, trial) -> float:
        return float(trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log))

    def grid(self) -> Grid:
        if self.step is None:
            raise ValueError(f"parameter {self.name!r} is a continuous range and cannot be enumerated; give it a step")
        for i in range(self._points()):
            v = self.low + i * self.step
            yield v, {self.name: v}

    def size(self) -> float:
        return math.inf if self.step is None else self._points()

    def optuna_grid(self) -> Dict[str, List[Any]]:
        return {self.name: [v for v, _ in self.grid()]}


#: The slot value meaning "no pass here" in a drawn pipeline.
SKIP = "-"
#: The choice of a PipelineParam that means "draw a pass sequence" rather than a named pipeline.
DRAWN = "<drawn>"


def join_passes(passes: Sequence[str]) -> str:
    """A flat pass sequence as an opt-style pipeline string."""
    return ",".join(passes)


class PipelineParam(BaseParam):
    """An optimization pipeline: one of the named `pipelines`, or a sequence of up to `num_draws` passes drawn
    from `passes` (default: `mneme.ir.available_passes()`), joined into a pipeline string.

    A drawn sequence is `num_draws` slots; the first always holds a pass, the others a pass or nothing, so
    every draw is a valid, non-empty pipeline. The domain is combinatorial (|passes|^num_draws): exhaustive
    search over drawn pipelines only makes sense for a handful of passes and draws.
    """

    def __init__(
        self,
        name: str,
        num_draws: int = 0,
        pipelines: Optional[Sequence[str]] = None,
        passes: Optional[Sequence[str]] = None,
        joiner: Callable[[Sequence[str]], str] = join_passes,
    ):
        super().__init__(name)
        if num_draws < 0:
            raise ValueError(f"PipelineParam {name!r}: num_draws must not be negative")
        self.pipelines: List[str] = list(dict.fromkeys(pipelines or []))
        if not self.pipelines and num_draws == 0:
            raise ValueError(f"PipelineParam {name!r} needs named pipelines or num_draws > 0")
        if DRAWN in self.pipelines:
            raise ValueError(f"PipelineParam {name!r}: {DRAWN!r} is reserved")
        self.num_draws = int(num_draws)
        self._passes = None if passes is None else sorted(dict.fromkeys(passes))
        self.joiner = joiner

    @property
    def available_passes(self) -> List[str]:
        if self._passes is None:
            from mneme.ir import available_passes

            self._passes = sorted(dict.fromkeys(available_passes()))
        if self.num_draws and not self._passes:
            raise ValueError(f"PipelineParam {self.name!r}: no passes to draw from")
        return self._passes

    def _slot(self, i: int) -> str:
        return f"{self.name}.{i}"

    def _slot_choices(self, i: int) -> List[str]:
        return list(self.available_passes) if i == 0 else [SKIP] + list(self.available_passes)

    def _choices(self) -> List[str]:
        return self.pipelines + ([DRAWN] if self.num_draws else [])

    def domain(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"type": "pipeline", "pipelines": list(self.pipelines), "num_draws": self.num_draws}
        if self.num_draws:
            d["passes"] = list(self.available_passes)
        return d

    def _head(self, choice: str) -> Dict[str, Any]:
        return {self.name: choice} if len(self._choices()) > 1 else {}

    def draw(self, rng: random.Random) -> Tuple[str, Dict[str, Any]]:
        choice = rng.choice(self._choices())
        if choice != DRAWN:
            return choice, self._head(choice)
        drawn = [rng.choice(self._slot_choices(i)) for i in range(self.num_draws)]
        params = self._head(DRAWN)
        params.update({self._slot(i): p for i, p in enumerate(drawn)})
        return self.joiner([p for p in drawn if p != SKIP]), params

    def optuna_params(self, value: Any) -> Dict[str, Any]:
        if value in self.pipelines:
            return self._head(value)
        if not self.num_draws or self.joiner is not join_passes:
            raise ValueError(f"{value!r} is not a pipeline of {self.name!r}")
        seq = [p for p in str(value).split(",") if p]
        if not 1 <= len(seq) <= self.num_draws or any(p not in self.available_passes for p in seq):
            raise ValueError(f"{value!r} is not a drawable pipeline of {self.name!r}")
        params = self._head(DRAWN)
        params.update({self._slot(i): seq[i] if i < len(seq) else SKIP for i in range(self.num_draws)})
        return params

    def suggest(self, trial) -> str:
        choices = self._choices()
        choice = choices[0] if len(choices) == 1 else trial.suggest_categorical(self.name, choices)
        if choice != DRAWN:
            return choice
        drawn = [trial.suggest_categorical(self._slot(i), self._slot_choices(i)) for i in range(self.num_draws)]
        return self.joiner([p for p in drawn if p != SKIP])

    def grid(self) -> Grid:
        for p in self.pipelines:
            yield p, self._head(p)
        if not self.num_draws:
            return
        passes = self.available_passes
        for length in range(1, self.num_draws + 1):
            for seq in itertools.product(passes, repeat=length):
                params = self._head(DRAWN)
                params.update({self._slot(i): seq[i] if i < length else SKIP for i in range(self.num_draws)})
                yield self.joiner(seq), params

    def size(self) -> float:
        n = len(self.pipelines)
        if self.num_draws:
            p = len(self.available_passes)
            n += sum(p**k for k in range(1, self.num_draws + 1))
        return n

    def optuna_grid(self) -> Dict[str, List[Any]]:
        if self.num_draws:
            raise ValueError(
                f"parameter {self.name!r} draws pass sequences (conditional parameters); the grid sampler needs a "
                "flat space: use --sampler bruteforce or exhaustive"
            )
        return {self.name: list(self.pipelines)} if len(self.pipelines) > 1 else {}


def sample_random_param(param: BaseParam, rng: Optional[random.Random] = None) -> Any:
    """The seeds' name for `param.sample_random`."""
    return param.sample_random(rng or random.Random())


def sample_optuna_param(trial, param: BaseParam) -> Any:
    """The seeds' name for `param.suggest`."""
    return param.suggest(trial)
