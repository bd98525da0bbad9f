"""`mneme compare`: the runs of an experiment, read back from MLflow, side by side.

Shows the trials (not the sweep parents) with their time, speedup, resources and the replay
parameters that differ between them; `--best` keeps the best run per kernel. Filters use MLflow's
search syntax (`--filter "metrics.verified = 1"`), so what works in `mlflow ui` works here.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import pandas as pd

from mneme.errors import ConfigurationError
from mneme.track import runs
from mneme.track.store import check_store, local_path, resolve_uri
from mneme.track.tracker import DEFAULT_EXPERIMENT

FORMATS = ("table", "csv", "markdown", "json")

#: (column in runs.frame, heading) shown first when present
BASE_COLUMNS = [
    ("run_name", "run"),
    ("tags.mneme.kernel", "kernel"),
    ("tags.mneme.status", "status"),
    ("metrics.speedup", "speedup"),
    ("metrics.registers", "regs"),
    ("metrics.local_mem_bytes", "lmem"),
    ("metrics.obj_size_bytes", "size"),
    ("metrics.compile_time_s", "compile_s"),
    ("tags.mneme.config_hash", "config"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", nargs="?", default=None,
                        help=f"MLflow experiment name (default: {DEFAULT_EXPERIMENT}, or MLFLOW_EXPERIMENT_NAME)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--sweep", metavar="RUN", help="only the trials of this sweep (parent run id or run name)")
    which.add_argument("--latest", action="store_true", help="only the trials of the most recent sweep")
    parser.add_argument("--filter", action="append", default=[], metavar="EXPR",
                        help='MLflow search expression, e.g. "metrics.verified = 1" (repeatable; ANDed)')
    parser.add_argument("--kernel", help="only runs of kernels whose name contains this")
    parser.add_argument("--best", action="store_true", help="only the best run per kernel")
    parser.add_argument("--metric", choices=("median", "min", "mean"), default="median",
                        help="the execution-time statistic to rank by (default: median)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    parser.add_argument("--columns", default="", help="extra columns, comma separated (e.g. metrics.occupancy)")
    parser.add_argument("--all-params", action="store_true", help="show every replay parameter, not only those that differ")
    parser.add_argument("--limit", type=int, default=0, help="show at most this many rows")
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")


def search_filter(args: argparse.Namespace, sweep_run_id: Optional[str]) -> str:
    """The MLflow filter string for the chosen runs (never the sweep parents themselves)."""
    parts = ["tags.`mneme.role` != 'sweep'"]
    if sweep_run_id:
        parts.append(f"tags.mlflow.parentRunId = {runs.quote(sweep_run_id)}")
    if args.kernel:
        parts.append(f"tags.`mneme.kernel` LIKE {runs.quote('%' + args.kernel + '%')}")
    parts += [f"({f})" if " or " in f.lower() else f for f in args.filter]
    return " and ".join(parts)


def find_sweep(client, experiment_id: str, which: Optional[str], latest: bool) -> Optional[str]:
    if not which and not latest:
        return None
    flt = "tags.`mneme.role` = 'sweep'"
    sweeps = client.search_runs([experiment_id], filter_string=flt, order_by=["attributes.start_time DESC"], max_results=1000)
    if latest:
        if not sweeps:
            raise ConfigurationError(f"experiment {experiment_id} has no sweep runs; drop --latest")
        return sweeps[0].info.run_id
    for r in sweeps:
        if which in (r.info.run_id, r.info.run_name):
            return r.info.run_id
    names = ", ".join(f"{r.info.run_name} ({r.info.run_id})" for r in sweeps[:10]) or "none"
    raise ConfigurationError(f"no sweep {which!r} in this experiment; sweeps: {names}")


def table(df: pd.DataFrame, metric: str, extra: List[str], all_params: bool) -> pd.DataFrame:
    """The comparison table: base columns, the time, then replay parameters (those that vary)."""
    if df.empty:
        return pd.DataFrame(columns=[h for _, h in BASE_COLUMNS])
    time_col = runs.time_column(metric)
    cols = [(c, h) for c, h in BASE_COLUMNS if c in df]
    cols.insert(min(3, len(cols)), (time_col, f"{metric}_us"))
    params = [c for c in df.columns if c.startswith("params.replay.")]
    if not all_params:
        params = [c for c in params if df[c].nunique(dropna=False) > 1]
    cols += [(c, c[len("params.replay."):]) for c in params]
    cols += [(c, c) for c in extra if c in df]
    out = pd.DataFrame({h: df[c] if c in df else pd.NA for c, h in cols})
    if f"{metric}_us" in out:
        out[f"{metric}_us"] = pd.to_numeric(out[f"{metric}_us"], errors="coerce") / 1000.0  # runs log ns
    out = out.apply(_natural)
    out = out[[c for c in out.columns if c == "run" or out[c].notna().any()]]  # e.g. no times without a GPU
    if "config" in out:
        out["config"] = out["config"].astype(str).str[:12]
    return out.reset_index(drop=True)


TEXT_COLUMNS = {"run", "kernel", "status", "config"}


def _natural(col: pd.Series) -> pd.Series:
    """Numbers as numbers (MLflow params are strings, metrics floats) and integers as integers."""
    if col.name in TEXT_COLUMNS:
        return col
    try:
        num = pd.to_numeric(col)
    except (ValueError, TypeError):
        return col
    vals = num.dropna()
    if len(vals) and pd.api.types.is_float_dtype(num) and (vals == vals.round()).all() and vals.abs().max() < 2**53:
        return num.astype("Int64")
    return num


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table (pandas' own needs the optional `tabulate`)."""
    def cell(v) -> str:
        if v is None or (isinstance(v, float) and pd.isna(v)) or v is pd.NA:
            return ""
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v).replace("|", "\\|")

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body]) + "\n"


def render(df: pd.DataFrame, fmt: str) -> str:
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "markdown":
        return to_markdown(df)
    if fmt == "json":
        return df.to_json(orient="records", indent=2) + "\n"
    with pd.option_context("display.max_columns", None, "display.width", 200, "display.max_colwidth", 40):
        return (df.to_string(index=False) if not df.empty else "(no runs)") + "\n"


def compare(args: argparse.Namespace) -> pd.DataFrame:
    """The table `mneme compare` prints, for use from Python."""
    import os

    from mlflow import MlflowClient

    uri = resolve_uri(args.tracking_uri)
    path = local_path(uri)
    if path is not None and not path.exists():  # MlflowClient would create an empty store here
        raise ConfigurationError(f"no MLflow store at {path}: track runs first (python -m mneme +experiment=..., "
                                 "mneme tune) or point --tracking-uri / MLFLOW_TRACKING_URI at a store")
    check_store(uri, write=False)  # an unreachable server: one line, not minutes of retries
    name = args.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        known = ", ".join(e.name for e in client.search_experiments()) or "none"
        raise ConfigurationError(f"MLflow store {uri} has no experiment {name!r}; experiments: {known}")
    sweep = find_sweep(client, exp.experiment_id, args.sweep, args.latest)
    try:
        found = runs.search(client, [exp.experiment_id], search_filter(args, sweep))
    except Exception as e:  # MLflow's parser error names the bad token
        raise ConfigurationError(f"--filter: {e}") from None
    df = runs.frame(found)
    if args.best:
        df = runs.best_per_kernel(df, args.metric)
    elif not df.empty:
        ranked = runs.ranked(df, args.metric)
        df = pd.concat([ranked, df.drop(ranked.index)])
    extra = [c.strip() for c in args.columns.split(",") if c.strip()]
    out = table(df, args.metric, extra, args.all_params)
    return out.head(args.limit) if args.limit else out


def run(args: argparse.Namespace) -> int:
    text = render(compare(args), args.format)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
