"""Where the best configuration's gain comes from, checked by removing each knob.

After a search, every knob group in which the best configuration differs from the baseline is set back to the
baseline's value, one group at a time, and that configuration is measured (not counted as a trial). The gain a
group carries is `time without it / best time`; the group whose removal costs the most is the one the gain
comes from (`gain_from`). Identical machine code at the same launch is not timed again (the executor reuses the
run), so a knob that changed nothing shows a factor of exactly 1.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional

from mneme.config import KNOB_DEFAULTS, ExperimentConfiguration, ExperimentResult, dim3

#: study attribute holding the attribution (written by the tuner, read by the report)
A_ATTRIBUTION = "mneme.attribution"

#: knob group -> the configuration fields it sets
GROUPS: Dict[str, tuple] = {
    "launch": ("grid", "block", "shared_mem"),
    "passes": ("passes",),
    "codegen_opt": ("codegen_opt",),
    "specialize": ("specialize",),
    "specialize_dims": ("specialize_dims",),
    "launch_bounds": ("set_launch_bounds", "max_threads", "min_blocks_per_sm"),
    "internalize": ("internalize",),
    **{k: (k,) for k in KNOB_DEFAULTS},
}


def _value(config: ExperimentConfiguration, group: str) -> Any:
    c = config.grounded()
    vals = []
    for f in GROUPS[group]:
        v = getattr(c, f)
        vals.append(v.to_dict() if isinstance(v, dim3) else v)
    return vals[0] if len(vals) == 1 else vals


def differing(best: ExperimentConfiguration, baseline: ExperimentConfiguration) -> List[str]:
    """The knob groups in which `best` differs from `baseline`."""
    return [g for g in GROUPS if _value(best, g) != _value(baseline, g)]


def without(best: ExperimentConfiguration, baseline: ExperimentConfiguration, group: str) -> ExperimentConfiguration:
    """`best` with `group` set back to the baseline's values (launch bounds follow a block that changes)."""
    c = replace(best.grounded(), grid=dim3.from_dict(best.grid), block=dim3.from_dict(best.block))
    b = baseline.grounded()
    for f in GROUPS[group]:
        v = getattr(b, f)
        setattr(c, f, dim3.from_dict(v) if isinstance(v, dim3) else v)
    if c.set_launch_bounds and c.max_threads < c.block.total():
        c.max_threads = c.block.total()
    return c.ground()


def attribute(
    evaluate: Callable[[ExperimentConfiguration], ExperimentResult],
    best: ExperimentConfiguration,
    best_ns: float,
    baseline: ExperimentConfiguration,
    baseline_ns: Optional[float],
    metric_ns: Callable[[ExperimentResult], Optional[float]],
) -> Dict[str, Any]:
    """Measure `best` without each differing group; {"groups": [...], "gain_from": name or None}."""
    rows: List[Dict[str, Any]] = []
    for group in differing(best, baseline):
        cfg = without(best, baseline, group)
        row: Dict[str, Any] = {"knob": group, "value": _value(best, group), "baseline_value": _value(baseline, group),
                               "config_hash": cfg.hash()}
        problems = cfg.problems()
        if problems:
            row.update(status="invalid_config", error="; ".join(problems))
            rows.append(row)
            continue
        r = evaluate(cfg)
        ns = metric_ns(r) if r.status == "verified" else None
        row.update(status=r.status, metric_ns=ns, same_binary_as=r.same_binary_as or None)
        if ns:
            row["gain"] = ns / best_ns  # how much slower the best gets without this knob
            if baseline_ns:
                row["speedup_without"] = baseline_ns / ns
        rows.append(row)
    ranked = [r for r in rows if r.get("gain")]
    top = max(ranked, key=lambda r: r["gain"]) if ranked else None
    return {
        "best_ns": best_ns, "baseline_ns": baseline_ns,
        "speedup": (baseline_ns / best_ns) if baseline_ns and best_ns else None,
        "groups": rows,
        "gain_from": top["knob"] if top is not None and top["gain"] > 1.0 else None,
        "gain_from_factor": top["gain"] if top is not None else None,
    }


def attribution_text(att: Optional[Dict[str, Any]]) -> str:
    if not att or not att.get("groups"):
        return ""
    parts = []
    for r in att["groups"]:
        if r.get("gain"):
            parts.append(f"{r['knob']} x{r['gain']:.3f}")
        else:
            parts.append(f"{r['knob']} ({r.get('status')})")
    head = f"gain from {att['gain_from']}" if att.get("gain_from") else "no single knob carries the gain"
    return f"{head} (best without each knob is slower by: {', '.join(parts)})"
