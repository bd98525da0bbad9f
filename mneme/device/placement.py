"""Where recorded memory is placed in the replay process: the host pages around pinned-host blobs, the
granules around managed-memory blobs, and holds that keep the managed ranges free until their arenas take them.

The app's managed memory (cudaMallocManaged) lies where the recording process's driver put it, in the host's
mmap area (0x7f...), which this process's libraries and the driver's own address space may cover by chance
(the kernel randomizes where the mmap area starts). `host_mappings` says what lies there when a range cannot
be had. `hold_managed` keeps ranges free, but the replay pipeline does not use it: held from before the device
opened, on the H200 (2026-12-03) every managed replay then failed, the driver's own layout moved by the hole.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Iterable, List, Optional, Tuple

from mneme.device.errors import AddressNotGranted, check, lib
from mneme.snapshot import Space

__all__ = ["HOLD_UNIT", "AddressHold", "hold_managed", "host_mappings", "host_regions", "managed_spans", "not_placed"]


def host_regions(blobs: Iterable[Any], page: Optional[int] = None) -> List[Tuple[int, int]]:
    """Page-aligned (addr, size) regions covering every pinned-host blob, touching pages merged: the
    recorder's pinned region and host memory the app registered itself (cudaHostRegister)."""
    return _cover(blobs, Space.HOST_PINNED, page or os.sysconf("SC_PAGESIZE"))


def managed_spans(blobs: Iterable[Any], granularity: int) -> List[Tuple[int, int]]:
    """Granularity-aligned (addr, size) spans covering every managed-memory blob, touching spans merged:
    where replay reserves device memory at the recorded addresses (the app's cudaMallocManaged ranges)."""
    return _cover(blobs, Space.MANAGED, granularity)


def _cover(blobs: Iterable[Any], space: Space, unit: int) -> List[Tuple[int, int]]:
    spans = sorted((b.addr // unit * unit, -(-(b.addr + max(b.size, 1)) // unit) * unit)
                   for b in blobs if Space(b.space) == space)
    out: List[List[int]] = []
    for lo, hi in spans:
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in out]


#: managed spans are held in units of this before a device is open (then the device's granularity rules)
HOLD_UNIT = 2 << 20


class AddressHold:
    """Host address space kept free at [addr, addr + size) (an inaccessible mapping without memory) until
    `release()`: the app's managed memory lay in the host's mmap area (0x7f...), where this process's own
    libraries and the driver's address space may land by chance; held before the device opens, the range
    is still free when its arena is placed. AddressNotGranted when something lives there already."""

    def __init__(self, addr: int, size: int) -> None:
        _, native = lib()
        check(native.mnc_va_hold(int(addr), int(size)))
        self.addr, self.size = int(addr), int(size)
        self._finalizer = weakref.finalize(self, native.mnc_va_release, self.addr, self.size)

    @property
    def held(self) -> bool:
        return self._finalizer.alive

    def overlaps(self, addr: int, size: int) -> bool:
        return self.addr < addr + size and addr < self.addr + self.size

    def release(self) -> None:
        if self._finalizer.alive:
            check(self._finalizer())

    def __repr__(self) -> str:
        return f"AddressHold(0x{self.addr:x}, {self.size}{'' if self.held else ', released'})"


def hold_managed(blobs: Iterable[Any], unit: int = HOLD_UNIT) -> List[AddressHold]:
    """Holds of the spans of every managed-memory blob that are free now; a span that is not free gets
    none (placing its arena then says what is there)."""
    out = []
    for addr, size in managed_spans(blobs, unit):
        try:
            out.append(AddressHold(addr, size))
        except AddressNotGranted:
            pass
    return out


def host_mappings(addr: int, size: int, maps: Optional[str] = None) -> List[str]:
    """The lines of /proc/self/maps (or `maps`) whose mapping overlaps [addr, addr + size)."""
    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return []
    out = []
    for line in maps.splitlines():
        lo, _, hi = line.partition(" ")[0].partition("-")
        try:
            if int(lo, 16) < addr + size and addr < int(hi, 16):
                out.append(" ".join(line.split()))
        except ValueError:
            continue
    return out


def not_placed(addr: int, size: int) -> str:
    """What this process has at a managed span that could not be placed, for the error."""
    found = host_mappings(addr, size)
    if found:
        return "; this process maps there: " + "; ".join(found[:4]) + (" ..." if len(found) > 4 else "")
    return "; no host mapping of this process overlaps it (the driver keeps that range for itself)"
