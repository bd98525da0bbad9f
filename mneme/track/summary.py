"""What a sweep's parent run gets at the end: counts, the best configuration, and the plots.

Computed from the store, not from memory, so trials logged by other processes sharing the study
count too. Runs in the writer (see `Tracker.call`), after every trial of this process is written.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from dataclasses import fields
from typing import Any, Dict, List, Optional

import pandas as pd
import yaml

from mneme.config import ExperimentConfiguration, MeasurementSettings
from mneme.track import plots, runs

#: the text fields of each params prefix: read back as the text MLflow holds, not as YAML (a dlcm of ''
#: would come back None, a pipeline or an arch that looks like a number or a bool would change type)
_TEXT_FIELDS = {
    prefix: {f.name for f in fields(cls) if str(f.type) in ("str", "Optional[str]")}
    for prefix, cls in (("replay", ExperimentConfiguration), ("measure", MeasurementSettings))
}


def _value(text: str, as_text: bool = False) -> Any:
    if text == "None":
        return None
    if as_text:
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def unflatten(params: Dict[str, str], prefix: str) -> Dict[str, Any]:
    """{'replay.grid.x': '4'} -> {'grid': {'x': 4}} for the keys under `prefix`; the dataclasses' text fields
    stay text (config_params writes each value as str(value), so every field round-trips)."""
    text_fields = _TEXT_FIELDS.get(prefix, set())
    out: Dict[str, Any] = {}
    for key, text in sorted(params.items()):
        if not key.startswith(prefix + "."):
            continue
        node = out
        *parents, leaf = key[len(prefix) + 1:].split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = _value(text, as_text=not parents and leaf in text_fields)
    return out


def canonical(replay: Dict[str, Any]) -> Dict[str, Any]:
    """The replay configuration in the dataclass's own field order (as `mneme replay` prints it)."""
    try:
        return ExperimentConfiguration.from_dict(replay).to_dict()
    except (KeyError, TypeError, ValueError):
        return replay


def trials_table(df: pd.DataFrame, metric: str = "median") -> pd.DataFrame:
    """trial, verified, speedup, time_ns, registers, local_mem: the columns the plots draw."""
    def col(name: str) -> pd.Series:
        return pd.to_numeric(df[name], errors="coerce") if name in df else pd.Series([float("nan")] * len(df), index=df.index)

    def text(name: str) -> pd.Series:
        return df[name].fillna("").astype(str) if name in df else pd.Series([""] * len(df), index=df.index)

    trial = col("tags.mneme.trial")
    fallback = pd.Series(range(len(df)), index=df.index, dtype=float)
    kernel = text("params.kernel").where(text("params.kernel") != "", text(runs.KERNEL))
    return pd.DataFrame({
        "trial": trial.fillna(fallback),
        "kernel": kernel,
        "role": text("tags.mneme.role"),
        "verified": col("metrics.verified").fillna(0),
        "speedup": col("metrics.speedup"),
        "time_ns": col(runs.time_column(metric)),
        "registers": col("metrics.registers"),
        "local_mem": col("metrics.local_mem_bytes"),
    })


def children(client, parent, rows: Optional[List[Dict[str, Any]]], session: str = "") -> pd.DataFrame:
    """Every child run of `parent`: `rows` (what this process's writers kept, as runs.frame rows) plus, from the
    store, the children other trackers logged (earlier processes of a resumed study, processes sharing it),
    told apart by the mneme.tracker tag `session`; without `rows`, all of them from the store."""
    where = f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    if rows is None:
        return runs.frame(runs.search(client, [parent.info.experiment_id], where))
    others = runs.search(client, [parent.info.experiment_id], f"{where} and tags.`mneme.tracker` != '{session}'")
    parts = [f for f in (runs.frame(others), pd.DataFrame(rows)) if not f.empty]
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if not df.empty and "tags.mneme.trial" in df:
        df = df.sort_values("tags.mneme.trial", key=lambda c: pd.to_numeric(c, errors="coerce"), kind="stable")
    return df.reset_index(drop=True)


def _us(ns) -> str:
    return "-" if ns is None or pd.isna(ns) else f"{float(ns) / 1000:.2f} µs"


def note_markdown(df: pd.DataFrame, metric: str, title: str = "", output: str = "") -> str:
    """The parent run's description (MLflow shows `mlflow.note.content` as markdown): per kernel the trials by
    status, the baseline, the best run and its speedup; where the results directory is."""
    lines = [f"### {title or 'sweep'}: {len(df)} runs", "",
             "| kernel | trials | verified | failed | baseline | best run | best | speedup |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    kernels = trials_table(df, metric)["kernel"] if not df.empty else pd.Series(dtype=str)
    col = runs.time_column(metric)
    for k in dict.fromkeys(kernels):
        g = df[kernels == k]
        role = g["tags.mneme.role"] if "tags.mneme.role" in g else pd.Series([""] * len(g), index=g.index)
        base = g[role == "baseline"]
        trials = g[role != "baseline"]
        verified = int((pd.to_numeric(trials.get("metrics.verified"), errors="coerce") == 1).sum()) \
            if "metrics.verified" in trials else 0
        failed = int((trials["status"] == "FAILED").sum()) if "status" in trials else 0
        best = runs.ranked(g, metric).head(1)
        b = best.iloc[0] if not best.empty else None
        speed = b.get("metrics.speedup") if b is not None else None
        lines.append(
            f"| {k or '-'} | {len(trials)} | {verified} | {failed} | "
            f"{_us(base[col].iloc[0]) if not base.empty and col in base else '-'} | "
            f"{b['run_name'] if b is not None else '-'} | {_us(b.get(col)) if b is not None else '-'} | "
            f"{'-' if speed is None or pd.isna(speed) else f'{float(speed):.2f}x'} |")
    if output:
        lines += ["", f"Results: `{output}` (summary.txt, best.md, best.sh)"]
    lines += ["", "Artifacts: `report.html` (sortable table, parallel coordinates), plots, `best_config.yaml`."]
    return "\n".join(lines)


def summarize_sweep(client, parent_run_id: str, metric: str = "median", title: str = "",
                    rows: Optional[List[Dict[str, Any]]] = None, session: str = "") -> Optional[Dict[str, Any]]:
    """Log counts, best configuration and plots to the parent run; returns the best row as a dict.

    `rows`, `session`: see `children`."""
    from mlflow.entities import Metric, RunTag

    parent = client.get_run(parent_run_id)
    df = children(client, parent, rows, session)
    table = trials_table(df, metric) if not df.empty else pd.DataFrame()
    now = int(time.time() * 1000)  # a later summary (a resumed study) must win over an earlier one
    counts = {
        "runs": float(len(df)),
        "verified_runs": float((table["verified"] == 1).sum()) if not table.empty else 0.0,
        "failed_runs": float((df["status"] == "FAILED").sum()) if not df.empty else 0.0,
    }
    metrics = [Metric(k, v, now, 0) for k, v in counts.items()]
    tags = []
    kernels = list(dict.fromkeys(table["kernel"])) if not table.empty else []
    best = runs.ranked(df, metric).head(1) if not df.empty else df
    best_row: Optional[Dict[str, Any]] = None
    with tempfile.TemporaryDirectory(prefix="mneme-summary-") as tmp:
        out = Path(tmp)
        if len(kernels) > 1:  # one "best" across kernels means nothing: the best of each
            per = {}
            for k in kernels:
                b = runs.ranked(df[table["kernel"] == k], metric).head(1)
                if not b.empty:
                    row = b.iloc[0].to_dict()
                    params = {key[len("params."):]: v for key, v in row.items() if key.startswith("params.") and isinstance(v, str)}
                    per[k] = {"run_id": row["run_id"], "run_name": row["run_name"],
                              "time_ns": None if pd.isna(row.get(runs.time_column(metric), float("nan"))) else row.get(runs.time_column(metric)),
                              "replay": canonical(unflatten(params, "replay"))}
            (out / "best_per_kernel.json").write_text(json.dumps(per, indent=2, default=str) + "\n")
            (out / "best_config.yaml").write_text(yaml.safe_dump({k: {"replay": v["replay"]} for k, v in per.items()},
                                                                 sort_keys=False))
            tags += [RunTag(f"mneme.best_run_id.{i}", v["run_id"]) for i, v in enumerate(per.values())]
            best = best.iloc[0:0]
        if not best.empty:
            best_row = best.iloc[0].to_dict()
            params = {k[len("params."):]: v for k, v in best_row.items() if k.startswith("params.") and isinstance(v, str)}
            config = {"replay": canonical(unflatten(params, "replay")), "measure": unflatten(params, "measure")}
            info = {
                "run_id": best_row["run_id"],
                "run_name": best_row["run_name"],
                "kernel": best_row.get(runs.KERNEL, ""),
                "config_hash": best_row.get("tags.mneme.config_hash", ""),
                "time_ns": best_row.get(runs.time_column(metric)),
                "speedup": best_row.get("metrics.speedup"),
            }
            info = {k: (None if isinstance(v, float) and pd.isna(v) else v) for k, v in info.items()}
            (out / "best_config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
            (out / "best_config.json").write_text(json.dumps({**info, **config}, indent=2, default=str) + "\n")
            tags += [RunTag("mneme.best_run_id", info["run_id"]), RunTag("mneme.best_config_hash", str(info["config_hash"]))]
            for name, key in (("best_exec_time_ns", "time_ns"), ("best_speedup", "speedup")):
                if info[key] is not None:
                    metrics.append(Metric(name, float(info[key]), now, 0))
        if not table.empty:
            timed = table[(table["verified"] == 1) & table["time_ns"].notna()]
            if table["speedup"].notna().any():
                plots.speedup_over_trials(table, out / "speedup_over_trials.png", title)
            if not timed.empty and timed["registers"].notna().any():
                plots.pareto_time_registers(timed, out / "pareto_time_registers.png", title)
            if timed.empty and table["registers"].notna().any():
                plots.compile_metrics_over_trials(table, out / "registers_over_trials.png", title)
        if not df.empty:
            from mneme.track import htmlreport

            note = note_markdown(df, metric, title or parent.info.run_name, parent.data.tags.get("mneme.output", ""))
            tags.append(RunTag("mlflow.note.content", note))
            (out / "report.html").write_text(htmlreport.report(df, metric, title or parent.info.run_name, note))
        client.log_batch(parent_run_id, metrics=metrics, tags=tags)
        if any(out.iterdir()):
            client.log_artifacts(parent_run_id, str(out))
    return best_row
