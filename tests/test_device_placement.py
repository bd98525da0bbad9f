"""Placement of recorded memory without a GPU: the holds that keep the app's managed-memory ranges free in
the replay process until their arenas take them (mneme.device.placement), and what the process has mapped
where a range cannot be had."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mneme.device.errors import AddressNotGranted
from mneme.device.placement import HOLD_UNIT, AddressHold, hold_managed, host_mappings, not_placed
from mneme.snapshot import Space
from mnemetest import free_range


def _free_range(size: int) -> int:
    """An address (a multiple of HOLD_UNIT) where `size` bytes are unmapped now: inside a mapping the kernel
    chose, unmapped again."""
    return free_range(size, HOLD_UNIT)


def _managed(addr: int, size: int):
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


def test_hold_managed_holds_each_free_span_and_skips_a_taken_one():
    addr = _free_range(8 * HOLD_UNIT)
    taken = AddressHold(addr + 4 * HOLD_UNIT, HOLD_UNIT)  # stands in for a library mapped there
    try:
        blobs = [_managed(addr + 100, 4096), _managed(addr + HOLD_UNIT - 8, 16),  # one span of 2 units
                 _managed(addr + 4 * HOLD_UNIT + 64, 64),                          # inside the taken unit
                 SimpleNamespace(addr=addr + 6 * HOLD_UNIT, size=64, space=int(Space.DEVICE))]  # not managed
        holds = hold_managed(blobs)
        try:
            assert [(h.addr, h.size) for h in holds] == [(addr, 2 * HOLD_UNIT)]
            assert holds[0].overlaps(addr + HOLD_UNIT, 1) and not holds[0].overlaps(addr + 2 * HOLD_UNIT, 1)
        finally:
            for h in holds:
                h.release()
    finally:
        taken.release()


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
