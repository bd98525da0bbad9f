"""Tracking on / off on corpus kernels, at the trial rates their tuning really has.

bench_tune_throughput.py measures what MLflow tracking costs `mneme tune` on vecAdd, whose trials come at
130-500 per second; the corpus's kernels tune at about 10-17 per second (docs/corpus.json). This bench takes
corpus kernels of 20 us to 1 ms in-app time (--min-us, --max-us; one per app: the heaviest replayable
instance in that window, preferring one whose baseline replay verified in the corpus's replay stage) and runs
`mneme tune` on each exactly as the corpus's tune stage does (bench/corpus/tune.py: tune_argv; the `standard`
space and mneme's defaults for sampler, compile jobs, iterations and study storage; a fixed --seed) for
--trials trials, with MLflow tracking off (--no-track) and on (a fresh SQLite store per run, one MLflow run
per trial, counted back from the store through MlflowClient), --pairs times in ABBA order (off-on, on-off,
...). Configurations per second are tune's own figure (timing.trials_per_s: the trials over the search plus
its finish, from the last trial until workers, results directory and tracking are closed). Per kernel: the
median run of each mode, their ratio, the per-pair ratios (their spread says how far the ratio can be
trusted). Then, per kernel, mneme.track.overhead's paced synthetic search at that kernel's untracked rate:
what tracking takes from the search thread per trial, and how long the writers drain after the last trial.

Record DBs come from the corpus work folder (--work, default .corpus/work: <app>/rdb, written by
`bash scripts/corpus.sh record`); an app without them is recorded first from the pack (--pack), as the
corpus's replay and tune stages do. --record-db DB tunes the given record DBs instead (heaviest instance).
The bench stops starting kernels when --budget seconds are spent, and names the ones it left out.

Usage:
    python bench/bench_track_corpus.py --pack .corpus/pack [--apps A,B] [--trials 100] [--pairs 2]
    python bench/bench_track_corpus.py --record-db DB.json --compile-only --trials 6 --pairs 1   # no GPU
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import benchlib  # noqa: E402
from bench_tune_throughput import abba, median_row, pair_ratios, wait_for_writers  # noqa: E402

from bench.corpus import gpu, stage  # noqa: E402
from bench.corpus import tune as ctune  # noqa: E402
from bench.corpus.apps import App  # noqa: E402

OFF, ON = "mneme tune", "tune+mlflow"
GOAL = 0.90


# ---- which kernels -------------------------------------------------------------------------------------

def window_picks(kernels: List[Dict[str, Any]], replayed: Optional[List[Dict[str, Any]]], min_us: float,
                 max_us: float, top: int = 1) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """The corpus tune stage's pick_kernels over the instances of min_us..max_us in-app time only."""
    inside = [{**k, "instances": [i for i in k["instances"] if (i["in_app_ns"] or 0) <= max_us * 1000]} for k in kernels]
    return ctune.pick_kernels(inside, replayed, top, min_us * 1000)


def corpus_targets(work: Path, apps: Sequence[str], min_us: float, max_us: float,
                   record=None) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """(targets, apps without one): a target is {label, app, kernel, db, rid, in_app_us}. `record(app)` records an
    app that has no record DBs in `work` (None: such an app is reported, not recorded)."""
    targets, skipped = [], []
    for app in apps:
        rdb = work / app / "rdb"
        kernels = gpu.read_dbs(rdb)
        if not kernels and record is not None:
            try:
                record(app)
            except Exception as e:  # noqa: BLE001 - the other apps go on
                skipped.append({"app": app, "why": f"recording failed: {type(e).__name__}: {e}"})
                continue
            kernels = gpu.read_dbs(rdb)
        if not kernels:
            skipped.append({"app": app, "why": f"no record DB under {rdb}"})
            continue
        rj = work / app / "replay.json"
        replayed = json.loads(rj.read_text()) if rj.is_file() else None
        picks = window_picks(kernels, replayed, min_us, max_us)
        if not picks:
            skipped.append({"app": app, "why": f"no replayable instance of {min_us:g}-{max_us:g} us"
                                               + (" whose baseline replay verified" if replayed is not None else "")})
            continue
        k, inst = picks[0]
        targets.append(target(app, k, rdb / k["db"], inst))
    return targets, skipped


def db_targets(dbs: Sequence[Path]) -> List[Dict[str, Any]]:
    """Targets from record DB files: each DB's heaviest instance."""
    out = []
    for db in dbs:
        db = Path(db).resolve()
        k = next((r for r in gpu.read_dbs(db.parent) if r["db"] == db.name), None)
        if k is None or not k["instances"]:
            raise FileNotFoundError(f"{db}: not a record DB with instances")
        out.append(target(db.parent.name, k, db, k["instances"][0]))
    return out


def target(app: str, k: Dict[str, Any], db: Path, inst: Dict[str, Any]) -> Dict[str, Any]:
    from mneme.track.naming import short_kernel

    return {"label": f"{app}/{short_kernel(k['demangled'] or k['name'])}", "app": app, "kernel": k["name"], "db": str(db),
            "rid": inst["id"], "in_app_us": (inst["in_app_ns"] or 0) / 1000 or None}


def pack_recorder(pack: Path, work: Path, budget: stage.Budget):
    """record(app): `mneme record` of the pack's app into work/<app>/rdb, as `corpus.sh record` does."""
    from bench.corpus import build

    manifest = build.read_manifest(pack)
    ctx = gpu.Ctx(manifest, pack, work)

    def record(name: str) -> None:
        if name not in ctx.entries:
            raise FileNotFoundError(f"{name}: not in the pack {pack} (it has {', '.join(ctx.entries)})")
        print(f"  recording {name} from {pack}", file=sys.stderr)
        gpu.ensure_recorded(App.from_dict(ctx.entries[name]), budget, ctx)

    return record, [e["name"] for e in manifest["apps"]]


# ---- one `mneme tune` --------------------------------------------------------------------------------------

def tune_argv(t: Dict[str, Any], out: Path, trials: int, space: str, track: bool, seed: int,
              compile_only: bool) -> List[str]:
    """The corpus tune stage's command line, tracked or not."""
    argv = ctune.tune_argv(Path(t["db"]), t["rid"], out, trials, space, None) + ["--seed", str(seed)]
    if track:
        argv.remove("--no-track")
    if compile_only:  # no GPU: compile every configuration, registers as the objective
        argv += ["--devices", "none", "--objective", "registers"]
    return argv


def store_runs(store: Path) -> Dict[str, int]:
    """MLflow runs in a store by their mneme.role tag (trial, baseline, sweep), read through MlflowClient."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    ids = [e.experiment_id for e in client.search_experiments()]
    roles: Dict[str, int] = {}
    token = None
    while ids:
        page = client.search_runs(ids, max_results=1000, page_token=token)
        for r in page:
            role = r.data.tags.get("mneme.role", "-")
            roles[role] = roles.get(role, 0) + 1
        token = page.token
        if not token:
            break
    return roles


def parse_row(doc: Optional[Dict[str, Any]], output: str, returncode: Optional[int]) -> Dict[str, Any]:
    """`mneme tune --json`'s summary -> the row's numbers (an error when there is none)."""
    if not doc or not (doc.get("timing") or {}).get("trials_per_s"):
        why = "timed out" if returncode is None else f"exit {returncode}"
        raise RuntimeError(f"mneme tune gave no timing ({why}): {gpu.last_line(output)}")
    timing, tracking = doc["timing"], doc.get("tracking") or {}
    res = ctune.parse_tune(doc)
    return {"per_s": timing["trials_per_s"], "search_s": timing.get("search_s"), "finish_s": timing.get("finish_s"),
            "trials": res["trials"], "statuses": ", ".join(f"{k} {v}" for k, v in sorted(res["by_status"].items())),
            "best_speedup": res["best_speedup"], "exit_code": doc.get("exit_code"),
            "runs_written": tracking.get("runs_written")}


def tune_row(t: Dict[str, Any], track: bool, trials: int, space: str, seed: int, compile_only: bool, timeout: float,
             scratch: Path) -> Dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="row-", dir=scratch))
    try:
        store = out / "mlflow.db"
        env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{store}")
        p = stage.run(tune_argv(t, out / "tune", trials, space, track, seed, compile_only), timeout, cwd=out, env=env)
        row = {**parse_row(ctune.json_object(p.output), p.output, p.returncode), "wall_s": round(p.seconds, 2)}
        if track:
            roles = store_runs(store)
            row.update(store_trial_runs=roles.get("trial", 0), store_runs=sum(roles.values()))
        return row
    finally:
        shutil.rmtree(out, ignore_errors=True)


# ---- the summary ---------------------------------------------------------------------------------------

def kernel_summary(rows: List[Dict[str, Any]], t: Dict[str, Any]) -> Dict[str, Any]:
    """One kernel's line: medians of each mode, their ratio, the pair ratios, the runs tracking logged."""
    label = t["label"]
    off, on = median_row(rows, OFF, label, key="kernel"), median_row(rows, ON, label, key="kernel")
    pairs = sorted(pair_ratios(rows, label, key="kernel"))
    mine = [r for r in rows if r["kernel"] == label]
    out = {"kernel": label, "in_app_us": t.get("in_app_us"), "pairs_run": len(pairs),
           "failed_runs": sum(1 for r in mine if "error" in r)}
    if off and on:
        out.update(off_per_s=off["per_s"], on_per_s=on["per_s"], ratio=on["per_s"] / off["per_s"],
                   pair_min=pairs[0] if pairs else None, pair_max=pairs[-1] if pairs else None,
                   trials=off["trials"], statuses=off["statuses"],
                   runs_logged=min((r.get("store_trial_runs", 0) for r in mine if r["mode"] == ON and "error" not in r),
                                   default=None))
    return out


def ratio_line(kernels: List[Dict[str, Any]], trials: int, pairs: int, space: str) -> str:
    done = [k for k in kernels if k.get("ratio")]
    if not done:
        return "tracking on / off on corpus kernels: no kernel measured in both modes"
    geo = math.exp(sum(math.log(k["ratio"]) for k in done) / len(done))
    ok = all(k["ratio"] >= GOAL for k in done)
    parts = ", ".join(f"{k['kernel']} {k['ratio']:.3f} ({k['on_per_s']:.1f} vs {k['off_per_s']:.1f}/s)" for k in done)
    return (f"tracking on / off, {len(done)} corpus kernel(s), `{space}` space, {trials} trials, medians of {pairs} "
            f"ABBA pair(s): geomean {geo:.3f}; {parts} (goal >= {GOAL:.2f} on each: {'met' if ok else 'NOT met'})")


def synthetic_row(t: Dict[str, Any], rate: float, trials: int) -> Dict[str, Any]:
    """mneme.track.overhead's paced search at the kernel's untracked rate (real MLflow writers, fresh SQLite store)."""
    from mneme.track.overhead import measure

    r = measure(trials=trials, rate=rate)
    return {"rate": rate, "synthetic_trials": trials, "tracking_us_per_trial": r["tracking_us_per_trial"],
            "drain_s": r["drain_s"], "synthetic_on_per_s": r["configs_per_s_on_with_drain"],
            "synthetic_off_per_s": r["configs_per_s_off"]}


SUMMARY_COLUMNS = [["kernel", "kernel"], ["in_app_us", "in-app us", ".1f"], ["trials", "trials", "d"],
                   ["off_per_s", "off configs/s", ".2f"], ["on_per_s", "on configs/s", ".2f"], ["ratio", "on / off", ".3f"],
                   ["pair_min", "pairs min", ".3f"], ["pair_max", "pairs max", ".3f"], ["runs_logged", "MLflow runs", "d"],
                   ["tracking_us_per_trial", "search thread us/trial", ".0f"], ["drain_s", "drain s", ".2f"],
                   ["statuses", "statuses (off)"]]
RUN_COLUMNS = [["kernel", "kernel"], ["mode", "mode"], ["pair", "pair", "d"], ["per_s", "configs/s", ".2f"],
               ["search_s", "search s", ".2f"], ["finish_s", "finish s", ".2f"], ["wall_s", "wall s", ".1f"],
               ["trials", "trials", "d"], ["store_trial_runs", "trial runs in store", "d"], ["statuses", "statuses"]]


def summarize(run: benchlib.Run, targets: List[Dict[str, Any]], rows: List[Dict[str, Any]],
              synthetic: Dict[str, Dict[str, Any]], skipped: List[Dict[str, Any]], args) -> List[Dict[str, Any]]:
    kernels = [{**kernel_summary(rows, t), **synthetic.get(t["label"], {})} for t in targets]
    run.add(benchlib.table("Tracking on / off per corpus kernel (medians of the ABBA pairs)", SUMMARY_COLUMNS, kernels))
    run.add(benchlib.table("Every `mneme tune` run, in run order", RUN_COLUMNS, rows, ident=3))
    if skipped:
        run.add(benchlib.table("Left out", [["app", "app"], ["why", "why"]], skipped))
    run.summary = {"kernels": kernels, "skipped": skipped, "trials": args.trials, "pairs": args.pairs, "space": args.space}
    run.ratio = ratio_line(kernels, args.trials, args.pairs, args.space)
    return kernels


# ---- the run -------------------------------------------------------------------------------------------

def save_partial(out: Path, rows, synthetic, skipped) -> None:
    """The rows so far beside the results file (OUT.partial.json), in case the call is cut before the end."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".partial.json").write_text(json.dumps(
            {"rows": rows, "synthetic": synthetic, "skipped": skipped}, indent=1, default=str) + "\n")
    except OSError as e:
        print(f"bench track_corpus: could not save the rows so far: {e}", file=sys.stderr)

def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = benchlib.arguments("track_corpus", __doc__)
    ap.add_argument("--work", type=Path, default=gpu.WORK, help="corpus work folder with <app>/rdb (default .corpus/work)")
    ap.add_argument("--pack", type=Path, default=None, help="corpus pack to record apps from that have no record DBs")
    ap.add_argument("--apps", default=None, help="comma-separated apps (default: the pack's, else the work folder's)")
    ap.add_argument("--record-db", type=Path, action="append", default=[], help="tune these record DBs instead")
    ap.add_argument("--kernels", type=int, default=4, help="kernels at most (default 4)")
    ap.add_argument("--min-us", type=float, default=20.0, help="shortest in-app instance time (default 20 us)")
    ap.add_argument("--max-us", type=float, default=1000.0, help="longest in-app instance time (default 1000 us)")
    ap.add_argument("--trials", type=int, default=100, help="trials per `mneme tune` run (default 100)")
    ap.add_argument("--pairs", type=int, default=2, help="off/on pairs per kernel, ABBA order (default 2)")
    ap.add_argument("--space", default="standard", help="search space (default standard, the corpus tune stage's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--synthetic-trials", type=int, default=40,
                    help="trials of mneme.track.overhead's paced loop per kernel (0: none; default 40)")
    ap.add_argument("--compile-only", action="store_true", help="no GPU: --devices none --objective registers")
    ap.add_argument("--budget", type=float, default=420.0,
                    help="seconds; a kernel starts only if 1.25x the longest kernel so far still fits (default 420)")
    ap.add_argument("--run-timeout", type=float, default=180.0, help="seconds one `mneme tune` may take (default 180)")
    args = ap.parse_args(argv)
    args.work = args.work.resolve()  # each `mneme tune` runs in a scratch folder of its own
    if args.quick:
        args.trials, args.pairs, args.kernels, args.synthetic_trials = min(args.trials, 40), 1, min(args.kernels, 2), 0
    budget = stage.Budget(args.budget)
    run = benchlib.Run("track_corpus", __doc__, args.quick)
    skipped: List[Dict[str, Any]] = []
    if args.record_db:
        targets = db_targets(args.record_db)
    else:
        record, names = (None, [])
        if args.pack is not None:
            record, names = pack_recorder(args.pack, args.work, budget)
        if args.apps:
            names = [a.strip() for a in args.apps.split(",") if a.strip()]
        elif not names:
            names = sorted(d.name for d in args.work.glob("*") if (d / "rdb").is_dir())
        targets, skipped = corpus_targets(args.work, names, args.min_us, args.max_us, record)
    skipped += [{"app": t["app"], "why": f"over --kernels {args.kernels}"} for t in targets[args.kernels:]]
    targets = targets[:args.kernels]
    rows: List[Dict[str, Any]] = []
    synthetic: Dict[str, Dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mneme-bench-track-") as tmp:
        measured: List[Dict[str, Any]] = []
        longest = 0.0  # the longest kernel so far (its runs, the paced loop and the writers' waits), seconds
        for t in targets:
            need = 1.25 * longest
            if measured and not budget.can_start(need):
                skipped.append({"app": t["app"], "why": f"budget: {budget.left():.0f} s left of {args.budget:.0f}, "
                                                        f"~{need:.0f} s needed"})
                continue
            started = time.perf_counter()
            measured.append(t)
            for i, track in enumerate(abba(args.pairs)):
                wait_for_writers()
                ident = {"kernel": t["label"], "mode": ON if track else OFF, "pair": i // 2 + 1}
                rows.append(benchlib.guarded(ident, lambda: tune_row(t, track, args.trials, args.space, args.seed,
                                                                     args.compile_only, args.run_timeout,
                                                                     Path(tmp)), args.verbose))
                print(f"  {t['label']:<40} {rows[-1]['mode']:<11} {rows[-1].get('per_s', 0):7.2f} configs/s"
                      + (f"  ERROR {rows[-1]['error'][:200]}" if "error" in rows[-1] else ""), file=sys.stderr)
            off = median_row(rows, OFF, t["label"], key="kernel")
            if args.synthetic_trials and off:
                wait_for_writers()
                syn = benchlib.guarded({}, lambda: synthetic_row(t, off["per_s"], args.synthetic_trials), args.verbose)
                syn["synthetic_error"] = syn.pop("error", None)  # the tune rows stand without it
                synthetic[t["label"]] = syn
            longest = max(longest, time.perf_counter() - started)
            save_partial(args.out, rows, synthetic, skipped)
    summarize(run, measured, rows, synthetic, skipped, args)
    for tab in run.tables[:1]:
        print("\n" + benchlib.render_markdown(tab) + "\n")  # for docs/BENCHMARKS.md as it is
    return run.finish(args.out)


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"bench track_corpus: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    sys.exit(code)
