"""Running an app under the recorder: find librecord.so, check for a driver, write the kernel table,
set the environment, show progress while the app runs, then post-process into the record DB."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Optional, Sequence, TextIO, Tuple

import mneme
from mneme.errors import RecordError
from mneme.record.kerneltable import IRIndex, compile_selector, executables_in, write_table
from mneme.record.layout import DEFAULT_VADDR
from mneme.record.rawlog import LOG_GLOB, SKIP_TEXT

if TYPE_CHECKING:  # post-processing (and the record-DB schema) load while the app runs: see record()
    from mneme.record.postprocess import RecordOutcome

LIB_NAME = "librecord.so"
EPILOGUE_FORMATS = ("diff", "bytes", "best")
_RANKS = re.compile(r"^(all|\d+(-\d+)?(,\d+(-\d+)?)*)$")
GIB = 1 << 30
#: errors of the recorder that mean nothing could be recorded
FATAL = ("the fixed device address range was not granted", "cannot set up the device arena",
         "the app found no CUDA driver")


@dataclass
class RecordSettings:
    """`mneme record`'s options (the CLI maps its flags onto these)."""

    db_dir: Path
    kernels: Optional[str] = None
    max_recordings: int = 10
    skip: int = 0
    va_size_gib: float = 4.0
    epilogue_format: str = "diff"
    record_ranks: str = "0"
    va_base: int = DEFAULT_VADDR
    pinned_size_gib: float = 1.0
    keep_raw: bool = False
    #: extra timed runs of each new instance's own kernel on its prologue, for a warm in-app median
    retime: int = 10
    #: ... for at most this long per instance (the first rerun always runs); 0: no bound
    retime_budget_s: float = 1.0
    #: fsync every snapshot file: durable across a crash of the machine, not only of the app (slower)
    snapshot_fsync: bool = False

    def validate(self) -> None:
        if not _RANKS.match(self.record_ranks):
            raise RecordError(f"--record-ranks {self.record_ranks!r}: expected 'all' or ranks such as 0,3 or 0-3")
        for spec in self.record_ranks.split(","):
            lo, _, hi = spec.partition("-")
            if hi and int(hi) < int(lo):
                raise RecordError(f"--record-ranks {self.record_ranks!r}: the range {spec} runs backwards")
        if not self.va_size_gib > 0:
            raise RecordError(f"--va-size {self.va_size_gib}: must be a positive number of GiB")
        if not self.pinned_size_gib > 0:
            raise RecordError(f"--pinned-size {self.pinned_size_gib}: must be a positive number of GiB")
        if self.max_recordings < 0:
            raise RecordError(f"--max-recordings {self.max_recordings}: must be 0 (no limit) or more")
        if not 0 <= self.retime <= 64:
            raise RecordError(f"--retime {self.retime}: must be 0..64")
        if not 0 <= self.retime_budget_s <= 3600:
            raise RecordError(f"--retime-budget {self.retime_budget_s}: must be 0 (no bound) .. 3600 seconds")
        if self.skip < 0:
            raise RecordError(f"--skip {self.skip}: must be 0 or more")
        if self.epilogue_format not in EPILOGUE_FORMATS:
            raise RecordError(f"--epilogue-format {self.epilogue_format!r}: choose one of {', '.join(EPILOGUE_FORMATS)}")
        compile_selector(self.kernels)


def check_driver() -> None:
    """Raises before the app starts when this machine has no NVIDIA driver."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RecordError(
            f"no NVIDIA driver: libcuda.so.1 cannot be loaded ({e}). `mneme record` runs the app on a GPU: run it "
            "on a machine with an NVIDIA GPU and its driver. The app was not started."
        ) from None


def _recorder_sources() -> Path:
    return Path(mneme.__file__).resolve().parent.parent / "native" / "recorder"


def find_preload_library(name: str, env_var: str, src: Path, error: type, build: bool = True) -> Path:
    """An LD_PRELOAD library of mneme's (librecord.so, libapply.so): $ENV_VAR, else mneme/lib/NAME, built
    from its sources `src` (native/...) when the package runs from a source checkout. Problems raise
    `error` in one line that says how to build it."""
    env = os.environ.get(env_var)
    if env:
        p = Path(env)
        if not p.is_file():
            raise error(f"{env_var}={env}: no such file")
        return p.resolve()
    lib = Path(mneme.__file__).resolve().parent / "lib" / name
    if build and (src / "Makefile").is_file():
        try:
            r = subprocess.run(["make", "-s", "-C", str(src), f"OUT={lib.parent}"], capture_output=True, text=True)
        except OSError as e:
            r = None
            if not lib.is_file():
                raise error(f"cannot build {lib}: make is not available ({e}); run `make native`") from None
        if r is not None and r.returncode != 0:
            raise error(f"building {lib} failed (make -C {src}):\n{(r.stdout + r.stderr)[-3000:]}")
    if not lib.is_file():
        raise error(f"{lib} is missing: build it with `make native` (or `make -C native/{src.name}`)")
    return lib


def find_librecord(build: bool = True) -> Path:
    """librecord.so: $MNEME_LIBRECORD, else mneme/lib/librecord.so (built from native/recorder when the
    package runs from a source checkout)."""
    return find_preload_library(LIB_NAME, "MNEME_LIBRECORD", _recorder_sources(), RecordError, build)


def recorder_env(settings: RecordSettings, lib: Path, raw_dir: Path, table: Optional[Path],
                 base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The app's environment: librecord preloaded and configured through MNEME_* variables."""
    env = dict(os.environ if base is None else base)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{lib}:{preload}" if preload else str(lib)
    env["MNEME_RECORD_DIR"] = str(raw_dir)
    env["MNEME_RUN_ID"] = raw_dir.name
    env["MNEME_RECORD_RANKS"] = settings.record_ranks
    env["MNEME_MAX_RECORDINGS"] = str(settings.max_recordings)
    env["MNEME_SKIP"] = str(settings.skip)
    env["MNEME_VA_BASE"] = hex(settings.va_base)
    env["MNEME_VA_BYTES"] = str(int(settings.va_size_gib * GIB))
    env["MNEME_HOST_BYTES"] = str(int(settings.pinned_size_gib * GIB))
    env["MNEME_EPILOGUE_FORMAT"] = settings.epilogue_format
    env["MNEME_RETIME"] = str(settings.retime)
    # --snapshot-fsync, or MNEME_SNAPSHOT_FSYNC=1 in mneme record's own environment (a campaign's switch)
    env["MNEME_SNAPSHOT_FSYNC"] = "1" if settings.snapshot_fsync or env.get("MNEME_SNAPSHOT_FSYNC") == "1" else "0"
    budget = settings.retime_budget_s
    env["MNEME_RETIME_BUDGET_US"] = str(max(1, int(round(budget * 1e6))) if budget > 0 else 0)
    if settings.kernels:
        env["MNEME_KERNELS"] = settings.kernels
    else:
        env.pop("MNEME_KERNELS", None)
    if table is not None:
        env["MNEME_KERNEL_TABLE"] = str(table)
    else:
        env.pop("MNEME_KERNEL_TABLE", None)
    return env


class Progress(threading.Thread):
    """Follows the raw logs while the app runs and reports recorded instances and unsupported launches."""

    def __init__(self, raw_dir: Path, out: TextIO, demangle: Callable[[str], str]):
        super().__init__(daemon=True)
        self.raw_dir = raw_dir
        self.out = out
        self.demangle = demangle
        self.stop = threading.Event()
        self._offsets: Dict[Path, int] = {}
        self._names: Dict[Tuple[Path, int], str] = {}
        self.recorded = 0

    def run(self) -> None:
        while not self.stop.wait(0.3):
            self.poll()
        self.poll()

    def poll(self) -> None:
        import json

        for path in sorted(self.raw_dir.glob(LOG_GLOB)):
            off = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as fh:
                    fh.seek(off)
                    data = fh.read()
            except OSError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            self._offsets[path] = off + end + 1
            for raw in data[: end + 1].splitlines():
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                self.show(path, ev)

    def show(self, path: Path, ev: dict) -> None:
        kind = ev.get("ev")
        if kind == "kernel":
            self._names[(path, ev["k"])] = ev["name"]
        elif kind == "inst":
            self.recorded += 1
            name = self.demangle(self._names.get((path, ev["k"]), "?"))
            grid, block = tuple(ev["grid"]), tuple(ev["block"])
            kib = (ev.get("pro_bytes", 0) + ev.get("epi_bytes", 0)) / 1024
            outside = "".join(f", {ev[f + '_bytes'] / 1024:.0f} KiB of {what} in it"
                              for f, what in (("managed", "managed memory"), ("registered", "registered host memory"))
                              if ev.get(f + "_bytes"))
            print(f"mneme record: recorded {name} grid={grid} block={block} ({kib:.0f} KiB of snapshots{outside})",
                  file=self.out, flush=True)
        elif kind == "unsupported":
            name = self.demangle(self._names.get((path, ev["k"]), "?"))
            print(f"mneme record: {name}: {SKIP_TEXT.get(ev['why'], ev['why'])}: not recordable", file=self.out, flush=True)
        elif kind == "graph" and ev.get("why"):
            print(f"mneme record: a CUDA graph ({ev.get('nodes', '?')} nodes) is launched whole, not node by node: "
                  f"{ev['why']}; its kernels are not recorded", file=self.out, flush=True)


def _run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def _prepare_raw_dir(db_dir: Path, out: TextIO) -> Tuple[Path, bool]:
    """The run's raw directory inside the DB directory, and whether it could be written."""
    try:
        db_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RecordError(f"cannot create the record directory {db_dir}: {e.strerror}") from None
    raw = db_dir / f".raw-{_run_id()}"
    try:
        raw.mkdir()
        probe = raw / ".probe"
        probe.write_bytes(b"x" * 4096)
        probe.unlink()
        return raw, True
    except OSError as e:
        print(f"mneme record: warning: cannot write to {db_dir} ({e.strerror}); the app runs anyway, the record "
              "will be incomplete", file=out)
        return raw, False


def _ir_of(argv: Sequence[str], out: TextIO) -> IRIndex:
    from mneme.cc.embedded import libraries_with_ir

    index = IRIndex()
    exes = executables_in(argv)
    for exe in exes:
        index.add_file(exe)
        try:
            for lib in libraries_with_ir(exe):
                index.add_file(lib)
        except RecordError as e:
            print(f"mneme record: warning: {e}", file=out)
    if not index.modules:
        names = ", ".join(str(e) for e in exes) or "the command"
        print(f"mneme record: {names} carries no embedded device IR (not built with `mneme cc`): kernels are recorded "
              "without IR and cannot be replayed", file=out)
    return index


def run_app(argv: Sequence[str], env: Dict[str, str], progress: Optional[Progress]) -> int:
    """Runs the app to its end; Ctrl-C reaches the app (which flushes its record) and is waited for."""
    try:
        proc = subprocess.Popen(list(argv), env=env)
    except OSError as e:
        raise RecordError(f"cannot start {argv[0]}: {e.strerror}") from None
    if progress is not None:
        progress.start()
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:
                continue  # the app got the SIGINT too; keep waiting so its record is flushed
    finally:
        if progress is not None:
            progress.stop.set()
            progress.join()
    return rc


def record(argv: Sequence[str], settings: RecordSettings, out: TextIO = sys.stderr, check: bool = True,
           show_progress: bool = True) -> Tuple[int, RecordOutcome]:
    """Records `argv` into settings.db_dir; returns the app's exit status and what was recorded.
    `check=False` skips the driver check (the recorder then records registrations only)."""
    if not argv:
        raise RecordError("no app to record: give it after --, e.g. mneme record -rdb DIR -- ./app ARGS")
    t0 = time.perf_counter()
    settings.validate()
    if check:
        check_driver()
    lib = find_librecord()
    index = _ir_of(argv, out)
    raw, writable = _prepare_raw_dir(Path(settings.db_dir), out)
    table = None
    if index.modules and writable:
        try:
            table = write_table(index, compile_selector(settings.kernels), raw / "kernels.tsv")
        except OSError:
            table = None
    env = recorder_env(settings, lib, raw, table)
    from mneme.ir.module import demangle

    progress = Progress(raw, out, demangle) if show_progress else None
    # the record-DB schema and post-processing load while the app runs (a few tenths of a second of
    # imports that would otherwise add to the app's wall time)
    warm = threading.Thread(target=_load_postprocess, name="mneme-record-imports", daemon=True)
    warm.start()
    t1 = time.perf_counter()
    rc = run_app(argv, env, progress)
    t2 = time.perf_counter()
    warm.join()
    from mneme.record.postprocess import postprocess

    outcome = postprocess(raw, Path(settings.db_dir), index=index, keep_raw=settings.keep_raw)
    outcome.complete = outcome.complete and writable
    outcome.wall_split = {"prepare_s": t1 - t0, "app_s": t2 - t1, "postprocess_s": time.perf_counter() - t2}
    fatal = [e for e in outcome.errors if any(e.split(": ", 1)[-1].startswith(f) for f in FATAL)]
    if fatal and not any(k.instances for k in outcome.kernels):
        raise RecordError(fatal[0].split(": ", 1)[-1])
    return rc, outcome


def _load_postprocess() -> None:
    try:
        import mneme.record.postprocess  # noqa: F401
    except Exception:  # noqa: BLE001 - the import is retried, and its error shown, after the app ran
        pass


def exit_status(rc: int) -> int:
    """A shell-style status for the app's return code (signals as 128+N)."""
    return 128 - rc if rc < 0 else rc

