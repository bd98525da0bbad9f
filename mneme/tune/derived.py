"""User-defined derived metrics, as Kernel Tuner users write them: `gbps = 3 * n * 4 / time_s / 1e9`.

An expression over the kernel's scalar arguments by name (their recorded values) and the trial's time
(`time_s`, `time_ms`, `time_us`, `time_ns`: the median), with + - * / // % **, parentheses, numbers and
min/max/abs/sqrt/log/log2. Evaluated through Python's ast with nothing else allowed (no attribute access,
no calls but those), so a config file cannot run code.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from mneme.config import ExperimentResult
from mneme.errors import ConfigurationError

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCS = {"min": min, "max": max, "abs": abs, "sqrt": math.sqrt, "log": math.log, "log2": math.log2}
TIME_NAMES = ("time_s", "time_ms", "time_us", "time_ns")


@dataclass(frozen=True)
class Derived:
    name: str
    expr: str
    tree: ast.AST

    @classmethod
    def parse(cls, spec: str) -> "Derived":
        """`NAME = EXPRESSION`; ConfigurationError names what is wrong."""
        m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.+?)\s*", spec or "")
        if not m:
            raise ConfigurationError(f"derived metric {spec!r}: write NAME = EXPRESSION, e.g. 'gbps = 3 * n * 4 / time_s / 1e9'")
        try:
            tree = ast.parse(m.group(2), mode="eval").body
        except SyntaxError as e:
            raise ConfigurationError(f"derived metric {spec!r}: {e.msg}") from None
        for node in ast.walk(tree):
            ok = isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, ast.Call, ast.Constant,
                                   ast.operator, ast.unaryop))
            if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCS
                                                   and not node.keywords):
                ok = False
            if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
                ok = False
            if not ok:
                raise ConfigurationError(f"derived metric {spec!r}: only arithmetic on numbers, argument names, "
                                         f"{', '.join(TIME_NAMES)} and {', '.join(_FUNCS)}() is allowed")
        return cls(m.group(1), m.group(2), tree)

    def names(self) -> List[str]:
        return sorted({n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name) and n.id not in _FUNCS})

    def value(self, env: Mapping[str, float]) -> float:
        def ev(node):
            if isinstance(node, ast.Constant):
                return node.value
            if isinstance(node, ast.Name):
                return env[node.id]
            if isinstance(node, ast.BinOp):
                return _BIN[type(node.op)](ev(node.left), ev(node.right))
            if isinstance(node, ast.UnaryOp):
                return _UNARY[type(node.op)](ev(node.operand))
            return _FUNCS[node.func.id](*[ev(a) for a in node.args])

        return float(ev(self.tree))


def parse_all(specs: Sequence[str]) -> List[Derived]:
    out = [Derived.parse(s) for s in specs or []]
    dup = sorted({d.name for d in out if [e.name for e in out].count(d.name) > 1})
    if dup:
        raise ConfigurationError(f"derived metric {dup[0]!r} is defined twice")
    return out


def check(defs: Sequence[Derived], args: Mapping[str, float]) -> None:
    """Every name a definition uses is a scalar argument or a time; else the error lists the known names."""
    known = set(args) | set(TIME_NAMES)
    for d in defs:
        missing = [n for n in d.names() if n not in known]
        if missing:
            raise ConfigurationError(f"derived metric {d.name!r}: {missing[0]!r} is not a scalar argument of the kernel "
                                     f"or a time; known: {', '.join(sorted(known))}")


def evaluate(defs: Sequence[Derived], args: Mapping[str, float], time_ns: Optional[float]) -> Dict[str, float]:
    """{name: value} for the definitions that can be evaluated (no time: only those that need none)."""
    env: Dict[str, float] = dict(args)
    if time_ns:
        env.update(time_ns=time_ns, time_us=time_ns / 1e3, time_ms=time_ns / 1e6, time_s=time_ns / 1e9)
    out: Dict[str, float] = {}
    for d in defs:
        try:
            v = d.value(env)
        except (KeyError, ZeroDivisionError, ValueError, OverflowError):
            continue
        if math.isfinite(v):
            out[d.name] = v
    return out


def for_results(specs: Sequence[str], record_db: str, record_id: Optional[str],
                results: Mapping[str, Optional[ExperimentResult]], metric: str) -> Dict[str, Dict[str, float]]:
    """{role: {name: value}} of the definitions `specs` for each result (e.g. the baseline and the best), its time
    the `metric` statistic of its iterations; {} without definitions."""
    if not specs:
        return {}
    from mneme.tune.objective import metric_ns

    defs = parse_all(specs)
    args = scalar_args(record_db, record_id)
    check(defs, args)
    return {role: evaluate(defs, args, metric_ns(r.exec_time, metric) if r.exec_time else None)
            for role, r in results.items() if r is not None}


def text(values: Mapping[str, Mapping[str, float]]) -> str:
    """`derived: gbps 812.3 (baseline 640.1), bytes 1.258e+07 (baseline 1.258e+07)` (best first)."""
    best, base = values.get("best") or {}, values.get("baseline") or {}
    names = list(dict.fromkeys([*best, *base]))
    return "derived: " + ", ".join(
        f"{n} {best[n]:.4g}" + (f" (baseline {base[n]:.4g})" if n in base else "") if n in best else f"{n} baseline {base[n]:.4g}"
        for n in names)


@functools.lru_cache(maxsize=16)
def scalar_args(record_db: str, record_id: Optional[str] = None) -> Dict[str, float]:
    """The recorded values of a kernel instance's integer and floating-point arguments, by their IR names (read once
    per process; the dict is shared: do not change it)."""
    from mneme.ir.params import canonical_value, kernel_params
    from mneme.replay.pipeline import ReplayPipeline
    from mneme.snapshot import Snapshot

    pipe = ReplayPipeline(record_db, record_id, device_id=None)
    params = kernel_params(pipe.linked(), pipe.kernel_name)
    names = list(pipe.record.arg_names or [])
    out: Dict[str, float] = {}
    with Snapshot.read(pipe.instance.prologue_fn) as pro:
        args = pro.args
        for p in params:
            name = (names[p.index] if p.index < len(names) and names[p.index] else p.name) or f"arg{p.index}"
            if p.kind in ("int", "float") and p.index < len(args):
                out[name] = float(canonical_value(p, bytes(args[p.index])))
    return out
