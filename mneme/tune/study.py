"""The Optuna study as the one record of a tuning run.

Storage (`--storage`):
- nothing: Optuna's journal file `<output>/study.journal` (`default_storage`; an output directory where an
  earlier mneme left `study.db` keeps that SQLite database, so its studies resume);
- `sqlite:///PATH`, `postgresql://USER@HOST/DB` (any SQLAlchemy URL Optuna's RDB storage takes);
- `journal:PATH` (or a path ending in .log/.journal): Optuna's journal file storage, an append-only file with a
  lock; fastest on one machine, and the choice where no database server exists (the default's kind).

What the study holds besides Optuna's own trials (all as user attributes, so a results directory can be
written from the storage alone):
- study: `mneme.fingerprints` (record, space, objective: a resume refuses when one changed), `mneme.options`,
  `mneme.record`, `mneme.space`, `mneme.baseline`, `mneme.banned` (block shapes that failed to launch),
  `mneme.heartbeat.<owner>` (when each tuning process last showed it was alive);
- trial: `mneme.claim` (owner process, configuration and its hash, set when the trial starts),
  `mneme.result` (the ExperimentResult with its status), `mneme.flag` for trials that do not count:
  `rejected` (broke a constraint, never ran), `surplus` (asked beyond --trials by a racing process),
  `retried` (its process died; the same parameters were queued again).

Several processes share one study safely: trial numbers come from the storage, a process only runs a trial
whose rank among counted trials is within --trials, a configuration already claimed by an earlier trial is
not run again (the later trial copies its result), and a trial whose process stopped heartbeating is failed
and queued again.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import os
import random
import re
import socket
import sqlite3
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mneme.errors import ConfigurationError
from mneme.locks import FileLock

A_FINGERPRINTS = "mneme.fingerprints"
A_OPTIONS = "mneme.options"
A_RECORD = "mneme.record"
A_SPACE = "mneme.space"
A_BASELINE = "mneme.baseline"
A_BANNED = "mneme.banned"
A_HEARTBEAT = "mneme.heartbeat."
T_CLAIM = "mneme.claim"
T_RESULT = "mneme.result"
T_FLAG = "mneme.flag"
EXCLUDED = ("rejected", "surplus", "retried")


def _optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def new_owner() -> str:
    """A name for this tuning process, unique across machines and restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def storage_url(spec: Optional[str], output: str) -> str:
    """The storage URL for --storage (None: `default_storage` in the output directory). File paths in it are made
    absolute, so workers, resumes and the results' hints name the same file from any working directory."""
    if not spec:
        return default_storage(Path(output), "study")
    if spec.startswith("journal:"):
        return f"journal:{Path(spec[len('journal:'):]).resolve()}"
    if "://" not in spec and (spec.endswith(".log") or spec.endswith(".journal")):
        return f"journal:{Path(spec).resolve()}"
    if spec.startswith("sqlite:///") and not spec.startswith("sqlite:////") and spec != "sqlite:///:memory:":
        return f"sqlite:///{Path(spec[len('sqlite:///'):]).resolve()}"
    if "://" not in spec:
        raise ConfigurationError(
            f"--storage {spec!r}: expected a database URL (sqlite:///PATH, postgresql://USER@HOST/DB) or "
            "journal:PATH"
        )
    return spec


def default_storage(directory: Path, stem: str) -> str:
    """The storage used without --storage: the journal file `<directory>/<stem>.journal`, or the SQLite database
    `<stem>.db` there when an earlier mneme (before the journal default) left one, so its studies still resume.

    The journal because Optuna's RDB storage reads every trial back from the database on each ask: with compiles
    and runs that cost nothing, 300 TPE trials of `standard` ran 7-16 trials/s on SQLite (ask 47-117 ms per trial)
    and 37-76/s on the journal (ask 10-20 ms, most of it TPE's own: 7-16 ms with no storage at all), on the
    shared 2-core dev machine (bench/bench_study_storage.py, docs/BENCHMARKS.md).
    Both take several processes at once and lose nothing when a process dies (_page_cache_journal)."""
    directory = directory.resolve()
    legacy = directory / f"{stem}.db"
    if legacy.is_file() and not (directory / f"{stem}.journal").exists():
        return f"sqlite:///{legacy}"
    return f"journal:{directory / f'{stem}.journal'}"


def _sqlite_creator(path: str):
    def connect():
        conn = sqlite3.connect(path, timeout=120, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    return connect


def redacted(text: str) -> str:
    """A URL (or a message quoting one) without its password."""
    return re.sub(r"(://[^:/@\s]+:)\S+@", r"\1***@", text)


def with_available_driver(url: str) -> str:
    """postgresql:// means psycopg (3) to SQLAlchemy 2.1; use psycopg2 when only that one is installed."""
    import importlib.util

    scheme, sep, rest = url.partition("://")
    if scheme in ("postgresql", "postgres") and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:
        return f"postgresql+psycopg2://{rest}"
    return url


@functools.lru_cache(maxsize=None)
def _page_cache_journal():
    """Optuna's journal file backend without its fsync after every write.

    The fsync made each trial wait for the disk, and with it for every other write on the machine (ext4 commits
    its journal for all files at once): a plain `dd` beside an untracked 1000-trial study on the H200 slowed its
    search by 30-50 %. Without it a crashed or killed process loses nothing (the page cache has the lines); only a
    crash of the OS can lose the last trials, which --resume runs again. The SQLite storages make the same choice
    (the study's and MLflow's: WAL with synchronous=NORMAL).

    Its lock is flock on `PATH.flock` (mneme.locks) rather than Optuna's lock file, created, renamed and removed
    around every write: file-system metadata updates, several per trial, that also queue behind other processes'
    disk writes. On the dev machine an untracked 1000-trial search of repeats took 1.7 s instead of 3.0 s. On NFS,
    Linux turns flock into a POSIX lock held through the NFS lock manager, which SQLite needs as well. Processes
    of a mneme from before this lock (0287629) do not take it: all processes sharing one journal need it."""
    from optuna.storages.journal import JournalFileBackend

    class PageCacheJournal(JournalFileBackend):
        def __init__(self, path: str) -> None:
            super().__init__(path, lock_obj=FileLock(path + ".flock"))  # acquire and release are all it asks of one

        def append_logs(self, logs: List[Dict[str, Any]]) -> None:
            text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode()
            with self._lock, open(self._file_path, "ab") as f:
                f.write(text)

    return PageCacheJournal


def _writable_file(path: str, what: str) -> None:
    """Fail at once, naming the file, when a storage file or its directory cannot be written (SQLite would
    retry for minutes; a journal would fail with a traceback on its first write)."""
    import tempfile

    p = Path(path)
    made = [d for d in p.parents if not d.exists()]  # innermost first
    existed = p.exists()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "ab"):
            pass
        with tempfile.TemporaryFile(dir=p.parent, prefix=".mneme-probe-") as f:
            f.write(b"\0" * 4096)  # SQLite's WAL and the journal's lock file live beside it; a full disk shows here
            f.flush()  # (no fsync: storages here never wait for the disk, see _page_cache_journal)
    except OSError as e:
        if not existed and p.exists():
            p.unlink()
        for d in made:  # leave the place as it was
            try:
                d.rmdir()
            except OSError:
                break
        raise ConfigurationError(
            f"{what} {path} cannot be written ({e.strerror or e}); choose a writable place with --storage or -o"
        ) from None


def open_storage(url: str):
    """An Optuna storage object for a URL from `storage_url`."""
    optuna = _optuna()
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalStorage

        path = url[len("journal:"):]
        _writable_file(path, "study journal")
        return JournalStorage(_page_cache_journal()(path))
    kwargs: Dict[str, Any] = {}
    url = with_available_driver(url)
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if path and path != ":memory:":
            _writable_file(path, "study database")
            kwargs["creator"] = _sqlite_creator(path)
    else:
        kwargs["pool_pre_ping"] = True
        if url.startswith("postgres"):
            kwargs["connect_args"] = {"connect_timeout": 10}  # an unreachable server: one line within 10 s
    for attempt in range(6):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except Exception as e:  # noqa: BLE001 - sqlalchemy/driver errors vary; say what failed and where
            # processes that start together race to create the schema; the loser finds it made and goes on
            racing = type(e).__name__ in ("IntegrityError", "OperationalError", "ProgrammingError")
            if attempt < 5 and racing:
                time.sleep(0.1 + random.random() * 0.4)
                continue
            raise ConfigurationError(
                f"--storage {redacted(url)}: cannot open the study storage ({type(e).__name__}: {redacted(str(e))})"
            ) from None
    raise AssertionError("unreachable")


def record_fingerprint(record: Any, instance: Any) -> str:
    """Changes when the recorded kernel changes: hashes, geometry, arguments, IR contents, snapshot sizes."""
    h = hashlib.sha256()
    h.update(json.dumps(
        {"static": record.static_hash, "dynamic": instance.dynamic_hash, "kernel": record.kernel_name,
         "instance": instance.to_dict() | {"Prologue": "", "Epilogue": ""}},
        sort_keys=True, default=str,
    ).encode())
    for f in sorted(record.llvm_files):
        p = Path(f)
        h.update(hashlib.sha256(p.read_bytes()).digest() if p.exists() else b"missing:" + f.encode())
    for f in (instance.prologue_fn, instance.epilogue_fn):
        p = Path(f)
        h.update(str(p.stat().st_size if p.exists() else -1).encode())
    return h.hexdigest()


def fingerprint_of(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def open_study(storage, name: str, directions: Sequence[str], sampler, fingerprints: Dict[str, str], resume: bool,
               metric_names: Optional[Sequence[str]] = None):
    """Create the study, or load it when resuming; refuse a resume whose record, space or objective changed.
    `metric_names` name the objective values (optuna-dashboard and Optuna's plots show them for 'Objective 0')."""
    optuna = _optuna()
    summaries = {s.study_name: s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    # a study whose start failed before its first trial (e.g. a bad setting) holds nothing: a rerun reuses it
    exists = name in summaries and summaries[name].n_trials > 0
    names = list(summaries)
    if resume and not exists:
        # --resume also means "join or start" for processes that share a study: say it, so a typo shows
        import sys

        print(f"mneme tune: --resume: there is no study {name!r} in this storage yet "
              f"({'it holds ' + ', '.join(map(repr, names)) if names else 'it holds no study'}); starting it",
              file=sys.stderr)
    if exists and not resume:
        raise ConfigurationError(
            f"study {name!r} already exists in this storage; pass --resume to continue it, or --study to name a new one"
        )
    study = optuna.create_study(
        storage=storage, study_name=name, directions=list(directions), sampler=sampler, load_if_exists=True,
    )
    stored = study.user_attrs.get(A_FINGERPRINTS)
    if stored:
        changed = [k for k in ("record", "space", "objective") if stored.get(k) != fingerprints.get(k)]
        if changed:
            what = {"record": "the record (kernel, geometry, IR or snapshots)", "space": "the search space",
                    "objective": "the objective, metric or sampler's objective count"}
            raise ConfigurationError(
                f"study {name!r} cannot be resumed: {' and '.join(what[k] for k in changed)} changed since it was "
                "created; start a new study with --study NAME"
            )
    elif [d.name.lower() for d in study.directions] != [d.lower() for d in directions]:
        raise ConfigurationError(f"study {name!r} optimises {study.directions}, not {list(directions)}")
    if metric_names and study.metric_names != list(metric_names):
        import warnings

        with warnings.catch_warnings():  # set_metric_names is "experimental" in Optuna 4 and 5
            warnings.simplefilter("ignore")
            study.set_metric_names(list(metric_names))
    return study, bool(stored)


def load_study(storage, name: str):
    optuna = _optuna()
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise ConfigurationError(f"no study {name!r} in this storage") from None


def flag(trial) -> str:
    return str(trial.user_attrs.get(T_FLAG, ""))


def counts(trial) -> bool:
    """Whether a trial counts toward --trials (queued ones and excluded ones do not)."""
    return trial.state is not _states().WAITING and flag(trial) not in EXCLUDED


def claim(trial) -> Dict[str, Any]:
    return trial.user_attrs.get(T_CLAIM) or {}


@functools.lru_cache(maxsize=None)
def _states():
    from optuna.trial import TrialState

    return TrialState


@dataclass
class Ledger:
    """One snapshot of the study's trials, with the questions the tuner asks of it.

    The tuner builds one or two per batch of trials it asks, over the whole study. `finished` (trial number ->
    (counts, config hash)), kept by the caller across snapshots, spares re-reading the attributes of trials that
    can no longer change: a ledger of 1200 trials took 1.1 ms without it, 0.44 ms with it (dev machine). On a
    journal storage that was the largest part of a search of repeats."""

    trials: List[Any]
    finished: Dict[int, Tuple[bool, Optional[str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        trials = self.trials
        if any(a.number > b.number for a, b in zip(trials, trials[1:])):  # storages list them by number already
            trials = sorted(trials, key=lambda t: t.number)
        states = _states()
        running, waiting = states.RUNNING, states.WAITING
        self.by_number: Dict[int, Any] = {}
        self.counted: List[Any] = []
        self.numbers: List[int] = []
        self.running: List[Any] = []  # counted or not
        self.first_by_hash: Dict[str, Any] = {}
        for t in trials:
            n = t.number
            self.by_number[n] = t
            facts = self.finished.get(n)
            if facts is None:
                state = t.state
                facts = (counts(t), claim(t).get("config_hash"))
                if state is running:
                    self.running.append(t)
                elif state is not waiting:
                    self.finished[n] = facts
            counted, h = facts
            if counted:
                self.counted.append(t)
                self.numbers.append(n)
                if h and h not in self.first_by_hash:
                    self.first_by_hash[h] = t

    def rank(self, number: int) -> int:
        """1-based position of a counted trial among the counted trials (by trial number)."""
        return bisect.bisect_right(self.numbers, number)

    def original(self, config_hash: str, number: int):
        """The earliest counted trial before `number` that claimed the same configuration."""
        t = self.first_by_hash.get(config_hash)
        return t if t is not None and t.number < number else None

    def stale(self, heartbeats: Dict[str, float], me: str, stale_after: float, now: Optional[float] = None) -> List[Any]:
        """Running trials whose process is gone (never this process's own): at once when the owner ran on this
        host and its pid is no longer alive; by heartbeat (`stale_after` seconds) for owners on other hosts."""
        now = time.time() if now is None else now
        out = []
        for t in self.running:
            if not counts(t):
                continue
            owner = claim(t).get("owner")
            if owner == me:
                continue
            local = owner_alive_here(owner) if owner else None
            if local is not None:
                if not local:
                    out.append(t)
                continue
            seen = heartbeats.get(owner) if owner else None
            if seen is None:
                start = t.datetime_start.timestamp() if t.datetime_start else now
                seen = start
            if now - seen > stale_after:
                out.append(t)
        return out


def owner_alive_here(owner: str) -> Optional[bool]:
    """For an owner `host:pid:tag` (new_owner) on this host: whether its process still runs (a zombie does
    not); None for an owner on another host, whose liveness only its heartbeat tells."""
    parts = str(owner).split(":")
    if len(parts) < 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return None
    from mneme.tmpfiles import pid_alive

    return pid_alive(int(parts[1]))


def heartbeats(study) -> Dict[str, float]:
    return {k[len(A_HEARTBEAT):]: float(v) for k, v in study.user_attrs.items() if k.startswith(A_HEARTBEAT)}
