"""What every stage shares: a time budget over a subset of apps (it stops cleanly before the budget
runs out and names the apps that remain), one result file per stage run, and subprocesses that are
stopped with their whole process group when they run too long.

A stage result file:

    {"stage", "commit", "date", "host", "gpu", "driver", "argv", "budget_s", "wall_s",
     "apps": {NAME: {...stage fields...}}, "remaining": [NAME...], "stopped": null | "budget"}
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from bench.corpus.apps import App

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402  (bench/benchlib.py: commit, GPU and driver of the run)

#: a stage does not start an app with less than this left of its budget
MIN_START_S = 15.0


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def tail(text: str, n: int = 1200) -> str:
    return text[-n:] if text else ""


class Budget:
    """Seconds left of a stage's time budget; `clock` is injectable so tests need not sleep."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = float(seconds)
        self.clock = clock
        self.t0 = clock()

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def can_start(self, need: float = MIN_START_S) -> bool:
        return self.left() >= need

    def cap(self, limit: float) -> float:
        """A subprocess limit that keeps inside the budget."""
        return max(1.0, min(float(limit), self.left()))


@dataclass
class Proc:
    """One finished (or stopped) subprocess."""
    argv: Sequence[str]
    returncode: Optional[int]
    output: str
    seconds: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run(argv: Sequence[str], timeout: float, cwd: Optional[Path] = None, env: Optional[Mapping[str, str]] = None,
        shell: bool = False) -> Proc:
    """Runs argv (stdout and stderr together) in its own process group; on timeout the group is stopped
    (SIGTERM, then SIGKILL) and `timed_out` is set. A missing program is returncode 127, not an exception."""
    t0 = time.perf_counter()
    try:
        p = subprocess.Popen(argv if not shell else argv[0], cwd=cwd, env=dict(env) if env is not None else None,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, shell=shell, executable="/bin/bash" if shell else None)
    except OSError as e:
        return Proc(argv, 127, f"{argv[0]}: {e.strerror}", time.perf_counter() - t0)
    try:
        out, _ = p.communicate(timeout=timeout)
        return Proc(argv, p.returncode, out.decode(errors="replace"), time.perf_counter() - t0)
    except subprocess.TimeoutExpired:
        out = b""
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, _ = p.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                pass
        return Proc(argv, None, (out or b"").decode(errors="replace"), time.perf_counter() - t0, timed_out=True)


def machine() -> Dict[str, Any]:
    gpus = benchlib.gpu_info()
    return {"host": platform.node(), "gpu": gpus[0]["name"] if gpus else "none",
            "driver": gpus[0]["driver"] if gpus else "", "cpus": os.cpu_count()}


def commit(fallback: str = "unknown") -> str:
    c = benchlib.git_commit()
    return c if c != "unknown" else fallback


AppFn = Callable[[App, Budget], Dict[str, Any]]


def run_stage(stage: str, apps: Sequence[App], fn: AppFn, budget: Budget, *, min_start: float = MIN_START_S,
              argv: Optional[Sequence[str]] = None, commit_fallback: str = "unknown",
              progress: Callable[[str], None] = lambda s: print(s, flush=True),
              save: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
    """fn(app, budget) for each app while the budget allows; an app whose run was cut short by the
    budget (fn returns {"budget_cut": True}) counts as remaining; with "partial": True its row (what it finished)
is kept too. An exception in fn
    is that app's error, and the stage goes on. `save(result)` runs after every app (the result so far,
    its `remaining` listing the apps not yet done), so a killed call still leaves what it finished."""
    result: Dict[str, Any] = {"stage": stage, "commit": commit(commit_fallback), "date": now_iso(), **machine(),
                              "argv": list(argv if argv is not None else sys.argv), "budget_s": budget.seconds,
                              "apps": {}, "remaining": [], "stopped": None}
    for i, app in enumerate(apps):
        if not budget.can_start(min_start):
            result["stopped"] = "budget"
            result["remaining"] = [a.name for a in apps[i:]]
            break
        progress(f"corpus {stage}: {app.name} ({i + 1}/{len(apps)}, {budget.left():.0f} s of budget left)")
        t0 = time.perf_counter()
        try:
            row = fn(app, budget)
        except Exception as e:  # noqa: BLE001 - one app's failure must not end the stage
            row = {"stage_error": f"{type(e).__name__}: {e}"}
        if row.pop("budget_cut", False):
            result["stopped"] = "budget"
            result["remaining"] = [a.name for a in apps[i:]]
            if row.get("partial"):  # what it finished before the cut (the tune stage's kernels) comes back too
                result["apps"][app.name] = row
            progress(f"corpus {stage}: {app.name} cut short by the budget; it stays in the remaining list")
            break
        row.setdefault("stage_s", round(time.perf_counter() - t0, 2))
        result["apps"][app.name] = row
        progress(f"corpus {stage}: {app.name}: {brief(row)}")
        if save is not None:
            save({**result, "remaining": [a.name for a in apps[i + 1:]], "stopped": "in progress",
                  "wall_s": round(budget.elapsed(), 2)})
    result["wall_s"] = round(budget.elapsed(), 2)
    if save is not None:
        save(result)
    return result


def brief(row: Mapping[str, Any]) -> str:
    keys = [k for k in row if k not in ("kernels", "output", "log") and not k.endswith("_log")]
    return ", ".join(f"{k}={row[k]}" for k in keys[:8] if not isinstance(row[k], (dict, list)))


def remaining_line(result: Mapping[str, Any], script: str = "bash scripts/corpus.sh", extra: str = "") -> str:
    if not result.get("remaining"):
        return f"corpus {result['stage']}: done, {len(result['apps'])} app(s) in {result.get('wall_s', 0):.0f} s"
    rest = ",".join(result["remaining"])
    return (f"corpus {result['stage']}: stopped by the time budget after {len(result['apps'])} app(s); "
            f"remaining: {rest} -- continue with: {script} {result['stage']} --apps {rest}{extra}")


def result_path(out_dir: Path, stage: str, tag: str = "") -> Path:
    """<out_dir>/<stage>[-tag].json, or a new name if that exists (nothing is overwritten)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = f"{stage}{'-' + tag if tag else ''}"
    path = out_dir / f"{base}.json"
    n = 2
    while path.exists():
        path = out_dir / f"{base}-{n}.json"
        n += 1
    return path


def save(result: Mapping[str, Any], path: Path) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path


def write_result(result: Mapping[str, Any], out_dir: Path, tag: str = "") -> Path:
    return save(result, result_path(out_dir, result["stage"], tag))


def read_result(path: Path) -> Dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a corpus stage result ({e})") from e
    if not isinstance(data, dict) or "stage" not in data or not isinstance(data.get("apps"), dict):
        raise ValueError(f"{path}: not a corpus stage result (needs 'stage' and 'apps')")
    return data
