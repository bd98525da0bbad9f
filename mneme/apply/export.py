"""`mneme export`: a wisdom file from the best MLflow run of a tracked sweep (MLflow's public client API).

    mneme export [--sweep RUN_ID | --study NAME] [--tracking-uri URI] [--experiment NAME] [--rule exact|scaled] -o W

The sweep is the parent run `mneme tune` (or a Hydra sweep) made (tag mneme.role = sweep). Its best child is,
for a timed sweep, the verified trial with the lowest time by the sweep's metric (metrics.exec_time_median_ns), for a
compile-only sweep the compiled trial with the lowest value of the objective (registers or size). The
configuration is read back from the run's replay.* parameters; its kernel.cubin artifact, when the run
has one, is stored next to the wisdom file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from mneme.apply.wisdom import WISDOM_VERSION, KernelWisdom, Provenance, RecordRef, Source, Wisdom, write_wisdom
from mneme.errors import ConfigurationError

#: compile-only objective -> the metric it minimizes (mneme/track/records.py: RESOURCE_METRICS)
COMPILE_ORDER = {"registers": "metrics.registers", "size": "metrics.obj_size_bytes"}


def _client(uri: Optional[str]):
    from mlflow import MlflowClient

    from mneme.track.store import resolve_uri

    u = resolve_uri(uri)
    return MlflowClient(u), u


def find_sweep(client, experiment: Optional[str], sweep: Optional[str], study: Optional[str]):
    if sweep:
        return client.get_run(sweep)
    exps = ([client.get_experiment_by_name(experiment)] if experiment else client.search_experiments())
    ids = [e.experiment_id for e in exps if e is not None]
    if not ids:
        raise ConfigurationError(f"no MLflow experiment {experiment!r} in the store")
    flt = "tags.`mneme.role` = 'sweep'"
    if study:
        flt += f" and tags.`mneme.study` = '{study}'"
    runs = client.search_runs(ids, filter_string=flt, order_by=["attributes.start_time DESC"], max_results=2)
    if not runs:
        raise ConfigurationError("no sweep run found" + (f" for study {study!r}" if study else "") +
                                 "; name one with --sweep RUN_ID (tag mneme.role = sweep)")
    if len(runs) > 1 and not study:
        print(f"mneme export: several sweeps; taking the latest ({runs[0].info.run_name}); choose with --study/--sweep",
              file=sys.stderr)
    return runs[0]


def best_child(client, sweep):
    objective = sweep.data.params.get("objective", "time")
    base = f"tags.`mlflow.parentRunId` = '{sweep.info.run_id}' and tags.`mneme.role` = 'trial'"
    if objective in COMPILE_ORDER:
        flt, order = base + " and tags.`mneme.status` = 'compiled'", [f"{COMPILE_ORDER[objective]} ASC"]
    else:
        metric = sweep.data.params.get("metric") or "median"  # the sweep's own statistic (median, mean, min)
        flt, order = base + " and tags.`mneme.status` = 'verified'", [f"metrics.exec_time_{metric}_ns ASC"]
    runs = client.search_runs([sweep.info.experiment_id], filter_string=flt, order_by=order + ["attributes.start_time ASC"],
                              max_results=1)
    if not runs:
        raise ConfigurationError(f"sweep {sweep.info.run_id} has no successful trial ({flt})")
    base_runs = client.search_runs([sweep.info.experiment_id],
                                   filter_string=f"tags.`mlflow.parentRunId` = '{sweep.info.run_id}' and tags.`mneme.role` = 'baseline'",
                                   max_results=1)
    return runs[0], (base_runs[0] if base_runs else None)


def export_wisdom(out: str, uri: Optional[str] = None, experiment: Optional[str] = None, sweep: Optional[str] = None,
                  study: Optional[str] = None, rule: str = "exact") -> Wisdom:
    from mneme.track.summary import canonical, unflatten

    client, u = _client(uri)
    sw = find_sweep(client, experiment, sweep, study)
    best, baseline = best_child(client, sw)
    tags, params, metrics = best.data.tags, best.data.params, best.data.metrics
    config = canonical(unflatten(params, "replay"))
    db = sw.data.params.get("record_db") or ""
    if not db:
        raise ConfigurationError(f"sweep {sw.info.run_id} does not name its record DB (param record_db)")
    out_p = Path(out)
    cubin: Optional[str] = None
    try:
        import tempfile

        names = {a.path for a in client.list_artifacts(best.info.run_id)}
        with tempfile.TemporaryDirectory() as d:
            got = Path(d) / "none"
            if "kernel.cubin" in names:
                got = Path(client.download_artifacts(best.info.run_id, "kernel.cubin", d))
            if got.is_file():
                cubin_p = out_p.resolve().parent / f"{tags.get('mneme.code_hash', best.info.run_id)[:32]}.cubin"
                cubin_p.parent.mkdir(parents=True, exist_ok=True)
                cubin_p.write_bytes(got.read_bytes())
                cubin = str(cubin_p)
    except Exception:  # noqa: BLE001 - no cubin artifact: apply rebuilds it from the record
        cubin = None
    from mneme.record.db import RecordedExecution

    rec = RecordedExecution.from_json(str(Path(db).resolve()), check_files=False)  # the mangled name is the DB's
    tune_out = sw.data.tags.get("mneme.output")
    dyn = tags.get("mneme.dynamic_hash", "")
    k = KernelWisdom(
        kernel=rec.kernel_name, demangled=rec.demangled_name, static_hash=tags.get("mneme.static_hash") or rec.static_hash,
        dynamic_hash=dyn, rule=rule,
        config=config, config_hash=tags.get("mneme.config_hash", ""), code_hash=tags.get("mneme.code_hash", ""),
        expected_speedup=metrics.get("speedup"), tuned_ns=metrics.get("exec_time_median_ns"),
        baseline_ns=(baseline.data.metrics.get("exec_time_median_ns") if baseline else None),
        record=RecordRef(db=str(Path(db).resolve()), dynamic_hash=dyn), cubin=cubin,
        provenance=Provenance(study=sw.data.tags.get("mneme.study"), trial=_int(tags.get("mneme.trial")),
                              mlflow_run_id=best.info.run_id, sweep_run_id=sw.info.run_id, tracking_uri=u,
                              launch_safety=sw.data.params.get("launch_safety"), tune_dir=tune_out,
                              compile_cache=str(Path(tune_out) / "cache") if tune_out else None),
    )
    if k.static_hash != rec.static_hash:
        raise ConfigurationError(f"run {best.info.run_id} tuned static hash {k.static_hash[:16]}, {db} now records "
                                 f"{rec.static_hash[:16]}: the kernel changed since; tune it again")
    w = Wisdom(mneme_wisdom=WISDOM_VERSION, source=Source(kind="mlflow", run_id=sw.info.run_id, path=u), kernels=[k])
    write_wisdom(w, out_p)
    return w


def _int(v: Any) -> Optional[int]:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--sweep", default=None, help="the sweep's parent run id (default: the latest sweep, or --study's)")
    a("--study", default=None, help="the study name (tag mneme.study)")
    a("--tracking-uri", default=None, help="MLflow store (default MLFLOW_TRACKING_URI, else ./mlflow.db)")
    a("--experiment", default=None, help="MLflow experiment to search (default: all)")
    a("--rule", default="exact", choices=["exact", "scaled"], help="which launches it applies to (default exact)")
    a("-o", "--output", default="wisdom.yaml", help="the wisdom file to write (.yaml or .json; default wisdom.yaml)")


def run(args: argparse.Namespace) -> int:
    w = export_wisdom(args.output, args.tracking_uri, args.experiment, args.sweep, args.study, args.rule)
    k = w.kernels[0]
    sp = f", expected {k.expected_speedup:.3f}x" if k.expected_speedup else ""
    print(f"{args.output}: {k.demangled or k.kernel} instance {k.dynamic_hash} from run {k.provenance.mlflow_run_id}{sp}")
    return 0
