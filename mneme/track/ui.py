"""`mneme ui`: MLflow's UI on the tracking store, opened at the runs page of the experiment.

MLflow 3 opens an experiment on its GenAI "Traces" page, where mneme has nothing; the runs (sweeps as
parent rows, trials nested) are at `#/experiments/<id>/runs?workflowType=machine_learning`. This prints that
URL, then runs `mlflow ui` until Ctrl-C. The Optuna study behind a sweep has its own dashboard:
`optuna-dashboard <output>/study.journal` (a journal file by path; docs/EXPERIMENTS.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import List

from mneme.errors import ConfigurationError
from mneme.track.store import local_path, resolve_uri
from mneme.track.tracker import DEFAULT_EXPERIMENT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", nargs="?", default=None,
                        help=f"MLflow experiment to open (default: {DEFAULT_EXPERIMENT}, or MLFLOW_EXPERIMENT_NAME)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", "-p", type=int, default=5000, help="port (default 5000)")
    parser.add_argument("--print-url", action="store_true", help="print the runs page's URL and exit")


def runs_url(host: str, port: int, experiment_id: str) -> str:
    """The runs page of an experiment (MLflow 3's classic runs table, not the GenAI traces page)."""
    return f"http://{host}:{port}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def experiment_id(uri: str, name: str) -> str:
    path = local_path(uri)
    if path is not None and not path.exists():
        raise ConfigurationError(f"no MLflow store at {path}: track runs first (python -m mneme +experiment=..., "
                                 "mneme tune) or point --tracking-uri / MLFLOW_TRACKING_URI at a store")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        known = ", ".join(e.name for e in client.search_experiments()) or "none"
        raise ConfigurationError(f"MLflow store {uri} has no experiment {name!r}; experiments: {known}")
    return exp.experiment_id


def command(uri: str, host: str, port: int) -> List[str]:
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]


def run(args: argparse.Namespace) -> int:
    uri = resolve_uri(args.tracking_uri)
    name = args.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    url = runs_url(args.host, args.port, experiment_id(uri, name))
    if args.print_url:
        print(url)
        return 0
    print(f"mneme ui: experiment {name!r} of {uri}\nmneme ui: open {url}\nmneme ui: Ctrl-C stops the server", flush=True)
    try:
        return subprocess.run(command(uri, args.host, args.port)).returncode
    except KeyboardInterrupt:
        return 0
