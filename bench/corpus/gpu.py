"""The stages on the GPU machine, one app at a time from the pack's manifest (build.pack):

- plain:  the app as built, success check, wall time;
- record: a plain run and then `mneme record` side by side (record_overhead = recorded / plain wall),
          success check on both, the record DBs read back (kernels, IR, replayable or why not);
- replay: `mneme replay --json` of at most N instances per recorded kernel, each in its own process;
- tune:   `mneme tune --json` of the heaviest replayable kernels (bench/corpus/tune.py);
- ncu:    Nsight Compute's gpu__time_duration.sum of the app's own launches (the in-app referee).

Record DBs stay under the work folder (.corpus/work/<app>/rdb), which a warm GPU machine keeps between
calls; replay and tune record the app first when they find none there (and say so).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench.corpus import stage
from bench.corpus.apps import App, ROOT

WORK = ROOT / ".corpus" / "work"
EXIT_WAIVED = 2
MIN_TIMED_NS = 20_000


def mneme(*args: str) -> List[str]:
    return [sys.executable, "-m", "mneme.cli", *args]


def shape(d: Any) -> str:
    """dim3 / dict / ncu's '(4, 1, 1)' -> '4x1x1'."""
    if isinstance(d, dict):
        return f"{d.get('x', 1)}x{d.get('y', 1)}x{d.get('z', 1)}"
    if isinstance(d, str):
        nums = re.findall(r"\d+", d)
        return "x".join(nums) if nums else d
    return f"{getattr(d, 'x', 1)}x{getattr(d, 'y', 1)}x{getattr(d, 'z', 1)}"


def median(values: Sequence[float]) -> Optional[float]:
    vals = [float(v) for v in values if v is not None]
    return statistics.median(vals) if vals else None


class Ctx:
    """Where a GPU stage runs: the pack's apps, the work folder, the time limits."""

    def __init__(self, manifest: Dict[str, Any], pack_dir: Path, work: Path = WORK, app_timeout: float = 300.0,
                 max_recordings: int = 3, retime: Optional[int] = None):
        self.manifest = manifest
        self.pack_dir = Path(pack_dir)
        self.work = Path(work)
        self.app_timeout = app_timeout
        self.max_recordings = max_recordings
        self.retime = retime
        self.entries = {e["name"]: e for e in manifest["apps"]}

    def exe(self, app: App) -> Path:
        exe = (self.pack_dir / self.entries[app.name]["exe"]).resolve()
        if not exe.is_file():
            raise FileNotFoundError(f"{exe}: not in the pack; carry .corpus/pack made by `corpus.sh pack --apps {app.name}`")
        if not os.access(exe, os.X_OK):  # a copy that lost its mode bits
            exe.chmod(exe.stat().st_mode | 0o755)
        return exe

    def run_dir(self, app: App, what: str) -> Path:
        d = self.work / app.name / what
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def rdb(self, app: App) -> Path:
        return self.work / app.name / "rdb"


def stopped_by_budget(p: stage.Proc, limit: float, wanted: float) -> bool:
    """True when the process was stopped by the stage's budget rather than by its own limit."""
    return p.timed_out and limit < wanted


def outcome(app: App, p: stage.Proc) -> Dict[str, Any]:
    ok = app.success_ok(p.returncode, p.output) and not p.timed_out
    why = None
    if not ok:
        if p.timed_out:
            why = f"timed out after {p.seconds:.0f} s"
        elif p.returncode == EXIT_WAIVED:
            why = f"exit 2 (waived by a cuda-sample when the GPU lacks a feature): {last_line(p.output)}"
        elif p.returncode != 0:
            why = f"exit {p.returncode}: {last_line(p.output)}"
        else:
            why = f"success pattern {app.success!r} not in the output"
    return {"ok": ok, "rc": p.returncode, "wall_s": round(p.seconds, 3), "why": why}


#: an error text kept in the results is cut only beyond this (CORPUS.md shows a short form:
#: bench.corpus.render.short_reason); the JSON keeps the reason whole
MAX_ERROR_CHARS = 4000


def full_error(text: str) -> str:
    text = text.strip()
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return text[:MAX_ERROR_CHARS] + f" ... ({len(text) - MAX_ERROR_CHARS} more characters)"


def last_line(text: str) -> str:
    """The output's last non-empty line, whole (mneme's errors are one line: `mneme replay: error: ...`)."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return full_error(lines[-1]) if lines else ""


# ---- plain ---------------------------------------------------------------------------------------

def plain_app(app: App, budget: stage.Budget, ctx: Ctx) -> Dict[str, Any]:
    limit = budget.cap(ctx.app_timeout)
    p = stage.run([str(ctx.exe(app)), *app.argv], timeout=limit, cwd=ctx.run_dir(app, "plain"))
    if stopped_by_budget(p, limit, ctx.app_timeout):
        return {"budget_cut": True}
    o = outcome(app, p)
    row = {"app_ok_plain": o["ok"], "plain_rc": o["rc"], "plain_s": o["wall_s"], "plain_error": o["why"]}
    if not o["ok"]:
        row["plain_log"] = stage.tail(p.output)
    return row


# ---- record --------------------------------------------------------------------------------------

def record_argv(ctx: Ctx, app: App, rdb: Path) -> List[str]:
    argv = mneme("record", "-rdb", str(rdb), "--quiet", "--max-recordings", str(ctx.max_recordings))
    if ctx.retime is not None:
        argv += ["--retime", str(ctx.retime)]
    return argv + ["--", str(ctx.exe(app)), *app.argv]


_NO_IR = re.compile(r"mneme record: no IR for \d+ kernel\(s\)[^:]*: (.*)")


def kernels_without_ir(output: str) -> List[str]:
    """The kernels `mneme record` names as carrying no IR."""
    names: List[str] = []
    for m in _NO_IR.finditer(output):
        depth, cur = 0, ""
        for ch in m.group(1) + ",":
            if ch in "(<[":
                depth += 1
            elif ch in ")>]":
                depth -= 1
            if ch == "," and depth == 0:
                names += [cur.strip()] if cur.strip() else []
                cur = ""
            else:
                cur += ch
    return names


_SPLIT = re.compile(r"mneme record: (wall [^\n]*|recorder time [^\n]*)")
_SECONDS = re.compile(r"([a-z/-]+(?: [a-z-]+)?) (\d+\.\d+) s")


def record_split(output: str) -> Dict[str, float]:
    """`mneme record`'s own time split (its wall and recorder-time lines) as {part: seconds}."""
    split: Dict[str, float] = {}
    for m in _SPLIT.finditer(output):
        for name, sec in _SECONDS.findall(m.group(1)):
            split[re.sub(r"[ /-]", "_", name)] = float(sec)
    return split


def read_dbs(rdb: Path) -> List[Dict[str, Any]]:
    """Every record DB under rdb as one kernel row (mneme's own reader, so the format has one owner)."""
    from mneme.record.db import RecordedExecution, find_dbs

    rows = []
    if not rdb.is_dir():
        return rows
    for db in find_dbs(str(rdb)):
        rec = RecordedExecution.from_json(db, check_files=False)
        insts = []
        for rid, inst in rec.items():
            insts.append({"id": rid, "grid": shape(inst.grid_dim), "block": shape(inst.block_dim),
                          "shared_mem": inst.shared_mem, "occurrences": inst.occ,
                          "in_app_ns": inst.in_app_time_ns})
        insts.sort(key=lambda i: -(i["in_app_ns"] or 0))
        total = sum((i["in_app_ns"] or 0) * max(1, i["occurrences"] or 1) for i in insts)
        rows.append({"name": rec.kernel_name, "demangled": rec.demangled_name, "static_hash": rec.static_hash,
                     "db": str(Path(db).relative_to(rdb)), "has_ir": bool(rec.llvm_files),
                     "replayable": bool(rec.replayable and rec.llvm_files),
                     "not_replayable_reason": rec.not_replayable_reason or (None if rec.llvm_files else "no IR"),
                     "launches": rec.extra.get("Launches"), "complete": rec.complete,
                     "instances_recorded": len(insts), "total_in_app_ns": total,
                     "in_app_ns": median([i["in_app_ns"] for i in insts]), "instances": insts})
    rows.sort(key=lambda k: -(k["total_in_app_ns"] or 0))
    return rows


def record_app(app: App, budget: stage.Budget, ctx: Ctx, with_plain: bool = True) -> Dict[str, Any]:
    row: Dict[str, Any] = {}
    if with_plain:
        row = plain_app(app, budget, ctx)
        if row.get("budget_cut"):
            return row
    rdb = ctx.rdb(app)
    shutil.rmtree(rdb, ignore_errors=True)
    (ctx.work / app.name / "replay.json").unlink(missing_ok=True)  # it described the previous recording
    limit = budget.cap(ctx.app_timeout * 4)
    p = stage.run(record_argv(ctx, app, rdb), timeout=limit, cwd=ctx.run_dir(app, "record"))
    if stopped_by_budget(p, limit, ctx.app_timeout * 4):
        return {"budget_cut": True}
    o = outcome(app, p)
    try:
        kernels = read_dbs(rdb)
        db_error = None
    except Exception as e:  # noqa: BLE001 - the run's outcome stands without its DBs
        kernels, db_error = [], f"{type(e).__name__}: {e}"
    no_ir = kernels_without_ir(p.output)
    row.update({"app_ok_recorded": o["ok"], "record_rc": o["rc"], "record_s": o["wall_s"], "record_error": o["why"],
                "recorded": any(k["has_ir"] for k in kernels), "kernels_no_ir": no_ir, "kernels": kernels,
                "record_db_error": db_error, "max_recordings": ctx.max_recordings,
                "record_split": record_split(p.output)})
    if row.get("plain_s"):
        row["record_overhead"] = round(o["wall_s"] / row["plain_s"], 3)
        row["record_added_s"] = round(o["wall_s"] - row["plain_s"], 3)
    if not o["ok"] or not kernels:
        row["record_log"] = stage.tail(p.output, 2000)
    return row


def ensure_recorded(app: App, budget: stage.Budget, ctx: Ctx) -> Tuple[List[Dict[str, Any]], Optional[Dict[str, Any]]]:
    """The app's kernels from the DBs in the work folder, recording it first when there are none."""
    kernels = read_dbs(ctx.rdb(app))
    if kernels:
        return kernels, None
    rec = record_app(app, budget, ctx, with_plain=False)
    if rec.get("budget_cut"):
        return [], rec
    return rec.get("kernels", []), rec


# ---- replay --------------------------------------------------------------------------------------

#: baseline replays that learn which bytes vary between identical runs (float atomics, work queues,
#: scratch) before the instance is verified (docs/VERIFY.md)
VERIFY_RUNS = 3


def replay_argv(db: Path, rid: str, out_json: Path, iterations: int = 10) -> List[str]:
    return mneme("replay", "-rdb", str(db), "-rid", rid, "--iterations", str(iterations), "--json", str(out_json),
                 "--verify-runs", str(VERIFY_RUNS))


def parse_replay(doc: Dict[str, Any], in_app_ns: Optional[float]) -> Dict[str, Any]:
    """`mneme replay --json` -> status, median ns and fidelity (replay median / recorder's in-app median)."""
    r = doc.get("result", {})
    times = r.get("exec_time") or []
    med = median(times)
    fid = r.get("fidelity") or (med / in_app_ns if med and in_app_ns else None)
    return {"status": r.get("status") or "unknown", "replay_ns": med, "replay_min_ns": min(times) if times else None,
            "fidelity": round(fid, 4) if fid else None, "registers": r.get("reg_usage"),
            "error": (r.get("error") or None) and full_error(str(r["error"])), "code_hash": r.get("code_hash")}


def replay_app(app: App, budget: stage.Budget, ctx: Ctx, max_instances: int = 3,
               timeout: float = 180.0) -> Dict[str, Any]:
    kernels, rec = ensure_recorded(app, budget, ctx)
    if rec is not None and rec.get("budget_cut"):
        return rec
    out = ctx.run_dir(app, "replay")
    rows = []
    for k in kernels:
        kr = {"name": k["name"], "replayed": []}
        if k["replayable"]:
            for inst in k["instances"][:max_instances]:
                limit = budget.cap(timeout)
                js = out / f"{k['static_hash'][:16]}-{inst['id']}.json"
                p = stage.run(replay_argv(ctx.rdb(app) / k["db"], inst["id"], js), timeout=limit, cwd=out)
                if stopped_by_budget(p, limit, timeout):
                    return {"budget_cut": True}
                if js.is_file():
                    res = parse_replay(json.loads(js.read_text()), inst["in_app_ns"])
                else:
                    res = {"status": "timeout" if p.timed_out else "error", "replay_ns": None, "fidelity": None,
                           "error": last_line(p.output) or f"exit {p.returncode}"}
                kr["replayed"].append({"id": inst["id"], "in_app_ns": inst["in_app_ns"], **res})
        rows.append(kr)
    (ctx.work / app.name / "replay.json").write_text(json.dumps(rows, indent=1) + "\n")
    row: Dict[str, Any] = {"replay": rows}
    if rec is not None:
        row["recorded_here"] = {k: rec.get(k) for k in ("app_ok_recorded", "record_s", "record_error")}
        row["kernels"] = rec.get("kernels", [])
    return row


# ---- ncu -----------------------------------------------------------------------------------------

def ncu_path() -> str:
    """ncu on PATH, else the CUDA root's (the GPU machine's PATH may lack /usr/local/cuda/bin): mneme apply's."""
    from mneme.apply.ncutimer import find_ncu

    return find_ncu() or "ncu"


def ncu_argv(exe: Path, args: Sequence[str], launch_count: int, ncu: str = "ncu") -> List[str]:
    from mneme.apply.ncutimer import METRIC

    return [ncu, "--clock-control", "none", "--cache-control", "none", "--metrics", METRIC, "--csv",
            "--print-units", "base", "--print-kernel-base", "mangled", "--launch-count", str(launch_count),
            str(exe), *args]


def parse_ncu_csv(output: str) -> Dict[str, Dict[str, Any]]:
    """ncu's CSV (app output and ==PROF== lines around it) -> kernel -> launches, median ns, per shape."""
    from mneme.apply.ncutimer import parse_csv

    per: Dict[str, Dict[str, List[float]]] = {}
    for r in parse_csv(output):
        key = f"{'x'.join(map(str, r.grid))}/{'x'.join(map(str, r.block))}"
        per.setdefault(r.kernel, {}).setdefault(key, []).append(r.ns)
    return {name: {"launches": sum(len(v) for v in shapes.values()),
                   "median_ns": median([x for v in shapes.values() for x in v]),
                   "by_shape": {s: median(v) for s, v in shapes.items()}} for name, shapes in per.items()}


def ncu_app(app: App, budget: stage.Budget, ctx: Ctx, launch_count: int = 300, timeout: float = 420.0) -> Dict[str, Any]:
    limit = budget.cap(timeout)
    p = stage.run(ncu_argv(ctx.exe(app), app.argv, launch_count, ncu_path()), timeout=limit, cwd=ctx.run_dir(app, "ncu"))
    if stopped_by_budget(p, limit, timeout):
        return {"budget_cut": True}
    o = outcome(app, p)
    row = {"app_ok_ncu": o["ok"], "ncu_s": o["wall_s"], "ncu_error": o["why"], "ncu": parse_ncu_csv(p.output)}
    if not row["ncu"]:
        row["ncu_log"] = stage.tail(p.output)
    return row
