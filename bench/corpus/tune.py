"""The corpus campaign's tune stage (issue 17 item 5): per program, its heaviest replayable kernels - up to
TOP, each instance of at least MIN_US in-app - get `mneme tune --space standard --trials TRIALS`, and each
kernel's row records the verified trial fraction, the best speedup and configuration, where the gain comes
from (mneme tune's attribution: the best configuration measured without each knob it changed), why trials
failed, tune_configs_per_s, gpu_busy and the bytes the kernel moves (for its achieved bandwidth).

Resumable per kernel, so the stage fits device calls of 10 minutes: each kernel tunes in its own folder under
the work folder (.corpus/work/<app>/tune/<static hash>-<instance>, kept by a warm GPU machine), and its row is
written there when it finishes (corpus-row.json). A later call reuses a finished row with the same settings
(`resumed: true`) and continues a study that a budget cut stopped (`mneme tune --resume`). A kernel is not
started with less than KERNEL_MIN_S of the budget left: the app stays in the remaining list instead, and
what it finished comes back in the stage result (`partial: true`).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from bench.corpus import stage
from bench.corpus.gpu import Ctx, ensure_recorded, last_line, mneme, stopped_by_budget

TRIALS = 100
SPACE = "standard"
TOP = 3
MIN_US = 20.0
#: seconds one kernel's `mneme tune` may take
KERNEL_TIMEOUT_S = 420.0
#: a kernel is not started with less of the budget left (100 trials took 8-60 s per kernel on the H200)
KERNEL_MIN_S = 75.0
ROW_FILE = "corpus-row.json"
#: the study, in Optuna's journal file storage: with mneme tune's default SQLite storage, Optuna's RDB layer reads
#: the trials back on every ask, which capped 100 trials of `standard` at ~20 trials/s on the dev machine even with
#: free compiles and runs (journal: ~90/s; docs/BENCHMARKS.md, compile throughput)
STUDY_FILE = "study.journal"
#: the settings a reused row must have been made with
ROW_KEYS = ("instance", "space", "trials_requested")

Progress = Callable[[str], None]


def tune_argv(db: Path, rid: str, out_dir: Path, trials: int, space: str, jobs: Optional[int],
              resume: bool = False) -> List[str]:
    argv = mneme("tune", "-rdb", str(db), "-rid", rid, "--space", space, "--trials", str(trials), "--no-track",
                 "--json", "--quiet", "-o", str(out_dir), "--storage", f"journal:{Path(out_dir) / STUDY_FILE}")
    # resuming: the budget stopped the process that ran it, so its running trials are redone after 10 s
    argv += ["--compile-jobs", str(jobs)] if jobs else []
    return argv + (["--resume", "--stale-after", "10"] if resume else [])


def json_object(text: str) -> Optional[Dict[str, Any]]:
    """The last top-level JSON object printed in `text` (tune prints its summary with --json)."""
    start = text.find("{\n")
    while start >= 0:
        try:
            return json.loads(text[start:])
        except ValueError:
            try:
                obj, _ = json.JSONDecoder().raw_decode(text[start:])
                return obj
            except ValueError:
                start = text.find("{\n", start + 1)
    return None


def timed_share(trials_jsonl: Path, search_s: Optional[float]) -> Optional[float]:
    """Timed kernel time of all trials / the search's wall time: a lower bound of the GPU's busy share
    (warm-up runs, resets and verification are not counted); used when tune reports no gpu_busy."""
    if not search_s or not trials_jsonl.is_file():
        return None
    ns = 0.0
    for line in trials_jsonl.read_text().splitlines():
        try:
            ns += sum((json.loads(line).get("result") or {}).get("exec_time") or [])
        except ValueError:
            continue
    return round(ns * 1e-9 / search_s, 4)


def changed(best: Optional[Dict[str, Any]], base: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The fields of the best configuration that differ from the baseline's (what the tuner changed)."""
    if not best or not base:
        return None
    return {k: v for k, v in best.items() if base.get(k) != v}


def attribution_row(att: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Where the gain comes from: the knob whose removal costs the most, and each knob's factor."""
    if not att:
        return {"gain_from": None, "gain_from_factor": None, "gain_by_knob": None}
    by = {g["knob"]: (round(g["gain"], 4) if g.get("gain") else g.get("status")) for g in att.get("groups") or []}
    factor = att.get("gain_from_factor")
    return {"gain_from": att.get("gain_from"), "gain_from_factor": round(factor, 4) if factor else None,
            "gain_by_knob": by}


def parse_tune(doc: Dict[str, Any], out_dir: Optional[Path] = None) -> Dict[str, Any]:
    """`mneme tune --json` -> the kernel's tune row."""
    trials = doc.get("trials") or {}
    by = trials.get("by_status") or {}
    counted = trials.get("counted") or sum(by.values()) or 0
    best = doc.get("best") or {}
    base = doc.get("baseline") or {}
    timing = doc.get("timing") or {}
    busy = doc.get("gpu_busy")
    fails = doc.get("failures") or {}
    row = {"trials": counted, "by_status": by,
           "verified_fraction": round(by.get("verified", 0) / counted, 4) if counted else None,
           "best_speedup": best.get("speedup"), "best_config": best.get("config"),
           "best_changes": changed(best.get("config"), base.get("config")),
           "best_params": best.get("params"), "baseline_ns": base.get("metric_ns"), "best_ns": best.get("metric_ns"),
           **attribution_row(doc.get("attribution")),
           "failure_reasons": (fails.get("reasons") or [])[:5],
           "tune_configs_per_s": timing.get("trials_per_s"), "search_s": timing.get("search_s"),
           "gpu_busy": busy, "gpu_busy_source": "GPU workers busy / search wall" if busy is not None else None,
           "exit_code": doc.get("exit_code"), "message": doc.get("message") or None}
    if busy is None and out_dir is not None:
        row["gpu_busy"] = timed_share(Path(out_dir) / "trials.jsonl", timing.get("search_s"))
        row["gpu_busy_source"] = "timed iterations / search wall (lower bound)" if row["gpu_busy"] is not None else None
    return row


def recorded_traffic(db: Path, rid: str) -> Dict[str, Any]:
    """The bytes one launch moves, from its snapshots: the allocations its arguments point into (any 8-byte
    word of an argument that falls in a recorded allocation, so pointers inside structs count) and those it
    wrote. Each byte counts once: `written_bytes` (changed by the launch) and `read_bytes` (the rest of those
    allocations). A kernel that reads what it writes moves more than this, one that touches part of an
    allocation less: an estimate, named as such wherever it is shown."""
    from mneme.record.db import RecordedExecution

    inst = RecordedExecution.from_json(str(db)).instance(rid)
    with inst.epilogue as epi:
        written = epi.written_ranges()
    with inst.prologue as pro:
        snap = pro.snapshot
        blobs: Dict[int, int] = {}
        for arg in pro.args:
            raw = bytes(arg)
            for off in range(0, len(raw) - 7, 8):
                b = snap.find_blob(int.from_bytes(raw[off:off + 8], "little"))
                if b is not None:
                    blobs[b.addr] = b.size
        for addr, _ in written:
            b = snap.find_blob(addr)
            if b is not None:
                blobs[b.addr] = b.size
    footprint = sum(blobs.values())
    wbytes = sum(length for _, length in written)
    return {"allocations": len(blobs), "read_bytes": max(0, footprint - wbytes), "written_bytes": wbytes,
            "bytes_moved": max(footprint, wbytes)}


def pick_kernels(kernels: List[Dict[str, Any]], replayed: Optional[List[Dict[str, Any]]], top: int,
                 min_ns: float) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """The heaviest replayable kernels (by total in-app time), preferring ones whose baseline replay
    verified; with each its heaviest instance (verified if known) of at least min_ns."""
    verified = {}
    for k in replayed or []:
        ok = [r["id"] for r in k.get("replayed", []) if r.get("status") == "verified"]
        verified[k["name"]] = ok
    picks = []
    for k in kernels:
        if not k["replayable"] or not k["instances"]:
            continue
        if replayed is not None and not verified.get(k["name"]):
            continue
        insts = [i for i in k["instances"] if (i["in_app_ns"] or 0) >= min_ns
                 and (replayed is None or i["id"] in verified[k["name"]])]
        if insts:
            picks.append((k, insts[0]))
    return picks[:top]


def kernel_dir(ctx: Ctx, app_name: str, k: Dict[str, Any], inst: Dict[str, Any]) -> Path:
    return ctx.work / app_name / "tune" / f"{k['static_hash'][:16]}-{inst['id']}"


def finished_row(d: Path, want: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The row a previous call left in `d`, if it was made with the settings in `want`."""
    try:
        row = json.loads((d / ROW_FILE).read_text())
    except (OSError, ValueError):
        return None
    return row if all(row.get(k) == want.get(k) for k in ROW_KEYS) and "error" not in row else None


def _label(k: Dict[str, Any]) -> str:
    return (k.get("demangled") or k["name"])[:70]


def tune_kernel(ctx: Ctx, app, k: Dict[str, Any], inst: Dict[str, Any], budget: stage.Budget, trials: int,
                space: str, jobs: Optional[int], timeout: float) -> Optional[Dict[str, Any]]:
    """One kernel's row (None: the budget stopped it; the study stays for the next call to resume)."""
    d = kernel_dir(ctx, app.name, k, inst)
    head = {"name": k["name"], "instance": inst["id"], "in_app_ns": inst["in_app_ns"], "space": space,
            "trials_requested": trials}
    db = ctx.rdb(app) / k["db"]
    resume = (d / STUDY_FILE).is_file()
    limit = budget.cap(timeout)
    p = stage.run(tune_argv(db, inst["id"], d, trials, space, jobs, resume), timeout=limit, cwd=d.parent)
    if stopped_by_budget(p, limit, timeout):
        return None
    doc = json_object(p.output)
    if doc is None and resume:  # a study the current settings refuse to resume: start it again
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        limit = budget.cap(timeout)
        p = stage.run(tune_argv(db, inst["id"], d, trials, space, jobs), timeout=limit, cwd=d.parent)
        if stopped_by_budget(p, limit, timeout):
            return None
        doc = json_object(p.output)
    res = parse_tune(doc, d) if doc else {"error": f"{'timed out' if p.timed_out else 'exit ' + str(p.returncode)}: "
                                                    f"{last_line(p.output)}"}
    row = {**head, "tune_s": round(p.seconds, 1), "resumed_study": resume, **res}
    try:
        row["traffic"] = recorded_traffic(db, inst["id"])
    except Exception as e:  # noqa: BLE001 - the tuning result stands without the byte count
        row["traffic"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    (d / ROW_FILE).write_text(json.dumps(row, indent=1, default=str) + "\n")
    return row


def row_text(row: Dict[str, Any]) -> str:
    if row.get("error"):
        return f"error: {row['error']}"
    vf, sp = row.get("verified_fraction"), row.get("best_speedup")
    out = (f"{row.get('trials')} trials {row.get('by_status')}, verified {vf if vf is not None else '-'}, best "
           f"{f'{sp:.3f}x' if sp else '-'}")
    if row.get("gain_from"):
        out += f" (gain from {row['gain_from']})"
    return out + f", {row.get('tune_s', 0):.0f} s"


def tune_app(app, budget: stage.Budget, ctx: Ctx, trials: int = TRIALS, space: str = SPACE, top: int = TOP,
             min_us: float = MIN_US, jobs: Optional[int] = None, timeout: float = KERNEL_TIMEOUT_S,
             resume: bool = True, progress: Progress = lambda s: print(s, flush=True)) -> Dict[str, Any]:
    kernels, rec = ensure_recorded(app, budget, ctx)
    if rec is not None and rec.get("budget_cut"):
        return rec
    rj = ctx.work / app.name / "replay.json"
    replayed = json.loads(rj.read_text()) if rj.is_file() else None
    picks = pick_kernels(kernels, replayed, top, min_us * 1000)
    rows: List[Dict[str, Any]] = []
    cut = False
    for n, (k, inst) in enumerate(picks, 1):
        d = kernel_dir(ctx, app.name, k, inst)
        want = {"instance": inst["id"], "space": space, "trials_requested": trials}
        done = finished_row(d, want) if resume else None
        what = f"corpus tune: {app.name} kernel {n}/{len(picks)} {_label(k)} ({(inst['in_app_ns'] or 0) / 1e3:.1f} us)"
        if done is not None:
            rows.append({**done, "resumed": True})
            progress(f"{what}: done in an earlier call: {row_text(done)}")
            continue
        if not budget.can_start(KERNEL_MIN_S):
            progress(f"{what}: not started, {budget.left():.0f} s of the budget left (< {KERNEL_MIN_S:.0f} s)")
            cut = True
            break
        if not resume:
            shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True, exist_ok=True)
        progress(f"{what}: {trials} trials of {space} ({budget.left():.0f} s of the budget left)")
        t0 = time.perf_counter()
        row = tune_kernel(ctx, app, k, inst, budget, trials, space, jobs, timeout)
        if row is None:
            progress(f"{what}: stopped by the budget after {time.perf_counter() - t0:.0f} s; the next call resumes it")
            cut = True
            break
        rows.append(row)
        progress(f"{what}: {row_text(row)}")
    out: Dict[str, Any] = {"tune": rows, "tune_note": None if picks else "no replayable kernel "
                           + ("whose baseline replay verified " if replayed is not None else "") + f"of >= {min_us:g} us"}
    if rec is not None:
        out["kernels"] = rec.get("kernels", [])
    if cut:
        out.update(budget_cut=True, partial=True)
    return out
