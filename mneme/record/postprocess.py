"""From the recorder's raw output to the record DB: one `<static-hash>.json` per kernel, its
`RecordedIR_<static-hash>.bc` and its snapshots (moved under `snapshots/`, named by static and dynamic
hash), merged into what the directory already holds.

Decisions made here, not in the recorder: the official hashes (hashing.py), which kernels have IR, and
whether a kernel can be replayed (IR present; texture/surface objects passed as arguments and captured
(mneme/record/textures.py); no pointers into memory replay cannot place; at least one recordable launch).
Managed memory and host memory the app registered itself are not in the arena but are snapshotted by
contents (rawlog.SNAPSHOTTED), so replay places them; each instance's `SnapshottedMemory` attribute says
how much of it there was.
"""

from __future__ import annotations

import datetime
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from mneme.config import dim3
from mneme.errors import MnemeError, RecordError
from mneme.locks import FileLock
from mneme.record.db import DEFAULT_VADDR, KernelInstance, RecordedExecution, median
from mneme.record.hashing import dynamic_hash, static_hash_without_ir
from mneme.record.kerneltable import IRIndex, KernelIR
from mneme.record.rawlog import FOREIGN_TEXT, SKIP_TEXT, UNSUPPORTED, ProcessLog, RawInstance, read_raw_dir
from mneme.record.textures import instance_textures, memory_reasons

MAX_TIMES = 1000
SNAPSHOT_DIR = "snapshots"
LOCK_NAME = ".mneme-record.lock"
NO_IR_REASON = "no IR: the app was not built with `mneme cc` (rebuild it with `mneme cc` and record again)"


@dataclass
class KernelSummary:
    """What one kernel got from this recording (one line of `mneme record`'s summary)."""

    name: str
    demangled: str
    static_hash: str = ""
    db_path: Optional[Path] = None
    new_instances: int = 0
    instances: int = 0
    occurrences: int = 0
    median_ns: Optional[float] = None
    has_ir: bool = False
    replayable: bool = False
    reason: str = ""
    launches: int = 0
    skips: Dict[str, int] = field(default_factory=dict)
    complete: bool = True

    def line(self) -> str:
        head = f"{self.demangled}"
        if self.static_hash:
            head += f"  [{self.static_hash[:12]}]"
        parts = [f"{self.instances} instance{'s' if self.instances != 1 else ''} ({self.new_instances} new)"]
        if self.occurrences:
            parts.append(f"{self.occurrences} launch{'es' if self.occurrences != 1 else ''} recorded")
        if self.median_ns is not None:
            parts.append(f"median {self.median_ns / 1000:.1f} us in-app")
        for why, n in sorted(self.skips.items()):
            parts.append(f"{n} {SKIP_TEXT.get(why, why)}")
        if self.db_path is not None:
            parts.append("replayable" if self.replayable else f"NOT replayable: {self.reason}")
        elif not self.has_ir:
            parts.append("no IR (not built with mneme cc)")
        return f"{head}: " + ", ".join(parts)


@dataclass
class RecordOutcome:
    db_dir: Path
    kernels: List[KernelSummary]
    complete: bool
    processes: int
    errors: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    #: the recorder's own time over this run's recorded instances (RECORDER_TIME's names, summed)
    recorder_time: Dict[str, int] = field(default_factory=dict)
    recorded_instances: int = 0
    #: timed launches the recorder's hold watchdog released, over all processes (rawlog.ProcessLog.holds_broken)
    holds_broken: int = 0
    #: mneme record's own wall time around the app (runner.record fills it): prepare_s, app_s, postprocess_s
    wall_split: Dict[str, float] = field(default_factory=dict)

    def wall_line(self) -> Optional[str]:
        """Where `mneme record`'s wall time went: before the app, the app's run under the recorder, after it."""
        w = self.wall_split
        if not w:
            return None
        rec = self.recorder_time.get("record_ns", 0) / 1e9
        inside = f" (recorder {rec:.3f} s of it)" if self.recorded_instances and "record_ns" in self.recorder_time else ""
        return (f"wall {sum(w.values()):.3f} s: prepare {w['prepare_s']:.3f} s (IR index, kernel table), "
                f"app {w['app_s']:.3f} s{inside}, post-processing {w['postprocess_s']:.3f} s")

    def recorder_time_line(self) -> Optional[str]:
        """Where the recorder's time went, or None when it recorded nothing (or an older recorder did)."""
        t = self.recorder_time
        if not self.recorded_instances or "record_ns" not in t:
            return None
        s = lambda key: t.get(key, 0) / 1e9  # noqa: E731
        copied = t.get("copy_bytes", 0)
        rate = f" ({copied / t['copy_ns']:.2f} GB/s over {copied / 1e9:.3f} GB)" if t.get("copy_ns") else ""
        return (f"recorder time {s('record_ns'):.3f} s for {self.recorded_instances} instance(s): "
                f"copy {s('copy_ns'):.3f} s{rate}, hash/diff {s('diff_ns'):.3f} s, write {s('write_ns'):.3f} s, "
                f"retime {s('retime_ns'):.3f} s" + (f", other {s('other_ns'):.3f} s" if "other_ns" in t else "")
                + (f", hidden {s('hidden_ns'):.3f} s (prologue hash/write on its thread, not waited for)"
                   if t.get("hidden_ns") else "")
                + (f", waited {s('wait_ns'):.3f} s" if t.get("wait_ns") else ""))

    def holds_line(self) -> Optional[str]:
        """What a broken timing hold means for the in-app times, or None when none broke."""
        if not self.holds_broken:
            return None
        n = self.holds_broken
        return (f"{n} timed launch{'es' if n != 1 else ''} stayed held until the hold watchdog released "
                f"{'them' if n != 1 else 'it'} (not timed); later timed launches of that process were not held, so "
                "their in-app times include host launch latency (MNEME_RECORD_HOLD_MS)")

    @property
    def kernels_without_ir(self) -> List[str]:
        return [k.demangled for k in self.kernels if not k.has_ir]


@contextmanager
def db_lock(db_dir: Path) -> Iterator[None]:
    """One post-processing at a time per record directory (merges read, then rewrite, DB files)."""
    lock = FileLock(str(db_dir / LOCK_NAME))
    try:
        db_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except OSError as e:
        raise RecordError(f"cannot write the record DB into {db_dir}: {e.strerror}") from None
    try:
        yield
    finally:
        lock.release()
        lock.close()


def _split_args(inst: RawInstance) -> List[str]:
    """Argument bytes per parameter, as hex strings (the DB's Args)."""
    return [inst.args[off : off + size].hex() for off, size in inst.params]


def _param_of(inst: RawInstance, offset: int) -> int:
    for i, (off, size) in enumerate(inst.params):
        if off <= offset < off + size:
            return i
    return -1


def snapshotted_memory(raw: RawInstance) -> Dict[str, Dict[str, object]]:
    """The DB's `SnapshottedMemory` of an instance: per kind (managed, host_registered) how many ranges
    and bytes outside the arena its snapshots hold, and the ranges the recorder named."""
    out: Dict[str, Dict[str, object]] = {}
    for r in raw.snapshotted:
        k = out.setdefault(r.kind, {"Ranges": 0, "Bytes": 0, "Named": []})
        k["Named"].append({"Address": hex(r.addr), "Bytes": r.size})
        k["Ranges"] += 1
        k["Bytes"] += r.size
    for kind, (n, nbytes) in raw.snapshotted_totals.items():
        k = out.setdefault(kind, {"Ranges": 0, "Bytes": 0, "Named": []})
        k["Ranges"], k["Bytes"] = n, nbytes
    return out


def _provenance_entry(log: ProcessLog) -> Dict[str, object]:
    dev = log.device
    start = log.start
    when = start.get("time_ns")
    return {
        "run": start.get("run", ""),
        "host": start.get("host", ""),
        "pid": log.pid,
        "rank": start.get("rank", -1),
        "exe": start.get("exe", ""),
        "time": datetime.datetime.fromtimestamp(when / 1e9, datetime.timezone.utc).isoformat() if when else "",
        "gpu": dev.get("gpu", ""),
        "sm": dev.get("sm", ""),
        "sms": dev.get("sms"),
        "uuid": dev.get("uuid", ""),
        "driver": dev.get("driver"),
        "runtime": dev.get("runtime"),
        "app_exit": log.how_it_ended(),
    }


@dataclass
class _KernelRun:
    """One kernel's share of a recording run, gathered over all processes."""

    name: str
    instances: List[Tuple[ProcessLog, RawInstance]] = field(default_factory=list)
    launches: int = 0
    skips: Dict[str, int] = field(default_factory=dict)
    logs: List[ProcessLog] = field(default_factory=list)

    @property
    def unsupported(self) -> Dict[str, int]:
        return {k: v for k, v in self.skips.items() if k in UNSUPPORTED}


def _gather(logs: List[ProcessLog]) -> Dict[str, _KernelRun]:
    runs: Dict[str, _KernelRun] = {}
    for log in logs:
        names = set(log.stats) | {i.kernel for i in log.instances.values()}
        for name in names:
            kr = runs.setdefault(name, _KernelRun(name))
            kr.logs.append(log)
            st = log.stats.get(name)
            if st is not None:
                kr.launches += st.launches
                for why, n in st.skips.items():
                    kr.skips[why] = kr.skips.get(why, 0) + n
        for inst in log.instances.values():
            runs[inst.kernel].instances.append((log, inst))
    return runs


#: what a kernel that allocates from the device heap means for its recording (warning, replay hints)
HEAP_NOTE = ("allocates from the device heap (malloc/new in device code): the heap is not recorded, so replay "
             "allocates from its own and the heap pointers it stores differ from the app's; later kernels that "
             "read objects it allocated find no recorded memory there. It was not rerun for timing in the app")


def _replay_reasons(ir: Optional[KernelIR], kr: _KernelRun, managed_vars: List[str]) -> List[str]:
    reasons: List[str] = []
    if ir is None:
        reasons.append(NO_IR_REASON)
    elif ir.uses_textures:
        reasons += memory_reasons(ir.textures)
    if ir is None and any(inst.texture_words for _, inst in kr.instances):
        reasons.append("an argument equals a live texture/surface object, which replay cannot recreate")
    if ir is not None:
        for i in ir.fnptr_params if not ir.code_tables else ():
            name = ir.arg_names[i] if i < len(ir.arg_names) else f"#{i}"
            reasons.append(f"argument {i} ({name}) is a device function pointer the kernel calls, and no variable of "
                           "its module names a device function (`__device__ fn_t p = f;`, a table, a vtable): replay "
                           "cannot tell which function the app's address is, so it cannot give the replay module's")
        used = sorted(set(ir.variables) & set(managed_vars))
        if used:
            reasons.append(f"it uses __managed__ variable(s) {', '.join(used)}, which replay cannot place")
    seen = set()
    for _, inst in kr.instances:
        for off, kind in inst.foreign:
            key = (_param_of(inst, off), kind)
            if key in seen:
                continue
            seen.add(key)
            reasons.append(f"argument {key[0]} points into {FOREIGN_TEXT.get(kind, f'memory of kind {kind}')}")
    if not kr.instances and kr.unsupported:
        ways = ", ".join(f"{n} {SKIP_TEXT[w]}" for w, n in sorted(kr.unsupported.items()))
        reasons.append(f"no launch could be recorded ({ways})")
    return reasons


def _arena(logs: List[ProcessLog]) -> Tuple[str, int]:
    for log in logs:
        if log.arena:
            return log.arena.get("base", hex(DEFAULT_VADDR)), int(log.arena.get("bytes", 0))
    start = logs[0].start if logs else {}
    return start.get("va_base", hex(DEFAULT_VADDR)), int(start.get("va_bytes", 0))


def _move(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.stat().st_dev == dst.parent.stat().st_dev:
        os.replace(src, dst)
    else:
        shutil.move(str(src), str(dst))


class _Writer:
    """Builds or extends one kernel's DB file."""

    def __init__(self, db_dir: Path, name: str, ir: Optional[KernelIR], kr: _KernelRun, warnings: List[str]):
        self.db_dir = db_dir
        self.name = name
        self.ir = ir
        self.kr = kr
        self.warnings = warnings
        self.static = ir.static_hash if ir else static_hash_without_ir(name)
        self.path = db_dir / f"{self.static}.json"
        self.db: Optional[RecordedExecution] = None
        self.texture_reasons: List[str] = []
        if self.path.exists():
            self.db = RecordedExecution.from_json(str(self.path), check_files=False)

    def _check_arena(self, vaddr: str, vasize: int) -> None:
        if self.db is None or not self.db.kernel_instances:
            return
        if int(str(self.db.va_addr), 16) != int(str(vaddr), 16):
            raise RecordError(
                f"{self.path}: its instances were recorded with the arena at {self.db.va_addr}, this run used "
                f"{vaddr} (MNEME_VA_BASE); record into another directory or with the same base"
            )

    def instances(self, complete_flags: List[bool]) -> Tuple[Dict[str, KernelInstance], Dict[str, dict], int]:
        insts: Dict[str, KernelInstance] = dict(self.db.kernel_instances) if self.db else {}
        attrs: Dict[str, dict] = dict((self.db.extra.get("InstanceAttributes") or {}) if self.db else {})
        new = 0
        for log, raw in self.kr.instances:
            if not (raw.prologue.is_file() and raw.epilogue.is_file()):
                complete_flags.append(False)
                self.warnings.append(f"{self.name}: instance {raw.iid} of {log.path.name} lost its snapshot files")
                continue
            dh = dynamic_hash(self.static, raw.grid, raw.block, raw.shmem, raw.args,
                              [tuple(r) for r in raw.masked], raw.cluster, raw.cooperative)
            times = [raw.t_ns] + raw.samples if raw.t_ns else list(raw.samples)
            if dh in insts:
                old = insts[dh]
                old.occ += raw.occurrences
                old.in_app_times_ns = (list(old.in_app_times_ns) + times)[:MAX_TIMES]
                old.in_app_time_ns = median(old.in_app_times_ns)
                for f in (raw.prologue, raw.epilogue):
                    f.unlink()
                continue
            rel_pro = f"{SNAPSHOT_DIR}/{self.static}-{dh}.prologue"
            rel_epi = f"{SNAPSHOT_DIR}/{self.static}-{dh}.epilogue"
            _move(raw.prologue, self.db_dir / rel_pro)
            _move(raw.epilogue, self.db_dir / rel_epi)
            insts[dh] = KernelInstance(
                static_hash=self.static,
                dynamic_hash=dh,
                kernel_name=self.name,
                args=_split_args(raw),
                shared_mem=raw.shmem,
                block_dim=dim3(*raw.block),
                grid_dim=dim3(*raw.grid),
                specializations=self.specializations(raw),
                occ=raw.occurrences,
                prologue_fn=str(self.db_dir / rel_pro),
                epilogue_fn=str(self.db_dir / rel_epi),
                in_app_time_ns=median(times),
                in_app_times_ns=times[:MAX_TIMES],
                prologue_rel=rel_pro,
                epilogue_rel=rel_epi,
            )
            a = {"Api": raw.api, "MaskedBytes": raw.masked, "MaskSource": raw.mask_source, "Rank": log.rank,
                 "StateBytes": raw.blob_bytes, "SnapshotBytes": raw.stored_bytes}
            if raw.cluster:
                a["Cluster"] = raw.cluster
            if raw.cooperative:
                a["Cooperative"] = True
            if raw.attrs:
                a["OtherLaunchAttributes"] = raw.attrs
            if self.ir is not None and self.ir.textures is not None and self.ir.textures.params:
                tex, why = instance_textures(self.ir.textures, self.db_dir / rel_pro, self.db_dir / rel_epi, raw.params,
                                             raw.args, self.ir.arg_names, raw.texture_why)
                a["Textures"] = tex
                self.texture_reasons += [r for r in why if r not in self.texture_reasons]
            if raw.recorder_time:
                a["RecorderTime"] = dict(raw.recorder_time)
            if raw.limits:
                a["ContextLimits"] = dict(raw.limits)
            if raw.snapshotted or raw.snapshotted_totals:
                a["SnapshottedMemory"] = snapshotted_memory(raw)
            attrs[dh] = a
            new += 1
        return insts, attrs, new

    def specializations(self, raw: Optional[RawInstance]) -> List[bool]:
        if self.ir is not None:
            return list(self.ir.specializations)
        n = len(raw.params) if raw is not None else 0
        return [False] * n

    def write(self, logs: List[ProcessLog], managed_vars: List[str]) -> Tuple[RecordedExecution, int, List[str]]:
        vaddr, vasize = _arena(self.kr.logs or logs)
        self._check_arena(vaddr, vasize)
        complete_flags = [lg.complete for lg in self.kr.logs]
        insts, attrs, new = self.instances(complete_flags)
        reasons = _replay_reasons(self.ir, self.kr, managed_vars) + self.texture_reasons
        if self.db is not None and not self.db.replayable and self.db.not_replayable_reason:
            for r in self.db.not_replayable_reason.split("; "):
                if r not in reasons and not r.startswith("no launch could be recorded"):
                    reasons.append(r)
        if insts and any(r.startswith("no launch could be recorded") for r in reasons):
            reasons = [r for r in reasons if not r.startswith("no launch could be recorded")]
        modules: List[str] = []
        if self.ir is not None:
            ir_path = self.db_dir / f"RecordedIR_{self.static}.bc"
            if not ir_path.exists():
                ir_path.write_bytes(self.ir.bitcode)
            modules = [str(ir_path)]
        first_raw = self.kr.instances[0][1] if self.kr.instances else None
        extra = dict(self.db.extra) if self.db else {}
        unsupported = dict(extra.get("UnsupportedLaunches") or {})
        for why, n in self.kr.unsupported.items():
            unsupported[why] = unsupported.get(why, 0) + n
        extra["UnsupportedLaunches"] = unsupported
        extra["Launches"] = int(extra.get("Launches", 0)) + self.kr.launches
        extra["InstanceAttributes"] = attrs
        extra["SourceModules"] = list(self.ir.modules) if self.ir else []
        extra["DeviceState"] = list(self.ir.state) if self.ir else []
        if self.ir is not None and "heap" in self.ir.state and not self.db:
            self.warnings.append(f"{self.ir.demangled}: {HEAP_NOTE}")
        if self.ir is not None and self.ir.build:
            extra["BuildSettings"] = dict(self.ir.build)  # the app's device build flags: the replay baseline's
        if self.ir is not None and self.ir.fnptr_params:
            extra["FunctionPointerParams"] = list(self.ir.fnptr_params)  # relocated by mneme.replay.codemap
        if self.ir is not None and self.ir.other_unit_functions:
            extra["OtherUnitFunctions"] = list(self.ir.other_unit_functions)
        prov = dict(self.db.provenance) if self.db else {}
        runs = list(prov.get("runs", []))
        runs += [_provenance_entry(lg) for lg in self.kr.logs]
        first = runs[0] if runs else {}
        for key in ("gpu", "sm", "driver", "runtime"):
            prov.setdefault(key, first.get(key))
        prov["runs"] = runs
        self._check_ir_arch(prov.get("sm"))
        if self.db is not None and self.db.va_size and vasize:
            vasize = max(vasize, self.db.va_size)
        db = RecordedExecution(
            static_hash=self.static,
            kernel_name=self.name,
            demangled_name=self.ir.demangled if self.ir else _demangle(self.name),
            llvm_files=modules,
            arg_names=list(self.ir.arg_names) if self.ir else [f"arg{i}" for i in range(len(first_raw.params) if first_raw else 0)],
            specializations=self.specializations(first_raw),
            va_addr=vaddr,
            va_size=vasize or (self.db.va_size if self.db else 0),
            kernel_instances=insts,
            arg_kinds=list(self.ir.arg_kinds) if self.ir else ["unknown"] * (len(first_raw.params) if first_raw else 0),
            replayable=not reasons,
            not_replayable_reason="; ".join(reasons),
            provenance=prov,
            complete=all(complete_flags) and (self.db.complete if self.db else True),
            path=str(self.path),
            extra=extra,
        )
        db.to_json(str(self.path))
        return db, new, reasons


    def _check_ir_arch(self, sm: object) -> None:
        """Warns when the IR is for another architecture of the app's build than the one the app ran
        (MNEME_IR_ARCH, docs/CC.md): code that tests __CUDA_ARCH__ differs, CUB's policies among it."""
        from mneme.cc.cc import ir_arch

        build = self.ir.build if self.ir is not None else {}
        archs, have = list(build.get("archs") or []), build.get("arch")
        if not sm or not have or len(archs) < 2:
            return
        gpu = str(sm) if str(sm).startswith("sm_") else f"sm_{sm}"
        best = ir_arch(archs, gpu)
        if best != have:
            self.warnings.append(
                f"{self.ir.demangled}: its IR was compiled for {have}, but the app ran {best}'s code of its build "
                f"({', '.join(archs)}) on this {gpu} GPU; code that tests __CUDA_ARCH__ (CUB's and Thrust's "
                f"policies: block sizes, launch bounds) differs in replay. Rebuild with MNEME_IR_ARCH={gpu} "
                "and record again")


def _demangle(name: str) -> str:
    from mneme.ir.module import demangle

    return demangle(name)


def _remove_raw(raw_dir: Path) -> None:
    if not raw_dir.is_dir():
        return
    for p in raw_dir.iterdir():
        if p.is_file():
            p.unlink()
    try:
        raw_dir.rmdir()
    except OSError:
        pass


def _record_kernel(db_dir: Path, name: str, kr: _KernelRun, index: IRIndex, logs: List[ProcessLog],
                   managed_vars: List[str], warnings: List[str]) -> KernelSummary:
    """Writes (or extends) one kernel's DB when it has instances or unsupported launches."""
    ir: Optional[KernelIR] = None
    if index.has(name):
        try:
            ir = index.closure(name)
        except MnemeError as e:
            warnings.append(f"{name}: cannot extract its IR closure ({e}); recorded without IR")
    summary = KernelSummary(name=name, demangled=ir.demangled if ir else _demangle(name), has_ir=ir is not None,
                            launches=kr.launches, skips=dict(kr.skips))
    if not (kr.instances or kr.unsupported):
        return summary
    w = _Writer(db_dir, name, ir, kr, warnings)
    db, new, _ = w.write(logs, managed_vars)
    summary.static_hash = db.static_hash
    summary.db_path = w.path
    summary.new_instances = new
    summary.instances = len(db)
    summary.occurrences = sum(i.occ for i in db.values())
    summary.median_ns = median([t for i in db.values() for t in i.in_app_times_ns])
    summary.replayable = db.replayable
    summary.reason = db.not_replayable_reason
    summary.complete = db.complete
    return summary


def postprocess(raw_dir: Path, db_dir: Path, index: Optional[IRIndex] = None, keep_raw: bool = False) -> RecordOutcome:
    """Turns one run's raw output into (or adds it to) the record DB in `db_dir`."""
    raw_dir, db_dir = Path(raw_dir), Path(db_dir)
    logs = read_raw_dir(raw_dir)
    outcome = RecordOutcome(db_dir=db_dir, kernels=[], complete=all(lg.complete for lg in logs), processes=len(logs))
    for lg in logs:
        outcome.errors += [f"{lg.path.name}: {e}" for e in lg.errors]
        outcome.warnings += [f"{lg.path.name}: {w}" for w in lg.warnings]
        outcome.holds_broken += lg.holds_broken
        for inst in lg.instances.values():
            outcome.recorded_instances += 1
            for key, v in inst.recorder_time.items():
                outcome.recorder_time[key] = outcome.recorder_time.get(key, 0) + v
    index = index or IRIndex()
    for lg in logs:
        for obj in lg.objects:
            try:
                index.add_file(obj)
            except MnemeError as e:
                outcome.warnings.append(f"cannot read the IR embedded in {obj}: {e}")
    managed_vars = sorted({n for lg in logs for n, v in lg.variables.items() if v.get("managed")})
    runs = _gather(logs)
    with db_lock(db_dir):
        for name in sorted(runs):
            summary = _record_kernel(db_dir, name, runs[name], index, logs, managed_vars, outcome.warnings)
            if summary.db_path is not None:
                outcome.complete = outcome.complete and summary.complete
            outcome.kernels.append(summary)
    if not keep_raw:
        _remove_raw(raw_dir)
    return outcome
