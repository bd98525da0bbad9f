"""What `mneme apply` proves: wall time and per-kernel in-app time without and with apply, side by side.

realized speedup (per entry) = median in-app time of the original launches the entry matched (observed run)
                               / median in-app time of the tuned launches (applied run)
gain ratio                   = (realized - 1) / (predicted - 1), predicted = the tune's replay speedup;
                               none where the prediction is no gain (under MIN_PREDICTED_GAIN): a ratio of
                               two timing noises (a tuned 0.999x realized at 1.2x read as -38000 %)
wall speedup                 = median wall time of the observed runs / that of the applied runs

An entry no launch of which the in-app timer saw (inside a CUDA graph) takes its times from the runs under
Nsight Compute (mneme/apply/ncutimer.py), if there were any; its `timer` says which. Runs under ncu never
count into the wall times (ncu serializes and profiles every matched launch) unless every run was one.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from mneme.apply import ncutimer
from mneme.apply.manifest import Entry
from mneme.apply.runner import CHECK_EXIT, RunStats


#: a predicted speedup under 1 + this has no gain to share (timing noise either way)
MIN_PREDICTED_GAIN = 0.01


def gain_ratio(predicted: Optional[float], realized: Optional[float]) -> Optional[float]:
    """(realized - 1) / (predicted - 1): the share of the predicted gain the app saw; None without a gain."""
    if realized is None or predicted is None or predicted - 1.0 < MIN_PREDICTED_GAIN:
        return None
    return (realized - 1.0) / (predicted - 1.0)


@dataclass
class KernelEvidence:
    kernel: str
    demangled: str
    rule: str
    description: str
    predicted: Optional[float]
    original_ns: Optional[float]
    tuned_ns: Optional[float]
    matched: int
    applied: int
    fell_back: int
    checked: int
    #: what timed original_ns and tuned_ns: "events" (libapply's in-app timer), "ncu", or "" (nothing did)
    timer: str = "events"

    @property
    def realized(self) -> Optional[float]:
        if self.original_ns and self.tuned_ns:
            return self.original_ns / self.tuned_ns
        return None

    @property
    def gain_ratio(self) -> Optional[float]:
        return gain_ratio(self.predicted, self.realized)


@dataclass
class ApplyReport:
    kernels: List[KernelEvidence]
    wall_original_s: Optional[float]
    wall_applied_s: Optional[float]
    app_ok: bool
    returncodes: Dict[str, List[int]]
    warnings: List[str] = field(default_factory=list)
    check_failed: str = ""
    notes: Dict[str, List[str]] = field(default_factory=dict)
    workdir: str = ""
    #: timed launches the hold watchdog released (not timed; native/apply/timing.c)
    holds_broken: int = 0

    @property
    def wall_speedup(self) -> Optional[float]:
        if self.wall_original_s and self.wall_applied_s:
            return self.wall_original_s / self.wall_applied_s
        return None

    @property
    def kernels_applied(self) -> int:
        return len({k.kernel for k in self.kernels if k.applied > 0})

    def campaign(self) -> Dict[str, Any]:
        """The corpus campaign's record (docs/corpus.json "apply")."""
        return {
            "kernels_applied": self.kernels_applied, "app_ok": self.app_ok, "wall_speedup": self.wall_speedup,
            "kernels": [{"kernel": k.demangled or k.kernel, "predicted": k.predicted, "realized": k.realized}
                        for k in self.kernels],
        }

    def to_json(self) -> Dict[str, Any]:
        return {
            **self.campaign(),
            "wall_original_s": self.wall_original_s, "wall_applied_s": self.wall_applied_s,
            "returncodes": self.returncodes, "warnings": self.warnings, "check_failed": self.check_failed,
            "notes": self.notes, "workdir": self.workdir, "holds_broken": self.holds_broken,
            "entries": [{**k.__dict__, "realized": k.realized, "gain_ratio": k.gain_ratio} for k in self.kernels],
        }

    def lines(self) -> List[str]:
        def x(v: Optional[float]) -> str:
            return f"{v:.3f}x" if v else "-"

        def us(v: Optional[float]) -> str:
            return f"{v / 1000:.2f} us" if v else "-"

        out = []
        for k in self.kernels:
            name = (k.demangled or k.kernel).split("(")[0]
            out.append(f"apply {name}: {k.description}")
            g = f", {100 * k.gain_ratio:.0f}% of the predicted gain" if k.gain_ratio is not None else ""
            timer = " (ncu)" if k.timer == "ncu" else ""
            out.append(f"  launches matched {k.matched}, applied {k.applied}, fell back {k.fell_back}"
                       f"{f', checked {k.checked}' if k.checked else ''}; in-app{timer} {us(k.original_ns)} -> {us(k.tuned_ns)}: "
                       f"realized {x(k.realized)}, predicted {x(k.predicted)}{g}")
            if k.applied and not k.timer:
                out.append("  not timed: its launches run inside a CUDA graph, which the in-app timer cannot see "
                           "(--timer ncu times them with Nsight Compute)")
            if k.matched == 0:
                out.append("  no launch matched: the app did not launch this instance"
                           + (" (--rule scaled applies it to other problem sizes)" if k.rule == "exact" else ""))
        for kernel, ns in self.notes.items():
            out += [f"  note ({kernel.split('(')[0]}): {n}" for n in ns]
        wo, wa = self.wall_original_s, self.wall_applied_s
        out.append(f"apply wall: {wo:.3f} s -> {wa:.3f} s ({x(self.wall_speedup)}); app "
                   f"{'ok' if self.app_ok else 'FAILED'} (exit {self.returncodes})" if wo and wa else
                   f"apply wall: -; app {'ok' if self.app_ok else 'FAILED'} (exit {self.returncodes})")
        if self.check_failed:
            out.append(f"apply --check FAILED: {self.check_failed}")
        out += [f"warning: {w}" for w in dict.fromkeys(self.warnings)]
        if self.workdir:
            out.append(f"results: {self.workdir} (apply.json, manifest.txt, the cubins, the statistics of each run)")
        return out


def _median(xs: List[float]) -> Optional[float]:
    return float(statistics.median(xs)) if xs else None


def _shapes(e: Entry) -> tuple:
    """(original, tuned) (grid, block) of an exact entry's launches, for picking its rows out of ncu's; None for
    the scaled rule (its launches have many grids)."""
    if e.rule != "exact":
        return None, None
    return (tuple(e.rec_grid), tuple(e.rec_block)), (tuple(e.tuned.grid), tuple(e.tuned.block))


def _in_app(rounds: List[Dict[str, RunStats]]) -> List[Dict[str, RunStats]]:
    """The rounds timed by libapply's in-app timer (a round's two runs share their timer)."""
    return [r for r in rounds if r["observe"].timer == "events"]


def entry_times(e: Entry, i: int, rounds: List[Dict[str, RunStats]]) -> tuple:
    """(original ns, tuned ns, timer) of entry i: the in-app timer's medians, else ncu's, else none."""
    ev = _in_app(rounds)
    orig = [s for r in ev for s in r["observe"].entries.get(i, _EMPTY).samples]
    tuned = [s for r in ev for s in r["apply"].entries.get(i, _EMPTY).samples]
    if orig and tuned:
        return _median(orig), _median(tuned), "events"
    nc = [r for r in rounds if r["observe"].timer == "ncu"]
    rec, new = _shapes(e)
    # a checked launch runs the original and the tuned kernel one after the other: skip both of each
    o = [s for r in nc for s in ncutimer.samples(r["observe"].ncu_rows, e.kernel, rec)]
    t = [s for r in nc for s in ncutimer.samples(r["apply"].ncu_rows, e.kernel, new,
                                                 skip=2 * r["apply"].entries.get(i, _EMPTY).checked)]
    if o and t:
        return _median(o), _median(t), "ncu"
    return _median(orig), _median(tuned), "events" if orig or tuned else ""


def build_report(entries: List[Entry], rounds: List[Dict[str, RunStats]], notes: Dict[str, List[str]]) -> ApplyReport:
    kernels = []
    for i, e in enumerate(entries):
        ap = [r["apply"].entries.get(i, _EMPTY) for r in (_in_app(rounds) or rounds)]
        orig_ns, tuned_ns, timer = entry_times(e, i, rounds)
        matched, applied = sum(a.matched for a in ap), sum(a.applied for a in ap)
        rec, new = _shapes(e)
        if not applied and timer == "ncu" and rec != new:
            # runs under ncu alone: ncu launches a graph's nodes itself, past libapply's counters; where the tuned
            # launch shape differs from the recorded one, the launches ncu timed in that shape are the count
            applied = len([s for r in rounds if r["apply"].timer == "ncu"
                           for s in ncutimer.samples(r["apply"].ncu_rows, e.kernel, new)])
            matched = max(matched, applied)
        kernels.append(KernelEvidence(
            kernel=e.kernel, demangled=e.demangled, rule=e.rule, description=e.description, predicted=e.expected_speedup,
            original_ns=orig_ns, tuned_ns=tuned_ns, matched=matched, applied=applied,
            fell_back=sum(a.fell_back for a in ap), checked=sum(a.checked for a in ap), timer=timer))
    rcs = {m: [r[m].returncode for r in rounds] for m in ("observe", "apply")}
    check_failed = next((r["apply"].check_failed for r in rounds if r["apply"].check_failed), "")
    ok = all(c == 0 for c in rcs["observe"] + rcs["apply"]) and not check_failed
    warnings = [w for r in rounds for m in ("observe", "apply") for w in r[m].warnings]
    if any(c == CHECK_EXIT for c in rcs["apply"]) and not check_failed:
        check_failed = "the app exited with libapply's check status (see the warnings)"
    walled = _in_app(rounds)  # a run under ncu (kernels serialized, each profiled) is no wall time: none then
    return ApplyReport(
        kernels=kernels, wall_original_s=_median([r["observe"].wall_s for r in walled]),
        wall_applied_s=_median([r["apply"].wall_s for r in walled]), app_ok=ok, returncodes=rcs,
        warnings=warnings, check_failed=check_failed, notes={k: v for k, v in notes.items() if v},
        holds_broken=sum(r[m].holds_broken for r in rounds for m in ("observe", "apply")))


class _Empty:
    samples: List[int] = []
    matched = applied = fell_back = checked = 0


_EMPTY = _Empty()


def write_report(rep: ApplyReport, workdir: Path) -> Path:
    p = workdir / "apply.json"
    p.write_text(json.dumps(rep.to_json(), indent=2, default=str) + "\n")
    (workdir / "apply.txt").write_text("\n".join(rep.lines()) + "\n")
    return p


def track(rep: ApplyReport, wisdom, argv: List[str], workdir: Path, uri: Optional[str] = None,
          experiment: Optional[str] = None) -> str:
    """One MLflow run for this apply: under the sweep run the wisdom came from when known, else its own."""
    from mlflow import MlflowClient

    from mneme.track.store import resolve_uri
    from mneme.track.tracker import DEFAULT_EXPERIMENT

    u = resolve_uri(uri or next((k.provenance.tracking_uri for k in wisdom.kernels if k.provenance.tracking_uri), None))
    client = MlflowClient(u)
    parent = next((k.provenance.sweep_run_id for k in wisdom.kernels if k.provenance.sweep_run_id), None)
    if parent is None:  # a tune results directory: its sweep run, found by study name
        studies = {k.provenance.study for k in wisdom.kernels if k.provenance.study}
        for exp in client.search_experiments():
            for s in studies:
                runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`mneme.role` = 'sweep' and "
                                          f"tags.`mneme.study` = '{s}'", max_results=1)
                if runs:
                    parent = runs[0].info.run_id
                    break
            if parent:
                break
    if parent:
        exp_id = client.get_run(parent).info.experiment_id
    else:
        name = experiment or DEFAULT_EXPERIMENT
        e = client.get_experiment_by_name(name)
        exp_id = e.experiment_id if e else client.create_experiment(name)
    tags = {"mneme.role": "apply", "mneme.app": " ".join(argv)[:5000]}
    if parent:
        tags["mlflow.parentRunId"] = parent
    run = client.create_run(exp_id, tags=tags, run_name="apply")
    rid = run.info.run_id
    from mlflow.entities import Metric
    import time

    now = int(time.time() * 1000)
    metrics = [("app_ok", 1.0 if rep.app_ok else 0.0), ("kernels_applied", float(rep.kernels_applied))]
    if rep.wall_speedup:
        metrics += [("wall_speedup", rep.wall_speedup), ("wall_original_s", rep.wall_original_s),
                    ("wall_applied_s", rep.wall_applied_s)]
    for i, k in enumerate(rep.kernels):
        for key, v in (("realized", k.realized), ("predicted", k.predicted), ("original_ns", k.original_ns),
                       ("tuned_ns", k.tuned_ns), ("gain_ratio", k.gain_ratio)):
            if v is not None:
                metrics.append((f"k{i}.{key}", float(v)))
    client.log_batch(rid, metrics=[Metric(k, float(v), now, 0) for k, v in metrics])
    client.log_artifact(rid, str(write_report(rep, workdir)))
    client.log_artifact(rid, str(workdir / "apply.txt"))
    client.set_terminated(rid, "FINISHED" if rep.app_ok else "FAILED")
    return rid
