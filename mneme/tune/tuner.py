"""One tuning run: baseline first, then trials from the sampler through the executor, told back to the study.

The loop keeps the executor busy (up to `max_inflight` trials in flight) and talks to the study between
results. See mneme.tune.study for how several tuning processes share one study.
"""

from __future__ import annotations

import collections
import re
import sys
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, TextIO, Tuple

from mneme.config import ExperimentConfiguration, ExperimentResult
from mneme.errors import ConfigurationError, DeviceError, MnemeError
from mneme.tune import study as st
from mneme.tune.hooks import SafeHook
from mneme.tune.interrupt import InterruptGuard
from mneme.tune.objective import FAILURES, Objective, metric_ns, speedup, succeeded
from mneme.tune.options import (
    EXIT_ALL_FAILED, EXIT_BASELINE_FAILED, EXIT_INTERRUPTED, EXIT_NO_DEVICE, EXIT_OK, EXIT_USAGE, TuneOptions,
)
from mneme.tune.presets import ROUNDING_KNOBS, preset_space, uses_pipelines
from mneme.tune.samplers import EXHAUSTING, Proposer, make_optuna_sampler
from mneme.tune.session import A_BANNED_CODE, Ticket, TrialSession
from mneme.tune.space import SearchSpace, SpaceContext, build_user_space


@dataclass
class TuneOutcome:
    exit_code: int
    summary: Dict[str, Any] = field(default_factory=dict)
    out_dir: Optional[str] = None
    message: str = ""


def read_pipelines(passes: List[str], pipeline_file: Optional[str]) -> List[str]:
    """Custom pipelines: each --passes value, and each non-empty, non-comment line of --pipeline-file."""
    out = [p.strip() for p in passes or [] if p and p.strip()]
    if pipeline_file:
        path = Path(pipeline_file)
        if not path.is_file():
            raise ConfigurationError(f"--pipeline-file {pipeline_file}: no such file")
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                out.append(line)
    return list(dict.fromkeys(out))


def recorded_baseline(record_db: str, record_id: str, baseline: str = "app-build") -> ExperimentConfiguration:
    """The recorded launch compiled as the app was built, as the replay pipeline defines it (compiles nothing)."""
    return recorded_launch(record_db, record_id, baseline=baseline)[0]


def baseline_code(record_db: str, record_id: str, baseline: str = "app-build"):
    """Which code the baseline compiles (mneme.ir.appbuild.Baseline) for the record's instance."""
    from mneme.replay.pipeline import ReplayPipeline

    return ReplayPipeline(record_db, record_id, device_id=None, baseline=baseline).baseline


def recorded_launch(record_db: str, record_id: str, analyze: bool = False,
                    baseline: str = "app-build") -> Tuple[ExperimentConfiguration, Any, str]:
    """(baseline, LaunchFacts or None, why there are none): with `analyze`, the kernel's linked IR is read for
    the launch quantities its code depends on (mneme.ir.launchsafety)."""
    from mneme.replay.pipeline import ReplayPipeline

    rp = ReplayPipeline(record_db, record_id, device_id=None, baseline=baseline)
    if not analyze:
        return rp.baseline_config(), None, "not asked"
    from mneme.ir.launchsafety import analyze_launch

    try:
        return rp.baseline_config(), analyze_launch(rp.linked(), rp.kernel_name), ""
    except MnemeError as e:
        return rp.baseline_config(), None, f"the kernel's IR could not be analyzed ({e})"


def _slug(text: str, limit: int = 40) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:limit] or "kernel"


class Tuner:
    def __init__(self, options: TuneOptions, hook: Any = None, out: TextIO = sys.stdout):
        self.o = options
        self.hook = SafeHook(hook)
        self.out = out
        self.owner = st.new_owner()
        self.study = None
        self.executor = None
        self.baseline_ns: Optional[float] = None
        self.best_speedup: Optional[float] = None
        self.best_value: Optional[float] = None
        #: seconds of the baseline and of the search (first trial asked to last told), for the summary
        self.timing: Dict[str, float] = {}
        self._search_ended: Optional[float] = None

    # -- preparation (no GPU, no storage) ----------------------------------------------------------------
    def prepare(self) -> None:
        from mneme.record.db import RecordedExecution

        o = self.o
        o.validate()
        self.objective = Objective.of(o.objective, o.metric, o.sampler)
        self.record = RecordedExecution.from_json(o.record_db)
        self.instance = self.record.instance(o.record_id)
        self.baseline, facts, no_facts = recorded_launch(o.record_db, self.instance.dynamic_hash, analyze=True,
                                                         baseline=o.baseline)
        self.code = baseline_code(o.record_db, self.instance.dynamic_hash, o.baseline)
        self.pipelines = read_pipelines(o.passes, o.pipeline_file)
        if self.pipelines:
            from mneme.ir import parse_pipeline

            for p in self.pipelines:
                parse_pipeline(p)  # a typo fails here, naming the valid passes, not as N compile errors
        ctx = SpaceContext(self.baseline, self.record, self.instance, o.launch_safety, self.pipelines,
                           launch_facts=facts, code=self.code)
        self.space: SearchSpace = (
            build_user_space(o.space_module, ctx, o.space_args) if o.space_module else preset_space(o.space, ctx)
        )
        self.sampler = make_optuna_sampler(o.sampler, self.space, o.seed)
        self.proposer = Proposer(o.sampler, self.space, o.seed)
        kernel = self.record.demangled_name or self.record.kernel_name
        self.study_name = o.study or f"{_slug(kernel.split('(')[0])}-{self.instance.dynamic_hash[:12]}-{_slug(self.space.name, 24)}"
        self.out_dir = str(Path(o.output or Path("mneme-tune") / self.study_name))
        self.storage_url = st.storage_url(o.storage, self.out_dir)
        self.notes: List[str] = [f"baseline code: {n}" for n in self.code.notes]
        if facts is None:
            self.notes.append(f"no launch analysis: {no_facts}; launch candidates follow --launch-safety alone")
        if self.pipelines and not uses_pipelines(self.space):
            self.notes.append(f"space {self.space.name!r} does not search pipelines; --passes/--pipeline-file are ignored")
        rounding = [k for k in ROUNDING_KNOBS if k in self.space.dimensions()]
        if rounding and o.atol is None and o.rtol is None and not o.verification.get("float_rtol"):
            self.notes.append(
                f"the space searches {', '.join(rounding)}, whose results round differently from the recorded build; "
                "without a tolerance (--float-rtol, --rtol/--atol or the recording's annotations) those trials fail verification"
            )
        size = self.space.size()
        if o.sampler not in EXHAUSTING and size == size and size != float("inf") and size < o.trials:
            self.notes.append(
                f"the space has only {int(size)} points for {o.trials} trials; repeated configurations are answered "
                "from the study (consider --sampler exhaustive)"
            )

    def plan(self) -> Dict[str, Any]:
        o = self.o
        return {
            "study": self.study_name, "storage": st.redacted(self.storage_url), "output": self.out_dir,
            "record": {"db": o.record_db, "kernel": self.record.demangled_name or self.record.kernel_name,
                       "static_hash": self.record.static_hash, "dynamic_hash": self.instance.dynamic_hash},
            "baseline": self.baseline.to_dict(), "baseline_code": self.code.to_dict(),
            "space": self.space.describe(), "sampler": o.sampler,
            "objective": self.objective.describe(), "trials": o.trials,
            "devices": "all visible" if o.devices is None else (o.devices or "none (compile only)"),
            "compile_jobs": o.compile_jobs or "CPU count", "notes": self.notes,
        }

    # -- the run -----------------------------------------------------------------------------------------
    def run(self) -> TuneOutcome:
        from mneme.tune.executor import AsyncReplayExecutor

        o = self.o
        self.prepare()
        if o.derived:  # a definition that names no argument of this kernel fails before any work
            from mneme.tune.derived import check, parse_all, scalar_args

            check(parse_all(o.derived), scalar_args(o.record_db, self.instance.dynamic_hash))
        for note in self.notes:
            print(f"mneme tune: note: {note}", file=sys.stderr)
        if o.devices is None:  # before the study exists: a machine without GPUs leaves no empty study behind
            from mneme.tune.executor import visible_devices

            o.devices = visible_devices()
            if not o.devices:
                return self._finish(EXIT_NO_DEVICE, "no GPU is visible (no driver or no device); "
                                    "use --devices none to tune compile-only (--objective registers or size)")
        storage = st.open_storage(self.storage_url)
        fingerprints = {
            "record": st.record_fingerprint(self.record, self.instance),
            "space": self.space.fingerprint(),
            "objective": st.fingerprint_of(self.objective.describe()),
        }
        self.study, resumed = st.open_study(storage, self.study_name, self.objective.directions, self.sampler,
                                            fingerprints, o.resume, self.objective.labels)
        if not resumed:
            self._describe_study(fingerprints)
        else:  # the summary names the options of the latest run (sampler, trials, ...), not the first run's
            self.study.set_user_attr(st.A_OPTIONS, self._options_attr())
        self.space.banned.update(self.study.user_attrs.get(st.A_BANNED) or [])
        if hasattr(self.space, "banned_code"):
            self.space.banned_code.update(self.study.user_attrs.get(A_BANNED_CODE) or [])
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        self._heartbeat()
        code, message = EXIT_OK, ""
        try:
            self.executor = AsyncReplayExecutor(
                o.record_db, self.instance.dynamic_hash, devices=o.devices, compile_jobs=o.compile_jobs,
                settings=o.settings(), cache_dir=o.cache_dir or str(Path(self.out_dir) / "cache"),
                log_dir=str(Path(self.out_dir) / "logs"), backend=o.backend, compile_timeout=o.compile_timeout,
                run_timeout=o.run_timeout,
            )
        except DeviceError as e:
            return self._finish(EXIT_NO_DEVICE, str(e))
        self.hook("on_start", {**self.plan(), "resumed": resumed, "directions": self.objective.directions,
                               "options": {**o.to_dict(), "storage": st.redacted(o.storage) if o.storage else None}})
        self.guard = InterruptGuard()
        try:
            with self.guard.installed():
                t0 = time.perf_counter()
                baseline_ok = self._measure_baseline(resumed)
                self.timing = {"baseline_s": time.perf_counter() - t0}
                if not baseline_ok:
                    code, message = self._baseline_failure()
                elif not o.baseline_only:
                    t1, busy0 = time.perf_counter(), self._gpu_busy_s()
                    self._search()
                    self._search_ended = time.perf_counter()
                    self.timing["search_s"] = self._search_ended - t1
                    self._gpu_busy(self._gpu_busy_s() - busy0)
                    self.hook("on_search_end", {"search_s": self.timing["search_s"], "trials": o.trials})
                    if o.attribute and not self.objective.device_less:
                        t2 = time.perf_counter()
                        self._attribute()
                        self.timing["attribution_s"] = time.perf_counter() - t2
        except BaseException as e:  # interrupted, or a failure: stop the workers, give the trials back, say so
            self.executor.shutdown(wait=False, cancel_futures=True)
            self._abandon_pending()
            self.exec_stats = self.executor.stats()
            if not isinstance(e, KeyboardInterrupt):
                self._finish(EXIT_USAGE if isinstance(e, MnemeError) else 1, f"{type(e).__name__}: {e}", self._results())
                raise
            return self._finish(EXIT_INTERRUPTED, "interrupted; resume with --resume", self._results())
        self.executor.shutdown(wait=True)
        self.exec_stats = self.executor.stats()
        summary = self._results()
        if code == EXIT_OK and not o.baseline_only and o.trials > 0 and summary["trials"]["succeeded"] == 0:
            code, message = EXIT_ALL_FAILED, "every trial failed"
        return self._finish(code, message, summary)

    def _gpu_busy_s(self) -> float:
        """The executor's GPU busy seconds so far (0 for an executor that does not count them)."""
        fn = getattr(self.executor, "gpu_busy_s", None)
        return float(fn()) if callable(fn) else 0.0

    def _gpu_busy(self, busy_s: float) -> None:
        """The GPU workers' share of the search's wall time (loading, resets, timing and verification of
        trials: what the GPU side did; compile-bound searches stay far below 1)."""
        gpus = len(getattr(self.executor, "devices", None) or [])
        if gpus and busy_s > 0 and self.timing.get("search_s"):
            self.timing["gpu_busy"] = round(busy_s / (self.timing["search_s"] * gpus), 4)

    def _baseline_failure(self) -> Tuple[int, str]:
        errors = self.executor.worker_errors()
        if errors and all(w["state"] == "broken" for w in self.executor.stats()["workers"] if w["role"] == "gpu"):
            return EXIT_NO_DEVICE, "no GPU worker could start: " + "; ".join(errors)
        return EXIT_BASELINE_FAILED, "the baseline (recorded configuration) failed; nothing to tune against"

    def _results(self) -> Dict[str, Any]:
        from mneme.tune.report import write_results

        try:
            return write_results(self.study, self.out_dir)
        except Exception as e:  # noqa: BLE001 - the storage may be what failed; the original error matters more
            print(f"mneme tune: could not write the results directory: {e}", file=sys.stderr)
            return {}

    def _finish(self, code: int, message: str, summary: Optional[Dict[str, Any]] = None) -> TuneOutcome:
        summary = summary or {}
        summary.setdefault("out_dir", self.out_dir)
        summary["exit_code"] = code
        summary["message"] = message
        if getattr(self, "exec_stats", None):
            summary["executor"] = {k: v for k, v in self.exec_stats.items() if k != "workers"}
        t = time.perf_counter()
        self.hook("on_end", summary)  # tracking writes its last runs here
        if "search_s" in self.timing:
            # finish_s: from the last trial until everything is written (workers stopped, results directory,
            # tracking closed); tracking_close_s is on_end's share of it
            now = time.perf_counter()
            timing = dict(self.timing, tracking_close_s=now - t, finish_s=now - (self._search_ended or t))
            spent = timing["search_s"] + timing["finish_s"]
            timing["trials_per_s"] = (summary.get("trials") or {}).get("counted", 0) / spent if spent > 0 else 0.0
            summary["timing"] = timing
            if "gpu_busy" in timing:
                summary["gpu_busy"] = timing["gpu_busy"]
        return TuneOutcome(code, summary, self.out_dir, message)

    def _options_attr(self) -> Dict[str, Any]:
        return {**self.o.to_dict(), "record_db": str(Path(self.o.record_db).resolve()),
                "storage": st.redacted(self.o.storage) if self.o.storage else None}

    def _describe_study(self, fingerprints: Dict[str, str]) -> None:
        rec = self.record
        spec_args = [rec.arg_names[i] for i in self.instance.available_specializations if i < len(rec.arg_names)]
        attrs = {
            st.A_FINGERPRINTS: fingerprints,
            st.A_OPTIONS: self._options_attr(),
            st.A_RECORD: {"kernel": rec.kernel_name, "demangled": rec.demangled_name, "static_hash": rec.static_hash,
                          "dynamic_hash": self.instance.dynamic_hash, "specializable_args": spec_args},
            st.A_SPACE: self.space.describe(),
        }
        for k, v in attrs.items():
            self.study.set_user_attr(k, v)

    def _heartbeat(self) -> None:
        self.study.set_user_attr(st.A_HEARTBEAT + self.owner, time.time())

    # -- baseline ----------------------------------------------------------------------------------------
    def _measure_baseline(self, resumed: bool) -> bool:
        stored = self.study.user_attrs.get(st.A_BASELINE) if resumed else None
        if stored and stored.get("result"):
            result = ExperimentResult.from_dict(stored["result"])
            print(f"mneme tune: baseline from the study: {result.status}", file=sys.stderr)
        else:
            result = self.executor.evaluate(self.baseline)
            self.study.set_user_attr(st.A_BASELINE, {
                "config": self.baseline.to_dict(), "result": result.to_dict(), "code": self.code.to_dict(),
                "metric_ns": metric_ns(result.exec_time, self.o.metric) if succeeded(result, False) else None,
            })
        ok = succeeded(result, self.objective.device_less)
        self.baseline_ns = metric_ns(result.exec_time, self.o.metric) if ok and not self.objective.device_less else None
        self.hook("on_baseline", self.baseline, result, self.baseline_ns)
        if not ok:
            print(f"mneme tune: baseline failed ({result.status}): {result.error}", file=sys.stderr)
        return ok

    # -- the search --------------------------------------------------------------------------------------
    def _max_inflight(self) -> int:
        if self.o.max_inflight:
            return max(1, self.o.max_inflight)
        ex = self.executor
        return max(4, ex.compile_jobs + 2 * len(ex.devices)) if ex.devices else max(4, 2 * ex.compile_jobs)

    def _progress(self, initial: int):
        from tqdm import tqdm

        return tqdm(total=self.o.trials, initial=min(initial, self.o.trials), unit="trial", desc=self.study_name[:30],
                    disable=not self.o.progress, file=sys.stderr, dynamic_ncols=True, mininterval=0.5)

    def _search(self) -> None:
        """Keep up to max_inflight trials in the executor until the study holds --trials of them."""
        o = self.o
        self.statuses: collections.Counter = collections.Counter()
        session = self.session = TrialSession(
            self.study, self.space, self.proposer, self.objective, o.trials, owner=self.owner,
            stale_after=o.stale_after, sampler=self.sampler, on_answer=self._on_answer, guard=self.guard,
        )
        session.baseline_ns = self.baseline_ns
        session.reap()
        limit = self._max_inflight()
        inflight: Dict[Any, Ticket] = {}
        self.bar = self._progress(session.counted_at_start)
        try:
            while True:
                session.heartbeat()
                # tell what has finished before asking more: the sampler learns from it, and a new trial that
                # repeats a finished configuration is answered at once instead of waiting on it
                for fut in [f for f in inflight if f.done()]:
                    session.answer(inflight.pop(fut), fut.result())
                if len(inflight) < limit and not session.exhausted:
                    need = min(limit - len(inflight), session.remaining())
                    if need > 0:
                        for t in session.ask(need):
                            inflight[self.executor.submit(t.config)] = t
                        continue
                if not inflight:
                    run, done = session.poll()
                    for t in run:
                        inflight[self.executor.submit(t.config)] = t
                    if done:
                        break
                    if not run:
                        time.sleep(0.5)
                    continue
                wait(list(inflight), timeout=1.0, return_when=FIRST_COMPLETED)  # told at the top of the loop
        finally:
            self.bar.close()

    def _attribute(self) -> None:
        """Measure the best configuration without each knob it changed (mneme.tune.attribution)."""
        from mneme.tune.attribution import A_ATTRIBUTION, attribute
        from mneme.tune.report import load_report

        best = load_report(self.study).best()
        if best is None or best.config is None or not best.result or not best.result.exec_time:
            return
        best_ns = metric_ns(best.result.exec_time, self.o.metric)
        att = attribute(self.executor.evaluate, best.config, best_ns, self.baseline, self.baseline_ns,
                        lambda r: metric_ns(r.exec_time, self.o.metric) if r.exec_time else None)
        att["trial"] = best.number
        self.study.set_user_attr(A_ATTRIBUTION, att)

    def _on_answer(self, t: Ticket, result: ExperimentResult, values: Optional[List[float]]) -> None:
        self.statuses[result.status] += 1
        sp = speedup(self.baseline_ns, result, self.o.metric)
        if sp is not None and (self.best_speedup is None or sp > self.best_speedup):
            self.best_speedup = sp
        if values is not None and self.objective.device_less and (self.best_value is None or values[0] < self.best_value):
            self.best_value = values[0]
        self.hook("on_trial", {
            "number": t.number, "status": result.status, "config": t.config, "result": result, "values": values,
            "speedup": sp, "duplicate_of": t.original, "params": t.params,
        })
        post: Dict[str, Any] = {}
        if self.best_speedup is not None:
            post["best"] = f"{self.best_speedup:.3f}x"
        elif self.best_value is not None:
            post["best"] = f"{self.best_value:g}"
        ok = sum(v for k, v in self.statuses.items() if k not in FAILURES)
        post["ok"], post["failed"] = ok, sum(self.statuses.values()) - ok
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def _abandon_pending(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session.abandon()


def run_tune(options: TuneOptions, hook: Any = None) -> TuneOutcome:
    """The Python entry point of `mneme tune` (also used by the Hydra app)."""
    return Tuner(options, hook).run()
