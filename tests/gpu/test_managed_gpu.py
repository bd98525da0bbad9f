"""Managed memory, app-registered (zero-copy) host memory, stream-ordered and pitched allocations on the
H200 (issue 15, items 1 and 2): recorded with their contents, replayed at the recorded addresses and
verified; `mneme show` lists them as replayable, a wrong configuration still fails, and the apps run
as before under the recorder (cudaMemAdvise and cudaMemPrefetchAsync included).

The examples are recorded once per session by tests/gpu/conftest.py (SMALL: managed, zerocopy,
streamalloc); tests/gpu/test_replay_gpu.py replays every instance of them under the standard variants."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
MNEME = [sys.executable, "-m", "mneme.cli"]
ARENA = (0x153940000000, 0x153940000000 + (4 << 30))


def dbs_of(rec):
    from mneme.record.db import RecordedExecution

    return {RecordedExecution.from_json(str(p)).demangled_name.split("(")[0]: RecordedExecution.from_json(str(p))
            for p in rec.dbs()}


def only(db):
    (dh,) = list(db)
    return dh, db[dh], db.extra["InstanceAttributes"][dh]


def replay(db, *flags):
    return subprocess.run([*MNEME, "replay", "-rdb", db.path, *flags, "-it", "3"], capture_output=True, text=True,
                          timeout=300)


def words(data: bytes):
    return struct.unpack(f"<{len(data) // 8}Q", data[: len(data) // 8 * 8])


def test_managed_kernels_record_with_their_managed_memory_snapshotted(small_recordings):
    from mneme.snapshot import Snapshot, Space

    rec = small_recordings["managed"]
    assert rec.returncode == 0, rec.stdout + rec.stderr
    assert "NOT replayable" not in rec.stdout, rec.stdout
    dbs = dbs_of(rec)
    assert sorted(dbs) == ["managedRows", "managedUpdate"]
    for db in dbs.values():
        assert db.replayable and not db.not_replayable_reason, db.not_replayable_reason
        _, inst, attrs = only(db)
        mem = attrs["SnapshottedMemory"]["managed"]
        assert mem["Ranges"] >= 4, mem  # data, table, rows, weights (the runtime may hold more)
        with Snapshot.read(inst.prologue_fn) as pro:
            managed = {b.addr: b for b in pro.blobs if Space(b.space) == Space.MANAGED}
            assert {int(r["Address"], 16) for r in mem["Named"]} <= set(managed)
            assert all(not (ARENA[0] <= a < ARENA[1]) for a in managed), "managed memory is not the arena's"
            first = struct.unpack("<Q", bytes.fromhex(inst.args[0]))[0]
            assert first in managed, "the kernel's first argument is the start of a managed blob"

    # the row table: pointers inside managed data that point into another managed range
    _, inst, _ = only(dbs["managedRows"])
    with Snapshot.read(inst.prologue_fn) as pro:
        rows = struct.unpack("<Q", bytes.fromhex(inst.args[0]))[0]
        table = pro.find_blob(rows)
        assert Space(table.space) == Space.MANAGED and table.addr == rows
        targets = words(bytes(table.contents))
        assert len(targets) == 64, "16384 floats in rows of 256"
        homes = {pro.find_blob(t).addr for t in targets}
        assert len(homes) == 1 and homes != {rows}, "every row points into the one data range"
        assert Space(pro.find_blob(targets[0]).space) == Space.MANAGED
        assert list(targets) == [targets[0] + 1024 * r for r in range(len(targets))], "256 floats per row"


@pytest.mark.parametrize("kernel", ["managedUpdate", "managedRows"])
def test_managed_kernels_replay_and_verify_at_the_recorded_addresses(small_recordings, kernel):
    db = dbs_of(small_recordings["managed"])[kernel]
    p = replay(db)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "verified" in p.stdout, p.stdout


def test_a_half_grid_on_managed_memory_fails_and_does_not_leak(small_recordings):
    db = dbs_of(small_recordings["managed"])["managedUpdate"]
    p = subprocess.run([sys.executable, str(HERE / "replay_matrix.py"), "override", db.path], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    by = {r["variant"]: r for r in (json.loads(x) for x in p.stdout.splitlines() if x.startswith("{"))}
    assert by["half-grid"]["status"] == "failed_verification", by
    assert by["O3-after"]["verified"], by["O3-after"]


def test_zero_copy_registered_host_memory_records_replays_and_verifies(small_recordings):
    from mneme.snapshot import Snapshot, Space

    rec = small_recordings["zerocopy"]
    assert rec.returncode == 0 and "NOT replayable" not in rec.stdout, rec.stdout + rec.stderr
    dbs = dbs_of(rec)
    assert sorted(dbs) == ["zeroCopyRead", "zeroCopyWrite"]
    for name, db in dbs.items():
        assert db.replayable, db.not_replayable_reason
        _, inst, attrs = only(db)
        mem = attrs["SnapshottedMemory"]["host_registered"]
        assert mem["Ranges"] == 2 and mem["Bytes"] == 2 * 16384 * 4, mem
        p = replay(db)
        assert p.returncode == 0 and "verified" in p.stdout, p.stdout + p.stderr
    _, inst, _ = only(dbs["zeroCopyWrite"])
    out = struct.unpack("<Q", bytes.fromhex(inst.args[1]))[0]
    with Snapshot.read(inst.prologue_fn) as pro, Snapshot.read(inst.epilogue_fn) as epi:
        blob = pro.find_blob(out)
        assert Space(blob.space) == Space.HOST_PINNED and blob.addr == out
        changed = {b.addr: b.ranges for b in epi.blobs}
        assert changed[out], "the kernel writes the registered host buffer: the epilogue has it"


def test_stream_ordered_and_pitched_allocations_come_from_the_arena_and_verify(small_recordings):
    from mneme.snapshot import Snapshot

    rec = small_recordings["streamalloc"]
    assert rec.returncode == 0 and "NOT replayable" not in rec.stdout, rec.stdout + rec.stderr
    dbs = dbs_of(rec)
    assert sorted(dbs) == ["pitchScale", "poolAxpy", "volumeAdd"]
    for name, db in dbs.items():
        assert db.replayable, (name, db.not_replayable_reason)
        _, inst, attrs = only(db)
        assert "SnapshottedMemory" not in attrs, "all of it is arena memory"
        first = struct.unpack("<Q", bytes.fromhex(inst.args[0])[:8])[0]  # volumeAdd: cudaPitchedPtr.ptr
        assert ARENA[0] <= first < ARENA[1], f"{name}: 0x{first:x} is not in the arena"
        with Snapshot.read(inst.prologue_fn) as pro:
            assert pro.find_blob(first) is not None
        p = replay(db)
        assert p.returncode == 0 and "verified" in p.stdout, (name, p.stdout + p.stderr)
    _, inst, _ = only(dbs["pitchScale"])
    pitch = struct.unpack("<Q", bytes.fromhex(inst.args[1]))[0]
    assert pitch >= 256 * 4, f"cudaMallocPitch's pitch {pitch}"


def test_mneme_show_lists_them_replayable_with_their_memory(small_recordings):
    for name, says in (("managed", "managed memory"), ("zerocopy", "registered host memory"), ("streamalloc", None)):
        p = subprocess.run([*MNEME, "show", str(small_recordings[name].dir)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "NOT replayable" not in p.stdout and "unsupported" not in p.stdout.lower(), p.stdout
        assert p.stdout.count("replayable") >= len(dbs_of(small_recordings[name])), p.stdout
        if says:
            assert f"(+ {says} " in p.stdout, p.stdout
