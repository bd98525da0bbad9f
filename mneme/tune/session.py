"""One process's side of a (possibly shared) study: which trials to ask, which to run, how to tell them back.

The protocol (see mneme.tune.study for the attributes it writes):

- `ask(need)` asks the proposer for trials, tells the ones that break the space's constraints back as rejected
  (no GPU time), claims the others (owner, configuration, its hash), then ranks them: a trial beyond --trials
  is surplus; a trial whose configuration an earlier trial claimed is a copy (its answer is that trial's
  answer: at once when it is finished, when it finishes when it runs here, or when another process tells it).
  What is left is returned: those are the trials to run.
- `answer(ticket, result)` tells a result back (and to every copy waiting on it).
- `poll()` is for when nothing runs here: fail and requeue the trials of processes that stopped heartbeating,
  copy finished originals, and say whether the study is complete.
- `abandon()` gives this process's unanswered trials back (they are requeued), for an interrupted run.

Whoever runs the trials (the tuner's executor, or a Hydra launcher) only submits what `ask` and `poll` return
and hands the results to `answer`.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from mneme.config import ExperimentConfiguration, ExperimentResult
from mneme.errors import ConfigurationError
from mneme.tune import study as st
from mneme.tune.interrupt import InterruptGuard
from mneme.tune.objective import Objective
from mneme.tune.samplers import Proposer, params_key
from mneme.tune.launch import shape_key
from mneme.tune.space import MAX_REJECTIONS, SearchSpace, kills_context

#: study attribute: compile keys banned because they killed the CUDA context at the recorded launch
A_BANNED_CODE = "mneme.banned_code"

HEARTBEAT_S = 10.0
REAP_S = 15.0
#: longest wait for the trials numbered before ours to state their configuration (a process that died between
#: asking and claiming must not hold the others up; the reaper fails its trial later)
CLAIM_WAIT_S = 2.0


@dataclass
class Ticket:
    """A trial this process answers."""

    trial: Any  # optuna Trial
    number: int
    params: Dict[str, Any]
    config: ExperimentConfiguration
    config_hash: str
    original: Optional[int] = None  # the earlier trial whose answer this one copies
    followers: List["Ticket"] = field(default_factory=list)


#: called for every answered trial: (ticket, result, values told to Optuna or None)
AnswerCallback = Callable[[Ticket, ExperimentResult, Optional[List[float]]], None]


def _critical(method):
    """Hold Ctrl-C until the method's storage writes are done (see mneme.tune.interrupt)."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        with self.guard.critical():
            return method(self, *args, **kwargs)

    return guarded


class TrialSession:
    def __init__(
        self,
        study,
        space: SearchSpace,
        proposer: Proposer,
        objective: Objective,
        trials: int,
        owner: Optional[str] = None,
        stale_after: float = 120.0,
        sampler: Any = None,
        on_answer: Optional[AnswerCallback] = None,
        guard: Optional[InterruptGuard] = None,
    ):
        self.study = study
        self.space = space
        self.proposer = proposer
        self.objective = objective
        self.trials = int(trials)
        self.owner = owner or st.new_owner()
        self.stale_after = float(stale_after)
        self.sampler = sampler
        self.on_answer = on_answer
        self.guard = guard or InterruptGuard()
        self.baseline_ns: Optional[float] = None
        self.pending: Dict[int, Ticket] = {}  # every unanswered ticket, by trial number
        self.remote: List[Ticket] = []  # copies of trials another process is running
        self.exhausted = False
        self.rejections = 0
        self._last_heartbeat = float("-inf")
        self._last_reap = float("-inf")
        self._finished: Dict[int, Tuple[bool, Optional[str]]] = {}  # see st.Ledger
        ledger = self.ledger()
        self.seen = {params_key(t.params) for t in ledger.trials}
        self.counted_at_start = len(ledger.counted)

    # -- housekeeping -----------------------------------------------------------------------------------
    def ledger(self) -> st.Ledger:
        return st.Ledger(self.study.get_trials(deepcopy=False), self._finished)

    def heartbeat(self, force: bool = False) -> None:
        """Show the other processes this one is alive (every few seconds; `force` now)."""
        now = time.monotonic()
        if force or now - self._last_heartbeat > min(HEARTBEAT_S, self.stale_after / 4):
            self.study.set_user_attr(st.A_HEARTBEAT + self.owner, time.time())
            self._last_heartbeat = now

    def remaining(self, ledger: Optional[st.Ledger] = None) -> int:
        return self.trials - len((ledger or self.ledger()).counted)

    # -- asking -----------------------------------------------------------------------------------------
    @_critical
    def ask(self, need: int) -> List[Ticket]:
        """Up to `need` new trials; returns those this process must run."""
        asked: List[Ticket] = []
        while len(asked) < need:
            trial = self.proposer.next_trial(self.study, self.seen)
            if trial is None or getattr(self.sampler, "exhausted", False):
                self.exhausted = True
                if trial is not None:
                    self._exclude(trial, "surplus", "the space is used up")
                break
            params = self.space.sample_optuna(trial)
            config, reasons = self.space.check(params)
            if reasons:
                self.rejections += 1
                self._exclude(trial, "rejected", "; ".join(reasons), reasons)
                if self.rejections >= MAX_REJECTIONS:
                    raise ConfigurationError(
                        f"space {self.space.name!r}: {MAX_REJECTIONS} samples in a row broke its constraints; "
                        "the space (or the banned shapes) leaves nothing to run"
                    )
                continue
            self.rejections = 0
            h = config.hash()
            trial.set_user_attr(st.T_CLAIM, {"owner": self.owner, "config_hash": h, "config": config.to_dict()})
            asked.append(Ticket(trial, trial.number, params, config, h))
        if not asked:
            return []
        ledger = self._settled_ledger(max(t.number for t in asked))
        run: List[Ticket] = []
        for t in asked:
            if ledger.rank(t.number) > self.trials:
                self._exclude(t.trial, "surplus", "beyond --trials (another process got there first)")
                continue
            self.pending[t.number] = t
            orig = ledger.original(t.config_hash, t.number)
            if orig is None:
                run.append(t)
                continue
            t.original = orig.number
            if orig.number in self.pending:
                self.pending[orig.number].followers.append(t)
            elif orig.state.name in ("COMPLETE", "FAIL") and st.T_RESULT in orig.user_attrs:
                self._copy(t, orig)
            else:
                self.remote.append(t)
        return run

    def _settled_ledger(self, upto: int) -> st.Ledger:
        """The ledger once every trial numbered before `upto` has claimed its configuration (or been excluded).

        Another process asks its trial and claims it in two writes. Without this wait, of two processes that
        drew one configuration at once, the later-numbered could read the study between the earlier one's two
        writes, see no claim, and run the configuration a second time (seen in CI with journal storage). After
        it, the later-numbered trial always sees the earlier claim and copies that trial's result."""
        deadline = time.monotonic() + CLAIM_WAIT_S
        while True:
            ledger = self.ledger()
            unsettled = [t for t in ledger.running if t.number < upto and not st.claim(t) and not st.flag(t)]
            if not unsettled or time.monotonic() >= deadline:
                return ledger
            time.sleep(0.005)

    def _exclude(self, trial, flag: str, error: str, reasons: Optional[List[str]] = None) -> None:
        from optuna.trial import TrialState

        doc: Dict[str, Any] = {"status": "invalid_config" if flag != "retried" else "runtime_error", "error": error}
        if reasons:
            doc["reasons"] = reasons
        trial.set_user_attr(st.T_FLAG, flag)
        trial.set_user_attr(st.T_RESULT, doc)
        self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)

    # -- answering --------------------------------------------------------------------------------------
    @_critical
    def answer(self, t: Ticket, result: ExperimentResult, extra: Optional[Dict[str, Any]] = None) -> None:
        """Tell `result` for a ticket and for the copies waiting on it."""
        self.pending.pop(t.number, None)
        self._tell(t, result, extra)
        for f in t.followers:
            self.answer(f, ExperimentResult.from_dict(result.to_dict()), {"duplicate_of": t.number})

    def _tell(self, t: Ticket, result: ExperimentResult, extra: Optional[Dict[str, Any]]) -> None:
        from optuna.trial import TrialState

        values = self.objective.values(result, self.baseline_ns)
        doc = result.to_dict()
        doc.update(extra or {})
        try:
            self.study._storage.set_trial_user_attr(t.trial._trial_id, st.T_RESULT, doc)
            if values is None:
                self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            else:
                self.study.tell(t.number, values=values, skip_if_finished=True)
        except (RuntimeError, ValueError) as e:
            print(f"mneme tune: trial {t.number} was closed by another process ({e})", file=sys.stderr)
            return
        if result.status == "invalid_launch" or kills_context(result.status, result.error):
            self._ban(t.config)
        elif result.status == "failed_verification" and t.config.fma and not t.config.fast_math:
            self._ban(t.config, shape_only=True)  # a wrong answer from bit-exact code: the shape is to blame
        if self.on_answer is not None:
            self.on_answer(t, result, values)

    def _ban(self, config, shape_only: bool = False) -> None:
        """A launch failure or a trial that killed the CUDA context is evidence: a block shape other than the
        recorded one is banned; at the recorded shape the compile settings are (never proposed again). With
        `shape_only` (a wrong answer), only another shape than the recorded one is banned."""
        base = getattr(self.space, "ctx", None)
        base_block = shape_key(base.baseline.block) if base is not None else None
        if shape_only and (base_block is None or shape_key(config.block) == base_block):
            return
        if shape_key(config.block) != base_block:
            key = self.space.ban(config)
            banned = sorted(set(self.study.user_attrs.get(st.A_BANNED) or []) | {key})
            self.study.set_user_attr(st.A_BANNED, banned)
        else:
            key = self.space.ban_code(config)
            banned = sorted(set(self.study.user_attrs.get(A_BANNED_CODE) or []) | {key})
            self.study.set_user_attr(A_BANNED_CODE, banned)

    def _copy(self, t: Ticket, orig) -> None:
        raw = {k: v for k, v in (orig.user_attrs.get(st.T_RESULT) or {}).items() if k not in ("duplicate_of", "reasons")}
        self.answer(t, ExperimentResult.from_dict(raw), {"duplicate_of": orig.number})

    # -- waiting on others ------------------------------------------------------------------------------
    @_critical
    def poll(self) -> Tuple[List[Ticket], bool]:
        """(tickets to run now, whether the study is complete) while nothing runs in this process."""
        ledger = self.ledger()
        if time.monotonic() - self._last_reap > REAP_S or not self.remote:
            self.reap(ledger)
            self._last_reap = time.monotonic()
            ledger = self.ledger()
        run, waiting = [], []
        for t in self.remote:
            orig = ledger.by_number.get(t.original)
            if orig is not None and orig.state.name in ("COMPLETE", "FAIL") and st.flag(orig) not in st.EXCLUDED:
                self._copy(t, orig)
            elif orig is None or st.flag(orig) in st.EXCLUDED:
                t.original = None  # its process died: run it here
                run.append(t)
            else:
                waiting.append(t)
        self.remote = waiting
        others = [t for t in ledger.running if st.counts(t) and st.claim(t).get("owner") != self.owner]
        done = not run and not self.remote and not others and (self.exhausted or len(ledger.counted) >= self.trials)
        return run, done

    @_critical
    def reap(self, ledger: Optional[st.Ledger] = None) -> None:
        """Fail the running trials of processes that stopped heartbeating and queue their parameters again."""
        from optuna.trial import TrialState

        ledger = ledger or self.ledger()
        for t in ledger.stale(st.heartbeats(self.study), self.owner, self.stale_after):
            storage = self.study._storage
            try:
                storage.set_trial_user_attr(t._trial_id, st.T_FLAG, "retried")
                storage.set_trial_user_attr(t._trial_id, st.T_RESULT, {
                    "status": "runtime_error", "error": f"abandoned: process {st.claim(t).get('owner', '?')} stopped"})
                self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            except (RuntimeError, ValueError):
                continue  # finished meanwhile
            self.study.enqueue_trial(dict(t.params))
            owner = st.claim(t).get("owner", "?")
            why = ("its process (pid " + owner.split(":")[1] + " on this host) is no longer running"
                   if st.owner_alive_here(owner) is False else f"its process {owner} stopped heartbeating")
            print(f"mneme tune: trial {t.number} was abandoned ({why}); queued again", file=sys.stderr)

    def abandon(self) -> None:
        """Close this process's unanswered trials and queue them again, so a resume redoes them at once."""
        for t in list(self.pending.values()):
            try:
                self._exclude(t.trial, "retried", "interrupted")
                self.study.enqueue_trial(dict(t.trial.params))
            except Exception:  # noqa: BLE001 - best effort while stopping; stale detection covers the rest
                pass
        self.pending.clear()
