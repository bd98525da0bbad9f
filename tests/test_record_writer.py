"""librecord's recording path end to end on the CPU, through a stand-in driver (tests/data/recordrun:
device memory is host memory at the arena's fixed addresses): one instance of a kernel that changes one
buffer and only reads another, its prologue written on a thread of its own while the launch and the
epilogue go on (MNEME_SNAPSHOT_THREAD, default on) or on the launching thread; and an app that really
crashes (SIGSEGV) while that thread is still writing. The GPU side: tests/gpu/test_record_options.py."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
from pathlib import Path

import pytest

from mnemetest import build_standin

DATA = Path(__file__).resolve().parent / "data" / "recordrun"
N = 1 << 20  # floats per buffer: 4 MiB each


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_standin(tmp_path_factory.mktemp("recordrun"), DATA, "app")


def run_app(built: Path, raw: Path, n: int = N, table: int = N, **env_extra: str) -> subprocess.CompletedProcess:
    from mneme.record.runner import find_librecord

    raw.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MNEME_", "FAKE_", "APP_")) and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(built / "fake"), LD_PRELOAD=str(find_librecord()), MNEME_RECORD_DIR=str(raw),
               MNEME_KERNELS="fill", MNEME_VA_BYTES=str(1 << 30), MNEME_HOST_BYTES=str(64 << 20), MNEME_RETIME="0",
               **env_extra)
    return subprocess.run([str(built / "app"), str(n), str(table)], env=env, capture_output=True, text=True,
                          timeout=120)


def floats(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


@pytest.mark.parametrize("thread", ["1", "0"])
def test_an_instance_is_recorded_whole_with_the_prologue_on_its_own_thread_or_not(built, tmp_path, thread):
    from mneme.record.rawlog import read_log
    from mneme.snapshot import Snapshot

    raw = tmp_path / "raw"
    p = run_app(built, raw, MNEME_SNAPSHOT_THREAD=thread)
    assert p.returncode == 0, p.stdout + p.stderr
    out = dict(kv.split("=") for kv in p.stdout.split())
    data, table = int(out["data"]), int(out["table"])
    (log,) = raw.glob("r0-p*.jsonl")
    parsed = read_log(log)
    (inst,) = parsed.instances.values()
    assert parsed.exit is not None
    t = inst.recorder_time
    # the split adds up: copy + hash/diff + write + retime + other + the kernel - hidden = record() + the
    # wait for the prologue at the next instance or at exit
    parts = t["copy_ns"] + t["diff_ns"] + t["write_ns"] + t["retime_ns"] + t["other_ns"] - t["hidden_ns"]
    assert abs(parts + 5000 - t["record_ns"] - t["wait_ns"]) <= 1, t  # the stand-in's kernel takes 5 us
    assert (t["hidden_ns"] > 0) == (thread == "1"), "only a prologue on its own thread runs under the epilogue"
    assert thread == "1" or t["wait_ns"] == 0
    before = floats(range(N))
    with Snapshot.read(raw / inst.prologue) as pro, Snapshot.read(raw / inst.epilogue) as epi:
        assert bytes(pro.find_blob(data).contents) == before
        assert bytes(pro.find_blob(table).contents) == floats([7.0] * N)
        assert epi.find_blob(table).ranges == [], "the kernel only read the table"
        assert epi.find_blob(table).checksum == pro.find_blob(table).checksum
        epi.apply(pro)
        assert bytes(epi.find_blob(data).contents) == floats([i + 1.0 for i in range(N)])
        assert bytes(epi.find_blob(table).contents) == floats([7.0] * N)


def test_a_crash_while_the_prologue_is_being_written_leaves_no_instance_and_no_file_that_reads_as_good(built,
                                                                                                      tmp_path):
    """The stand-in's launch waits until the prologue's thread has put bytes on disk, then the process
    dies of SIGSEGV with 64 MiB of that prologue still to write: the raw log ends with the signal's exit
    event and names no instance, and the torn prologue is refused by the reader."""
    from mneme.errors import SnapshotError
    from mneme.record.rawlog import read_log
    from mneme.snapshot import Snapshot

    raw = tmp_path / "raw"
    p = run_app(built, raw, n=16 << 20, FAKE_CRASH="1")
    assert p.returncode == -signal.SIGSEGV, p.stdout + p.stderr
    written = int(p.stdout.split("crashing with ")[1].split()[0])
    assert written > 0, "the prologue's thread had begun writing when the app crashed"
    (log,) = raw.glob("r0-p*.jsonl")
    parsed = read_log(log)
    assert parsed.instances == {} and parsed.exit["how"] == "signal" and parsed.exit["signal"] == signal.SIGSEGV
    prologues = list(raw.glob("*.prologue"))
    assert prologues and not list(raw.glob("*.epilogue"))
    for path in prologues:
        assert path.stat().st_size < 2 * (64 << 20), "cut short"
        with pytest.raises(SnapshotError, match="truncated|END|checksum|length"):
            Snapshot.read(path)


def test_a_crash_after_the_launch_returned_waits_for_the_prologue_and_loses_no_instance(built, tmp_path):
    """record() returns while the prologue's thread still writes (a 256 MiB table, fsynced, against an
    epilogue of 4 MiB); the app then dies of SIGSEGV. The fatal-signal path waits for the prologue and
    writes the instance event: both files are complete and rebuild the kernel's result."""
    from mneme.record.rawlog import read_log
    from mneme.snapshot import Snapshot

    raw, n, nt = tmp_path / "raw", 1 << 20, 64 << 20
    p = run_app(built, raw, n=n, table=nt, APP_CRASH_AFTER_LAUNCH="1", MNEME_SNAPSHOT_FSYNC="1")
    assert p.returncode == -signal.SIGSEGV, p.stdout + p.stderr
    out = dict(kv.split("=") for kv in p.stdout.split())
    parsed = read_log(raw.glob("r0-p*.jsonl").__next__())
    assert parsed.exit["how"] == "signal"
    (inst,) = parsed.instances.values()
    assert inst.recorder_time["wait_ns"] > 0, "the prologue was still being written when the app crashed"
    with Snapshot.read(raw / inst.prologue) as pro, Snapshot.read(raw / inst.epilogue) as epi:
        assert pro.find_blob(int(out["table"])).size == 4 * nt
        epi.apply(pro)
        assert bytes(epi.find_blob(int(out["data"])).contents) == floats([i + 1.0 for i in range(n)])


def test_the_next_instance_waits_for_the_previous_prologue_and_occurrences_follow_their_instance(built, tmp_path):
    """Three launches: the instance, the same instance again (an occurrence), a second instance (grid 2),
    whose record() first finishes the first one's prologue. Each instance event precedes the occurrence
    lines of its instance, and the second prologue holds the state after the first two launches."""
    import json

    from mneme.record.rawlog import read_log
    from mneme.snapshot import Snapshot

    raw = tmp_path / "raw"
    p = run_app(built, raw, APP_MORE="1")
    assert p.returncode == 0, p.stdout + p.stderr
    data = int(dict(kv.split("=") for kv in p.stdout.split())["data"])
    (log,) = raw.glob("r0-p*.jsonl")
    events = [json.loads(x) for x in log.read_text().splitlines()]
    order = [(e["ev"], e["i"]) for e in events if e["ev"] in ("inst", "occ")]
    assert order.index(("inst", 0)) < order.index(("occ", 0)), order
    assert max(e["n"] for e in events if e["ev"] == "occ" and e["i"] == 0) == 2
    parsed = read_log(log)
    assert sorted(parsed.instances) == [0, 1]
    second = parsed.instances[1]
    with Snapshot.read(raw / second.prologue) as pro, Snapshot.read(raw / second.epilogue) as epi:
        assert bytes(pro.find_blob(data).contents) == floats([i + 2.0 for i in range(N)])
        epi.apply(pro)
        assert bytes(epi.find_blob(data).contents) == floats([i + 3.0 for i in range(N)])
