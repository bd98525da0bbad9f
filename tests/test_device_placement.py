"""Placement of recorded memory without a GPU (mneme.device.placement): the reservation windows around the
app's managed-memory spans, the holds that stand for a library mapped at a range, and what the process has
mapped where a range cannot be had."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mneme.device.errors import AddressNotGranted
from mneme.device.placement import HOLD_UNIT, AddressHold, host_mappings, managed_spans, managed_windows, not_placed
from mneme.snapshot import Space
from mnemetest import free_range


def _free_range(size: int) -> int:
    """An address (a multiple of HOLD_UNIT) where `size` bytes are unmapped now: inside a mapping the kernel
    chose, unmapped again."""
    return free_range(size, HOLD_UNIT)


def _managed(addr: int, size: int):  # a blob as managed_spans reads it
    return SimpleNamespace(addr=addr, size=size, space=int(Space.MANAGED))


def test_a_hold_keeps_the_range_mapped_without_access_until_released():
    addr = _free_range(2 * HOLD_UNIT)
    h = AddressHold(addr, 2 * HOLD_UNIT)
    try:
        found = host_mappings(addr, 2 * HOLD_UNIT)
        assert found and all(" ---p " in f" {line} " for line in found), found
        with pytest.raises(AddressNotGranted, match=f"0x{addr + HOLD_UNIT:x}.*File exists"):
            AddressHold(addr + HOLD_UNIT, HOLD_UNIT)  # the range is taken: a second hold is refused
        assert "this process maps there" in not_placed(addr, HOLD_UNIT)
    finally:
        h.release()
    assert not h.held and host_mappings(addr, 2 * HOLD_UNIT) == []
    h.release()  # twice is harmless
    assert "no host mapping of this process overlaps it" in not_placed(addr, HOLD_UNIT)


def test_managed_spans_group_into_windows_each_backed_from_its_first_to_its_last_span():
    mb = 1 << 20
    base = 0x7F2000000000  # a multiple of 64 MB
    blobs = [_managed(base + 6 * mb + 64, 256), _managed(base + 8 * mb + 8, 64),   # one 4 MB span
             _managed(base + 40 * mb, 3 * mb),                                      # same 64 MB window
             _managed(base + 64 * mb - 4096, 8192),                                 # straddles two windows
             _managed(base + 300 * mb, 16),                                         # a window of its own
             SimpleNamespace(addr=base + 200 * mb, size=64, space=int(Space.DEVICE))]  # not managed
    spans = managed_spans(blobs, 2 * mb)
    assert spans == [(base + 6 * mb, 4 * mb), (base + 40 * mb, 4 * mb), (base + 62 * mb, 4 * mb),
                     (base + 300 * mb, 2 * mb)]
    assert managed_windows(spans, 64 * mb) == [
        (base, 128 * mb, base + 6 * mb, 60 * mb),           # the straddling span joins the first window's group
        (base + 256 * mb, 64 * mb, base + 300 * mb, 2 * mb)]
    assert managed_windows(spans, 1 << 30) == [(base, 1 << 30, base + 6 * mb, 296 * mb)]
    assert managed_windows([], 64 * mb) == []


def test_host_mappings_reads_the_overlapping_lines():
    maps = ("7f3300000000-7f3304200000 r-xp 00000000 08:01 42 /usr/lib/libbig.so\n"
            "7f3304200000-7f3304400000 ---p 00000000 00:00 0 \n"
            "7f3400000000-7f3400001000 rw-p 00000000 00:00 0 [heap]\n")
    assert host_mappings(0x7F3304000000, 3 << 20, maps) == [
        "7f3300000000-7f3304200000 r-xp 00000000 08:01 42 /usr/lib/libbig.so",
        "7f3304200000-7f3304400000 ---p 00000000 00:00 0"]
    assert host_mappings(0x7F3304400000, 4096, maps) == []


def test_replay_leaves_the_managed_ranges_to_the_driver_when_the_device_opens(tmp_path, monkeypatch):
    # Holding the app's managed ranges before the device opened was tried on the H200 (2026-12-03) and made it
    # worse: every managed replay failed ("no host mapping overlaps it"; the driver offered the range next door),
    # where fresh `mneme replay` processes without holds had placed it. The driver lays out its own address space
    # at init; a hole punched into it moves that layout. The pipeline therefore takes no holds.
    import shutil

    from mnemetest import FIXTURES
    from mneme.errors import DeviceError
    from mneme.record.db import find_dbs
    from mneme.replay.pipeline import ReplayPipeline
    from mneme.snapshot import Snapshot, SnapshotType, Writer

    d = tmp_path / "vecadd"
    shutil.copytree(FIXTURES / "vecadd", d)
    (db,) = find_dbs(str(d))
    pipe = ReplayPipeline(db, None)
    addr = _free_range(HOLD_UNIT)
    pro = pipe.instance.prologue_fn
    with Snapshot.read(pro) as old:
        blobs = [(b.addr, bytes(b.contents), b.space) for b in old.blobs]
        a = old.args
        raw, offsets, sizes = bytes(a.raw), list(a.offsets), list(a.sizes)
    with Writer(pro, SnapshotType.PROLOGUE) as w:
        for b_addr, data, space in blobs:
            w.blob(b_addr, data, space)
        w.blob(addr + 64, b"\x01" * 256, Space.MANAGED)
        w.args(raw=raw, offsets=offsets, sizes=sizes)
    seen = {}
    real_open = ReplayPipeline._open_device

    def open_device(self):
        seen["maps"] = host_mappings(addr, HOLD_UNIT)
        real_open(self)

    monkeypatch.setattr(ReplayPipeline, "_open_device", open_device)
    monkeypatch.setenv("MNEME_LIBCUDA", str(tmp_path / "no-libcuda.so.1"))  # no driver, wherever this runs
    with pytest.raises(DeviceError, match="no NVIDIA driver"):
        pipe.open()
    assert seen["maps"] == [], seen  # nothing of ours sat in the app's managed range when the driver started
    assert host_mappings(addr, HOLD_UNIT) == []
