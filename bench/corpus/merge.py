"""Stage results -> docs/corpus.json: each stage's fields folded into its apps (other stages' results
kept), the stage's commit and date stamped per app, the app-level figures derived from the kernels, the
whole validated against bench.corpus.schema, and the one-line summary."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from bench.corpus import schema
from bench.corpus.gpu import MIN_TIMED_NS, median

GPU_STAGES = ("plain", "record", "replay", "tune", "ncu", "apply")
OK_STATUSES = ("verified", "failed_verification")


def skeleton(name: str) -> Dict[str, Any]:
    return {"name": name, "built_unmodified": None, "build_error": None, "recorded": None, "app_ok_plain": None,
            "app_ok_recorded": None, "kernels_recorded": None, "kernels_replayable": None, "kernels_verified": None,
            "not_replayable": {}, "record_overhead": None, "fidelity": [], "fidelity_ncu": [],
            "tune_verified_fraction": None, "best_speedup": None, "tune_configs_per_s": None, "gpu_busy": None,
            "kernels": [], "stages": {}}


def _copy(app: Dict[str, Any], row: Dict[str, Any], keys: Iterable[str]) -> None:
    for k in keys:
        if k in row:
            app[k] = row[k]


def _kernel(app: Dict[str, Any], name: str) -> Dict[str, Any]:
    for k in app["kernels"]:
        if k["name"] == name:
            return k
    k = {"name": name, "instances": []}
    app["kernels"].append(k)
    return k


def _set_kernels(app: Dict[str, Any], kernels: List[Dict[str, Any]]) -> None:
    """A new recording's kernels; what later stages added to a kernel/instance that is still there stays."""
    old = {k["name"]: k for k in app["kernels"]}
    new = []
    for k in kernels:
        prev = old.get(k["name"], {})
        prev_inst = {i["id"]: i for i in prev.get("instances", [])}
        insts = [{**prev_inst.get(i["id"], {}), **i} for i in k.get("instances", [])]
        new.append({**{x: v for x, v in prev.items() if x != "instances"}, **k, "instances": insts})
    app["kernels"] = new


def fold_build(app, row, res):
    _copy(app, row, ("built_unmodified", "build_error", "build_s", "cudart", "ir_modules", "stripped_bytes"))
    app["ir_kernels"] = len(row.get("ir_kernels", [])) if row.get("built_unmodified") else None
    app["compiler"] = res.get("compiler_version") or res.get("compiler")


def fold_plain(app, row, res):
    _copy(app, row, ("app_ok_plain", "plain_s", "plain_error"))


def fold_record(app, row, res):
    _copy(app, row, ("app_ok_plain", "plain_s", "plain_error", "app_ok_recorded", "record_s", "record_error",
                     "recorded", "record_overhead", "record_added_s", "kernels_no_ir", "max_recordings"))
    # why the app failed under the recorder, in the recorder's own words (its log's first error line)
    app["record_cause"] = next((ln[len("mneme record: "):] for ln in (row.get("record_log") or "").splitlines()
                                if ln.startswith(("mneme record: the recorded", "mneme record: error"))), None)
    _set_kernels(app, row.get("kernels", []))


def fold_replay(app, row, res):
    if row.get("kernels"):
        _set_kernels(app, row["kernels"])
    for kr in row.get("replay", []):
        k = _kernel(app, kr["name"])
        by_id = {i["id"]: i for i in k.setdefault("instances", [])}
        for r in kr.get("replayed", []):
            inst = by_id.get(r["id"])
            if inst is None:
                inst = {"id": r["id"]}
                k["instances"].append(inst)
            inst.update({x: r.get(x) for x in ("replay_ns", "status", "fidelity", "error", "registers")})
            inst.setdefault("in_app_ns", r.get("in_app_ns"))
        statuses = [r.get("status") for r in kr.get("replayed", [])]
        k["verified"] = bool(statuses) and all(s == "verified" for s in statuses) if statuses else None


def fold_tune(app, row, res):
    if row.get("kernels"):
        _set_kernels(app, row["kernels"])
    rows = row.get("tune", [])
    for t in rows:
        _kernel(app, t["name"])["tune"] = {x: v for x, v in t.items() if x != "name"}
    if not rows and row.get("partial"):
        return  # cut before its first kernel: what an earlier result said stays
    head = rows[0] if rows else {}  # the heaviest kernel (pick order)
    app["tune_verified_fraction"] = head.get("verified_fraction")
    app["best_speedup"] = head.get("best_speedup")
    app["tune_configs_per_s"] = head.get("tune_configs_per_s")
    app["gpu_busy"] = head.get("gpu_busy")
    app["tune_note"] = row.get("tune_note")


def fold_ncu(app, row, res):
    _copy(app, row, ("app_ok_ncu", "ncu_s", "ncu_error"))
    for name, n in (row.get("ncu") or {}).items():
        k = _kernel(app, name)
        k["ncu_ns"] = n.get("median_ns")
        k["ncu_launches"] = n.get("launches")
        for inst in k.get("instances", []):
            inst["ncu_ns"] = (n.get("by_shape") or {}).get(f"{inst.get('grid')}/{inst.get('block')}")


def fold_apply(app, row, res):
    """bench.corpus.applystage's row: the "apply" record (null when nothing was applied) and why not."""
    app["apply"] = row["apply"] if "apply" in row else (row if "kernels_applied" in row else None)
    app["apply_note"] = row.get("apply_note")
    _copy(app, row, ("apply_s",))


def fold_other(app, row, res):
    """A stage this module does not know (another issue's): its fields land on the app as they are."""
    app.update({k: v for k, v in row.items() if k not in ("name", "stages")})


FOLDS: Dict[str, Callable] = {"build": fold_build, "plain": fold_plain, "record": fold_record,
                              "replay": fold_replay, "tune": fold_tune, "ncu": fold_ncu, "apply": fold_apply}


def derive(app: Dict[str, Any]) -> Dict[str, Any]:
    """The app-level counts and lists, from its kernels (one source: the kernels list)."""
    ks = app["kernels"]
    recorded = "record" in app["stages"] or any("has_ir" in k for k in ks)
    app["kernels_recorded"] = sum(1 for k in ks if k.get("has_ir")) if recorded else None
    app["kernels_replayable"] = sum(1 for k in ks if k.get("replayable")) if recorded else None
    replayed = [k for k in ks if k.get("verified") is not None]
    app["kernels_verified"] = sum(1 for k in replayed if k["verified"]) if "replay" in app["stages"] else None
    nr: Dict[str, str] = {}
    for k in ks:
        label = k.get("demangled") or k["name"]
        if "has_ir" in k and not k.get("replayable"):
            nr[label] = k.get("not_replayable_reason") or "not replayable"
            continue
        bad = [i for i in k.get("instances", []) if i.get("status") and i["status"] not in OK_STATUSES]
        if bad and len(bad) == len([i for i in k["instances"] if i.get("status")]):
            nr[label] = f"replay {bad[0]['status']}: {bad[0].get('error') or ''}".strip().rstrip(":")
    for name in app.get("kernels_no_ir") or []:
        nr.setdefault(name, "no IR (not built through mneme)")
    app["not_replayable"] = nr
    fid, fid_ncu = [], []
    for k in ks:
        for i in k.get("instances", []):
            if i.get("status") != "verified" or (i.get("in_app_ns") or 0) < MIN_TIMED_NS:
                continue
            if i.get("fidelity"):
                fid.append(round(float(i["fidelity"]), 4))
            ref = i.get("ncu_ns") or k.get("ncu_ns")
            if ref and i.get("in_app_ns"):
                i["in_app_vs_ncu"] = round(i["in_app_ns"] / ref, 4)
            if ref and i.get("replay_ns"):
                i["fidelity_ncu"] = round(i["replay_ns"] / ref, 4)
                fid_ncu.append(i["fidelity_ncu"])
    app["fidelity"], app["fidelity_ncu"] = fid, fid_ncu
    return app


def merge(doc: Optional[Dict[str, Any]], results: Sequence[Dict[str, Any]], names: Sequence[str] = ()) -> Dict[str, Any]:
    """doc (an earlier corpus.json or None) with `results` folded in, oldest first; `names` (the corpus's
    apps, in order) gives every app a row even before any stage ran for it."""
    doc = json.loads(json.dumps(doc)) if doc else {"gpu": None, "driver": None, "apps": []}
    apps = {a["name"]: a for a in doc["apps"]}
    for res in sorted(results, key=lambda r: r.get("date", "")):
        st = res["stage"]
        fold = FOLDS.get(st, fold_other)
        for name, row in res["apps"].items():
            app = apps.setdefault(name, skeleton(name))
            for k, v in skeleton(name).items():
                app.setdefault(k, v)
            fold(app, row, res)
            if row.get("stage_error"):
                app.setdefault("stage_errors", {})[st] = row["stage_error"]
            elif st in app.get("stage_errors", {}):
                del app["stage_errors"][st]
            app["stages"][st] = {"commit": str(res.get("commit", "unknown")), "date": str(res.get("date", ""))}
        if st in GPU_STAGES and res.get("gpu") not in (None, "", "none"):
            doc["gpu"], doc["driver"] = res["gpu"], str(res.get("driver") or "")
    order = list(names) + [n for n in apps if n not in names]
    doc["apps"] = [derive(apps.get(n) or skeleton(n)) for n in order]
    doc["summary"] = summary(doc)
    schema.validate(doc)
    return doc


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def geomean(vals: Sequence[float]) -> Optional[float]:
    vals = [v for v in vals if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def summary(doc: Dict[str, Any]) -> str:
    """The campaign's one line (the script prints it; docs/CORPUS.md starts with it)."""
    apps = doc["apps"]
    n = len(apps)
    if not any(a["stages"] for a in apps):
        return "corpus: no stage has run yet"
    nb = sum(1 for a in apps if "build" in a["stages"])
    parts = [f"{sum(1 for a in apps if a['built_unmodified'])}/{n} built unmodified"
             + (f" ({n - nb} not built yet)" if nb < n else "")]
    if any("plain" in a["stages"] or "record" in a["stages"] for a in apps):
        ok = sum(1 for a in apps if a["recorded"] and a["app_ok_plain"] and a["app_ok_recorded"])
        parts.append(f"{ok}/{n} recorded ok (success check plain and recorded, >= 1 kernel with IR)")
        parts.append(f"{sum(1 for a in apps if a['app_ok_plain'])} ran ok plain")
        long_ = [a["record_overhead"] for a in apps if a.get("record_overhead") and (a.get("plain_s") or 0) >= 1.0]
        short = [a["record_added_s"] for a in apps if a.get("record_added_s") is not None and (a.get("plain_s") or 0) < 1.0]
        if long_:
            parts.append(f"record overhead median {median(long_):.2f}x, worst {max(long_):.2f}x "
                         f"({len(long_)} apps >= 1 s plain)")
        if short:
            parts.append(f"recording added median {median(short):.2f} s ({len(short)} apps < 1 s plain)")
    ks = [k for a in apps for k in a["kernels"]]
    if ks:
        parts.append(f"kernels: {sum(1 for k in ks if k.get('has_ir'))} recorded with IR, "
                     f"{sum(1 for k in ks if k.get('replayable'))} replayable, "
                     f"{sum(1 for k in ks if k.get('verified'))} verified")
    fid = [f for a in apps for f in a["fidelity"]]
    if fid:
        w3, w5 = (sum(1 for f in fid if abs(f - 1) <= t) for t in (0.03, 0.05))
        parts.append(f"fidelity median {median(fid):.3f} over {len(fid)} instances >= 20 us "
                     f"({w3} within 3 %, {w5} within 5 %)")
    fn = [f for a in apps for f in a.get("fidelity_ncu", [])]
    if fn:
        parts.append(f"fidelity_ncu median {median(fn):.3f} over {len(fn)}")
    parts += tune_parts([k["tune"] for k in ks if k.get("tune") and k["tune"].get("trials")])
    applied = [a["apply"] for a in apps if a.get("apply")]
    if applied:
        gains = [k["gain_ratio"] for ap in applied for k in ap.get("kernels", []) if k.get("gain_ratio") is not None]
        parts.append(f"apply: {len(applied)} programs, {sum(ap.get('kernels_applied') or 0 for ap in applied)} kernels "
                     f"applied, app ok {sum(1 for ap in applied if ap.get('app_ok'))}/{len(applied)}"
                     + (f", realized/predicted gain median {median(gains):.2f}" if gains else ""))
    return "corpus: " + ", ".join(parts)


#: the first corpus campaign's tuning (H200, commit c1a7bf4, 2026-12-02: 30 trials of standard on each app's
#: heaviest kernel), quoted beside the current figures; docs/corpus.json no longer holds all of its rows
FIRST_TUNE = "first campaign (30 trials): 13 kernels, verified fraction median 1.00, best speedup geomean 1.102"
#: a best speedup under this is "no gain" (docs/CORPUS.md shows such kernels' achieved bandwidth)
GAIN = 1.05


def tune_figures(rows: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The tuning figures over kernel tune rows: count, verified fraction median, best speedup geomean..."""
    sp = [t["best_speedup"] for t in rows if t.get("best_speedup")]
    return {"kernels": len(rows),
            "verified_fraction": median([t["verified_fraction"] for t in rows if t.get("verified_fraction") is not None]),
            "geomean": geomean(sp), "gains": sum(1 for v in sp if v >= GAIN),
            "all_failed": sum(1 for t in rows if t.get("trials") and not (t.get("by_status") or {}).get("verified")),
            "configs_per_s": median([t["tune_configs_per_s"] for t in rows if t.get("tune_configs_per_s")]),
            "gpu_busy": median([t["gpu_busy"] for t in rows if t.get("gpu_busy") is not None])}


def tune_parts(tuned: Sequence[Dict[str, Any]]) -> List[str]:
    """Summary parts: one per budget (trials, space) tuned, most trials first, then the first campaign's."""
    if not tuned:
        return []
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for t in tuned:
        groups.setdefault((t.get("trials_requested") or t.get("trials"), t.get("space") or "standard"), []).append(t)
    parts = []
    for (trials, space), rows in sorted(groups.items(), key=lambda kv: -(kv[0][0] or 0)):
        f = tune_figures(rows)
        text = (f"tune ({trials} trials of {space}): {f['kernels']} kernels, verified fraction median "
                f"{_fmt(f['verified_fraction'], '.2f')}, best speedup geomean {_fmt(f['geomean'], '.3f')} "
                f"({f['gains']} >= {GAIN}x), every trial failed: {f['all_failed']}")
        if f["configs_per_s"] is not None:
            text += f", configs/s median {f['configs_per_s']:.1f}"
        if f["gpu_busy"] is not None:
            text += f", gpu_busy median {f['gpu_busy']:.2f}"
        parts.append(text)
    return parts + [FIRST_TUNE]


def load_doc(path: Path) -> Optional[Dict[str, Any]]:
    return json.loads(path.read_text()) if path.is_file() else None
