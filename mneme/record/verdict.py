"""The verdict of one verification: every buffer, how it was compared, and for a failure the first
differing elements as values, the max absolute and relative error and what would accept them.
The policy that decides how each buffer is compared is mneme.record.verification (docs/VERIFY.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from mneme.record.verification import (
    _SIZES,
    FLOAT_ELEMS,
    BufferPolicy,
    _contents,
    _where,
    _sorted_elems,
    decode,
)
from mneme.snapshot import Snapshot, compare as compare_buffers, diff_ranges

__all__ = ["BufferVerdict", "Verdict", "buffer_verdict", "mismatch_details", "judge"]

#: differing elements listed per failed buffer
SHOW = 4


@dataclass
class BufferVerdict:
    policy: BufferPolicy
    passed: bool
    mismatches: int = 0
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    details: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        head = f"{'ok  ' if self.passed else 'FAIL'} {self.policy.label()}: {self.policy.describe()}"
        if self.passed and (self.max_abs_err or self.max_rel_err) and self.policy.tolerance:
            head += f" [max abs err {self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}]"
        lines = [head] + [f"       {d}" for d in self.details]
        if self.policy.note:
            lines.append(f"       note: {self.policy.note}")
        return "\n".join(lines)


@dataclass
class Verdict:
    """Whether the replayed state equals the expected one, buffer by buffer."""

    passed: bool
    buffers: List[BufferVerdict] = field(default_factory=list)
    layout: List[str] = field(default_factory=list)
    calibration: str = ""
    #: what could not be compared and does not count against the verdict (variables optimized away)
    skipped: List[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def max_abs_err(self) -> float:
        return max((b.max_abs_err for b in self.buffers if b.policy.elem in FLOAT_ELEMS), default=0.0)

    @property
    def max_rel_err(self) -> float:
        return max((b.max_rel_err for b in self.buffers if b.policy.elem in FLOAT_ELEMS), default=0.0)

    @property
    def failures(self) -> List[BufferVerdict]:
        return [b for b in self.buffers if not b.passed]

    def __str__(self) -> str:
        n = len(self.failures) + len(self.layout)
        head = "verified" if self.passed else f"not verified: {n} buffer(s) differ"
        lines = [f"{head} ({len(self.buffers)} buffers; max abs err {self.max_abs_err:.3g}, "
                 f"max rel err {self.max_rel_err:.3g})"]
        if self.calibration:
            lines.append(f"  {self.calibration}")
        lines += [f"  FAIL {d}" for d in self.layout]
        lines += [f"  skipped {d}" for d in self.skipped]
        shown = self.failures + [b for b in self.buffers if b.passed]
        lines += [f"  {b}" for b in shown[:24]]
        if len(shown) > 24:
            lines.append(f"  ... and {len(shown) - 24} more buffers (all ok)")
        return "\n".join(lines)


def buffer_verdict(p: BufferPolicy, expected: memoryview, actual: memoryview) -> BufferVerdict:
    """Runs `p`'s checks on the buffer's expected and actual bytes (whole buffer each)."""
    v = BufferVerdict(p, passed=True)
    for c in p.checks:
        e, a = expected[c.offset:c.offset + c.length], actual[c.offset:c.offset + c.length]
        r = compare_buffers(e, a, c.elem) if c.exact else compare_buffers(e, a, c.elem, norm=c.norm, atol=c.atol,
                                                                          rtol=c.rtol)
        if not c.exact:
            v.max_abs_err, v.max_rel_err = max(v.max_abs_err, r.max_abs_err), max(v.max_rel_err, r.max_rel_err)
        if not r.equal:
            v.passed = False
            v.mismatches += r.mismatches
    if not v.passed:
        v.details = mismatch_details(p, expected, actual)
        ma, mr = _errors(p, expected, actual)
        v.max_abs_err, v.max_rel_err = max(v.max_abs_err, ma), max(v.max_rel_err, mr)
    if p.how.endswith("multiset"):
        e, a = _sorted_elems(expected, p.elem), _sorted_elems(actual, p.elem)  # each once: seconds for 10M elements
        if e is None or e != a:
            v.passed = False
            e, a = e or [], a or []
            bad = [i for i, (x, y) in enumerate(zip(e, a)) if x != y]
            v.mismatches += len(bad)
            i = bad[0] if bad else 0
            v.details.append(f"as a multiset of {p.elem} elements: {len(bad)} of {len(e)} differ once sorted; first: "
                             f"sorted[{i}] expected {e[i] if e else '-'} got {a[i] if a else '-'}: the configuration "
                             "computes other elements, not the same ones in another order")
    return v


def _errors(p: BufferPolicy, expected: memoryview, actual: memoryview) -> Tuple[float, float]:
    elem = p.elem if p.elem in _SIZES else None
    if elem is None:
        return 0.0, 0.0
    r = compare_buffers(expected, actual, elem, atol=0.0, rtol=0.0)
    return r.max_abs_err, r.max_rel_err


def mismatch_details(p: BufferPolicy, expected: memoryview, actual: memoryview) -> List[str]:
    """The first differing elements as values, the max errors, and what would accept them."""
    skipped = p.skipped
    diffs = [(o, n) for o, n in diff_ranges(expected, actual, 0)
             if not any(s <= o and o + n <= s + sn for s, sn in skipped)]
    if not diffs:
        return []
    elem = p.elem if p.elem in _SIZES else None
    lines: List[str] = []
    if elem is None:
        o = diffs[0][0]
        e, a = bytes(expected[o:o + 8]).hex(" "), bytes(actual[o:o + 8]).hex(" ")
        total = sum(n for _, n in diffs)
        lines.append(f"{total} bytes differ in {len(diffs)} ranges; at offset {o}: expected {e} got {a} "
                     "(element type unknown: the IR does not say, annotate the buffer to see values)")
        lines.append(_accept(p, None, 0.0, 0.0))
        return lines
    size = _SIZES[elem]
    shown = []
    seen = set()
    for o, n in diffs:
        for i in range(o // size, -(-(o + n) // size)):
            if i in seen or (i + 1) * size > len(expected):
                continue
            seen.add(i)
            shown.append(i)
            if len(shown) >= SHOW:
                break
        if len(shown) >= SHOW:
            break
    parts = []
    for i in shown:
        e, a = decode(expected, elem, i), decode(actual, elem, i)
        parts.append(f"[{i}] expected {e:.9g} got {a:.9g}" if elem in FLOAT_ELEMS else f"[{i}] expected {e} got {a}")
    r = compare_buffers(expected, actual, elem, atol=0.0, rtol=0.0)
    lines.append(f"{r.mismatches} {elem} elements differ ({elem} from {p.elem_source or 'the policy'}); first: "
                 + ", ".join(parts))
    lines.append(f"max abs err {r.max_abs_err:.3g}, max rel err {r.max_rel_err:.3g}")
    lines.append(_accept(p, elem, r.max_abs_err, r.max_rel_err))
    return lines


def _round_up(x: float) -> float:
    """`x` rounded up to two significant digits (a suggested tolerance must accept what it was made for)."""
    step = 10.0 ** (math.floor(math.log10(x)) - 1)
    return float(f"{math.ceil(x / step) * step:.2g}") if math.ceil(x / step) * step >= x else x


def _accept(p: BufferPolicy, elem: Optional[str], max_abs: float, max_rel: float) -> str:
    if elem is None:
        return ("to accept: give the element type and a tolerance with an annotation "
                "(mneme::annotate(ptr, n, mneme::absolute(TOL))) or --atol TOL --tol-type TYPE")
    if elem not in FLOAT_ELEMS:
        return (f"to accept: these are {elem} values, not rounding; if the buffer is only scratch, pass "
                f"--verify-runs N (calibration proves scratch) or annotate it with a tolerance")
    tol = _round_up(max_rel * 1.01) if max_rel and math.isfinite(max_rel) else 0.0
    if not math.isfinite(max_rel) or max_rel >= 1e-2:
        return (f"this is more than rounding (max rel err {max_rel:.3g}); the configuration computes something else."
                f" Only if that is intended: --float-rtol {tol:g} or mneme::annotate(ptr, n, mneme::relative({tol:g}))")
    learn = ("" if p.tolerance and p.tolerance.source.startswith("calibration") else
             "--verify-runs 3 if the kernel is not bit-reproducible (float atomics: learns the run-to-run spread), ")
    return (f"to accept: {learn}--float-rtol {tol:g} (mneme replay/tune, or measure.float_rtol={tol:g}), or annotate "
            f"the buffer: mneme::annotate(ptr, n, mneme::relative({tol:g}))")


def judge(expected: Snapshot, actual: Snapshot, pols: Sequence[BufferPolicy], calibration: str = "") -> Verdict:
    """The CPU verdict of `actual` against `expected` (both full snapshots) under `pols`."""
    exp, act = _contents(expected), _contents(actual)
    verdict = Verdict(passed=True, calibration=calibration)
    for p in pols:
        e, a = exp.get(p.key), act.get(p.key)
        if a is None:
            verdict.layout.append(f"{p.label()}: missing from the actual state")
            continue
        if len(a) != len(e):
            verdict.layout.append(f"{p.label()}: {len(a)} bytes, expected {len(e)}")
            continue
        verdict.buffers.append(buffer_verdict(p, e, a))
    extra = set(act) - set(exp)
    verdict.layout += [f"{_where(k)}: not in the expected state" for k in sorted(extra, key=str)]
    verdict.passed = not verdict.layout and all(b.passed for b in verdict.buffers)
    return verdict
