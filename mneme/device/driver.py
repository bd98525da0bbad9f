"""The process's GPU: which one, what it is, how long the watchdog waits.

The C core drives one device per process through one stream (a replay worker owns one GPU); opening
another device needs every arena, module and state of the first freed. Nothing here touches the
driver at import time, so `import mneme.device` works on machines without one.
"""

from __future__ import annotations

import functools
import uuid as _uuid
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from mneme.device.errors import check, lib

_current: Optional["Device"] = None


@dataclass(frozen=True)
class DeviceInfo:
    """What the driver says about one GPU."""

    ordinal: int
    name: str
    compute_capability: Tuple[int, int]
    driver_version: int
    sm_count: int
    l2_size: int
    max_shared_per_block: int
    max_shared_per_block_optin: int
    max_shared_per_sm: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    max_regs_per_block: int
    max_regs_per_sm: int
    warp_size: int
    clock_khz: int
    mem_clock_khz: int
    mem_bus_width: int
    total_mem: int
    uuid: str
    pci_bus_id: str
    unified_addressing: bool
    host_pointer_for_registered_mem: bool
    virtual_memory_management: bool

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // max(1, self.warp_size)


def _info(c: Any) -> DeviceInfo:
    ffi, _ = lib()
    return DeviceInfo(
        ordinal=c.ordinal,
        name=ffi.string(c.name).decode("utf-8", "replace"),
        compute_capability=(c.cc_major, c.cc_minor),
        driver_version=c.driver_version,
        sm_count=c.sm_count,
        l2_size=c.l2_size,
        max_shared_per_block=c.max_shared_per_block,
        max_shared_per_block_optin=c.max_shared_per_block_optin,
        max_shared_per_sm=c.max_shared_per_sm,
        max_threads_per_block=c.max_threads_per_block,
        max_threads_per_sm=c.max_threads_per_sm,
        max_blocks_per_sm=c.max_blocks_per_sm,
        max_regs_per_block=c.max_regs_per_block,
        max_regs_per_sm=c.max_regs_per_sm,
        warp_size=c.warp_size,
        clock_khz=c.clock_khz,
        mem_clock_khz=c.mem_clock_khz,
        mem_bus_width=c.mem_bus_width,
        total_mem=int(c.total_mem),
        uuid="GPU-" + str(_uuid.UUID(bytes=bytes(ffi.buffer(c.uuid, 16)))),
        pci_bus_id=ffi.string(c.pci_bus_id).decode(),
        unified_addressing=bool(c.unified_addressing),
        host_pointer_for_registered_mem=bool(c.host_pointer_for_registered_mem),
        virtual_memory_management=bool(c.virtual_memory_management),
    )


@functools.lru_cache(maxsize=None)
def device_info(ordinal: int = 0) -> DeviceInfo:
    """Properties of GPU `ordinal` without opening a context on it (they never change: cached)."""
    ffi, native = lib()
    c = ffi.new("mnc_device_info *")
    check(native.mnc_device_query(int(ordinal), c))
    return _info(c)


class Device:
    """This process's GPU: opening it retains its primary context and creates the core's stream.

    `timeout` (seconds) bounds every wait for a kernel or a copy; a kernel that runs longer raises
    DeviceTimeout and leaves the context unusable (replay runs in disposable worker processes)."""

    def __init__(self, ordinal: int = 0, timeout: Optional[float] = None) -> None:
        global _current
        ffi, native = lib()
        c = ffi.new("mnc_device_info *")
        check(native.mnc_device_open(int(ordinal), c))
        self.info = _info(c)
        self.ordinal = self.info.ordinal
        if timeout is not None:
            self.timeout = timeout
        _current = self

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def arch(self) -> str:
        return self.info.arch

    @property
    def timeout(self) -> float:
        return getattr(self, "_timeout", 60.0)

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"timeout={seconds} must be positive seconds")
        self._timeout = float(seconds)
        lib()[1].mnc_set_timeout(self._timeout)

    def set_limits(self, limits: Mapping[str, int]) -> Dict[str, str]:
        """Sets the context limits (mneme.config.CONTEXT_LIMITS names) that differ from the context's; returns
        {name: why} for each one the context refused (the heap size cannot change once a kernel that uses
        malloc ran in this process) or that is not a known limit. A refusal leaves the context usable."""
        from mneme.config import CONTEXT_LIMITS
        from mneme.device.errors import CudaError

        ffi, native = lib()
        problems: Dict[str, str] = {}
        now = ffi.new("uint64_t *")
        for name, value in sorted(limits.items()):
            if name not in CONTEXT_LIMITS:
                problems[name] = f"not a context limit mneme knows ({', '.join(CONTEXT_LIMITS)})"
                continue
            try:
                check(native.mnc_ctx_limit(CONTEXT_LIMITS[name], int(value), now))
            except CudaError as e:
                problems[name] = f"recorded {int(value)}, the context keeps {int(now[0])}: {e}"
        return problems

    @property
    def usable(self) -> bool:
        """False once a sticky error or a timeout broke the context."""
        return lib()[1].mnc_unusable() == 0

    def close(self) -> None:
        """Releases the context; every arena, module and state must be closed first."""
        global _current
        check(lib()[1].mnc_device_close())
        if _current is self:
            _current = None

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.usable:
            self.close()

    def __repr__(self) -> str:
        return f"Device({self.ordinal}, {self.name!r}, {self.arch})"


def get_device_count() -> int:
    ffi, native = lib()
    n = ffi.new("int *")
    check(native.mnc_device_count(n))
    return int(n[0])


def set_device(ordinal: int) -> Device:
    """Makes GPU `ordinal` this process's device (the seeds' set_device)."""
    if _current is not None and _current.ordinal == ordinal and lib()[1].mnc_device_current() == ordinal:
        return _current
    return Device(ordinal)


def get_device() -> Device:
    """The open device, opening GPU 0 when none is."""
    if _current is not None and lib()[1].mnc_device_current() == _current.ordinal:
        return _current
    return Device(0)


def get_device_arch(ordinal: Optional[int] = None) -> str:
    """'sm_90' for the open device (or GPU `ordinal`, or GPU 0), without opening a context."""
    if ordinal is None:
        current = lib()[1].mnc_device_current()
        ordinal = current if current >= 0 else 0
    return device_info(ordinal).arch
