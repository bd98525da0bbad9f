"""Bad snapshot files: every error names the file and the byte offset, and no corruption, however
crafted, makes the reader crash or allocate what the file cannot hold."""

import struct
import subprocess
import sys
import textwrap

import pytest

from mneme.errors import SnapshotError
from mneme.snapshot import Snapshot, SnapshotType, Writer, checksum

PRO, EPI = SnapshotType.PROLOGUE, SnapshotType.EPILOGUE


def records(data):
    """(offset, tag, payload_len, total length) of each record: the framing of snapshot.h."""
    out, off = [], 32
    while off < len(data):
        tag, _, n = struct.unpack_from("<IIQ", data, off)
        total = 16 + n + (-n % 8) + 8
        out.append((off, tag.to_bytes(4, "little").decode(), n, total))
        off += total
    return out


def reseal(data, off):
    """Recomputes the checksum of the record at `off` after its payload was edited on purpose."""
    n = struct.unpack_from("<Q", data, off + 8)[0]
    body = 16 + n + (-n % 8)
    struct.pack_into("<Q", data, off + body, checksum(bytes(data[off:off + body])))


def read_error(path):
    with pytest.raises(SnapshotError) as err:
        Snapshot.read(path)
    msg = str(err.value)
    assert str(path) in msg
    return msg


@pytest.fixture
def prologue(tmp_path):
    path = tmp_path / "p.snap"
    with Writer(path, PRO) as w:
        w.blob(0x1000, bytes(range(256)) * 2)
        w.variable("var", 0x2000, b"v" * 16, relocs=[(8, "tgt", 0)])
        w.args([b"\1" * 8, b"\2" * 4])
        w.annotation(0x1000, 64, "f32", "abs", "l2", 0.5, "tag")
    return path


@pytest.fixture
def epilogue(tmp_path):
    path = tmp_path / "e.snap"
    before = bytes(range(256)) * 2
    with Writer(path, EPI) as w:
        w.blob_epilogue(0x1000, before[:3] + b"xy" + before[5:300] + b"z" + before[301:], before)
    return path


def test_records_walker_matches_the_file(prologue):
    data = prologue.read_bytes()
    recs = records(data)
    assert [r[1] for r in recs] == ["BLOB", "VAR ", "ARGS", "ANNO", "END "]
    assert all(off % 8 == 0 for off, *_ in recs) and recs[-1][0] + recs[-1][3] == len(data)


def test_wrong_magic(tmp_path, prologue):
    data = bytearray(prologue.read_bytes())
    data[:8] = b"NOTSNAPS"
    bad = tmp_path / "bad.snap"
    bad.write_bytes(data)
    msg = read_error(bad)
    assert "byte 0" in msg and "not a mneme snapshot" in msg
    bad.write_bytes(b"")
    assert "byte 0" in read_error(bad)


def test_unknown_version_is_refused_with_the_version_found(tmp_path, prologue):
    data = bytearray(prologue.read_bytes())
    struct.pack_into("<I", data, 8, 7)
    bad = tmp_path / "v7.snap"
    bad.write_bytes(data)
    msg = read_error(bad)
    assert "version 7" in msg and "reads version 1" in msg and "record the kernel again" in msg


def test_truncation_at_every_byte_names_the_record_at_fault(tmp_path, prologue):
    data = prologue.read_bytes()
    starts = [off for off, *_ in records(data)]
    bad = tmp_path / "cut.snap"
    for cut in range(len(data)):
        bad.write_bytes(data[:cut])
        msg = read_error(bad)
        at = cut if cut < 32 else max(s for s in starts if s <= cut)
        assert f"byte {at}:" in msg, (cut, msg)
        assert "record the kernel again" in msg


def test_every_single_bit_flip_is_caught_at_its_record(tmp_path, prologue):
    data = prologue.read_bytes()
    recs = records(data)
    bad = tmp_path / "flip.snap"
    for pos in range(len(data)):
        flipped = bytearray(data)
        flipped[pos] ^= 1 << (pos % 8)
        bad.write_bytes(flipped)
        msg = read_error(bad)
        if pos < 32:
            assert any(f"byte {b}:" in msg for b in (0, 8, 12)), (pos, msg)
        else:
            start = max(off for off, *_ in recs if off <= pos)
            assert f"byte {start}:" in msg, (pos, msg)


def test_checksum_error_names_offset_and_says_corrupt(tmp_path, prologue):
    data = bytearray(prologue.read_bytes())
    blob_off = records(data)[0][0]
    data[blob_off + 16 + 40 + 100] ^= 0xFF  # inside the blob's contents
    bad = tmp_path / "x.snap"
    bad.write_bytes(data)
    msg = read_error(bad)
    assert f"byte {blob_off}: checksum mismatch" in msg and "corrupt" in msg


def test_trailing_garbage_and_lying_end_record(tmp_path, prologue):
    data = bytearray(prologue.read_bytes())
    bad = tmp_path / "t.snap"
    bad.write_bytes(data + b"\0" * 8)
    assert "after the END record" in read_error(bad)
    end = records(data)[-1][0]
    struct.pack_into("<Q", data, end + 16, 99)
    reseal(data, end)
    bad.write_bytes(data)
    assert f"byte {end}: END record counts 99 records" in read_error(bad)


def _edited(tmp_path, path, tag, edit):
    data = bytearray(path.read_bytes())
    off = next(o for o, t, *_ in records(data) if t == tag)
    edit(data, off + 16)
    reseal(data, off)
    bad = tmp_path / "edited.snap"
    bad.write_bytes(data)
    return bad, off


@pytest.mark.parametrize("tag, field, fmt, value, words", [
    ("BLOB", 8, "<Q", 1 << 62, "declares 4611686018427387904 bytes"),
    ("BLOB", 16, "<I", 9, "unknown space"),
    ("BLOB", 20, "<I", 5, "unknown encoding"),
    ("BLOB", 20, "<I", 1, "prologue cannot hold a diff"),
    ("VAR ", 20, "<I", 0xFFFFFFFF, "relocations, more than fit"),
    ("VAR ", 24, "<I", 0xFFFFFFF0, "more bytes than its payload holds"),
    ("VAR ", 24, "<I", 2, "not a NUL-terminated string"),
    ("VAR ", 8, "<Q", 4, "outside it"),
    ("ARGS", 0, "<I", 0xFFFFFFFF, "parameters, more than fit"),
    ("ARGS", 8, "<Q", 1 << 63, "declares 9223372036854775808 bytes"),
    ("ARGS", 16, "<I", 1 << 31, "lies outside the"),
    ("ANNO", 16, "<I", 99, "unknown element type"),
    ("ANNO", 32, "<d", float("nan"), "NaN"),
])
def test_absurd_fields_are_refused_without_allocating(tmp_path, prologue, tag, field, fmt, value, words):
    bad, off = _edited(tmp_path, prologue, tag, lambda d, p: struct.pack_into(fmt, d, p + field, value))
    msg = read_error(bad)
    assert f"byte {off}:" in msg and words in msg, msg


@pytest.mark.parametrize("field, fmt, value, words", [
    (32, "<I", 0xFFFFFFFF, "more than its payload can hold"),
    (40, "<Q", 0, "out of order"),           # second range starts where the first does
    (48, "<Q", 1 << 63, "outside the blob"),  # a huge length
    (40 + 16, "<Q", 4, "out of order"),      # second range (300, 1) moved into the first (3, 2)
])
def test_absurd_diff_ranges_are_refused(tmp_path, epilogue, field, fmt, value, words):
    def edit(d, p):
        if field == 40:  # make the second range overlap the first
            struct.pack_into("<Q", d, p + 56, struct.unpack_from("<Q", d, p + 40)[0])
        else:
            struct.pack_into(fmt, d, p + field, value)
    bad, off = _edited(tmp_path, epilogue, "BLOB", edit)
    msg = read_error(bad)
    assert f"byte {off}:" in msg and words in msg, msg


def test_absurd_record_length_is_a_truncation_not_an_allocation(tmp_path, prologue):
    data = bytearray(prologue.read_bytes())
    for value in (1 << 63, 2**64 - 1, 2**64 - 8, len(data)):
        struct.pack_into("<Q", data, 32 + 8, value)
        bad = tmp_path / "len.snap"
        bad.write_bytes(data)
        msg = read_error(bad)
        assert "byte 32:" in msg and "payload bytes but the file ends" in msg


FUZZ = textwrap.dedent(r"""
    import os, random, struct, sys
    from mneme.errors import SnapshotError
    from mneme.snapshot import Snapshot, checksum
    src, pro_path, work, seed, rounds, structured = sys.argv[1:7]
    data = open(src, "rb").read()
    pro = Snapshot.read(pro_path)
    rnd = random.Random(int(seed))
    recs, off = [], 32
    while off < len(data):
        n = struct.unpack_from("<Q", data, off + 8)[0]
        recs.append((off, 16 + n + (-n % 8)))
        off += 16 + n + (-n % 8) + 8
    ok = failed = 0
    for i in range(int(rounds)):
        d = bytearray(data)
        if structured == "1":  # keep checksums valid so the payload checks themselves are exercised
            roff, body = rnd.choice(recs[:-1])
            for _ in range(rnd.randint(1, 4)):
                p = roff + 16 + rnd.randrange(min(body - 16, 96))
                width = rnd.choice((1, 4, 8))
                val = rnd.choice((0, 1, 7, 0xFF, 0xFFFFFFFF, 1 << 31, 1 << 63, 2**64 - 1, rnd.getrandbits(64)))
                d[p:p + width] = (val % (1 << (8 * width))).to_bytes(width, "little")
            d = d[:len(data)]
            struct.pack_into("<Q", d, roff + body, checksum(bytes(d[roff:roff + body])))
        else:
            for _ in range(rnd.randint(1, 8)):
                d[rnd.randrange(len(d))] = rnd.randrange(256)
            if rnd.random() < 0.3:
                d = d[:rnd.randrange(len(d))]
        path = os.path.join(work, "f%d.snap" % (i % 4))
        open(path, "wb").write(d)
        try:
            s = Snapshot.read(path)
        except SnapshotError as e:
            assert path in str(e) and "byte " in str(e), str(e)
            failed += 1
            continue
        ok += 1
        total = sum(sum(b.contents) for b in s.blobs) + sum(sum(v.contents) for v in s.variables)
        total += sum(len(a) for a in s.args) + len(s.annotations)
        for b in s.blobs:
            b.ranges
        if s.kind == 2:
            try:
                s.apply(pro)
                total += sum(sum(b.contents) for b in s.blobs)
            except SnapshotError:
                pass
        s.close()
    print(ok, failed)
""")


@pytest.mark.parametrize("structured", ["0", "1"])
@pytest.mark.parametrize("which", ["prologue", "epilogue"])
def test_random_corruption_never_crashes_the_process(tmp_path, prologue, epilogue, structured, which):
    src = prologue if which == "prologue" else epilogue
    proc = subprocess.run(
        [sys.executable, "-c", FUZZ, str(src), str(prologue), str(tmp_path), "42", "1500", structured],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"reader crashed or misreported (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    ok, failed = map(int, proc.stdout.split())
    assert ok + failed == 1500 and failed > 0
