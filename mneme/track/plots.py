"""The sweep's two pictures: speedup over trials, and the time/registers Pareto front (PNG, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Tuple

import pandas as pd


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _figure():
    plt = _pyplot()
    return plt, *plt.subplots(figsize=(7, 4), dpi=120)


def _save(plt, fig, path: Path) -> Path:
    # fixed margins and legend places: tight_layout and loc="best" measure every point (0.2 s for 1000 trials,
    # paid at the end of each sweep)
    fig.subplots_adjust(left=0.1, right=0.9, bottom=0.12, top=0.92)
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
    """`trials` has columns trial, speedup (NaN for failed trials), verified."""
    plt, fig, ax = _figure()
    ok = trials[trials["verified"] == 1].sort_values("trial")
    bad = trials[trials["verified"] != 1]
    ax.scatter(ok["trial"], ok["speedup"], s=14, color="tab:blue", label="verified trial")
    if not ok.empty:
        ax.step(ok["trial"], ok["speedup"].cummax(), where="post", color="tab:green", label="best so far")
    if not bad.empty:
        ax.scatter(bad["trial"], [0] * len(bad), marker="x", s=14, color="tab:red", label="failed trial")
    ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    ax.set_xlabel("trial")
    ax.set_ylabel("speedup over baseline")
    ax.set_title(title or "speedup over trials")
    ax.legend(loc="lower right", fontsize=8)
    return _save(plt, fig, path)


def pareto_time_registers(trials: pd.DataFrame, path: Path, title: str = "") -> Path:
    """`trials` has columns time_ns and registers (verified trials only)."""
    plt, fig, ax = _figure()
    pts = list(zip(trials["registers"].astype(float), trials["time_ns"].astype(float)))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, color="tab:blue", label="verified trial")
    front = sorted((pts[i] for i in pareto_front(pts)), key=lambda p: p[0])
    if front:
        ax.plot([p[0] for p in front], [p[1] for p in front], "o-", color="tab:orange", label="Pareto front")
    ax.set_xlabel("registers per thread")
    ax.set_ylabel("execution time (ns)")
    ax.set_title(title or "time against registers")
    ax.legend(loc="upper right", fontsize=8)
    return _save(plt, fig, path)


def compile_metrics_over_trials(trials: pd.DataFrame, path: Path, title: str = "") -> Path:
    """For compile-only sweeps: registers and local memory per trial."""
    plt, fig, ax = _figure()
    ax.scatter(trials["trial"], trials["registers"], s=14, color="tab:blue", label="registers")
    ax.set_xlabel("trial")
    ax.set_ylabel("registers per thread")
    if "local_mem" in trials and trials["local_mem"].fillna(0).any():
        ax2 = ax.twinx()
        ax2.scatter(trials["trial"], trials["local_mem"], s=10, marker="s", color="tab:red", label="local memory")
        ax2.set_ylabel("local memory (bytes)")
    ax.set_title(title or "compile-only: registers over trials")
    return _save(plt, fig, path)
