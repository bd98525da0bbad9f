"""A Hydra sweeper on Optuna >= 4 through ask/tell, reading its search space from the composed config.

The space is mneme.tune's: the preset or user space named by `search_space.*`, plus dimensions written
in Hydra's sweep syntax on replay keys, from `search_space.params` or the command line
(`replay.codegen_opt=range(0,4)`, `replay.block.x=choice(64,128)`, `interval(a,b)`, `tag(log, ...)`).
Sweeps over other keys (`record.db=a.json,b.json`, `sampler=tpe,random`, `search_space=launch,compiler`)
keep Hydra's meaning: one study per combination.

A study asks a batch of trials, tells back at once the samples that break the space's constraints (no
GPU time spent), hands the rest to the launcher as jobs whose overrides set the whole replay
configuration, and tells Optuna what the jobs return. The baseline (the recorded launch at default<O3>,
with the user's replay overrides) runs first. The study lives in Optuna storage (`study.storage`,
default: SQLite beside the sweep directories), which makes `study.resume=true` continue it; the same
user attributes as `mneme tune` are kept, so its results directory is written the same way.
"""


import itertools
import logging
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from mneme.config import ExperimentConfiguration, ExperimentResult
from mneme.errors import ConfigurationError, MnemeError
from mneme.tune.params import BaseParam, CategoricalParam, FixedParam, IntRangeParam, RealRangeParam
from mneme.tune.space import SearchSpace

log = logging.getLogger(__name__)

#: study user attribute holding the MLflow parent run of the study (so a resumed study logs under it)
A_MLFLOW_RUN = "mneme.mlflow_run_id"
#: the claim owner of trials this sweeper asked (one sweep process per study at a time)
OWNER = "hydra-sweeper"


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.mneme_plugins.optuna_sweeper.MnemeOptunaSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="mneme_optuna", node=OptunaSweeperConf, provider="mneme")


# -- the space ---------------------------------------------------------------------------------------------
def param_from_override(override: Override) -> BaseParam:
    """A tune parameter named by the override's key from Hydra's sweep syntax."""
    key = override.get_key_element()
    sweep = override._value
    if isinstance(sweep, ChoiceSweep):
        values = list(sweep.list)
        return CategoricalParam(key, values) if len(values) > 1 else FixedParam(key, values[0])
    if isinstance(sweep, RangeSweep):
        start, stop, step = sweep.start, sweep.stop, sweep.step or 1
        if all(float(v).is_integer() for v in (start, stop, step)):
            return IntRangeParam(key, int(start), int(stop) - int(step), int(step))  # range() excludes stop
        values = list(override.sweep_iterator())
        return CategoricalParam(key, values)
    if isinstance(sweep, IntervalSweep):
        if "int" in sweep.tags:
            return IntRangeParam(key, int(sweep.start), int(sweep.end))
        return RealRangeParam(key, float(sweep.start), float(sweep.end), log="log" in sweep.tags)
    raise ConfigurationError(f"{override.input_line}: {type(sweep).__name__} cannot be a search dimension")


def set_replay_field(config: ExperimentConfiguration, key: str, value: Any) -> ExperimentConfiguration:
    """`replay.block.x` = value on a configuration."""
    parts = key.split(".")
    if parts[0] != "replay" or len(parts) < 2:
        raise ConfigurationError(f"search dimension {key!r}: only replay.* keys can be searched per trial")
    data = config.to_dict()
    node = data
    for p in parts[1:-1]:
        if p not in node or not isinstance(node[p], dict):
            raise ConfigurationError(f"search dimension {key!r}: replay has no {p!r}; valid: {sorted(data)}")
        node = node[p]
    if parts[-1] not in node:
        raise ConfigurationError(f"search dimension {key!r}: no field {parts[-1]!r}; valid: {sorted(node)}")
    node[parts[-1]] = value
    return ExperimentConfiguration.from_dict(data)


class OverrideSpace(SearchSpace):
    """A mneme.tune space (or none) plus dimensions on replay keys, applied after the space's own."""

    def __init__(self, base: Optional[SearchSpace], extra: Dict[str, BaseParam], baseline: ExperimentConfiguration):
        super().__init__()
        self.base = base
        self.extra = extra
        self.baseline = baseline
        names = [base.name] if base is not None else []
        self.name = "+".join(names + (["params"] if extra else [])) or "params"
        if base is not None:
            clash = sorted(set(base.dimensions()) & set(extra))
            if clash:
                raise ConfigurationError(f"search dimensions {clash} are given twice (by space {base.name!r} and as params)")

    def dimensions(self) -> Dict[str, BaseParam]:
        dims = dict(self.base.dimensions()) if self.base is not None else {}
        dims.update(self.extra)
        return dims

    def _split(self, params: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        return ({k: v for k, v in params.items() if k not in self.extra},
                {k: v for k, v in params.items() if k in self.extra})

    def derived(self, params: Dict[str, Any]) -> ExperimentConfiguration:
        own, extra = self._split(params)
        config = self.base.derived(own) if self.base is not None else replace(self.baseline)
        for key, value in extra.items():
            config = set_replay_field(config, key, value)
        return config.ground()

    def constraints(self, params: Dict[str, Any]):
        return self.base.constraints(self._split(params)[0]) if self.base is not None else True

    def extra_description(self) -> Dict[str, Any]:
        desc = dict(self.base.extra_description()) if self.base is not None else {"baseline": self.baseline.to_dict()}
        desc["params"] = {k: p.domain() for k, p in self.extra.items()}
        return desc


def _slug(text: str, limit: int = 40) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:limit] or "kernel"


# -- the sweeper -------------------------------------------------------------------------------------------
class MnemeOptunaSweeper(Sweeper):
    def __init__(self) -> None:
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.launcher = None
        self.job_idx = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def _parse(self, arguments: List[str]) -> Tuple[List[str], List[Override], List[List[str]]]:
        """(fixed overrides, replay dimensions, outer combinations: one study each)."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        fixed, dims, outer = [], [], []
        for o in parser.parse_overrides(arguments):
            key = o.get_key_element()
            if not o.is_sweep_override():
                fixed.append(o.input_line)
            elif key.startswith("replay."):
                dims.append(o)
            elif o.is_discrete_sweep():
                outer.append([f"{key}={v}" for v in o.sweep_string_iterator()])
            else:
                raise ConfigurationError(f"{o.input_line}: only replay.* keys can be searched; sweep {key} with a list")
        return fixed, dims, [list(c) for c in itertools.product(*outer)] if outer else [[]]

    def sweep(self, arguments: List[str]) -> Any:
        from mneme.track import session
        from mneme.track.records import FAILED, KILLED

        assert self.config is not None
        fixed, dims, combos = self._parse(arguments)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        # the MLflow store is checked before any job (and so any GPU work) starts; its writer starts up
        # while the studies are set up
        sess = session.get(self.config.tracking, self.config.name, multirun=True).start()
        returns: List[Sequence[JobReturn]] = []
        status = None
        try:
            for combo in combos:
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, fixed + combo)
                returns += StudyRun(self, cfg, fixed + combo, dims, combo if len(combos) > 1 else []).run()
        except KeyboardInterrupt:
            status = KILLED
            raise
        except BaseException:
            status = FAILED
            raise
        finally:
            stop = getattr(self.launcher, "shutdown", None)
            if stop is not None:
                stop(cancel=status is not None)
            if status is not None:
                sess.close(status)
        return returns

    def launch(self, batch: List[List[str]]) -> Sequence[JobReturn]:
        from mneme.track import session

        session.current().open()  # before the first job: a store that cannot be used fails here
        rets = self.launcher.launch(batch, initial_job_idx=self.job_idx)
        self.job_idx += len(batch)
        return rets


@dataclass
class Ticket:
    trial: Any
    params: Dict[str, Any]
    config: ExperimentConfiguration
    config_hash: str


def job_result(ret: JobReturn, config: ExperimentConfiguration) -> ExperimentResult:
    """The ExperimentResult a job returned; a job that raised is a runtime_error carrying the exception."""
    from mneme.tune.executor import failed_result

    if ret.status == JobStatus.COMPLETED and isinstance(ret.return_value, dict) and "result" in ret.return_value:
        return ExperimentResult.from_dict(ret.return_value["result"])
    return failed_result(config, "runtime_error", f"the job failed: {ret._return_value!r}")


class StudyRun:
    """One Optuna study: the composed config of its combination, its space, sampler and objective."""

    def __init__(self, sweeper: MnemeOptunaSweeper, cfg: DictConfig, overrides: List[str], dims: List[Override],
                 combo: Sequence[str] = ()):
        from mneme.track import app, schema
        from mneme.tune import study as st
        from mneme.tune.objective import Objective
        from mneme.tune.presets import preset_space
        from mneme.tune.samplers import Proposer, make_optuna_sampler
        from mneme.tune.space import SpaceContext, build_user_space
        from mneme.tune.tuner import read_pipelines, recorded_launch

        self.sweeper = sweeper
        self.cfg = cfg
        # replay.* values are carried by each job's full configuration; the rest goes to every job
        self.fixed = [o for o in overrides if not o.lstrip("+~").startswith("replay.")]
        self.opts = schema.tune_options(cfg)
        self.opts.validate()
        self.device_less = app.compile_only(cfg)
        if self.device_less and self.opts.objective in ("time", "speedup"):
            raise ConfigurationError(
                f"study.objective={self.opts.objective} needs a GPU; compile-only sweeps rank by study.objective=registers or size"
            )
        self.objective = Objective.of(self.opts.objective, self.opts.metric, self.opts.sampler)
        self.target = app.target(cfg)
        self.base = schema.configuration(cfg.replay, self.target.baseline)
        facts = recorded_launch(self.target.db, self.target.instance.dynamic_hash, analyze=True,
                                baseline=self.target.baseline_kind)[1]
        ctx = SpaceContext(self.base, self.target.record, self.target.instance, self.opts.launch_safety,
                           read_pipelines(self.opts.passes, self.opts.pipeline_file), launch_facts=facts,
                           code=self.target.code)
        name = cfg.search_space.name
        preset = None
        if self.opts.space_module:
            preset = build_user_space(self.opts.space_module, ctx, self.opts.space_args)
        elif name != "params":
            preset = preset_space(name, ctx)
        parser = OverridesParser.create()
        extra_text = OmegaConf.to_container(cfg.search_space.params) or {}
        overrides_in_config = parser.parse_overrides([f"{k}={v}" for k, v in extra_text.items()])
        extra = {o.get_key_element(): param_from_override(o) for o in [*overrides_in_config, *dims]}
        for key in extra:
            replay_value(self.base, key)  # a key that is no replay field fails here, before any job
        if preset is None and not extra:
            raise ConfigurationError("search_space=params needs search_space.params or replay.* sweeps on the command line")
        self.space = OverrideSpace(preset, extra, self.base)
        self.sampler = make_optuna_sampler(self.opts.sampler, self.space, self.opts.seed)
        self.proposer = Proposer(self.opts.sampler, self.space, self.opts.seed)
        kernel = self.target.kernel
        self.name = self.opts.study or f"{_slug(kernel.split('(')[0])}-{self.target.instance.dynamic_hash[:12]}-{_slug(self.space.name, 24)}"
        if combo:  # one study per combination of the outer sweep, each with a name of its own
            self.name += "-" + _slug("-".join(o.split("=", 1)[1] for o in combo), 60)
        sweep_dir = Path(str(sweeper.config.hydra.sweep.dir))
        # absolute: the sweep's last lines name it for the user (and optimization_results.yaml records it), and a
        # path relative to where mneme started means nothing from another directory or to a job run with chdir
        self.out_dir = (sweep_dir / "results" / self.name).resolve()
        # beside the timestamped sweep directories, so study.resume=true finds the study without study.storage
        self.storage_url = (st.storage_url(self.opts.storage, str(sweep_dir)) if self.opts.storage
                            else st.default_storage(sweep_dir.parent, "studies"))
        self.st = st

    # -- study --------------------------------------------------------------------------------------------
    def open(self) -> None:
        st = self.st
        storage = st.open_storage(self.storage_url)
        fingerprints = {
            "record": st.record_fingerprint(self.target.record, self.target.instance),
            "space": self.space.fingerprint(),
            "objective": st.fingerprint_of(self.objective.describe()),
        }
        try:
            self.study, self.resumed = st.open_study(storage, self.name, self.objective.directions, self.sampler,
                                                     fingerprints, self.opts.resume, self.objective.labels)
        except ConfigurationError as e:
            raise ConfigurationError(hydra_terms(str(e))) from None
        if not self.resumed:
            rec = self.target.record
            for k, v in {
                st.A_FINGERPRINTS: fingerprints,
                st.A_OPTIONS: {**self.opts.to_dict(), "record_db": self.target.db},
                st.A_RECORD: {"kernel": rec.kernel_name, "demangled": rec.demangled_name, "static_hash": rec.static_hash,
                              "dynamic_hash": self.target.instance.dynamic_hash},
                st.A_SPACE: self.space.describe(),
            }.items():
                self.study.set_user_attr(k, v)
        self.space.banned.update(self.study.user_attrs.get(st.A_BANNED) or [])
        self._requeue_unfinished()

    def _requeue_unfinished(self) -> None:
        """Trials left RUNNING by an interrupted sweep: failed, flagged, and their parameters asked again."""
        from optuna.trial import TrialState

        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if self.st.claim(t).get("owner") != OWNER:
                continue  # a `mneme tune` process sharing the study looks after its own trials
            self.study._storage.set_trial_user_attr(t._trial_id, self.st.T_FLAG, "retried")
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            self.study.enqueue_trial(dict(t.params))
            log.info(f"trial {t.number} was left unfinished by an interrupted sweep; its parameters are asked again")

    def _track(self) -> None:
        from mneme.track import session

        sess = session.current()
        if sess is None or not sess.enabled:
            return
        rec = self.target
        sweep = sess.begin_sweep(
            name=self.name, resume_run_id=self.study.user_attrs.get(A_MLFLOW_RUN),
            params={"space": self.space.name, "sampler": self.opts.sampler, "trials": self.opts.trials,
                    "objective": self.opts.objective, "metric": self.opts.metric, "seed": self.opts.seed,
                    "record_db": rec.db},
            tags={"mneme.study": self.name, "mneme.study_storage": self.storage_url, "mneme.kernel": rec.kernel,
                  "mneme.static_hash": rec.record.static_hash, "mneme.dynamic_hash": rec.instance.dynamic_hash,
                  "mneme.space": self.space.name, "mneme.sampler": self.opts.sampler,
                  "mneme.sweep_dir": str(self.sweeper.config.hydra.sweep.dir)},
            metric=self.opts.metric,
        )
        if sweep is not None:
            self.study.set_user_attr(A_MLFLOW_RUN, sweep.run_id)

    # -- jobs ---------------------------------------------------------------------------------------------
    def _job(self, config: ExperimentConfiguration, *tracking: str) -> List[str]:
        from mneme.track.schema import overrides_for

        return [*self.fixed, *overrides_for(config.grounded()), *tracking]

    def baseline(self) -> Tuple[Optional[float], Sequence[JobReturn]]:
        from mneme.tune.objective import metric_ns, succeeded

        st = self.st
        stored = self.study.user_attrs.get(st.A_BASELINE) if self.resumed else None
        rets: Sequence[JobReturn] = []
        if stored and stored.get("result"):
            result = ExperimentResult.from_dict(stored["result"])
        else:
            rets = self.sweeper.launch([self._job(self.base, "tracking.role=baseline", "tracking.trial=-1")])
            result = job_result(rets[0], self.base)
            ok = succeeded(result, False)
            self.study.set_user_attr(st.A_BASELINE, {
                "config": self.base.to_dict(), "result": result.to_dict(), "code": self.target.code.to_dict(),
                "metric_ns": metric_ns(result.exec_time, self.opts.metric) if ok else None,
            })
        self.baseline_result = result
        if not succeeded(result, self.device_less):
            raise MnemeError(
                f"the baseline (recorded configuration {self.base.hash()[:12]}) failed ({result.status}): "
                f"{result.error or 'no detail'}; nothing to tune against"
            )
        ns = None if self.device_less else metric_ns(result.exec_time, self.opts.metric)
        return ns, rets

    def ask(self, need: int, seen: set) -> Tuple[List[Ticket], bool]:
        """Up to `need` runnable trials; rejected samples are told back at once (no GPU time)."""
        from optuna.trial import TrialState

        from mneme.tune.space import MAX_REJECTIONS

        st = self.st
        tickets: List[Ticket] = []
        rejections = 0
        while len(tickets) < need:
            trial = self.proposer.next_trial(self.study, seen)
            if trial is None or getattr(self.sampler, "exhausted", False):
                if trial is not None:
                    trial.set_user_attr(st.T_FLAG, "surplus")
                    self.study.tell(trial, state=TrialState.FAIL)
                return tickets, True
            params = self.space.sample_optuna(trial)
            config, reasons = self.space.check(params)
            if reasons:
                trial.set_user_attr(st.T_FLAG, "rejected")
                trial.set_user_attr(st.T_RESULT, {"status": "invalid_config", "error": "; ".join(reasons), "reasons": reasons})
                self.study.tell(trial, state=TrialState.FAIL)
                rejections += 1
                if rejections >= MAX_REJECTIONS:
                    raise ConfigurationError(f"space {self.space.name!r}: {MAX_REJECTIONS} samples in a row broke its constraints")
                continue
            h = config.hash()
            trial.set_user_attr(st.T_CLAIM, {"owner": OWNER, "config_hash": h, "config": config.to_dict()})
            tickets.append(Ticket(trial, params, config, h))
        return tickets, False

    def tell(self, t: Ticket, result: ExperimentResult, baseline_ns: Optional[float], extra: Optional[Dict[str, Any]] = None) -> None:
        from optuna.trial import TrialState

        st = self.st
        values = self.objective.values(result, baseline_ns)
        self.study._storage.set_trial_user_attr(t.trial._trial_id, st.T_RESULT, {**result.to_dict(), **(extra or {})})
        if values is None:
            self.study.tell(t.trial, state=TrialState.FAIL)
        else:
            self.study.tell(t.trial, values=values)
        if result.status == "invalid_launch":
            key = self.space.ban(t.config)
            self.study.set_user_attr(st.A_BANNED, sorted(set(self.study.user_attrs.get(st.A_BANNED) or []) | {key}))

    def run(self) -> List[Sequence[JobReturn]]:
        from mneme.tune.samplers import params_key

        st = self.st
        self.open()
        self._track()
        baseline_ns, rets = self.baseline()
        returns = [rets] if rets else []
        n = self.opts.trials
        batch = self.cfg.study.batch_size or getattr(self.sweeper.launcher, "parallelism", lambda: os.cpu_count() or 4)()
        seen = {params_key(t.params) for t in self.study.get_trials(deepcopy=False)}
        exhausted = False
        pending: List[Ticket] = []
        try:
            while not exhausted:
                ledger = st.Ledger(self.study.get_trials(deepcopy=False))
                need = min(int(batch), n - len(ledger.counted))
                if need <= 0:
                    break
                tickets, exhausted = self.ask(need, seen)
                if not tickets:
                    break
                pending = list(tickets)
                run: List[Ticket] = []
                copies: List[Tuple[Ticket, Ticket]] = []  # (copy, the ticket whose job answers it)
                first: Dict[str, Ticket] = {}
                for t in tickets:
                    orig = ledger.original(t.config_hash, t.trial.number)
                    if t.config_hash == self.base.hash():
                        self.tell(t, self.baseline_result, baseline_ns, {"duplicate_of": "baseline"})
                        pending.remove(t)
                    elif orig is not None and st.T_RESULT in orig.user_attrs:
                        raw = {k: v for k, v in orig.user_attrs[st.T_RESULT].items() if k not in ("duplicate_of", "reasons")}
                        self.tell(t, ExperimentResult.from_dict(raw), baseline_ns, {"duplicate_of": orig.number})
                        pending.remove(t)
                    elif t.config_hash in first:
                        copies.append((t, first[t.config_hash]))
                    else:
                        first[t.config_hash] = t
                        run.append(t)
                if not run:
                    continue
                annotations = [f"tracking.baseline_ns={baseline_ns}"] if baseline_ns is not None else []
                rets = self.sweeper.launch([self._job(t.config, f"tracking.trial={t.trial.number}", *annotations)
                                            for t in run])
                results = {}
                for t, ret in zip(run, rets):
                    results[t.trial.number] = job_result(ret, t.config)
                    self.tell(t, results[t.trial.number], baseline_ns)
                    pending.remove(t)
                for t, orig in copies:
                    self.tell(t, results[orig.trial.number], baseline_ns, {"duplicate_of": orig.trial.number})
                    pending.remove(t)
                returns.append(rets)
        finally:
            self._abandon(pending)
            self._write_results()
        return returns

    def _abandon(self, pending: List[Ticket]) -> None:
        """Trials asked but not answered (an interrupt): failed and asked again when the study resumes."""
        from optuna.trial import TrialState

        for t in pending:
            try:
                self.study._storage.set_trial_user_attr(t.trial._trial_id, self.st.T_FLAG, "retried")
                self.study.tell(t.trial, state=TrialState.FAIL, skip_if_finished=True)
                self.study.enqueue_trial(dict(t.params))
            except (RuntimeError, ValueError):
                continue

    def _write_results(self) -> None:
        from mneme.tune.report import write_results

        try:
            summary = write_results(self.study, str(self.out_dir))
        except Exception as e:  # noqa: BLE001 - the study is the record; a report problem must not hide the sweep's end
            log.warning(f"could not write the results directory {self.out_dir}: {e}")
            return
        hydra_file = self._optimization_results(summary)
        # the sweep ends on its result, as `mneme tune` does, not on the last job's line
        print(f"\n{summary.get('text', '').rstrip()}\nresults: {self.out_dir}  (summary.txt, best.md, best.sh)"
              + (f"\nHydra: {hydra_file}" if hydra_file else ""), flush=True)

    def _optimization_results(self, summary: Dict[str, Any]) -> Optional[Path]:
        """Hydra's optimization_results.yaml (as its Optuna sweeper writes it) in the sweep directory."""
        best = (summary or {}).get("best") or {}
        if not best:
            return None
        from omegaconf import OmegaConf

        config = (best.get("config") if isinstance(best.get("config"), dict) else None) or {}
        from mneme.track.records import flatten

        flat = flatten(config, "replay.")
        doc = {"name": "mneme_optuna", "best_params": flat, "best_value": best.get("metric_ns"),
               "best_speedup": best.get("speedup"), "results": str(self.out_dir)}
        path = self.out_dir.parent.parent / "optimization_results.yaml"
        OmegaConf.save(OmegaConf.create(doc), path)
        return path


def hydra_terms(message: str) -> str:
    """`mneme tune`'s flags in a message, as the Hydra keys that mean the same (study.resume=true, study.name=)."""
    import re

    message = message.replace("--resume", "study.resume=true")
    return re.sub(r"--study(?: NAME)?", "study.name=NAME", message)


def replay_value(config: ExperimentConfiguration, key: str) -> Any:
    """The value of `replay.<path>` in a configuration."""
    if not key.startswith("replay."):
        raise ConfigurationError(f"search dimension {key!r}: only replay.* keys can be searched per trial")
    node: Any = config.to_dict()
    for p in key.split(".")[1:]:
        if not isinstance(node, dict) or p not in node:
            raise ConfigurationError(f"search dimension {key!r} is not a replay field")
        node = node[p]
    return node
