"""MLflow runs as a pandas table, and what "best" means for them.

Shared by `mneme compare` and the sweep summary so that both pick the same best run: the fastest
verified run on the chosen statistic; for compile-only runs (nothing timed) the one with the least
local memory (spills), then registers, then object size.
"""

from __future__ import annotations

from typing import Iterable, List, Optional

import pandas as pd

#: ordering when nothing ran on a GPU: spills hurt most, then register pressure, then code size
COMPILE_RANK = ("metrics.local_mem_bytes", "metrics.registers", "metrics.obj_size_bytes")
KERNEL = "tags.mneme.kernel"


def quote(value: str) -> str:
    """A string literal for MLflow's filter syntax (which has no escapes: pick the other quote)."""
    value = str(value)
    return f'"{value}"' if "'" in value else f"'{value}'"


def search(client, experiment_ids: Iterable[str], filter_string: str = "", max_results: Optional[int] = None):
    """Every run matching `filter_string` (MLflow search syntax), following pagination."""
    out: List = []
    token = None
    while True:
        page = client.search_runs(
            list(experiment_ids), filter_string=filter_string, max_results=1000, page_token=token,
            order_by=["attributes.start_time ASC"],
        )
        out.extend(page)
        token = page.token
        if not token or (max_results and len(out) >= max_results):
            return out[:max_results] if max_results else out


def frame(runs) -> pd.DataFrame:
    """One row per run: run_id, run_name, status, start_time, then params.*, metrics.*, tags.*."""
    rows = []
    for r in runs:
        row = {
            "run_id": r.info.run_id,
            "run_name": r.info.run_name,
            "status": r.info.status,
            "start_time": pd.to_datetime(r.info.start_time, unit="ms") if r.info.start_time else pd.NaT,
        }
        row.update({f"params.{k}": v for k, v in r.data.params.items()})
        row.update({f"metrics.{k}": v for k, v in r.data.metrics.items()})
        row.update({f"tags.{k}": v for k, v in r.data.tags.items() if not k.startswith("mlflow.log-model")})
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=["run_id", "run_name", "status", "start_time"])
    return df


def time_column(metric: str = "median") -> str:
    return f"metrics.exec_time_{metric}_ns"


def ranked(df: pd.DataFrame, metric: str = "median") -> pd.DataFrame:
    """Candidates for "best", best first: verified timed runs, else successful compile-only runs."""
    if df.empty:
        return df
    col = time_column(metric)
    if col in df and "metrics.verified" in df:
        timed = df[(df["metrics.verified"] == 1) & df[col].notna()]
        if not timed.empty:
            return timed.sort_values(col, kind="stable")
    if "metrics.verified" in df:
        df = df[df["metrics.verified"].isna()]  # a run that failed verification is never best
    ok = df[df["status"] == "FINISHED"]
    keys = [c for c in COMPILE_RANK if c in ok]
    return ok.sort_values(keys, kind="stable") if keys else ok.iloc[0:0]


def best_per_kernel(df: pd.DataFrame, metric: str = "median") -> pd.DataFrame:
    """The best run of each kernel (rows without a kernel tag count as one kernel, '')."""
    if df.empty:
        return df
    df = df.copy()
    df[KERNEL] = df[KERNEL].fillna("") if KERNEL in df else ""
    best = [ranked(group, metric).head(1) for _, group in df.groupby(KERNEL, sort=True)]
    best = [b for b in best if not b.empty]
    return pd.concat(best) if best else df.iloc[0:0]
