"""Reading the recorder's raw output: one JSON-lines log per recorded process (`r<rank>-p<pid>.jsonl`)
next to the snapshot files it names.

The recorder appends one line per event and may die at any point (a crashing app, a full disk), so a
log is read as far as it is whole: an unterminated or unparsable last line marks the log incomplete
but loses nothing before it. The event vocabulary is the recorder's (native/recorder/*.c).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from mneme.errors import RecordError

RAW_VERSION = 1
LOG_GLOB = "r*-p*.jsonl"

#: skip reasons that are launch paths mneme cannot replay (reported as unsupported)
UNSUPPORTED = ("graph_capture", "graph_node", "driver_api", "other_device", "graph_opaque")
#: what each skip reason means, for summaries
SKIP_TEXT = {
    # graph_capture, graph_node, driver_api: older recorders only (kernels of graphs are recorded at cuGraphLaunch)
    "graph_capture": "launched inside a CUDA graph capture",
    "graph_node": "added to a CUDA graph as a kernel node",
    "graph_opaque": "launched in a CUDA graph the recorder cannot run node by node (memory alloc/free, "
                    "conditional or other such nodes)",
    "driver_api": "launched through the driver API (cuLaunchKernel)",
    "other_device": "launched on a device other than the recorded one",
    "capture_elsewhere": "launched while another stream was being captured",
    "pending_error": "launched while the context held an error",
    "no_param_info": "the driver gave no parameter layout",
    "failed": "recording failed",
    "max_recordings": "beyond --max-recordings",
    "skipped": "within --skip",
}
FOREIGN_TEXT = {
    # managed memory is snapshotted (SNAPSHOTTED); a recorder logs kind 0 only when its table ran out of memory
    0: "managed memory (cudaMallocManaged) the recorder could not keep track of (out of host memory)",
    1: "host memory the app registered itself (cudaHostRegister) that the device sees at another address, "
       "or I/O memory, which replay cannot place",
    2: "pinned host memory outside the recorder's fixed region",
    3: "device memory outside the recorder's arena (another device, or the arena was full: record again with a larger --va-size)",
    4: "memory a CUDA graph's memory allocation node allocated (cudaGraphAddMemAllocNode, or cudaMallocAsync "
       "captured into a graph), which the recorder does not snapshot",
}

#: memory outside the arena whose contents every snapshot holds, so replay places it at the recorded
#: addresses: raw-log field of the "inst" event -> (the DB's kind name, what it is)
SNAPSHOTTED = {
    "managed": ("managed", "managed memory (cudaMallocManaged): device memory at the recorded addresses in replay"),
    "registered": ("host_registered", "host memory the app registered (cudaHostRegister): mapped at the recorded "
                                      "host addresses in replay"),
}


@dataclass
class SnapshottedRange:
    """A range of memory outside the arena that the instance's snapshots hold by contents."""

    kind: str      # a SNAPSHOTTED kind name
    addr: int
    size: int


#: the recorder's time split per recorded instance: raw-log field -> name in the DB's InstanceAttributes
RECORDER_TIME = {"t_copy": "copy_ns", "copy_bytes": "copy_bytes", "t_diff": "diff_ns", "t_write": "write_ns",
                 "t_retime": "retime_ns", "t_hidden": "hidden_ns", "t_other": "other_ns", "t_wait": "wait_ns",
                 "t_record": "record_ns"}


@dataclass
class RawInstance:
    """One recorded instance as the recorder logged it."""

    kernel: str
    iid: int
    api: str
    grid: List[int]
    block: List[int]
    shmem: int
    params: List[List[int]]            # [offset, size] per parameter
    args: bytes
    masked: List[List[int]]            # [offset, length] excluded from the key
    mask_source: str                   # "ir" or "value"
    prologue: Path
    epilogue: Path
    t_ns: int
    cluster: Optional[List[int]] = None
    cooperative: bool = False
    attrs: List[int] = field(default_factory=list)
    foreign: List[List[int]] = field(default_factory=list)   # [arg offset, kind]
    texture_words: List[int] = field(default_factory=list)
    #: why the texture/surface objects at texture_words could not be captured ("" when they were)
    texture_why: str = ""
    occurrences: int = 1
    samples: List[int] = field(default_factory=list)
    stored_bytes: int = 0
    blob_bytes: int = 0
    #: the recorder's own time for this instance (ns; copy_bytes in bytes), see RECORDER_TIME
    recorder_time: Dict[str, int] = field(default_factory=dict)
    #: live managed / app-registered ranges snapshotted with it (the recorder names at most 32 per kind)
    snapshotted: List[SnapshottedRange] = field(default_factory=list)
    #: per SNAPSHOTTED kind name: (ranges, bytes) over all of them
    snapshotted_totals: Dict[str, List[int]] = field(default_factory=dict)
    #: the context's limits at the launch (mneme.config.CONTEXT_LIMITS names): heap size, pending launches ...
    limits: Dict[str, int] = field(default_factory=dict)


def _limits(pairs) -> Dict[str, int]:
    """The recorder's [[CUlimit, value], ...] by mneme.config.CONTEXT_LIMITS name (unknown ids by number)."""
    from mneme.config import CONTEXT_LIMITS

    names = {v: k for k, v in CONTEXT_LIMITS.items()}
    return {names.get(int(i), f"limit_{int(i)}"): int(v) for i, v in pairs}


@dataclass
class KernelStats:
    launches: int = 0
    recorded_launches: int = 0
    instances: int = 0
    skips: Dict[str, int] = field(default_factory=dict)


@dataclass
class ProcessLog:
    """Everything one recorded process logged."""

    path: Path
    start: Dict[str, Any] = field(default_factory=dict)
    device: Dict[str, Any] = field(default_factory=dict)
    arena: Dict[str, Any] = field(default_factory=dict)
    pinned: Dict[str, Any] = field(default_factory=dict)
    kernels: Dict[int, str] = field(default_factory=dict)
    variables: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    objects: List[str] = field(default_factory=list)
    instances: Dict[int, RawInstance] = field(default_factory=dict)
    stats: Dict[str, KernelStats] = field(default_factory=dict)
    unsupported: Dict[str, List[str]] = field(default_factory=dict)
    errors: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    exit: Optional[Dict[str, Any]] = None
    #: timed launches whose hold the recorder's watchdog released (native/hold): not timed, and the launches
    #: timed after it were not held (their in-app times include host launch latency)
    holds_broken: int = 0
    truncated: bool = False          # the last line was cut off (crash or full disk)
    write_failed: bool = False       # the recorder said a write failed

    @property
    def rank(self) -> int:
        r = int(self.start.get("rank", 0))
        return max(r, 0)

    @property
    def pid(self) -> int:
        return int(self.start.get("pid", 0))

    @property
    def complete(self) -> bool:
        return not (self.truncated or self.write_failed)

    def how_it_ended(self) -> str:
        if self.exit is None:
            return "killed (no exit record: SIGKILL or a crash in the recorder)"
        if self.exit.get("how") == "signal":
            return f"signal {self.exit.get('signal')}"
        return "exited"


def _stats(log: ProcessLog, name: str) -> KernelStats:
    return log.stats.setdefault(name, KernelStats())


def _apply(log: ProcessLog, ev: Dict[str, Any]) -> None:
    kind = ev.get("ev")
    if kind == "start":
        if int(ev.get("v", 0)) != RAW_VERSION:
            raise RecordError(
                f"{log.path}: raw log version {ev.get('v')} (this mneme reads {RAW_VERSION}); "
                "librecord.so and the mneme package do not match: rebuild with `make native`"
            )
        log.start = ev
    elif kind == "kernel":
        log.kernels[int(ev["k"])] = ev["name"]
    elif kind == "var":
        log.variables[ev["name"]] = {"size": ev["size"], "const": bool(ev["const"]), "managed": bool(ev["managed"])}
    elif kind == "varaddr":
        log.variables.setdefault(ev["name"], {})["addr"] = ev.get("addr")
    elif kind == "device":
        log.device = ev
    elif kind == "arena":
        log.arena = ev
    elif kind == "pinned_region":
        log.pinned = ev
    elif kind == "object":
        if ev["path"] not in log.objects:
            log.objects.append(ev["path"])
    elif kind == "inst":
        name = log.kernels.get(int(ev["k"]), f"kernel#{ev['k']}")
        base = log.path.parent
        log.instances[int(ev["i"])] = RawInstance(
            kernel=name,
            iid=int(ev["i"]),
            api=ev.get("api", ""),
            grid=list(ev["grid"]),
            block=list(ev["block"]),
            shmem=int(ev["shmem"]),
            params=[list(p) for p in ev["params"]],
            args=bytes.fromhex(ev["args"]),
            masked=[list(p) for p in ev.get("ptr", [])],
            mask_source=ev.get("ptr_src", "value"),
            prologue=base / ev["pro"],
            epilogue=base / ev["epi"],
            t_ns=int(ev.get("t_ns", 0)),
            cluster=list(ev["cluster"]) if "cluster" in ev else None,
            cooperative=bool(ev.get("coop", 0)),
            attrs=list(ev.get("attrs", [])),
            foreign=[list(f) for f in ev.get("foreign", [])],
            texture_words=list(ev.get("tex", [])),
            texture_why=str(ev.get("tex_why", "")),
            stored_bytes=int(ev.get("pro_bytes", 0)) + int(ev.get("epi_bytes", 0)),
            blob_bytes=int(ev.get("blob_bytes", 0)),
            # timed reruns of the app's kernel on the prologue (MNEME_RETIME), warm where t_ns may be cold
            samples=[int(t) for t in ev.get("rt", [])],
            recorder_time={name: int(ev[f]) for f, name in RECORDER_TIME.items() if f in ev},
            snapshotted=[SnapshottedRange(SNAPSHOTTED[f][0], int(a), int(n))
                         for f in SNAPSHOTTED for a, n in ev.get(f, [])],
            snapshotted_totals={SNAPSHOTTED[f][0]: [int(ev[f + "_n"]), int(ev[f + "_bytes"])]
                                for f in SNAPSHOTTED if f + "_n" in ev},
            limits=_limits(ev.get("limits", [])),
        )
    elif kind == "occ":
        inst = log.instances.get(int(ev["i"]))
        if inst is not None:
            inst.occurrences = max(inst.occurrences, int(ev["n"]))
            inst.samples.extend(int(t) for t in ev.get("t", []))
    elif kind == "kstat":
        name = log.kernels.get(int(ev["k"]), f"kernel#{ev['k']}")
        log.stats[name] = KernelStats(
            launches=int(ev["launches"]),
            recorded_launches=int(ev["recorded_launches"]),
            instances=int(ev["instances"]),
            skips={k: int(v) for k, v in ev.get("skips", {}).items()},
        )
    elif kind == "unsupported":
        name = log.kernels.get(int(ev["k"]), f"kernel#{ev['k']}")
        reasons = log.unsupported.setdefault(name, [])
        if ev["why"] not in reasons:
            reasons.append(ev["why"])
        st = _stats(log, name)
        st.skips[ev["why"]] = max(st.skips.get(ev["why"], 0), 1)
    elif kind == "error":
        log.errors.append(ev.get("what", "") + (f": {ev['detail']}" if ev.get("detail") else ""))
        if "cannot write" in ev.get("what", ""):
            log.write_failed = True
    elif kind == "warning":
        log.warnings.append(ev.get("what", "") + (f": {ev['detail']}" if ev.get("detail") else ""))
    elif kind == "exit":
        log.exit = ev
        log.holds_broken = int(ev.get("holds_broken", 0))
        if int(ev.get("incomplete", 0)):
            log.write_failed = True


def read_log(path: Path) -> ProcessLog:
    """Parses one raw log as far as it is whole."""
    log = ProcessLog(path=Path(path))
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise RecordError(f"{path}: cannot read the raw record log ({e.strerror})") from None
    lines = data.split(b"\n")
    if lines and lines[-1] != b"":
        log.truncated = True  # the last line has no newline: cut off mid-write
    for lineno, raw in enumerate(lines[:-1], 1):
        if not raw.strip():
            continue
        try:
            ev = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.truncated = True
            continue
        try:
            _apply(log, ev)
        except (KeyError, TypeError, ValueError) as e:
            raise RecordError(f"{path}:{lineno}: malformed {ev.get('ev')!r} event ({e!r})") from None
    return log


def read_raw_dir(raw_dir: Path) -> List[ProcessLog]:
    """Every process log of one recording run, ordered by rank then pid."""
    logs = [read_log(p) for p in sorted(Path(raw_dir).glob(LOG_GLOB))]
    return sorted(logs, key=lambda lg: (lg.rank, lg.pid, str(lg.path)))
