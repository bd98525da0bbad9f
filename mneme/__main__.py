"""`python -m mneme +experiment=NAME [--multirun] [key=value ...]`: mneme's Hydra app.

The experiments live in experiments/ (sweep, baseline, pipeline_search, launch_search, compile_only,
record), the config groups in conf/. Every job is one experiment and one MLflow run; a multirun adds one
parent run. See docs/EXPERIMENTS.md.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Dict, List, Optional, Tuple

import hydra
from omegaconf import DictConfig

#: the exit code of each job this process ran (docs/USAGE.md, "Exit codes"); the process exits with the worst
_OUTCOMES: List[int] = []
#: (job number, status, its result line or error, its mneme.log) of each job, in _OUTCOMES' order: a multirun
#: prints its jobs' lines only to their logs (one progress line on the terminal), so the end of a multirun
#: that failed names the statuses and the failed jobs
_JOBS: List[Tuple[int, str, str, str]] = []
#: failed jobs named one by one at the end of a multirun; the rest are counted
_SHOW_FAILED = 10


def job_exit_code(ret: Dict[str, Any], search_trial: bool) -> int:
    """0 verified / compiled / recorded, 1 ran but did not verify, 2 any other failure. A search's trial
    (a job of the Optuna sweeper other than its baseline) that fails is an answer, not an error."""
    if search_trial:
        return 0
    status = ret.get("status")
    if status in ("verified", "compiled", "recorded"):
        return 0
    return 1 if status == "failed_verification" else 2


#: absolute: a relative config_path is taken relative to the package when the app runs as the `mneme-run`
#: console script (the module is then `mneme.__main__`, not `__main__`), where `conf` is no package
CONF_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "conf"))


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _app(cfg: DictConfig):
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from mneme.errors import MnemeError
    from mneme.track.app import run

    try:
        ret = run(cfg)
    except (MnemeError, OSError) as e:
        # a user error: one line (MNEME_DEBUG=1 shows the traceback); a multirun goes on with its other jobs
        if os.environ.get("MNEME_DEBUG"):
            traceback.print_exc()
        what = f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else str(e)
        print(f"mneme: error: {what}", file=sys.stderr, flush=True)
        _note(2, "error", what)
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            return {"status": "error", "error": what}
        raise SystemExit(2)
    hc = HydraConfig.get() if HydraConfig.initialized() else None
    searching = hc is not None and hc.mode == RunMode.MULTIRUN and "optuna" in str(hc.sweeper.get("_target_", "")).lower()
    role = str((cfg.get("tracking") or {}).get("role", ""))
    _note(job_exit_code(ret, searching and role != "baseline"), str(ret.get("status") or ""), str(ret.get("line") or ""))
    return ret


def _note(code: int, status: str, line: str) -> None:
    """Keep one job's exit code and what the end of a multirun says about it."""
    from hydra.core.hydra_config import HydraConfig

    num, log = len(_JOBS), ""
    if HydraConfig.initialized():
        hc = HydraConfig.get()
        num = int(hc.job.num) if hc.job.get("num") is not None else num
        log = os.path.join(str(hc.runtime.output_dir), "mneme.log")
    _OUTCOMES.append(code)
    _JOBS.append((num, status, line, log))


def failed_jobs_report(outcomes: List[int], jobs: List[Tuple[int, str, str, str]], multirun: Optional[bool] = None) -> List[str]:
    """The lines that end a run whose jobs failed: the count and, for a multirun, the jobs per status and each
    failed job's result line and log (the job lines went to the jobs' own logs, not to the terminal)."""
    code = max(outcomes, default=0)
    failed = [(c, j) for c, j in zip(outcomes, jobs) if c]
    head = f"mneme: {len(failed)} of {len(outcomes)} job(s) failed (exit {code})"
    if not (len(outcomes) > 1 if multirun is None else multirun):
        return [head]
    counts: Dict[str, int] = {}
    for _, status, _, _ in jobs:
        counts[status or "unknown"] = counts.get(status or "unknown", 0) + 1
    out = [head + ": " + ", ".join(f"{n} {s}" for s, n in counts.items())]
    for _, (num, status, line, log) in failed[:_SHOW_FAILED]:
        text = (line or status).splitlines()[0] if (line or status) else "failed"
        out.append(f"mneme:   job {num}: {text[:300]}" + (f" (log: {log})" if log and os.path.isfile(log) else ""))
    if len(failed) > _SHOW_FAILED:
        out.append(f"mneme:   ... and {len(failed) - _SHOW_FAILED} more failed job(s)")
    return out


def _multirun_first(argv: List[str]) -> List[str]:
    """`python -m mneme +experiment=sweep --multirun k=v` as well as `--multirun +experiment=sweep k=v`
    (Hydra's parser takes its flags only before the overrides)."""
    flags = [a for a in argv if a in ("-m", "--multirun")]
    return flags + [a for a in argv if a not in flags]


def main() -> None:
    from mneme.track import session
    from mneme.track.records import FAILED, FINISHED, KILLED

    import atexit

    from mneme.tmpfiles import reap

    atexit.register(reap)  # leftovers of killed workers (compile directories, unused lock files)
    sys.argv[1:] = _multirun_first(sys.argv[1:])
    try:
        _app()
    except SystemExit as e:
        failed = e.code not in (0, None)
        session.close(FAILED if failed else FINISHED)
        if failed:
            from mneme.track.schema import explain_overrides

            for line in explain_overrides([a for a in sys.argv[1:] if not a.startswith("-")]):
                print(f"mneme: {line}", file=sys.stderr)
        raise
    except KeyboardInterrupt:
        session.close(KILLED)
        print("mneme: interrupted", file=sys.stderr)
        sys.exit(130)
    code = max(_OUTCOMES, default=0)
    session.close(FINISHED if code == 0 else FAILED)
    if code:
        multirun = any(a in ("-m", "--multirun") for a in sys.argv[1:]) or None  # None: more than one job
        for line in failed_jobs_report(_OUTCOMES, _JOBS, multirun):
            print(line, file=sys.stderr)
        sys.exit(code)


if __name__ == "__main__":
    main()
