"""The sweep's pictures (PNG, Agg): speedup over trials, the time/registers Pareto front, and for compile-only
sweeps registers and local memory over trials. One panel per kernel, labelled axes with units, a legend,
the baseline and the best trial marked.

`trials` frames come from summary.trials_table: columns trial, kernel, role, verified, speedup, time_ns,
registers, local_mem (NaN where a trial has no value).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Sequence, Tuple

import pandas as pd

MAX_PANELS = 6


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _kernels(trials: pd.DataFrame) -> List[str]:
    ks = list(dict.fromkeys(trials["kernel"].fillna("").astype(str))) if "kernel" in trials else [""]
    return ks[:MAX_PANELS]


def _panels(n: int, rows_per: int = 1):
    plt = _pyplot()
    cols = min(n, 3)
    grid = math.ceil(n / cols)
    fig, axes = plt.subplots(grid * rows_per, cols, figsize=(6.4 * cols, 3.6 * grid * rows_per), dpi=110, squeeze=False)
    return plt, fig, axes


def _of(trials: pd.DataFrame, kernel: str) -> pd.DataFrame:
    return trials[trials["kernel"].fillna("").astype(str) == kernel] if "kernel" in trials else trials


def _integer_ticks(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _save(plt, fig, path: Path, title: str) -> Path:
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def pareto_front(points: Sequence[Tuple[float, float]]) -> List[int]:
    """Indices of the points no other point beats on both coordinates (both minimized)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front: List[int] = []
    best_y = float("inf")
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def speedup_over_trials(trials: pd.DataFrame, path: Path, title: str = "") -> Path:
    """Speedup over the baseline per trial, the best so far, failed trials at 0; one panel per kernel."""
    kernels = _kernels(trials)
    plt, fig, axes = _panels(len(kernels))
    for ax, k in zip(axes.flat, kernels):
        t = _of(trials, k)
        t = t[t.get("role", pd.Series("trial", index=t.index)) != "baseline"]
        ok = t[t["verified"] == 1].sort_values("trial")
        bad = t[t["verified"] != 1]
        ax.scatter(ok["trial"], ok["speedup"], s=14, color="tab:blue", label="verified trial")
        if not ok.empty and ok["speedup"].notna().any():
            ax.step(ok["trial"], ok["speedup"].cummax(), where="post", color="tab:green", label="best so far")
            best = ok.loc[ok["speedup"].idxmax()]
            ax.scatter([best["trial"]], [best["speedup"]], marker="*", s=160, color="gold", edgecolor="black", zorder=5,
                       label=f"best: {best['speedup']:.2f}x (trial {int(best['trial'])})")
        if not bad.empty:
            ax.scatter(bad["trial"], [0] * len(bad), marker="x", s=14, color="tab:red", label="failed trial")
        ax.axhline(1.0, color="gray", linewidth=1, linestyle="--", label="baseline (1.0x)")
        ax.set_xlabel("trial number")
        ax.set_ylabel("speedup over baseline (x)")
        ax.set_title(k or "speedup over trials", fontsize=9)
        _integer_ticks(ax.xaxis)
        ax.legend(loc="lower right", fontsize=7)
    for ax in list(axes.flat)[len(kernels):]:
        ax.set_visible(False)
    return _save(plt, fig, path, title)


def pareto_time_registers(trials: pd.DataFrame, path: Path, title: str = "") -> Path:
    """Median time (µs) against registers per thread for verified trials, the Pareto front, baseline and best."""
    kernels = _kernels(trials)
    plt, fig, axes = _panels(len(kernels))
    for ax, k in zip(axes.flat, kernels):
        t = _of(trials, k)
        t = t[(t["verified"] == 1) & t["time_ns"].notna() & t["registers"].notna()]
        pts = list(zip(t["registers"].astype(float), t["time_ns"].astype(float) / 1000.0))
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, color="tab:blue", label="verified trial")
        front = sorted((pts[i] for i in pareto_front(pts)), key=lambda p: p[0])
        if front:
            ax.plot([p[0] for p in front], [p[1] for p in front], "o-", color="tab:orange", label="Pareto front")
        base = t[t["role"] == "baseline"] if "role" in t else t.iloc[0:0]
        if not base.empty:
            ax.scatter(base["registers"], base["time_ns"] / 1000.0, marker="D", s=60, color="gray", edgecolor="black",
                       zorder=5, label="baseline")
        if pts:
            b = min(pts, key=lambda p: p[1])
            ax.scatter([b[0]], [b[1]], marker="*", s=160, color="gold", edgecolor="black", zorder=6,
                       label=f"fastest: {b[1]:.2f} µs, {int(b[0])} regs")
        ax.set_xlabel("registers per thread")
        ax.set_ylabel("median execution time (µs)")
        ax.set_title(k or "time against registers", fontsize=9)
        _integer_ticks(ax.xaxis)
        ax.legend(loc="upper right", fontsize=7)
    for ax in list(axes.flat)[len(kernels):]:
        ax.set_visible(False)
    return _save(plt, fig, path, title)


def compile_metrics_over_trials(trials: pd.DataFrame, path: Path, title: str = "") -> Path:
    """For compile-only sweeps: registers (top) and local memory (bottom) per trial, one column per kernel."""
    kernels = _kernels(trials)
    plt = _pyplot()
    fig, axes = plt.subplots(2, len(kernels), figsize=(6.4 * len(kernels), 6.0), dpi=110, squeeze=False, sharex="col")
    for col, k in enumerate(kernels):
        t = _of(trials, k)
        base = t[t["role"] == "baseline"] if "role" in t else t.iloc[0:0]
        runs = t.drop(base.index)
        for row, (field, label, color) in enumerate((("registers", "registers per thread", "tab:blue"),
                                                     ("local_mem", "local memory (bytes)", "tab:red"))):
            ax = axes[row][col]
            ax.scatter(runs["trial"], runs[field], s=16, color=color, label=f"{label.split(' (')[0]} per trial")
            if not base.empty and base[field].notna().any():
                ax.axhline(float(base[field].iloc[0]), color="gray", linestyle="--", linewidth=1,
                           label=f"baseline: {int(base[field].iloc[0])}")
            if runs[field].notna().any():
                best = runs.loc[runs[field].idxmin()]
                ax.scatter([best["trial"]], [best[field]], marker="*", s=160, color="gold", edgecolor="black", zorder=5,
                           label=f"fewest: {int(best[field])} (trial {int(best['trial'])})")
            ax.set_ylabel(label)
            _integer_ticks(ax.yaxis)
            _integer_ticks(ax.xaxis)
            ax.legend(loc="upper right", fontsize=7)
            if row == 0:
                ax.set_title(k or "compile-only", fontsize=9)
            else:
                ax.set_xlabel("trial number")
    return _save(plt, fig, path, title or "compile-only: registers and local memory per trial")
