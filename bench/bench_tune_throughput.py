"""Tuning throughput: replay configurations evaluated per second on one GPU.

For the `launch` and the `compiler` presets, with 1, 4 and 16 compile processes, the AsyncReplayExecutor is fed
N configurations drawn from the preset (seeded), each one compiled (or found in the cache), verified and timed
on the GPU. Every row starts from an empty cubin cache, after the workers are up (the baseline is evaluated
first and not counted). The last rows run the whole `mneme tune` loop (Optuna, random sampler) on the launch and
the compiler presets (--tune-presets), with MLflow tracking off and on (a fresh SQLite store, one run per trial),
--tune-repeats times each in ABBA order (off-on, on-off, ...: on the H200 the compiler rows once slowed from pair
to pair in both modes, which strict alternation would charge to tracking), on a journal study storage
(`--storage journal:PATH`; --tune-storage default: what `mneme tune` uses without --storage, since 2026-12 a journal
file in the output directory as well, SQLite before, whose Optuna RDB layer reads the trials back on every ask).
Their configurations per second are the trials over the search plus its finish (from the last trial until the
command has written everything: workers stopped, results directory, tracking closed), so the tracked rows show
what tracking costs a search. The tracking ratio compares the median rows of each mode, per preset. On vecAdd
the launch preset has 7 points, so nearly every trial is a repeat answered from the study (~500 trials/s: the
writers' worst case); the compiler preset's trials are mostly new configurations, compiled and replayed.

    python bench/bench_tune_throughput.py                       # records examples/bin/vecadd itself
    python bench/bench_tune_throughput.py --record-db DB.json --configs 400 --jobs 1,4,16

Prints a table, then one ratio line against the published Mneme figure (80 configurations in 7.09 s).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MNEME_PUBLISHED = 80 / 7.09  # configurations per second (HIP vecAdd, published with Mneme)
GOAL = 100.0


def record_vecadd(root: Path, n: int) -> Path:
    """Record examples/bin/vecadd (n elements) and return its record DB."""
    app = ROOT / "examples" / "bin" / "vecadd"
    if not app.exists():
        sys.exit(f"{app} is missing: build the examples (make examples / make gpu-bundle) or pass --record-db")
    out = root / "vecadd-rec"
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "record", "-rdb", str(out), "--quiet", "--", str(app), str(n)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"mneme record failed:\n{p.stdout}\n{p.stderr}")
    from mneme.record.db import find_dbs

    dbs = find_dbs(str(out))
    if not dbs:
        sys.exit(f"no record DB in {out}:\n{p.stdout}")
    return Path(dbs[0])


def draw_configs(record_db: Path, preset: str, n: int, seed: int):
    from mneme.record.db import RecordedExecution
    from mneme.tune.presets import preset_space
    from mneme.tune.space import SpaceContext
    from mneme.tune.tuner import recorded_baseline

    rec = RecordedExecution.from_json(str(record_db))
    inst = rec.instance(None)
    base = recorded_baseline(str(record_db), inst.dynamic_hash)
    space = preset_space(preset, SpaceContext(base, rec, inst))
    rng = random.Random(seed)
    return base, [space.derived(space.sample_random(rng)) for _ in range(n)]


def executor_row(record_db: Path, preset: str, jobs: int, n: int, device, seed: int, iterations: int) -> dict:
    """`device`: one GPU ordinal, or a list of them (one worker each)."""
    from mneme.config import MeasurementSettings
    from mneme.tune.executor import AsyncReplayExecutor

    devices = list(device) if isinstance(device, (list, tuple)) else [device]
    base, configs = draw_configs(record_db, preset, n, seed)
    with tempfile.TemporaryDirectory(prefix="mneme-bench-") as tmp:
        ex = AsyncReplayExecutor(str(record_db), None, devices=devices, compile_jobs=jobs,
                                 settings=MeasurementSettings(iterations=iterations, warmup=1),
                                 cache_dir=str(Path(tmp) / "cache"), log_dir=str(Path(tmp) / "logs"))
        try:
            warm = ex.evaluate(base)  # workers up, device open, baseline compiled: not counted
            if warm.status != "verified":
                sys.exit(f"the baseline did not verify ({warm.status}): {warm.error}")
            before = ex.stats()
            t0 = time.perf_counter()
            results = [f.result() for f in [ex.submit(c) for c in configs]]
            wall = time.perf_counter() - t0
            after = ex.stats()
        finally:
            ex.shutdown()
    compiles = after.get("compiles", 0) - before.get("compiles", 0)
    hits = (after.get("memo_hits", 0) - before.get("memo_hits", 0)) + (after.get("disk_hits", 0) - before.get("disk_hits", 0))
    statuses = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    best = min((sorted(r.exec_time)[len(r.exec_time) // 2] for r in results if r.status == "verified"), default=None)
    base_med = sorted(warm.exec_time)[len(warm.exec_time) // 2]
    per_gpu: dict = {}
    for r in results:
        if r.executed:
            per_gpu[r.gpu_id] = per_gpu.get(r.gpu_id, 0) + 1
    return {
        "mode": "executor", "preset": preset, "jobs": jobs, "configs": n, "wall_s": wall, "per_s": n / wall,
        "devices": devices, "per_gpu": per_gpu,
        "compiles": compiles, "cache_hit_rate": hits / max(1, hits + compiles), "statuses": statuses,
        "best_speedup": (base_med / best) if best else None, "distinct": len({c.hash() for c in configs}),
    }


def tune_row(record_db: Path, preset: str, jobs: int, n: int, device: int, seed: int, iterations: int,
             track: bool = False, sampler: str = "random", storage: str = "journal") -> dict:
    import os

    mode = "tune+mlflow" if track else "mneme tune"
    with tempfile.TemporaryDirectory(prefix="mneme-bench-tune-") as tmp:
        out = Path(tmp) / "out"
        argv = [sys.executable, "-m", "mneme.cli", "tune", "-rdb", str(record_db), "--space", preset, "--sampler", sampler,
                "--trials", str(n), "--devices", str(device), "--compile-jobs", str(jobs),
                "--seed", str(seed), "-it", str(iterations), "--warmup", "1",
                "--quiet", "--json", "-o", str(out)] + ([] if track else ["--no-track"])
        if storage == "journal":
            argv += ["--storage", f"journal:{Path(tmp) / 'study.journal'}"]
        env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{Path(tmp) / 'mlflow.db'}")
        p = subprocess.run(argv, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            return {"mode": mode, "preset": preset, "jobs": jobs, "configs": n, "error": p.stderr[-500:]}
        s = json.loads(p.stdout)
        ex = s.get("executor", {})
        timing = s.get("timing") or {}
        wall = timing.get("search_s", 0.0) + timing.get("finish_s", 0.0)
        return {
            "mode": mode, "preset": preset, "jobs": jobs, "configs": n, "wall_s": wall, "storage": storage,
            "per_s": timing.get("trials_per_s", 0.0), "search_s": timing.get("search_s", 0.0),
            "finish_s": timing.get("finish_s", 0.0), "tracking_close_s": timing.get("tracking_close_s", 0.0),
            "tracking": s.get("tracking") or {},
            "compiles": ex.get("compiles", 0), "cache_hit_rate": ex.get("cache_hit_rate", 0.0),
            "statuses": s["trials"]["by_status"], "best_speedup": (s.get("best") or {}).get("speedup"),
            "distinct": s["trials"]["counted"] - s["trials"]["duplicates"],
        }


def abba(pairs: int) -> list:
    """Tracking off/on per run, `pairs` pairs in ABBA order (off-on, on-off, ...): a drift favours neither mode."""
    return [track for i in range(max(1, pairs)) for track in ((False, True) if i % 2 == 0 else (True, False))]


def wait_for_writers(limit_s: float = 60.0) -> None:
    """Until no MLflow writer process of an earlier row is left: a writer folds its store's log back into the
    database after `mneme tune` has returned, and that disk work must not land on the next row."""
    deadline = time.monotonic() + limit_s
    while _writer_alive() and time.monotonic() < deadline:
        time.sleep(0.05)


def _writer_alive() -> bool:
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"mneme.track.writer" in (proc / "cmdline").read_bytes():
                return True
        except OSError:  # the process ended meanwhile
            continue
    return False


def median_row(rows: list, mode: str, preset: str = "", key: str = "preset"):
    """The row of `mode` (whose `key` is `preset`, if given) with the median configurations per second (the lower
    middle one of an even count)."""
    done = sorted((r for r in rows if r["mode"] == mode and r.get("per_s") and (not preset or r[key] == preset)),
                  key=lambda r: r["per_s"])
    return done[(len(done) - 1) // 2] if done else None


def pair_ratios(rows: list, preset: str, key: str = "preset") -> list:
    """Tracked over untracked configurations per second of each ABBA pair of `preset` (the rows whose `key` is it),
    in run order: their spread says how far the ratio of the medians can be trusted."""
    runs = [r for r in rows if r["mode"] in ("mneme tune", "tune+mlflow") and r[key] == preset]
    out = []
    for a, b in zip(runs[0::2], runs[1::2]):
        on, off = (a, b) if a["mode"] == "tune+mlflow" else (b, a)
        if on.get("per_s") and off.get("per_s"):
            out.append(on["per_s"] / off["per_s"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record-db", type=Path, default=None, help="record DB to tune (default: record examples/bin/vecadd)")
    ap.add_argument("--n", type=int, default=1 << 20, help="vecadd elements when recording it here (default 2^20)")
    ap.add_argument("--configs", type=int, default=300, help="configurations per row (default 300)")
    ap.add_argument("--jobs", default="1,4,16", help="compile processes per row (default 1,4,16)")
    ap.add_argument("--presets", default="launch,compiler")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-tune-row", action="store_true", help="skip the end-to-end `mneme tune` rows")
    ap.add_argument("--tune-presets", default="launch,compiler",
                    help="presets of the end-to-end rows (default launch,compiler: vecAdd's launch preset has 7 points, so "
                         "993 of 1000 trials are answered from the study and the rows measure the study's own speed; "
                         "in the compiler preset most trials are new configurations, compiled and replayed)")
    ap.add_argument("--tune-trials", type=int, default=1000,
                    help="trials of each end-to-end `mneme tune` row (default 1000: a study long enough that its fixed "
                         "costs, such as the sweep's summary plots, do not decide the per-second figure)")
    ap.add_argument("--tune-storage", default="journal", choices=("journal", "default"),
                    help="the study storage of the `mneme tune` rows: journal (a journal file) or default (what "
                         "`mneme tune` uses without --storage: <output>/study.journal)")
    ap.add_argument("--tune-repeats", type=int, default=6,
                    help="runs of each end-to-end row, off and on in ABBA order (default 6: on the H200 host one untracked "
                         "run of 1000 trials takes 1.2 to 2.2 s, so fewer pairs leave the ratio to chance)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="mneme-bench-rec-") as tmp:
        db = args.record_db or record_vecadd(Path(tmp), args.n)
        rows = []
        for preset in args.presets.split(","):
            for jobs in (int(j) for j in args.jobs.split(",")):
                rows.append(executor_row(db, preset, jobs, args.configs, args.device, args.seed, args.iterations))
                print(f"  {preset:<9} jobs={jobs:<3} {rows[-1]['per_s']:8.1f} configs/s", file=sys.stderr)
        tune_presets = [] if args.no_tune_row else [p for p in args.tune_presets.split(",") if p]
        jobs = max(int(j) for j in args.jobs.split(","))
        for preset in tune_presets:
            for track in abba(args.tune_repeats):
                wait_for_writers()
                rows.append(tune_row(db, preset, jobs, args.tune_trials, args.device, args.seed, args.iterations, track,
                                     storage=args.tune_storage))
                print(f"  {rows[-1]['mode']:<11} {preset:<9} {rows[-1].get('per_s', 0):8.1f} configs/s", file=sys.stderr)

    print(f"\nrecord: {db}")
    head = f"{'mode':<11} {'preset':<9} {'jobs':>4} {'configs':>7} {'distinct':>8} {'wall s':>8} {'finish s':>8} {'configs/s':>10} " \
           f"{'compiles':>8} {'cache hit':>9} {'best x':>7}  statuses"
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:<11} {r['preset']:<9} {r['jobs']:>4} {r['configs']:>7}  failed: {r['error']}")
            continue
        best = f"{r['best_speedup']:.3f}" if r.get("best_speedup") else "-"
        finish = f"{r['finish_s']:.2f}" if "finish_s" in r else "-"
        print(f"{r['mode']:<11} {r['preset']:<9} {r['jobs']:>4} {r['configs']:>7} {r['distinct']:>8} {r['wall_s']:>8.2f} {finish:>8} "
              f"{r['per_s']:>10.1f} {r['compiles']:>8} {r['cache_hit_rate']:>9.1%} {best:>7}  "
              + ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items())))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    launch = [r for r in rows if r["mode"] == "executor" and r["preset"] == "launch"]
    top = max(launch, key=lambda r: r["per_s"]) if launch else max(rows, key=lambda r: r.get("per_s", 0))
    parts, verdicts = [], []
    for preset in tune_presets:
        off, on = median_row(rows, "mneme tune", preset), median_row(rows, "tune+mlflow", preset)
        if not (on and off):
            continue
        ok = on["per_s"] >= 0.9 * off["per_s"]
        verdicts.append(ok)
        pairs = sorted(pair_ratios(rows, preset))
        spread = f"; pairs {pairs[(len(pairs) - 1) // 2]:.3f} median, {pairs[0]:.3f}-{pairs[-1]:.3f}" if pairs else ""
        parts.append(f"{preset} {on['per_s'] / off['per_s']:.3f} ({on['per_s']:.1f} vs {off['per_s']:.1f} configs/s, {off['distinct']} "
                     f"distinct of {off['configs']}; finish {on['finish_s']:.2f} vs {off['finish_s']:.2f} s{spread}; "
                     f"{'met' if ok else 'NOT met'})")
    tracking = (f"; tracking on / off, {args.tune_storage} study storage, medians of {args.tune_repeats}: " + ", ".join(parts)
                + f" (goal >= 0.90 on each: {'met' if all(verdicts) else 'NOT met'})") if parts else ""
    print(f"ratio: {top['per_s']:.1f} configs/s ({top['preset']} preset, {top['jobs']} compile jobs, one GPU) vs Mneme's "
          f"published {MNEME_PUBLISHED:.1f}/s = {top['per_s'] / MNEME_PUBLISHED:.1f}x "
          f"(goal >= {GOAL:.0f}/s: {'met' if top['per_s'] >= GOAL else 'NOT met'}){tracking}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
