"""`mneme apply`'s second timer: the matched kernels timed by Nsight Compute in the app's own runs.

libapply's in-app timer (an event pair around each launch) cannot time a kernel that runs inside a CUDA graph:
the swap happens while the app captures or builds the graph, and cudaGraphLaunch runs its nodes as one unit.
Nsight Compute profiles a graph's kernel nodes one by one (its default `--graph-profiling node`), so a run of
the app under ncu, with libapply preloaded as in any other run, times the original kernels (observe) and the
tuned ones (apply) alike:

    ncu -o REPORT --kernel-name-base mangled --kernel-name regex:^(K1|K2)$ --metrics gpu__time_duration.sum
        --clock-control none --cache-control none --target-processes all --launch-count N  APP ARGS
    ncu --import REPORT.ncu-rep --csv --print-units base --print-kernel-base mangled     -> rows

`--timer auto` (mneme apply's default) adds one such observe/apply pair only when a kernel was applied but no
launch of it could be timed in-app; `--timer ncu` times every run this way; `--timer events` never.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from mneme.errors import ConfigurationError

METRIC = "gpu__time_duration.sum"
TIMERS = ("auto", "events", "ncu")
#: kernels profiled per run at most (ncu serializes and profiles each; a bound for apps with many launches)
LAUNCH_COUNT = 500
_UNIT_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}


@dataclass(frozen=True)
class NcuRow:
    kernel: str  # mangled
    grid: Tuple[int, int, int]
    block: Tuple[int, int, int]
    ns: float


def find_ncu() -> Optional[str]:
    """ncu on PATH, else under $CUDA_HOME or /usr/local/cuda (a GPU machine's PATH often lacks cuda/bin)."""
    cands = [shutil.which("ncu")] + [str(Path(r) / "bin" / "ncu") for r in
                                     (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda") if r]
    return next((c for c in cands if c and Path(c).is_file() and os.access(c, os.X_OK)), None)


def require_ncu() -> str:
    ncu = find_ncu()
    if ncu is None:
        raise ConfigurationError("--timer ncu: Nsight Compute's `ncu` is not on PATH nor in $CUDA_HOME/bin or "
                                 "/usr/local/cuda/bin; install it or use --timer events")
    return ncu


def wrap(argv: Sequence[str], kernels: Sequence[str], report: Path, ncu: str,
         launch_count: int = LAUNCH_COUNT) -> List[str]:
    """The app's command line under ncu, profiling only `kernels` (mangled names) into `report`(.ncu-rep)."""
    if not kernels:
        raise ValueError("no kernels to time")
    names = "|".join(re.escape(k) for k in sorted(set(kernels)))
    return [ncu, "--export", str(report), "--force-overwrite", "--kernel-name-base", "mangled",
            "--kernel-name", f"regex:^(?:{names})$", "--metrics", METRIC, "--clock-control", "none",
            "--cache-control", "none", "--target-processes", "all", "--launch-count", str(launch_count), *argv]


def import_argv(report: Path, ncu: str) -> List[str]:
    return [ncu, "--import", str(report), "--csv", "--print-units", "base", "--print-kernel-base", "mangled"]


def _dims(text: str) -> Tuple[int, int, int]:
    v = [int(x) for x in re.findall(r"\d+", text or "")][:3]
    return tuple(v + [1] * (3 - len(v)))  # type: ignore[return-value]


def parse_csv(text: str) -> List[NcuRow]:
    """ncu's CSV (with any ==PROF== or app lines around it) -> one row per profiled launch."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    body = [line for line in lines[start:] if line.startswith('"')]
    rows: List[NcuRow] = []
    for r in csv.DictReader(io.StringIO("\n".join(body))):
        if r.get("Metric Name") != METRIC:
            continue
        try:
            v = float((r.get("Metric Value") or "").replace(",", ""))
        except ValueError:
            continue
        unit = (r.get("Metric Unit") or "nsecond").strip().lower()
        rows.append(NcuRow(r.get("Kernel Name", ""), _dims(r.get("Grid Size", "")), _dims(r.get("Block Size", "")),
                           v * _UNIT_NS.get(unit, 1.0)))
    return rows


def report_file(report: Path) -> Path:
    """The file ncu writes for `--export report`: report.ncu-rep."""
    return report if report.suffix == ".ncu-rep" else report.with_name(report.name + ".ncu-rep")


def read_report(report: Path, ncu: str, timeout: float = 300.0) -> Tuple[List[NcuRow], str]:
    """(rows, why none) of a report ncu wrote (`wrap`'s `report`)."""
    path = report_file(report)
    if not path.is_file():
        return [], f"ncu wrote no report ({path}): no matched kernel ran, or ncu failed (see the app's output)"
    try:
        p = subprocess.run(import_argv(path, ncu), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"cannot read {path} with ncu --import: {e}"
    rows = parse_csv(p.stdout)
    if not rows:
        return [], f"ncu --import {path} gave no {METRIC} rows (exit {p.returncode}): {p.stderr.strip()[-300:]}"
    return rows, ""


def samples(rows: Sequence[NcuRow], kernel: str, shape: Optional[Tuple[Sequence[int], Sequence[int]]] = None,
            skip: int = 0) -> List[float]:
    """The times of `kernel`'s launches (of grid/block `shape` when given), after the first `skip` of them."""
    out = [r.ns for r in rows if r.kernel == kernel and
           (shape is None or (r.grid == tuple(map(int, shape[0])) and r.block == tuple(map(int, shape[1]))))]
    return out[skip:]
