"""The verification policy (mneme.record.verification) on a real recording: tests/fixtures/vecadd's
epilogue and IR, with baseline runs written as snapshot files the way the replay core dumps them."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest

from mneme.ir.elemtypes import pointer_elem_types
from mneme.record.db import RecordedExecution, find_dbs
from mneme.record.verdict import Verdict, judge
from mneme.record.verification import Calibration, buffer_types, plan_of, policies
from mneme.snapshot import Snapshot, SnapshotType, Writer

FIX = Path(__file__).resolve().parent / "fixtures" / "vecadd"


@pytest.fixture(scope="module")
def vecadd():
    rec = RecordedExecution.from_json(find_dbs(str(FIX))[0])
    inst = rec.instance(None)
    pro = Snapshot.read(inst.prologue_fn)
    epi = Snapshot.read(inst.epilogue_fn)
    if not epi.is_full:
        epi.apply(pro)
    elems = pointer_elem_types(rec.link_llvm_modules(prune=True, internalize=True), rec.kernel_name)
    types, names = buffer_types(pro, elems, rec.arg_names)
    c_addr = int.from_bytes(bytes(pro.args[2]), "little")
    yield rec, pro, epi, types, names, c_addr
    epi.close()
    pro.close()


def state(tmp_path: Path, name: str, base: Snapshot, edits=None) -> Snapshot:
    """`base` rewritten as a full epilogue with `edits` {blob address: {float index: value}}."""
    path = tmp_path / f"{name}.snap"
    with Writer(path, SnapshotType.EPILOGUE) as w:
        for b in base.blobs:
            data = bytearray(b.contents)
            for i, v in ((edits or {}).get(b.addr) or {}).items():
                struct.pack_into("<f", data, 4 * i, v)
            w.blob(b.addr, bytes(data), b.space)
        for v in base.variables:
            w.variable(v.name, v.addr, bytes(v.contents), v.is_const)
    return Snapshot.read(path)


def value(snap: Snapshot, addr: int, i: int) -> float:
    return struct.unpack_from("<f", snap.find_blob(addr).contents, 4 * i)[0]


def test_the_ir_names_every_vecadd_buffer_f32_and_the_arguments(vecadd):
    _, pro, _, types, names, c_addr = vecadd
    assert types[("blob", c_addr)] == "f32"
    assert names[("blob", c_addr)] == "arg c"
    assert len(types) == 3


def test_identical_runs_mean_everything_exact(vecadd, tmp_path):
    _, _, epi, types, names, _ = vecadd
    runs = [state(tmp_path, f"r{i}", epi) for i in range(2)]
    cal = Calibration.learn(epi, runs, types)
    assert not cal.varying and "agree bit for bit" in cal.summary()
    pols = policies(epi, types=types, names=names, calibration=cal)
    assert {p.how for p in pols} == {"exact"}
    assert all(c.exact for c in plan_of(pols))
    v = judge(epi, runs[0], pols, cal.summary())
    assert v.passed and len(v.buffers) == len(pols)


def test_a_varying_float_gets_the_observed_spread_plus_margin_and_the_rest_stays_exact(vecadd, tmp_path):
    _, _, epi, types, names, c = vecadd
    e5 = value(epi, c, 5)
    runs = [state(tmp_path, "r1", epi, {c: {5: e5 + 0.25}}), state(tmp_path, "r2", epi, {c: {5: e5 - 0.25}})]
    cal = Calibration.learn(epi, runs, types, margin=1.0)
    assert cal.varying[("blob", c)] == [(20, 4)]
    assert cal.spread[("blob", c)] == pytest.approx(0.5, rel=1e-6)
    pols = policies(epi, types=types, names=names, calibration=cal)
    pc = next(p for p in pols if p.key == ("blob", c))
    assert pc.how == "exact+tolerance" and pc.tolerance.atol == pytest.approx(1.0, rel=1e-6)
    assert "calibration: 3 runs" in pc.tolerance.source and "margin 1x" in pc.tolerance.source
    tol = [ch for ch in pc.checks if not ch.exact]
    assert [(ch.offset, ch.length) for ch in tol] == [(20, 4)]
    # inside the tolerance: verified, the error is reported
    ok = judge(epi, state(tmp_path, "t1", epi, {c: {5: e5 + 0.75}}), pols)
    assert ok.passed and ok.max_abs_err == pytest.approx(0.75, rel=1e-3)
    assert "calibration" in str(ok)
    # beyond (1 + margin) * spread: fails, with values
    bad = judge(epi, state(tmp_path, "t2", epi, {c: {5: e5 + 1.5}}), pols)
    assert not bad.passed
    text = str(bad)
    assert "FAIL blob" in text and "arg c" in text and "f32 from IR" in text
    assert f"[5] expected {e5:.9g} got {e5 + 1.5:.9g}" in text
    assert "max abs err 1.5" in text
    # an element that did not vary in calibration is compared exactly, whatever the spread elsewhere
    off = judge(epi, state(tmp_path, "t3", epi, {c: {6: value(epi, c, 6) + 1e-3}}), pols)
    assert not off.passed and "[6] expected" in str(off) and "--float-rtol" in str(off)


def test_float_rtol_accepts_rounding_and_reports_the_error(vecadd, tmp_path):
    _, _, epi, types, names, c = vecadd
    e3 = value(epi, c, 3)
    trial = state(tmp_path, "fm", epi, {c: {3: e3 * (1 + 2e-7)}})
    strict = judge(epi, trial, policies(epi, types=types, names=names))
    assert not strict.passed
    assert "to accept: --verify-runs 3 if the kernel is not bit-reproducible" in str(strict)
    # the value it suggests accepts exactly this trial
    suggested = float(re.search(r"--float-rtol (\S+) \(mneme", str(strict)).group(1))
    assert f"mneme::relative({suggested:g})" in str(strict)
    assert judge(epi, trial, policies(epi, types=types, names=names, float_rtol=suggested)).passed
    pols = policies(epi, types=types, names=names, float_rtol=1e-6)
    assert all(p.how == "tolerance" and "--float-rtol" in p.tolerance.source for p in pols)
    v = judge(epi, trial, pols)
    assert v.passed and 0 < v.max_rel_err < 1e-6
    wrong = judge(epi, state(tmp_path, "fw", epi, {c: {3: e3 * 1.5 + 1}}), pols)
    assert not wrong.passed and "more than rounding" in str(wrong)


def test_non_float_varying_bytes_are_exact_unless_shown_to_be_scratch(vecadd, tmp_path):
    _, _, epi, _, names, c = vecadd
    # the recording holds c[2] = e2; the replays disagree on it in every byte (as ints they are 2 and -3)
    e2 = epi.find_blob(c).contents[8:12]
    runs = [state(tmp_path, "s1", epi, {c: {2: 123.0}}), state(tmp_path, "s1b", epi, {c: {2: -1.5e-30}})]
    assert all(x != y for x, y in zip(runs[0].find_blob(c).contents[8:12], runs[1].find_blob(c).contents[8:12]))
    assert bytes(e2) != bytes(runs[0].find_blob(c).contents[8:12])
    cal = Calibration.learn(epi, runs, {})  # no element types: nothing is known to be a float
    assert cal.varying[("blob", c)] == [(8, 4)] and not cal.replay_differs
    pols = policies(epi, names=names, calibration=cal)
    pc = next(p for p in pols if p.key == ("blob", c))
    assert pc.how == "exact" and "could not be shown to be scratch" in pc.note
    v = judge(epi, runs[0], pols)
    assert not v.passed and "element type unknown" in str(v)
    cal.scratch[("blob", c)] = "poison run: all other buffers as expected"
    pols = policies(epi, names=names, calibration=cal)
    pc = next(p for p in pols if p.key == ("blob", c))
    assert pc.how == "exact+scratch" and pc.skipped == [(8, 4)]
    assert judge(epi, runs[0], pols).passed
    assert "skipped 4 B as scratch (poison run" in str(judge(epi, runs[0], pols))
    # a byte outside the scratch range still fails
    assert not judge(epi, state(tmp_path, "s2", epi, {c: {2: 123.0, 9: 1.0}}), pols).passed
    # shown for the whole buffer (a poison run over all of it): all of it is skipped
    size = epi.find_blob(c).size
    cal.scratch_ranges[("blob", c)] = [(0, size)]
    pols = policies(epi, names=names, calibration=cal)
    pc = next(p for p in pols if p.key == ("blob", c))
    assert pc.how == "scratch" and not pc.checks
    assert judge(epi, state(tmp_path, "s3", epi, {c: {2: 123.0, 9: 1.0}}), pols).passed


def test_replays_that_agree_with_each_other_but_not_with_the_recording_are_not_nondeterminism(vecadd, tmp_path):
    _, _, epi, types, names, c = vecadd
    e7 = value(epi, c, 7)
    runs = [state(tmp_path, f"d{i}", epi, {c: {7: e7 + 0.5}}) for i in range(3)]
    cal = Calibration.learn(epi, runs, types)
    assert not cal.varying and cal.replay_differs == {("blob", c): 4}
    assert "differ from the recording in every replay" in cal.summary()
    pols = policies(epi, types=types, names=names, calibration=cal)
    pc = next(p for p in pols if p.key == ("blob", c))
    assert pc.how == "exact" and "not nondeterminism" in pc.note
    v = judge(epi, runs[0], pols, cal.summary())
    assert not v.passed and "[7] expected" in str(v)
    with pytest.raises(ValueError, match="at least 2 baseline replays"):
        Calibration.learn(epi, runs[:1], types)


def test_annotations_and_replay_tolerances_keep_precedence(vecadd, tmp_path):
    _, _, epi, types, names, c = vecadd
    pols = policies(epi, types=types, names=names, atol=0.5, tol_type="f32")
    assert {p.how for p in pols} == {"replay tolerance"}
    e1 = value(epi, c, 1)
    assert judge(epi, state(tmp_path, "a1", epi, {c: {1: e1 + 0.25}}), pols).passed
    assert not judge(epi, state(tmp_path, "a2", epi, {c: {1: e1 + 1.0}}), pols).passed


def test_layout_differences_fail_by_name(vecadd, tmp_path):
    _, _, epi, types, names, c = vecadd
    path = tmp_path / "short.snap"
    with Writer(path, SnapshotType.EPILOGUE) as w:
        for b in epi.blobs:
            if b.addr != c:
                w.blob(b.addr, bytes(b.contents), b.space)
    v = judge(epi, Snapshot.read(path), policies(epi, types=types, names=names))
    assert isinstance(v, Verdict) and not v.passed
    assert any("arg c" in d and "missing" in d for d in v.layout)


def test_a_permuted_output_is_learned_as_few_ranges_and_subtracted_exactly(vecadd, tmp_path):
    """warpAggregatedAtomicsCG's filter_arr on the H200: a 40 MB output whose order changes every run (atomic
    slots) made a Python tuple per differing byte and a quadratic subtraction; its replay was killed at 180 s.
    Differing bytes closer than an element now merge in C; the result is the same ranges as before."""
    from mneme.record.verification import _align, _subtract

    _, _, epi, types, _, c = vecadd
    vals = np.frombuffer(bytes(epi.find_blob(c).contents), dtype=np.float32)
    rng = np.random.default_rng(7)
    runs = []
    for i in range(2):
        path = tmp_path / f"perm{i}.snap"
        with Writer(path, SnapshotType.EPILOGUE) as w:
            for b in epi.blobs:
                data = rng.permutation(vals).tobytes() if b.addr == c else bytes(b.contents)
                w.blob(b.addr, data, b.space)
        runs.append(Snapshot.read(path))
    cal = Calibration.learn(epi, runs, {k: "i32" for k in types})
    varying = cal.varying[("blob", c)]
    assert len(varying) < 64 and sum(n for _, n in varying) > 0.95 * vals.nbytes
    # the subtraction against a byte-set reference, on random sorted disjoint ranges
    for seed in range(50):
        g = np.random.default_rng(seed)
        a = _align([(int(o), int(n)) for o, n in zip(g.integers(0, 900, 40), g.integers(1, 30, 40))], 4, 1000)
        m = _align([(int(o), int(n)) for o, n in zip(g.integers(0, 900, 40), g.integers(1, 30, 40))], 1, 1000)
        got = {x for o, n in _subtract(a, m) for x in range(o, o + n)}
        want = {x for o, n in a for x in range(o, o + n)} - {x for o, n in m for x in range(o, o + n)}
        assert got == want, seed


def test_an_int_output_in_another_order_every_run_is_compared_as_a_multiset(vecadd, tmp_path):
    """filter_arr's output (slots handed out by atomics): every replay holds the recording's elements in another
    order. Compared as a multiset, exactly: the same elements in any order pass, one other element fails by value;
    a float buffer in another order is not this case (its varying bytes get the spread tolerance)."""
    _, _, epi, types, names, c = vecadd
    ints = {k: "i32" for k in types}
    vals = np.arange(len(epi.find_blob(c).contents) // 4, dtype=np.int32) * 7 + 3
    rng = np.random.default_rng(11)

    def run(name, data):
        path = tmp_path / f"{name}.snap"
        with Writer(path, SnapshotType.EPILOGUE) as w:
            for b in epi.blobs:
                w.blob(b.addr, data.tobytes() if b.addr == c else bytes(b.contents), b.space)
        return Snapshot.read(path)

    rec = run("rec", vals)  # the recording, as the app left it
    runs = [run(f"p{i}", rng.permutation(vals)) for i in range(2)]
    cal = Calibration.learn(rec, runs, ints)
    assert cal.permuted == {("blob", c): "i32"} and "in another order" in cal.summary()
    pols = policies(rec, types=ints, names=names, calibration=cal)
    pc = next(p for p in pols if p.key == ("blob", c))
    assert pc.how == "exact+multiset" and "as a multiset of i32" in pc.describe()
    assert judge(rec, run("p2", rng.permutation(vals)), pols).passed
    wrong = rng.permutation(vals)
    wrong[5] += 1
    v = judge(rec, run("w", wrong), pols)
    assert not v.passed and "as a multiset of i32 elements: 1 of" in str(v), str(v)
    # not for floats: an f32 buffer in another order is judged by the calibration's spread, not as a multiset
    cal_f = Calibration.learn(rec, runs, types)
    assert not cal_f.permuted
