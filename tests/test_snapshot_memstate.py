"""MemState: the seeds' MemStateRef behaviour, written ranges, and the CPU definition of "verified"."""

import numpy as np
import pytest

from mneme.errors import SnapshotError
from mneme.record.memstate import Check, MemState, SnapshotType, verification_plan
from mneme.snapshot import Snapshot, Writer

PRO, EPI = SnapshotType.PROLOGUE, SnapshotType.EPILOGUE
OUT, IDX = 0x1000, 0x8000  # an annotated f32 output buffer and an int buffer

out_before = np.arange(64, dtype=np.float32)
idx_before = np.arange(16, dtype=np.int32)


def write_state(path, kind, out, idx, var=b"\0" * 8, annotate=True, fmt=None, extra=None):
    with Writer(path, kind) as w:
        if fmt is None:
            w.blob(OUT, out.tobytes())
            w.blob(IDX, idx.tobytes())
        else:
            w.blob_epilogue(OUT, out.tobytes(), out_before.tobytes(), format=fmt)
            w.blob_epilogue(IDX, idx.tobytes(), idx_before.tobytes(), format=fmt)
        w.variable("counter", 0x40, var)
        w.args([OUT.to_bytes(8, "little"), IDX.to_bytes(8, "little"), (64).to_bytes(4, "little")])
        if annotate:
            w.annotation(OUT + 16 * 4, 32 * 4, "f32", "abs", "element", 1e-3, "sum")
        if extra:
            extra(w)
    return str(path)


@pytest.fixture
def recorded(tmp_path):
    """A prologue and a diff epilogue in which the kernel wrote out[20:30], idx[3] and the counter."""
    out_after = out_before.copy()
    out_after[20:30] += 0.5
    idx_after = idx_before.copy()
    idx_after[3] = 99
    pro = write_state(tmp_path / "pro.snap", PRO, out_before, idx_before)
    epi = write_state(tmp_path / "epi.snap", EPI, out_after, idx_after, var=b"\5" + b"\0" * 7, fmt="diff")
    return pro, epi, out_after, idx_after


def actual(tmp_path, out, idx, var=b"\5" + b"\0" * 7, name="act.snap", **kw):
    """A replayed state, as the replay core would dump it (full bytes, no annotations)."""
    path = write_state(tmp_path / name, EPI, out, idx, var=var, annotate=False, **kw)
    return MemState(path, "k", EPI).open()


def test_constructor_and_lifetime(recorded, tmp_path):
    pro, epi, _, _ = recorded
    with pytest.raises(SnapshotError, match="missing.snap.*does not exist"):
        MemState(tmp_path / "missing.snap", "kern", PRO)
    with pytest.raises(SnapshotError, match="nope.snap"):
        MemState(epi, "kern", EPI, prologue_fn=tmp_path / "nope.snap")
    with pytest.raises(ValueError, match="epilogues only"):
        MemState(pro, "kern", PRO, prologue_fn=pro)
    m = MemState(pro, "kern", PRO)
    for attr in ("args", "num_args", "blobs"):
        with pytest.raises(RuntimeError, match="open the memory state"):
            getattr(m, attr)
    with pytest.raises(RuntimeError):
        m.reset()
    with m as opened:
        assert opened is m and m.loaded and m.num_args == 3
        assert m.args[0] == OUT.to_bytes(8, "little") and m.args.sizes == (8, 8, 4)
        assert m.open() is m  # idempotent
        m.reset()
        assert m.loaded and m.num_args == 3
    assert not m.loaded


def test_kind_mismatch_and_diff_without_prologue(recorded):
    pro, epi, _, _ = recorded
    with pytest.raises(SnapshotError, match="is a prologue, but kernel kern lists it as its epilogue"):
        MemState(pro, "kern", EPI).open()
    with pytest.raises(SnapshotError, match="stored as a diff; give its prologue"):
        MemState(epi, "kern", EPI).open()


def test_epilogue_opens_as_full_state_with_written_ranges(recorded):
    pro, epi, out_after, idx_after = recorded
    with MemState(epi, "kern", EPI, prologue_fn=pro) as m:
        blobs = {b.addr: bytes(b.contents) for b in m.blobs}
        assert blobs == {OUT: out_after.tobytes(), IDX: idx_after.tobytes()}
        assert m.num_args == 3  # stored in the epilogue too
        ranges = m.written_ranges()
        # f32 0.5 added to elements 20..29 changes bytes inside each element; merged with gap 16
        assert ranges[0][0] >= OUT + 20 * 4 and sum(ranges[0]) <= OUT + 30 * 4 and len(ranges) == 2
        assert ranges[1] == (IDX + 3 * 4, 1)
        assert m.written_variables() == {"counter": [(0, 1)]}
    with MemState(pro, "kern", PRO) as p, pytest.raises(ValueError, match="needs an epilogue"):
        p.written_ranges()


def test_written_ranges_of_a_bytes_epilogue_come_from_diffing_the_prologue(recorded, tmp_path):
    pro, epi, out_after, idx_after = recorded
    full = write_state(tmp_path / "full.snap", EPI, out_after, idx_after, var=b"\5" + b"\0" * 7, fmt="bytes")
    with MemState(full, "k", EPI, prologue_fn=pro) as f, MemState(epi, "k", EPI, prologue_fn=pro) as d:
        assert f.written_ranges() == d.written_ranges()
        assert f == d
    with MemState(full, "k", EPI) as alone:  # no prologue: everything counts as written
        assert alone.written_ranges() == [(OUT, 256), (IDX, 64)]


def test_identical_replay_verifies(recorded, tmp_path):
    pro, epi, out_after, idx_after = recorded
    with MemState(epi, "k", EPI, prologue_fn=pro) as exp:
        act = actual(tmp_path, out_after, idx_after)
        rep = exp.compare(act)
        assert rep.equal and rep and rep.differences == [] and exp == act
        assert rep.bytes_compared == 256 + 64 + 8 and rep.checks == 5  # out split in 3 by the annotation
        assert "equal" in str(rep)
        act.close()


def test_annotation_tolerance_applies_to_its_buffer_only(recorded, tmp_path):
    pro, epi, out_after, idx_after = recorded
    with MemState(epi, "k", EPI, prologue_fn=pro) as exp:
        inside = out_after.copy()
        inside[20] += 5e-4  # element 20 lies in the annotated [16, 48)
        assert exp.compare(actual(tmp_path, inside, idx_after, name="a1.snap")).equal
        inside[21] += 5e-3
        rep = exp.compare(actual(tmp_path, inside, idx_after, name="a2.snap"))
        assert not rep.equal and rep.blobs == [OUT]
        d, = rep.differences
        assert (d.first_offset, d.mismatches, d.check.source) == (21 * 4, 1, "annotation sum")
        assert d.max_abs_err == pytest.approx(5e-3, rel=1e-3)
        outside = out_after.copy()
        outside[5] += 5e-4  # element 5 is not annotated: byte-exact
        rep = exp.compare(actual(tmp_path, outside, idx_after, name="a3.snap"))
        assert not rep.equal and rep.differences[0].first_offset == 5 * 4
        assert rep.differences[0].check.exact and "bytes differ" in str(rep)


def test_replay_time_tolerance_covers_unannotated_bytes(recorded, tmp_path):
    pro, epi, out_after, idx_after = recorded
    with MemState(epi, "k", EPI, prologue_fn=pro) as exp:
        out = out_after.copy()
        out[5] += 0.01   # unannotated
        out[30] += 0.01  # annotated with atol 1e-3: the annotation wins
        act = actual(tmp_path, out, idx_after)
        rep = exp.compare(act, atol=0.1)
        assert not rep.equal and [d.first_offset for d in rep.differences] == [30 * 4]
        out[30] = out_after[30]
        act2 = actual(tmp_path, out, idx_after, name="b.snap")
        assert exp.compare(act2, atol=0.1).equal
        assert not exp.compare(act2).equal
        assert exp.compare(act2, rtol=0.01).equal  # 0.01 <= 0.01 * 5
        assert not exp.compare(act2, rtol=0.001).equal


def test_variables_and_layout_differences(recorded, tmp_path):
    pro, epi, out_after, idx_after = recorded
    with MemState(epi, "k", EPI, prologue_fn=pro) as exp:
        rep = exp.compare(actual(tmp_path, out_after, idx_after, var=b"\6" + b"\0" * 7))
        assert rep.variables == ["counter"] and rep.blobs == []
        extra = actual(tmp_path, out_after, idx_after, name="x.snap",
                       extra=lambda w: (w.blob(0x9000, b"new"), w.variable("other", 0x80, b"1")))
        rep = exp.compare(extra)
        assert {(d.kind, d.key, d.reason) for d in rep.differences} == {
            ("blob", 0x9000, "not in the expected state"), ("variable", "other", "not in the expected state")}
        with Writer(tmp_path / "small.snap", EPI) as w:
            w.blob(OUT, out_after.tobytes()[:128])
        small = MemState(tmp_path / "small.snap", "k", EPI).open()
        rep = exp.compare(small)
        reasons = {(d.kind, d.key): d.reason for d in rep.differences}
        assert reasons == {("blob", OUT): "128 bytes, expected 256", ("blob", IDX): "missing from the actual state",
                           ("variable", "counter"): "missing from the actual state"}
        assert not rep.equal and "blob 0x1000: 128 bytes, expected 256" in str(rep)


def test_norm_annotation(tmp_path):
    e = np.ones(100, np.float32)
    a = e.copy()
    a[:10] += 0.1  # L2 error 0.316, reference L2 norm 10
    paths = []
    for name, data, annotate in (("e.snap", e, True), ("a.snap", a, False)):
        with Writer(tmp_path / name, EPI) as w:
            w.blob(0x100, data.tobytes())
            if annotate:
                w.annotation(0x100, 400, "f32", "rel", "l2", 0.04)
        paths.append(MemState(tmp_path / name, "k", EPI).open())
    exp, act = paths
    assert exp.compare(act).equal
    with Writer(tmp_path / "e2.snap", EPI) as w:
        w.blob(0x100, e.tobytes())
        w.annotation(0x100, 400, "f32", "rel", "l2", 0.03)
    rep = MemState(tmp_path / "e2.snap", "k", EPI).open().compare(act)
    d, = rep.differences
    assert not rep.equal and d.err_norm == pytest.approx(np.sqrt(10) * 0.1, rel=1e-5)
    assert d.ref_norm == pytest.approx(10) and "l2 err" in str(d)


def test_verification_plan_cuts_regions_by_annotation(recorded):
    pro, _, _, _ = recorded
    with Snapshot.read(pro) as s:
        plan = verification_plan(s)
        assert [(c.key, c.offset, c.length, c.source) for c in plan] == [
            (OUT, 0, 64, "exact"), (OUT, 64, 128, "annotation sum"), (OUT, 192, 64, "exact"),
            (IDX, 0, 64, "exact"), ("counter", 0, 8, "exact")]
        assert plan[1].mode_tol() == ("abs", 1e-3) and plan[0].mode_tol() == ("abs", -1.0)
        assert plan[1].addr == OUT + 64
        tolerant = verification_plan(s, atol=1e-2, rtol=1e-3, elem="f64")
        assert (tolerant[0].elem, tolerant[0].atol, tolerant[0].rtol) == ("f64", 1e-2, 1e-3)
        with pytest.raises(ValueError, match="both non-zero"):
            tolerant[0].mode_tol()
        assert Check("blob", 1, 1, 0, 4, "f32", "element", 0.0, 0.5).mode_tol() == ("rel", 0.5)


def test_compare_refuses_unapplied_diffs(recorded):
    pro, epi, _, _ = recorded
    with MemState(pro, "k", PRO) as p, Snapshot.read(epi) as raw:
        with pytest.raises(SnapshotError, match="holds diffs"):
            p.compare(raw)
