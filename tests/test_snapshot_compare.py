"""mn_compare, mn_diff_ranges and mn_checksum through the Python face: every element type, tolerance
mode and norm, the NaN/inf/-0.0 rules of snapshot.h, and speed."""

import math
import random
import time

import numpy as np
import pytest

from mneme.errors import ConfigurationError
from mneme.snapshot import checksum, compare, diff_ranges, elem_size

FLOATS = {"f32": np.float32, "f64": np.float64, "f16": np.float16}
INTS = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
        "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64}


def bf16(values):
    """bf16 bytes of float32 values (exactly representable ones round-trip)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32) >> 16
    return bits.astype(np.uint16).tobytes()


def as_bytes(elem, values):
    if elem == "bf16":
        return bf16(values)
    return np.asarray(values, dtype=(FLOATS | INTS)[elem]).tobytes()


def test_elem_sizes():
    sizes = {"bytes": 1, "f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i8": 1, "i16": 2, "i32": 4, "i64": 8,
             "u8": 1, "u16": 2, "u32": 4, "u64": 8}
    assert {e: elem_size(e) for e in sizes} == sizes
    with pytest.raises(ConfigurationError, match="f128.*valid: bytes, f32"):
        elem_size("f128")


@pytest.mark.parametrize("elem", ["f32", "f64", "f16", "bf16", *INTS])
def test_exact_and_per_element_tolerance_for_every_type(elem):
    es = elem_size(elem)
    exp = [0, 1, 2, 3, 4, 5, 6, 100]
    act = [0, 1, 2, 3, 7, 5, 6, 100]  # element 4 off by 3
    e, a = as_bytes(elem, exp), as_bytes(elem, act)
    assert compare(e, e, elem).equal and compare(e, e, elem).mismatches == 0
    r = compare(e, a, elem)  # exact
    assert not r.equal and (r.mismatches, r.first_mismatch, r.max_abs_err) == (1, 4 * es, 3.0)
    assert r.max_rel_err == pytest.approx(0.75)
    assert compare(e, a, elem, "abs", tol=3).equal
    assert not compare(e, a, elem, "abs", tol=2.5).equal
    assert compare(e, a, elem, "rel", tol=0.75).equal
    assert not compare(e, a, elem, "rel", tol=0.7).equal
    assert compare(e, a, elem, atol=1, rtol=0.5).equal        # 3 <= 1 + 0.5*4
    assert not compare(e, a, elem, atol=0.9, rtol=0.5).equal
    assert compare(e, a, "bytes").mismatches >= 1 and not compare(e, a, "bytes").equal


@pytest.mark.parametrize("elem", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_norms_for_floats(elem, norm):
    exp = np.array([1, -2, 4, 0.5, 8, -16, 0, 2], dtype=np.float64)
    act = exp + np.array([0.5, 0, -0.25, 0, 1, 0, 0.125, 0])
    e, a = as_bytes(elem, exp), as_bytes(elem, act)
    order = {"l1": 1, "l2": 2, "linf": np.inf}[norm]
    err, ref = np.linalg.norm(act - exp, order), np.linalg.norm(exp, order)
    r = compare(e, a, elem, "abs", norm, tol=err)
    assert r.equal and r.err_norm == pytest.approx(err) and r.ref_norm == pytest.approx(ref)
    assert r.mismatches == 4 and r.first_mismatch == 0  # information: elements that differ at all
    assert not compare(e, a, elem, "abs", norm, tol=err * 0.99).equal
    assert compare(e, a, elem, "rel", norm, tol=err / ref * 1.001).equal
    assert not compare(e, a, elem, "rel", norm, tol=err / ref * 0.99).equal
    assert compare(e, a, elem, norm=norm, atol=err / 2, rtol=err / 2 / ref * 1.001).equal


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_norms_for_integers(norm):
    exp = np.array([10, 20, 30, 40], dtype=np.int32)
    act = np.array([11, 20, 27, 40], dtype=np.int32)
    err = {"l1": 4, "l2": math.sqrt(10), "linf": 3}[norm]
    r = compare(exp.tobytes(), act.tobytes(), "i32", "abs", norm, tol=err)
    assert r.equal and r.err_norm == pytest.approx(err)
    assert not compare(exp.tobytes(), act.tobytes(), "i32", "abs", norm, tol=err - 0.01).equal


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("elem", ["f32", "f64", "f16", "bf16"])
def test_nan_inf_and_negative_zero_rules(elem):
    def cmp(e, a, **kw):
        return compare(as_bytes(elem, e), as_bytes(elem, a), elem, **kw)

    # NaN equals NaN at the same position under a tolerance; bitwise-exact mode also accepts equal bits
    assert cmp([1, NAN], [1, NAN], tol=0).equal and cmp([1, NAN], [1, NAN]).equal
    r = cmp([1, NAN], [1, 2], tol=1e30)
    assert not r.equal and r.max_abs_err == INF and r.first_mismatch == elem_size(elem)
    assert not cmp([1, 2], [1, NAN], tol=1e30).equal
    for norm in ("l1", "l2", "linf"):
        assert cmp([NAN, 1], [NAN, 1], tol=0, norm=norm).equal
        r = cmp([NAN, 1], [0, 1], tol=1e30, norm=norm)
        assert not r.equal and r.err_norm == INF
    # infinities equal only themselves, whatever the tolerance
    assert cmp([INF, -INF], [INF, -INF], tol=0).equal
    assert not cmp([INF], [-INF], tol=INF).equal
    assert not cmp([INF], [1e4], tol=INF).equal
    assert not cmp([1e4], [INF], rtol=1e30).equal
    # -0.0 equals 0.0 as a value, not as bits
    assert cmp([-0.0, 0.0], [0.0, -0.0], tol=0).equal
    r = cmp([-0.0, 1], [0.0, 1])
    assert not r.equal and r.mismatches == 1 and r.max_abs_err == 0
    # a zero expected value admits no relative error
    assert not cmp([0.0], [1e-30 if elem != "f16" else 1e-7], rtol=1e6).equal


def test_nan_payloads_differ_bitwise_but_not_by_value():
    a = np.array([np.nan], dtype=np.float32).tobytes()
    b = (np.frombuffer(a, dtype=np.uint32) | 1).tobytes()  # another quiet NaN
    assert not compare(a, b, "f32").equal
    assert compare(a, b, "f32", tol=0).equal


def test_special_f16_and_bf16_values_widen_exactly():
    f16 = np.array([65504, 2.0**-24, -(2.0**-14), 1 + 2.0**-10], dtype=np.float16)
    shifted = np.array([65472, 0, -(2.0**-14), 1], dtype=np.float16)
    r = compare(f16.tobytes(), shifted.tobytes(), "f16", tol=32)
    assert r.equal and r.max_abs_err == 32 and r.mismatches == 0
    assert compare(f16.tobytes(), shifted.tobytes(), "f16", tol=31.99).mismatches == 1
    r = compare(bf16([3.0e38, 1.0]), bf16([3.0e38, 1.0078125]), "bf16", tol=0)
    assert r.mismatches == 1 and r.max_abs_err == 0.0078125 and r.first_mismatch == 2


def test_integer_extremes_are_exact_distances():
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    r = compare(np.array([lo], np.int64).tobytes(), np.array([hi], np.int64).tobytes(), "i64", tol=0)
    assert r.max_abs_err == float(2**64 - 1) and not r.equal
    r = compare(np.array([2**64 - 1], np.uint64).tobytes(), np.array([2**64 - 2], np.uint64).tobytes(), "u64", tol=1)
    assert r.equal and r.max_abs_err == 1
    assert compare(np.array([-128], np.int8).tobytes(), np.array([127], np.int8).tobytes(), "i8", tol=1).max_abs_err == 255


def test_trailing_partial_element_is_compared_exactly():
    e = np.array([1.0, 2.0], np.float32).tobytes() + b"\1\2"
    assert compare(e, e, "f32", tol=0.5).equal
    r = compare(e, e[:-1] + b"\3", "f32", tol=0.5)
    assert not r.equal and r.first_mismatch == 8 and r.mismatches == 1
    assert not compare(e, e[:-1] + b"\3", "f32", "abs", "l2", tol=100).equal


def test_byte_mode_counts_bytes():
    a = bytes(100)
    b = bytearray(a)
    b[3], b[4], b[50], b[99] = 1, 2, 3, 4
    r = compare(a, bytes(b))
    assert (r.equal, r.mismatches, r.first_mismatch) == (False, 4, 3)
    assert compare(a, a).first_mismatch is None


def test_compare_rejects_bad_arguments():
    with pytest.raises(ValueError, match="4 and 5 bytes"):
        compare(b"1234", b"12345")
    with pytest.raises(ConfigurationError, match="norm"):
        compare(b"1234", b"1234", "f32", norm="l3")
    with pytest.raises(ConfigurationError, match="tolerance mode"):
        compare(b"1234", b"1234", "f32", mode="relative")


def naive_diff(a, b, gap):
    runs, i, n = [], 0, len(a)
    while i < n:
        if a[i] != b[i]:
            j = i
            while j < n and a[j] != b[j]:
                j += 1
            runs.append([i, j])
            i = j
        else:
            i += 1
    merged = []
    for s, e in runs:
        if merged and s - merged[-1][1] < max(gap, 1):
            merged[-1][1] = e
        else:
            merged.append([s, e])
    return [(s, e - s) for s, e in merged]


@pytest.mark.parametrize("seed", range(12))
def test_diff_ranges_matches_a_byte_by_byte_reference(seed):
    rnd = random.Random(seed)
    n = rnd.choice([0, 1, 7, 8, 31, 32, 33, 100, 1000, 4099])
    a = bytes(rnd.randrange(256) for _ in range(n))
    b = bytearray(a)
    for _ in range(rnd.randrange(0, max(1, n // 3))):
        start = rnd.randrange(n)
        for k in range(start, min(n, start + rnd.choice([1, 1, 2, 5, 9, 40]))):
            b[k] = (b[k] + rnd.randrange(1, 256)) % 256
    for gap in (0, 1, 2, 3, 7, 8, 9, 16, 64):
        assert diff_ranges(a, bytes(b), gap) == naive_diff(a, b, gap), (n, gap)


def test_diff_ranges_of_fully_different_buffers_is_one_range():
    assert diff_ranges(bytes(1000), b"\1" * 1000, 0) == [(0, 1000)]
    assert diff_ranges(b"", b"") == []


def test_checksum_is_xxh64():
    assert checksum(b"") == 0xEF46DB3751D8E999
    assert checksum(b"a") == 0xD24EC4F1A98C6E5B
    assert checksum(b"abc") == 0x44BC2CF5AD770999
    assert checksum(b"Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1
    assert checksum(b"abc", 12345) == 0x01700E64F6F23509
    data = bytes(range(256)) * 3
    assert len({checksum(data[:n]) for n in range(0, 768, 5)}) == len(range(0, 768, 5))


def _rate(fn, nbytes):
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def test_checksum_diff_and_compare_run_at_gigabytes_per_second():
    n = 256 << 20
    a = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    b = a.copy()
    b[:: 1 << 16] ^= 1  # sparse writes: 4096 changed bytes
    ab, bb = memoryview(a), memoryview(b)
    gbs_sum = _rate(lambda: checksum(ab), n)
    gbs_diff = _rate(lambda: diff_ranges(ab, bb), n)
    gbs_cmp = _rate(lambda: compare(ab, ab, "f32", tol=0), n)
    dense = b.copy()
    dense[::2] ^= 1
    gbs_dense = _rate(lambda: diff_ranges(ab, memoryview(dense), 16), n)
    print(f"\n256 MiB: checksum {gbs_sum:.1f} GB/s, diff (sparse) {gbs_diff:.1f} GB/s, "
          f"diff (every other byte) {gbs_dense:.1f} GB/s, compare f32 equal {gbs_cmp:.1f} GB/s")
    assert len(diff_ranges(ab, bb)) == 4096
    assert gbs_sum > 1 and gbs_diff > 1


def test_a_device_check_result_is_the_compare_report_placed_in_its_buffer():
    """BufferResult (the device layer's) is CompareResult plus the check: the same report, offset to the range."""
    from mneme.device.memory import BufferCheck, BufferResult

    e = np.arange(64, dtype=np.float32)
    a = e.copy()
    a[9] += 1.0
    r = compare(e, a, "f32", atol=0.0, rtol=0.0)
    rep = type("Rep", (), dict(mismatches=r.mismatches, first_mismatch=r.first_mismatch, max_abs_err=r.max_abs_err,
                               max_rel_err=r.max_rel_err, err_norm=r.err_norm, ref_norm=r.ref_norm))
    c = BufferCheck("blob", 0x1000, 0x1000, 256, 256, "f32", "element", 0.0, 0.0)
    b = BufferResult.of(r.equal, rep, c.offset, check=c)
    assert not b and b.check is c and b.first_mismatch == 256 + 9 * 4 and b.max_abs_err == r.max_abs_err == 1.0
    assert "blob 0x1000 [256, +256): 1 f32 elements differ, first at offset 292" in str(b)


@pytest.mark.parametrize("seed", range(6))
def test_diff_ranges_across_skipped_blocks_and_changed_runs_match_the_reference(seed):
    """Equal 4 KiB blocks are skipped by memcmp and runs of changed words extend a range 32 bytes at a
    time: ranges that cross block edges, merge across equal blocks, or hold equal bytes inside a changed
    run (a zero byte of the XOR) come out as the byte-by-byte reference has them."""
    rnd = random.Random(100 + seed)
    n = rnd.choice([4096 * 5, 4096 * 5 + 13, 3 * 4096 - 1])
    a = bytes(rnd.randrange(256) for _ in range(n))
    b = bytearray(a)
    for start, length in [(4096 - 5, 10), (2 * 4096 + 100, 4096 + 37), (n - 3, 3)]:
        for k in range(start, min(n, start + length)):
            b[k] = (b[k] + rnd.randrange(1, 256)) % 256
    b[2 * 4096 + 900] = a[2 * 4096 + 900]  # one equal byte inside the long run
    for gap in (0, 1, 8, 16, 5000, 9000):
        assert diff_ranges(a, bytes(b), gap) == naive_diff(a, b, gap), (n, gap)
