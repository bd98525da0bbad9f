"""Where recorded memory is placed in the replay process: the host pages around pinned-host blobs, the
granules around managed-memory blobs and the reservation windows around those.

The app's managed memory (cudaMallocManaged) lies where the recording process's driver put it, in the host's
mmap area (0x7f...). On the H200 (driver 580.159.04, 2026-12-03) a 2 MB cuMemAddressReserve there was granted
elsewhere in 10 of 12 fresh processes (the driver serves small reservations from its own pools), while a
64 MB one at the 64 MB-aligned address around it was granted where asked in all 12: `managed_windows` gives
the windows replay reserves when the exact spans are refused. `host_mappings` says what lies at a range that
still cannot be had. Holding the ranges on the host before the device opened (`AddressHold`) made every
placement fail there, so replay takes no holds.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Iterable, List, Optional, Tuple

from mneme.device.errors import AddressNotGranted, check, lib
from mneme.snapshot import Space

__all__ = ["HOLD_UNIT", "MANAGED_WINDOWS", "AddressHold", "host_mappings", "host_regions", "managed_spans",
           "managed_windows", "not_placed"]


def host_regions(blobs: Iterable[Any], page: Optional[int] = None) -> List[Tuple[int, int]]:
    """Page-aligned (addr, size) regions covering every pinned-host blob, touching pages merged: the
    recorder's pinned region and host memory the app registered itself (cudaHostRegister)."""
    return _cover(blobs, Space.HOST_PINNED, page or os.sysconf("SC_PAGESIZE"))


def managed_spans(blobs: Iterable[Any], granularity: int) -> List[Tuple[int, int]]:
    """Granularity-aligned (addr, size) spans covering every managed-memory blob, touching spans merged:
    where replay reserves device memory at the recorded addresses (the app's cudaMallocManaged ranges)."""
    return _cover(blobs, Space.MANAGED, granularity)


#: the window sizes replay reserves around managed spans, in turn, when the exact spans are not granted
MANAGED_WINDOWS = (64 << 20, 1 << 30)


def managed_windows(spans: Iterable[Tuple[int, int]], unit: int) -> List[Tuple[int, int, int, int]]:
    """(window base, window size, backed base, backed size) per group of `spans` whose `unit`-aligned windows
    touch: one reservation per window, backed from its first span's start to its last span's end."""
    out: List[List[int]] = []
    for addr, size in sorted(spans):
        lo, hi = addr // unit * unit, -(-(addr + size) // unit) * unit
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
            out[-1][3] = max(out[-1][3], addr + size)
        else:
            out.append([lo, hi, addr, addr + size])
    return [(lo, hi - lo, a, b - a) for lo, hi, a, b in out]


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


#: the unit of address holds (the H200's allocation granularity)
HOLD_UNIT = 2 << 20


class AddressHold:
    """Host address space kept free at [addr, addr + size) (an inaccessible mapping without memory) until
    `release()`: the app's managed memory lay in the host's mmap area (0x7f...), where this process's own
    libraries and the driver's address space may land by chance. Replay takes none (see the module's text);
    tests use it to stand for a library mapped there. AddressNotGranted when something lives there already."""

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
