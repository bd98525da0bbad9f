"""Study storage: what each Optuna storage costs the `mneme tune` search loop, with nothing else to pay for.

The whole tuner runs in this process (TPE on the `standard` space, fixed seed) with the tune tests'
SyntheticBackend as its one GPU worker: compiles and runs cost nothing, so the search's pace is the storage's
and the sampler's. For each storage and trial count it prints the trials per second of the search (Tuner.run
wall time, baseline and results directory included) and the milliseconds per trial spent in
TrialSession.ask (Optuna's ask, the claim write and the ledger read-backs).

    python bench/bench_study_storage.py                    # 100 and 300 trials, every storage
    python bench/bench_study_storage.py --trials 100 --storages default,sqlite

Storages: `default` (what `mneme tune` uses without --storage), `sqlite` (sqlite:///<output>/study.db, the
default before the journal), `journal` (journal:<output>/study.journal), `memory` (Optuna's InMemoryStorage in the
tuner process: no storage cost at all, the floor for the others; not a choice for users, as nothing outlives the
process and no other process can join).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

MEMORY = "sqlite:///:memory:"  # stands for Optuna's InMemoryStorage here (open_storage is patched for it)
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def one(storage: str, trials: int, root: Path, sampler: str = "tpe") -> dict:
    import optuna

    from mneme.tune import session as session_mod
    from mneme.tune import study as st
    from mneme.tune.options import TuneOptions
    from mneme.tune.tuner import Tuner
    from test_tune_support import backend, write_record

    out = root / f"{storage}-{trials}-{sampler}"
    spec = {"default": None, "sqlite": f"sqlite:///{out / 'study.db'}",
            "journal": f"journal:{out / 'study.journal'}", "memory": MEMORY}[storage]
    record = write_record(root / "rec")
    spent = [0.0, 0]
    ask = session_mod.TrialSession.ask

    def timed_ask(self, need):
        t0 = time.perf_counter()
        try:
            return ask(self, need)
        finally:
            spent[0] += time.perf_counter() - t0

    o = TuneOptions(record_db=str(record), space="standard", sampler=sampler, seed=1, trials=trials, devices=[0],
                    compile_jobs=1, backend=backend("SyntheticBackend"), output=str(out), storage=spec,
                    track=False, progress=False, iterations=1, warmup=0, timeout=30.0)
    session_mod.TrialSession.ask = timed_ask
    open_storage = st.open_storage
    st.open_storage = lambda url: optuna.storages.InMemoryStorage() if url == MEMORY else open_storage(url)
    try:
        t0 = time.perf_counter()
        outcome = Tuner(o).run()
        wall = time.perf_counter() - t0
    finally:
        session_mod.TrialSession.ask = ask
        st.open_storage = open_storage
    if outcome.exit_code != 0:
        raise SystemExit(f"{storage} {trials}: exit {outcome.exit_code}: {outcome.message}")
    url = spec if storage == "memory" else st.storage_url(spec, str(out))
    return {"storage": storage, "sampler": sampler, "url": str(url).replace(str(root), "<tmp>"), "trials": trials,
            "wall_s": wall, "trials_per_s": trials / wall, "ask_ms": 1000 * spent[0] / trials}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", default="100,300")
    ap.add_argument("--storages", default="default,sqlite,journal,memory")
    ap.add_argument("--sampler", default="tpe", help="tpe (default) or random: how much of an ask is the sampler's")
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    ap.add_argument("--warmup", type=int, default=20, help="trials of an uncounted first run (imports, caches)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mneme-bench-storage-") as tmp:
        if args.warmup:
            one("journal", args.warmup, Path(tmp) / "warmup", args.sampler)
        for n in [int(x) for x in args.trials.split(",")]:
            for s in args.storages.split(","):
                rows.append(one(s, n, Path(tmp), args.sampler))
                r = rows[-1]
                print(f"  {r['storage']:8s} {n:4d} trials: {r['trials_per_s']:6.1f} trials/s, "
                      f"ask {r['ask_ms']:6.2f} ms/trial", file=sys.stderr)
    print("| storage | sampler | trials | wall s | trials/s | ask ms/trial |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['storage']} | {r['sampler']} | {r['trials']} | {r['wall_s']:.2f} | {r['trials_per_s']:.1f} | {r['ask_ms']:.2f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
    by = {(r["storage"], r["trials"]): r for r in rows}
    n = max(r["trials"] for r in rows)
    if ("default", n) in by and ("sqlite", n) in by:
        d, q = by["default", n], by["sqlite", n]
        print(f"ratio: default / sqlite storage at {n} trials = {d['trials_per_s'] / q['trials_per_s']:.1f}x trials/s "
              f"(ask {d['ask_ms']:.1f} vs {q['ask_ms']:.1f} ms per trial)")


if __name__ == "__main__":
    main()
