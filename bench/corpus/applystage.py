"""The `apply` stage on the GPU machine: the app run with its tuned kernels swapped in (`mneme apply`, issue 18).

For each program whose tune found at least `min_speedup` (default 1.05x) on a kernel, the tune results
directories of the stage's work folder (.corpus/work/<app>/tune/...) that reached it are applied:

    mneme apply TUNED... --rounds R --app-timeout S --workdir .corpus/work/<app>/apply/wd -- ./app ARGS

`mneme apply` runs the app observed (original kernels) and applied (tuned kernels) R times each, alternating,
and times the matched launches in both with the recorder's in-app timer, so predicted (the tune's replay
speedup) and realized (in-app original / tuned median) sit side by side from one call; a kernel launched only
inside CUDA graphs (which that timer cannot see) is timed by one more pair of runs under Nsight Compute
(`--timer auto`, its "timer" says "ncu"). The corpus's success
check is applied to every applied run's own output (and to every observed one). Per program:

    "apply": {"kernels_applied", "app_ok", "wall_speedup",
              "kernels": [{"kernel", "predicted", "realized", "gain_ratio", "matched", "applied", ...}], ...}

or "apply": null with "apply_note" saying why nothing was applied (no tune results, none >= min_speedup).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from bench.corpus import stage
from bench.corpus.apps import App

#: the issue's bar for applying a tuned kernel in the campaign
MIN_SPEEDUP = 1.05
#: `mneme apply`'s progress line before each run of the app (mneme/apply/runner.py)
_RUN_LINE = re.compile(r"^mneme apply: \[(observe|apply) run (\d+)(?:, under ncu)?\] [^\n]*\n?", re.M)


def tuned_dirs(tune_root: Path, min_speedup: float = MIN_SPEEDUP) -> Tuple[List[Tuple[Path, float]], List[str]]:
    """(results directory, tuned speedup) of every kernel tuned to >= min_speedup under tune_root, and a note
    per results directory that fell short (best speedup, or no best configuration)."""
    from mneme.apply.prepare import results_dirs

    picked: List[Tuple[Path, float]] = []
    short: List[str] = []
    if not tune_root.is_dir():
        return picked, short
    for d in results_dirs(tune_root):
        try:
            best = json.loads((d / "best.json").read_text())
        except (OSError, ValueError) as e:
            short.append(f"{d.name}: unreadable best.json ({e})")
            continue
        sp = best.get("speedup")
        if sp is not None and sp >= min_speedup:
            picked.append((d, float(sp)))
        else:
            short.append(f"{d.name}: best {sp:.3f}x" if sp is not None else f"{d.name}: no speedup")
    return picked, short


def apply_argv(mneme_argv: List[str], tuned: List[Path], workdir: Path, exe: Path, args: List[str], rounds: int,
               app_timeout: float, check: int, timer: str = "auto") -> List[str]:
    argv = mneme_argv + ["apply", *map(str, tuned), "--workdir", str(workdir), "--rounds", str(rounds),
                         "--app-timeout", str(app_timeout), "--timer", timer]
    if check:
        argv += ["--check", str(check)]
    return argv + ["--", str(exe), *args]


def split_runs(output: str, report: Optional[Dict[str, Any]] = None) -> Dict[Tuple[str, int], str]:
    """The output of each run of the app, by (mode, round), from `mneme apply`'s progress lines; the last run's
    ends where `mneme apply`'s report (its first kernel's `apply NAME:` line) begins."""
    marks = list(_RUN_LINE.finditer(output))
    stop = len(output)
    entries = (report or {}).get("entries") or []
    if entries and marks:
        first = (entries[0].get("demangled") or entries[0].get("kernel") or "").split("(")[0]
        at = output.rfind(f"\napply {first}: ")
        if at > marks[-1].end():
            stop = at + 1
    out: Dict[Tuple[str, int], str] = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else stop
        out[(m.group(1), int(m.group(2)))] = output[m.end():end]
    return out


def success(app: App, report: Dict[str, Any], output: str, mode: str) -> Optional[bool]:
    """The corpus's success check on every run of `mode` (exit status from apply.json, output from the log)."""
    runs = split_runs(output, report)
    codes = (report.get("returncodes") or {}).get(mode) or []
    if not codes:
        return None
    return all(app.success_ok(rc, runs.get((mode, i + 1), "")) for i, rc in enumerate(codes))


def campaign_row(report: Dict[str, Any], app_ok: Optional[bool], app_ok_observed: Optional[bool]) -> Dict[str, Any]:
    """apply.json -> the campaign's "apply" record (docs/corpus.json; bench.corpus.schema.APPLY)."""
    kernels = []
    for e in report.get("entries") or []:
        kernels.append({"kernel": e.get("demangled") or e.get("kernel"), "predicted": e.get("predicted"),
                        "realized": e.get("realized"), "gain_ratio": e.get("gain_ratio"), "rule": e.get("rule"),
                        "matched": e.get("matched"), "applied": e.get("applied"), "fell_back": e.get("fell_back"),
                        "original_ns": e.get("original_ns"), "tuned_ns": e.get("tuned_ns"),
                        "timer": e.get("timer")})
    return {"kernels_applied": report.get("kernels_applied"), "app_ok": bool(app_ok) and bool(report.get("app_ok")),
            "app_ok_observed": app_ok_observed, "wall_speedup": report.get("wall_speedup"),
            "wall_original_s": report.get("wall_original_s"), "wall_applied_s": report.get("wall_applied_s"),
            "check_failed": report.get("check_failed") or None, "holds_broken": report.get("holds_broken"),
            "warnings": list(dict.fromkeys(report.get("warnings") or []))[:8], "kernels": kernels}


def apply_app(app: App, budget: stage.Budget, ctx: Any, mneme_argv: List[str], rounds: int = 3,
              min_speedup: float = MIN_SPEEDUP, check: int = 0, timeout: Optional[float] = None,
              timer: str = "auto") -> Dict[str, Any]:
    """One program's apply row (see the module's docstring); {"budget_cut": True} when the budget stopped it."""
    picked, short = tuned_dirs(ctx.work / app.name / "tune", min_speedup)
    if not picked:
        why = (f"no kernel tuned to >= {min_speedup:.2f}x ({'; '.join(short)})" if short else
               "no tune results in the work folder (run the tune stage first, on this machine)")
        return {"apply": None, "apply_note": why}
    wanted = timeout or ctx.app_timeout * 2 * rounds + 180.0  # + preparing: cubins from the cache or rebuilt
    limit = budget.cap(wanted)
    run_dir = ctx.run_dir(app, "apply")
    wd = run_dir / "wd"
    p = stage.run(apply_argv(mneme_argv, [d for d, _ in picked], wd, ctx.exe(app), app.argv, rounds,
                             ctx.app_timeout, check, timer), timeout=limit, cwd=run_dir)
    if p.timed_out and limit < wanted:
        return {"budget_cut": True}
    row: Dict[str, Any] = {"apply_s": round(p.seconds, 1), "apply_tuned": [str(d) for d, _ in picked],
                           "apply_predicted": {d.name: sp for d, sp in picked}, "apply_rc": p.returncode}
    rep_path = wd / "apply.json"
    if not rep_path.is_file():
        row.update({"apply": None, "apply_note": f"mneme apply wrote no report ({'timed out' if p.timed_out else 'exit ' + str(p.returncode)}): "
                                                 f"{stage.tail(p.output, 300).strip().splitlines()[-1:] or ''}",
                    "apply_log": stage.tail(p.output, 2000)})
        return row
    report = json.loads(rep_path.read_text())
    row["apply"] = campaign_row(report, success(app, report, p.output, "apply"), success(app, report, p.output, "observe"))
    row["apply_lines"] = [line for line in p.output.splitlines() if line.startswith(("apply ", "  launches", "  note"))]
    if not row["apply"]["app_ok"]:
        row["apply_log"] = stage.tail(p.output, 2000)
    return row
