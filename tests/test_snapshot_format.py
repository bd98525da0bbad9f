"""Snapshot files through the C writer and reader: every record type, the epilogue formats, apply,
writer errors, and the lifetime rules of the Python handles."""

import gc
import os
import random
import time

import pytest

from mneme.errors import SnapshotError
from mneme.snapshot import (
    Encoding,
    Reloc,
    Snapshot,
    SnapshotType,
    Space,
    Writer,
    checksum,
    diff_ranges,
    pack_args,
)

PRO, EPI = SnapshotType.PROLOGUE, SnapshotType.EPILOGUE


def write(path, kind, fn):
    with Writer(path, kind) as w:
        fn(w)
    return path


def test_every_record_type_round_trips(tmp_path):
    rnd = random.Random(1)
    big = bytes(rnd.randrange(256) for _ in range(100_003))
    t0 = time.time_ns()

    def fill(w):
        w.blob(0x7000_0000_0000, big)
        w.blob(0x1000, b"")
        w.blob(0x2000, b"pinned!", space=Space.HOST_PINNED)
        w.variable("_ZN4data5tableE", 0x9000, b"\x11" * 24, is_const=True,
                   relocs=[(0, "_Z5otherv", 16), Reloc(8, None, 0), (16, "a_very_long_target_name" * 10, 0)])
        w.variable("plain", 0x9100, b"\x22" * 3)
        w.variable("empty", 0x9200, b"")
        w.args(raw=b"ABCDEFGHIJKL", offsets=[0, 8], sizes=[8, 4])
        w.annotation(0x7000_0000_0000, 400, "f16", "rel", "l2", 1e-2, "out")
        w.annotation(0x2000, 4, "u8", "abs", "linf", 0.0)

    with Snapshot.read(write(tmp_path / "p.snap", PRO, fill)) as s:
        assert (s.kind, s.version) == (PRO, 1)
        assert t0 <= s.created_ns <= time.time_ns()
        assert [b.addr for b in s.blobs] == [0x1000, 0x2000, 0x7000_0000_0000]  # sorted by address
        empty, pinned, large = s.blobs
        assert bytes(large.contents) == big and large.size == len(big) and large.encoding == Encoding.BYTES
        assert large.checksum == checksum(big)
        assert empty.size == 0 and bytes(empty.contents) == b""
        assert pinned.space == Space.HOST_PINNED and bytes(pinned.contents) == b"pinned!"
        v = s.find_variable("_ZN4data5tableE")
        assert v.is_const and v.addr == 0x9000 and bytes(v.contents) == b"\x11" * 24
        assert v.relocs == (Reloc(0, "_Z5otherv", 16), Reloc(8, None, 0), Reloc(16, "a_very_long_target_name" * 10, 0))
        assert [(x.name, x.size, x.is_const) for x in s.variables[1:]] == [("plain", 3, False), ("empty", 0, False)]
        assert s.has_args and list(s.args) == [b"ABCDEFGH", b"IJKL"]
        assert (s.args.offsets, s.args.sizes, bytes(s.args.raw)) == ((0, 8), (8, 4), b"ABCDEFGHIJKL")
        a0, a1 = s.annotations
        assert (a0.addr, a0.size, a0.elem, a0.mode, a0.norm, a0.tol, a0.tag) == \
            (0x7000_0000_0000, 400, "f16", "rel", "l2", 1e-2, "out")
        assert (a1.elem, a1.norm, a1.tag) == ("u8", "linf", "")
        assert isinstance(large.contents, memoryview) and large.contents.readonly


def test_empty_snapshot_and_no_args(tmp_path):
    with Snapshot.read(write(tmp_path / "e.snap", EPI, lambda w: None)) as s:
        assert s.kind == EPI and s.blobs == [] and s.variables == [] and s.annotations == []
        assert not s.has_args and len(s.args) == 0
    assert os.path.getsize(tmp_path / "e.snap") == 32 + 16 + 16 + 8


def test_pack_args_aligns_like_a_compiler():
    raw, offsets, sizes = pack_args([b"\1", b"\2\2\2\2", b"\3" * 8, b"\4\4", b"\5" * 12])
    assert offsets == [0, 4, 8, 16, 20] and sizes == [1, 4, 8, 2, 12]
    assert raw[4:8] == b"\2" * 4 and raw[20:32] == b"\5" * 12 and len(raw) == 32


def test_find_blob_finds_the_containing_blob(tmp_path):
    def fill(w):
        for addr, size in ((0x100, 0x10), (0x200, 0x100), (0x400, 0)):
            w.blob(addr, bytes(size))
    with Snapshot.read(write(tmp_path / "p.snap", PRO, fill)) as s:
        assert s.find_blob(0x200).addr == 0x200
        assert s.find_blob(0x2FF).addr == 0x200
        assert s.find_blob(0x300) is None
        assert s.find_blob(0x10F).addr == 0x100
        assert s.find_blob(0xFF) is None
        assert s.find_blob(0x400).addr == 0x400 and s.find_blob(0x401) is None


def _epilogue_pair(tmp_path, before, after, fmt, gap=16):
    pro = write(tmp_path / "p.snap", PRO, lambda w: w.blob(0x1000, before))
    epi = write(tmp_path / f"e_{fmt}.snap", EPI,
                lambda w: w.blob_epilogue(0x1000, after, before, format=fmt, merge_gap=gap))
    return pro, epi


@pytest.mark.parametrize("fmt", ["diff", "bytes", "best"])
def test_epilogue_formats_rebuild_the_same_state(tmp_path, fmt):
    rnd = random.Random(7)
    before = bytes(rnd.randrange(256) for _ in range(50_000))
    after = bytearray(before)
    for off in (0, 1, 4096, 4100, 49_999):
        after[off] ^= 0xFF
    after[20_000:20_500] = bytes(500)
    pro, epi = _epilogue_pair(tmp_path, before, after, fmt)
    with Snapshot.read(epi) as e, Snapshot.read(pro) as p:
        b = e.blobs[0]
        want_enc = Encoding.BYTES if fmt == "bytes" else Encoding.DIFF
        assert b.encoding == want_enc and b.checksum == checksum(after)
        if want_enc == Encoding.DIFF:
            assert b.ranges == diff_ranges(before, after, 16)
            assert b"".join(bytes(p_) for _, p_ in b.pieces()) == bytes(b.contents)
            assert os.path.getsize(epi) < 2_000
        e.apply(p)
        assert e.is_full and bytes(e.blobs[0].contents) == bytes(after)


def test_best_picks_bytes_when_the_diff_is_not_smaller(tmp_path):
    before = bytes(range(256)) * 4
    after = bytes((x + 1) % 256 for x in before)
    pro, epi = _epilogue_pair(tmp_path, before, after, "best")
    with Snapshot.read(epi) as e:
        assert e.blobs[0].encoding == Encoding.BYTES
    # one changed byte in 1 KiB: 16 bytes of table + 1 byte < 1024
    pro, epi = _epilogue_pair(tmp_path, before, before[:5] + b"\0" + before[6:], "best")
    with Snapshot.read(epi) as e:
        assert e.blobs[0].encoding == Encoding.DIFF and e.blobs[0].ranges == [(5, 1)]


def test_diff_format_writes_a_diff_even_when_larger_and_bytes_without_before(tmp_path):
    before, after = bytes(64), bytes([1, 0] * 32)
    _, epi = _epilogue_pair(tmp_path, before, after, "diff", gap=1)
    with Snapshot.read(epi) as e:
        assert e.blobs[0].encoding == Encoding.DIFF and len(e.blobs[0].ranges) == 32
    path = write(tmp_path / "nb.snap", EPI, lambda w: w.blob_epilogue(0x10, after, None, format="diff"))
    with Snapshot.read(path) as e:
        assert e.blobs[0].encoding == Encoding.BYTES and bytes(e.blobs[0].contents) == after


def test_unchanged_blob_is_an_empty_diff(tmp_path):
    data = os.urandom(4096)
    pro, epi = _epilogue_pair(tmp_path, data, data, "diff")
    with Snapshot.read(epi) as e, Snapshot.read(pro) as p:
        assert e.blobs[0].ranges == [] and bytes(e.blobs[0].contents) == b""
        assert bytes(e.apply(p).blobs[0].contents) == data


def test_apply_copies_what_the_epilogue_lacks(tmp_path):
    def pro_fill(w):
        w.blob(0x1000, b"a" * 100)
        w.blob(0x2000, b"b" * 50)
        w.variable("v", 0x30, b"12345678", relocs=[(0, "w", 8)])
        w.args([b"\1" * 8])
        w.annotation(0x1000, 100, "u8", "abs", "element", 1, "t")

    pro = write(tmp_path / "p.snap", PRO, pro_fill)
    epi = write(tmp_path / "e.snap", EPI, lambda w: w.blob_epilogue(0x1000, b"a" * 99 + b"z", b"a" * 100))
    with Snapshot.read(pro) as p:
        e = Snapshot.read(epi).apply(p)
    # the prologue is closed: everything copied must live on in the epilogue
    gc.collect()
    assert [(b.addr, bytes(b.contents)) for b in e.blobs] == [(0x1000, b"a" * 99 + b"z"), (0x2000, b"b" * 50)]
    assert e.variables[0].name == "v" and bytes(e.variables[0].contents) == b"12345678"
    assert e.variables[0].relocs == (Reloc(0, "w", 8),)
    assert list(e.args) == [b"\1" * 8] and e.annotations[0].tag == "t"
    e.close()


def test_apply_refuses_a_prologue_of_another_launch_and_changes_nothing(tmp_path):
    before = bytes(range(200))
    after = before[:10] + b"X" + before[11:]
    _, epi = _epilogue_pair(tmp_path, before, after, "diff")
    other = write(tmp_path / "o.snap", PRO, lambda w: w.blob(0x1000, bytes(200)))
    short = write(tmp_path / "s.snap", PRO, lambda w: w.blob(0x1000, bytes(100)))
    none = write(tmp_path / "n.snap", PRO, lambda w: w.blob(0x5000, bytes(200)))
    with Snapshot.read(epi) as e:
        for path, words in ((other, "checksum"), (short, "100"), (none, "no blob")):
            with Snapshot.read(path) as p, pytest.raises(SnapshotError) as err:
                e.apply(p)
            assert str(epi) in str(err.value) and words in str(err.value) and "same launch" in str(err.value)
            assert not e.is_full and e.blobs[0].ranges == [(10, 1)]
        with pytest.raises(SnapshotError, match="not a prologue"):
            e.apply(e)


def test_writer_rejects_bad_calls(tmp_path):
    with pytest.raises(SnapshotError, match="no_such_dir"):
        Writer(tmp_path / "no_such_dir" / "x.snap", PRO)
    with Writer(tmp_path / "p.snap", PRO) as w:
        with pytest.raises(SnapshotError, match="prologue stores blobs in full"):
            w.blob_epilogue(0x10, b"ab", b"aa")
        with pytest.raises(SnapshotError, match="relocation at offset 4"):
            w.variable("v", 0x10, bytes(8), relocs=[(4, "t", 0)])
        with pytest.raises(SnapshotError, match="parameter 1"):
            w.args(raw=b"12345678", offsets=[0, 6], sizes=[4, 4])
        w.args([b"1234"])
        with pytest.raises(SnapshotError, match="already written"):
            w.args([b"1234"])
        with pytest.raises(SnapshotError, match="NaN"):
            w.annotation(0x10, 4, tol=float("nan"))
        # rejected calls leave the file intact
        w.blob(0x10, b"ok")
    with Snapshot.read(tmp_path / "p.snap") as s:
        assert [bytes(b.contents) for b in s.blobs] == [b"ok"] and list(s.args) == [b"1234"]


def test_writer_on_a_full_disk_fails_and_stays_failed():
    w = Writer("/dev/full", PRO)
    with pytest.raises(SnapshotError, match="No space left") as first:
        w.blob(0x10, bytes(3 << 20))
    assert "/dev/full" in str(first.value)
    with pytest.raises(SnapshotError, match="No space left"):
        w.blob(0x20, b"x")
    with pytest.raises(SnapshotError, match="No space left"):
        w.close()


def test_an_aborted_or_dropped_writer_leaves_a_file_that_reads_as_interrupted(tmp_path):
    path = tmp_path / "a.snap"
    with pytest.raises(RuntimeError):
        with Writer(path, PRO) as w:
            w.blob(0x10, b"data")
            raise RuntimeError("app crashed")
    with pytest.raises(SnapshotError, match="without an END record"):
        Snapshot.read(path)
    w = Writer(tmp_path / "b.snap", PRO)
    w.blob(0x10, b"data")
    del w
    gc.collect()
    with pytest.raises(SnapshotError, match="without an END record"):
        Snapshot.read(tmp_path / "b.snap")


def test_bytes_written_counts_the_file(tmp_path):
    path = tmp_path / "p.snap"
    with Writer(path, PRO) as w:
        w.blob(0x10, bytes(1000))
        n = w.bytes_written
    assert n == 32 + 16 + 40 + 1000 + 8 and os.path.getsize(path) == n + 16 + 16 + 8


def test_views_outlive_close_and_memory_is_freed_after(tmp_path):
    path = write(tmp_path / "p.snap", PRO, lambda w: w.blob(0x10, b"payload" * 1000))
    s = Snapshot.read(path)
    handle = s._handle
    view = s.blobs[0].contents
    s.close()
    assert s.closed and handle._free.alive  # a view is alive: not freed yet
    with pytest.raises(SnapshotError, match="closed"):
        s.blobs
    assert bytes(view[:7]) == b"payload"
    del view
    gc.collect()
    assert not handle._free.alive


def test_unclosed_snapshots_are_freed_by_gc(tmp_path):
    path = write(tmp_path / "p.snap", PRO, lambda w: w.blob(0x10, b"x" * 100))
    s = Snapshot.read(path)
    view = s.blobs[0].contents
    freed = s._handle._free  # the finalizer does not keep the handle alive
    del s
    gc.collect()
    assert freed.alive and bytes(view) == b"x" * 100
    del view
    gc.collect()
    assert not freed.alive


def test_close_without_views_frees_at_once(tmp_path):
    path = write(tmp_path / "p.snap", PRO, lambda w: w.blob(0x10, b"x"))
    s = Snapshot.read(path)
    s.blobs, s.variables, s.args  # cached views are released by close
    handle = s._handle
    s.close()
    assert not handle._free.alive


def test_an_unchanged_blob_takes_the_prologues_checksum_and_a_changed_one_is_hashed(tmp_path):
    rnd = random.Random(3)
    before = bytes(rnd.randrange(256) for _ in range(70_000))
    with Writer(tmp_path / "p.snap", PRO) as w:
        w.blob(0x1000, before)
        pro_sum = w.last_checksum
    assert pro_sum == checksum(before)
    after = bytearray(before)
    after[12_345] ^= 1
    with Writer(tmp_path / "e.snap", EPI) as w:
        w.blob_epilogue(0x1000, before, before, before_checksum=pro_sum)
        assert w.last_checksum == pro_sum
        w.blob_epilogue(0x80000, bytes(after), before, before_checksum=pro_sum)  # changed: hashed again
        assert w.last_checksum == checksum(after)
    with Snapshot.read(tmp_path / "e.snap") as e:
        assert [b.checksum for b in e.blobs] == [pro_sum, checksum(after)]
        assert e.blobs[0].encoding == Encoding.DIFF and e.blobs[0].ranges == []


def test_a_wrong_prologue_checksum_makes_the_epilogue_refused_never_misread(tmp_path):
    before = bytes(range(256)) * 16
    pro = write(tmp_path / "p.snap", PRO, lambda w: w.blob(0x1000, before))
    epi = write(tmp_path / "e.snap", EPI,
                lambda w: w.blob_epilogue(0x1000, before, before, before_checksum=checksum(before) ^ 1))
    with Snapshot.read(epi) as e, Snapshot.read(pro) as p:
        with pytest.raises(SnapshotError, match="checksum"):
            e.apply(p)


def test_files_written_without_fsync_are_complete_after_close(tmp_path):
    from mneme.snapshot import _native

    lib = _native()[1]
    data = os.urandom(1 << 20)
    try:
        lib.mn_snapshot_set_fsync(0)
        path = write(tmp_path / "p.snap", PRO, lambda w: w.blob(0x1000, data))
    finally:
        lib.mn_snapshot_set_fsync(1)
    with Snapshot.read(path) as s:
        assert bytes(s.blobs[0].contents) == data and s.blobs[0].checksum == checksum(data)
