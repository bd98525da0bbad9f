"""Running the app under libapply: once observed (the original kernels, timed) and once applied, per round.

Both runs time the launches each manifest entry matches with the same in-app timer (an event pair around
the launch, resolved lazily, as the recorder's in-app times); the observed run's times are the original
kernel's, the applied run's the tuned kernel's. A kernel the in-app timer cannot see (launched inside a CUDA
graph) is timed by a pair of runs under Nsight Compute (mneme/apply/ncutimer.py; `timer`). The app's own
output of each run is shown as it comes.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import mneme
from mneme.apply import ncutimer
from mneme.errors import ConfigurationError
from mneme.record.runner import find_preload_library

LIB_NAME = "libapply.so"
#: libapply's exit status when --check found a mismatch (native/apply/check.c: MNA_CHECK_EXIT)
CHECK_EXIT = 86


def find_libapply(build: bool = True) -> Path:
    """libapply.so: $MNEME_LIBAPPLY, else mneme/lib/libapply.so (built from native/apply in a source checkout,
    as mneme record builds librecord)."""
    src = Path(mneme.__file__).resolve().parent.parent / "native" / "apply"
    return find_preload_library(LIB_NAME, "MNEME_LIBAPPLY", src, ConfigurationError, build)


@dataclass
class EntryStats:
    matched: int = 0
    applied: int = 0
    fell_back: int = 0
    checked: int = 0
    lost: int = 0
    timed: int = 0
    total_ns: int = 0
    samples: List[int] = field(default_factory=list)

    @property
    def median_ns(self) -> Optional[float]:
        return float(statistics.median(self.samples)) if self.samples else None


@dataclass
class RunStats:
    mode: str
    returncode: int
    wall_s: float
    entries: Dict[int, EntryStats] = field(default_factory=dict)
    unmatched: int = 0
    #: timed launches whose hold the watchdog had to release (native/apply/timing.c): not timed
    holds_broken: int = 0
    warnings: List[str] = field(default_factory=list)
    check_failed: str = ""
    stats_missing: bool = False
    #: "events" (libapply's in-app timer) or "ncu" (the run was under Nsight Compute: slower, not for wall time)
    timer: str = "events"
    ncu_rows: List[ncutimer.NcuRow] = field(default_factory=list)


def parse_stats(text: str, mode: str, returncode: int, wall_s: float) -> RunStats:
    """The statistics file libapply writes at exit (native/apply/launch.c: write_stats)."""
    lines = text.splitlines()
    if not lines or lines[0] != "mneme-apply-stats 1":
        raise ConfigurationError("not a libapply statistics file (version 1)")
    st = RunStats(mode, returncode, wall_s)
    for line in lines[1:]:
        key, _, rest = line.partition(" ")
        if key == "mode":
            st.mode = rest
        elif key == "entry":
            w = rest.split()
            vals = dict(zip(w[1::2], (int(v) for v in w[2::2])))
            st.entries[int(w[0])] = EntryStats(**{k: vals.get(k, 0) for k in
                                                  ("matched", "applied", "fell_back", "checked", "lost", "timed", "total_ns")})
        elif key == "samples":
            w = rest.split()
            st.entries.setdefault(int(w[0]), EntryStats()).samples = [int(v) for v in w[1:]]
        elif key == "unmatched":
            st.unmatched = int(rest)
        elif key == "holds_broken":
            st.holds_broken = int(rest)
        elif key == "warn":
            st.warnings.append(rest)
        elif key == "check_failed":
            st.check_failed = rest
    return st


@dataclass
class ApplyRunner:
    manifest: Path
    workdir: Path
    argv: Sequence[str]
    check: int = 0
    atol: Optional[float] = None
    rtol: Optional[float] = None
    tol_type: str = "f32"
    lib: Optional[Path] = None
    quiet: bool = False
    #: seconds one run of the app may take (None: no bound); a run past it is killed and reported (exit 124)
    timeout: Optional[float] = None
    #: auto (ncu only for kernels applied but never timed in-app), events, ncu (every run under ncu)
    timer: str = "events"
    #: the manifest's kernels (mangled), for ncu's kernel filter
    kernels: Sequence[str] = ()

    def env(self, mode: str, stats: Path) -> Dict[str, str]:
        if self.lib is None:
            self.lib = find_libapply()
        lib = self.lib
        env = dict(os.environ)
        pre = env.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = f"{lib}:{pre}" if pre else str(lib)
        env["MNEME_APPLY_MANIFEST"] = str(self.manifest)
        env["MNEME_APPLY_MODE"] = mode
        env["MNEME_APPLY_STATS"] = str(stats)
        env["MNEME_APPLY_CHECK"] = str(self.check if mode == "apply" else 0)
        if self.atol is not None or self.rtol is not None:
            from mneme.snapshot import elem_code

            env["MNEME_APPLY_CHECK_ELEM"] = str(elem_code(self.tol_type))
            env["MNEME_APPLY_CHECK_ATOL"] = repr(float(self.atol or 0.0))
            env["MNEME_APPLY_CHECK_RTOL"] = repr(float(self.rtol or 0.0))
        return env

    def run(self, mode: str, round_no: int = 0, ncu: bool = False) -> RunStats:
        tag = f"{mode}-{round_no}{'-ncu' if ncu else ''}"
        stats = self.workdir / f"stats-{tag}.txt"
        stats.unlink(missing_ok=True)
        argv = list(self.argv)
        if ncu:
            exe = ncutimer.require_ncu()
            report = self.workdir / f"ncu-{tag}"
            ncutimer.report_file(report).unlink(missing_ok=True)
            argv = ncutimer.wrap(argv, self.kernels, report, exe)
        if not self.quiet:
            print(f"mneme apply: [{mode} run {round_no + 1}{', under ncu' if ncu else ''}] {' '.join(self.argv)}",
                  file=sys.stderr, flush=True)
        env = self.env(mode, stats)
        t0 = time.perf_counter()
        timed_out = False
        try:
            p = subprocess.run(argv, env=env, timeout=self.timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:  # subprocess.run killed it
            timed_out, rc = True, 124
        except OSError as e:
            raise ConfigurationError(f"cannot run {self.argv[0]}: {e}") from None
        wall = time.perf_counter() - t0
        if timed_out:
            st = RunStats(mode, rc, wall, stats_missing=True)
            st.warnings.append(f"the {mode} run did not end within {self.timeout:g} s and was killed (--app-timeout)")
            return st
        if not stats.is_file():
            st = RunStats(mode, rc, wall, stats_missing=True)
            st.warnings.append(f"libapply wrote no statistics ({stats}): the app ended without running its exit "
                               "handlers (killed, or _exit), or libapply was not loaded")
            return st
        st = parse_stats(stats.read_text(), mode, rc, wall)
        if ncu:
            st.timer = "ncu"
            st.ncu_rows, why = ncutimer.read_report(report, exe)
            if why:
                st.warnings.append(f"the {mode} run under ncu: {why}")
        return st

    def rounds(self, n: int = 1) -> List[Dict[str, RunStats]]:
        """n rounds of (observe, apply), alternating, so drift hits both alike; stops after a failed check.
        With timer auto, one more round under ncu when a kernel was applied but never timed in-app."""
        if self.timer not in ncutimer.TIMERS:
            raise ConfigurationError(f"--timer {self.timer}: not one of {', '.join(ncutimer.TIMERS)}")
        out = []
        for i in range(max(1, n)):
            obs = self.run("observe", i, ncu=self.timer == "ncu")
            app = self.run("apply", i, ncu=self.timer == "ncu")
            out.append({"observe": obs, "apply": app})
            if app.check_failed or app.returncode == CHECK_EXIT:
                return out
        if self.timer == "auto" and untimed(out) and self.kernels:
            if ncutimer.find_ncu() is None:
                out[-1]["apply"].warnings.append(
                    "a kernel was applied where the in-app timer cannot time it (inside a CUDA graph) and Nsight "
                    "Compute's ncu was not found to time it (put ncu on PATH, or use --timer events to skip this)")
            else:
                i = len(out)
                out.append({"observe": self.run("observe", i, ncu=True), "apply": self.run("apply", i, ncu=True)})
        return out


def untimed(rounds: List[Dict[str, RunStats]]) -> List[int]:
    """Entries applied in the runs so far of which no launch was timed in-app in one of the two modes."""
    def stats(i: int, mode: str) -> List[EntryStats]:
        return [r[mode].entries[i] for r in rounds if i in r[mode].entries]

    keys = sorted({i for r in rounds for m in ("observe", "apply") for i in r[m].entries})
    return [i for i in keys if sum(e.applied for e in stats(i, "apply")) > 0 and
            not all(any(e.samples for e in stats(i, m)) for m in ("observe", "apply"))]
