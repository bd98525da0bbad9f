"""The verification policy: how each buffer of a replayed state is compared, and the verdict.

`mneme.record.memstate.verification_plan` says what "verified" means when every byte is deterministic
(annotations, replay-time tolerances, everything else byte-exact). Real kernels are not always
bit-reproducible: float atomics sum in a different order each run, dynamic work queues hand items to
different blocks, scratch buffers keep whatever the last writer left. This module tells "this
configuration computes something else" from "this kernel is not bit-reproducible":

* A `Calibration` is learned from the recorded epilogue and N replays of the *recorded*
  configuration (baseline runs: same code, same launch, same prologue). The bytes that differ
  between any two of those states vary between identical runs.
* Per buffer (`BufferPolicy`), in this order of precedence:
  1. bytes an annotation covers: the annotation's element type and tolerance;
  2. replay-time tolerances (`--atol/--rtol/--tol-type`): every unannotated byte, as before;
  3. varying bytes of a buffer whose element type is a float (from the IR or an annotation):
     compared with |a - e| <= atol, atol = (1 + margin) * the largest spread (max - min) any varying
     element showed across the calibration's states. Never wider than that: the margin is stated;
  4. varying bytes of an integer buffer whose every state holds the recording's elements in another order
     (slots handed out by atomics: a filtered or compacted output): compared as a multiset of elements,
     exactly (`multiset`);
  5. varying bytes of any other buffer: skipped as scratch when replay showed that nothing else the
     kernel writes depends on them (`scratch` evidence: a run with those bytes poisoned left every
     other buffer as expected), otherwise compared exactly (and the verdict says what would accept them);
  6. `float_rtol` (`--float-rtol`): float buffers (by IR element type) compared with
     |a - e| <= atol + float_rtol * |e|, for configurations that only round differently (fast-math,
     FMA contraction); the observed error is reported per trial;
  7. every other byte exactly.
* A `Verdict` (mneme.record.verdict) names every buffer, how it was compared (exact / tolerance with its value and source /
  skipped as scratch with the evidence), and for a failure the first differing elements as values,
  the max absolute and relative error and the flag or annotation that would accept them.

The checks are `mneme.snapshot.Check`s: the GPU core runs the very same plan (mneme.replay.verify).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from mneme.record.memstate import _regions, verification_plan
from mneme.snapshot import Check, Snapshot, diff_ranges

__all__ = ["FLOAT_ELEMS", "Tolerance", "BufferPolicy", "Calibration", "buffer_types", "policies", "plan_of", "decode",
           "DEFAULT_MARGIN"]

Key = Tuple[str, Union[int, str]]

FLOAT_ELEMS = ("f32", "f64", "f16", "bf16")
_SIZES = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4,
          "i64": 8, "u64": 8}
_FMT = {"f32": "f", "f64": "d", "f16": "e", "i8": "b", "u8": "B", "i16": "h", "u16": "H", "i32": "i",
        "u32": "I", "i64": "q", "u64": "Q"}
#: tolerance = (1 + margin) * observed spread
DEFAULT_MARGIN = 3.0
#: at most this many tolerant ranges per buffer; beyond, the span from the first to the last varying
#: element is compared with the tolerance (the verdict says so)
MAX_RANGES = 64


def decode(data: bytes, elem: str, index: int) -> Union[float, int]:
    """Element `index` of `data` as a Python number."""
    size = _SIZES[elem]
    raw = bytes(data[index * size:(index + 1) * size])
    if elem == "bf16":
        return struct.unpack("<f", b"\0\0" + raw)[0]
    return struct.unpack("<" + _FMT[elem], raw)[0]


def _where(key: Key) -> str:
    kind, k = key
    if kind in ("blob", "array"):
        return f"{kind} 0x{k:x}"
    return f"variable {k}"


@dataclass(frozen=True)
class Tolerance:
    """|actual - expected| <= atol + rtol * |expected| per element of `elem`; `source` says who chose it."""

    elem: str
    atol: float = 0.0
    rtol: float = 0.0
    source: str = ""

    def check(self, key: Key, base: int, offset: int, length: int) -> Check:
        return Check(key[0], key[1], base, offset, length, self.elem, "element", float(self.atol),
                     float(self.rtol), self.source)

    def __str__(self) -> str:
        parts = [f"atol {self.atol:.3g}"] if self.atol or not self.rtol else []
        if self.rtol:
            parts.append(f"rtol {self.rtol:.3g}")
        return f"{self.elem} {' + '.join(parts)} ({self.source})"


@dataclass
class BufferPolicy:
    """How one blob or variable is compared."""

    key: Key
    base: int
    size: int
    name: str = ""
    elem: Optional[str] = None
    elem_source: str = ""
    #: "exact", "tolerance", "annotation", "replay tolerance", "scratch" (skipped) or a mix ("exact+tolerance")
    how: str = "exact"
    checks: List[Check] = field(default_factory=list)
    tolerance: Optional[Tolerance] = None
    skipped: List[Tuple[int, int]] = field(default_factory=list)
    evidence: str = ""
    #: bytes that varied between identical runs but are compared exactly (what to do about them)
    note: str = ""

    def label(self) -> str:
        bits = [self.name] if self.name else []
        if self.elem:
            bits.append(f"{self.elem} from {self.elem_source}" if self.elem_source else self.elem)
        bits.append(f"{self.size} B")
        return f"{_where(self.key)} ({', '.join(bits)})"

    def describe(self) -> str:
        parts = []
        exact = sum(c.length for c in self.checks if c.exact)
        if exact:
            parts.append(f"exact on {exact} B")
        for c in self.checks:
            if not c.exact:
                rt = f" + {c.rtol:.3g}*|e|" if c.rtol else ""
                parts.append(f"{c.elem} |a-e| <= {c.atol:.3g}{rt} on [{c.offset}, +{c.length}) ({c.source})")
        if len(parts) > 4:
            parts = parts[:3] + [f"... {len(parts) - 3} more tolerant ranges"]
        if self.skipped:
            n = sum(length for _, length in self.skipped)
            parts.append(f"skipped {n} B as scratch ({self.evidence})")
        if self.how.endswith("multiset"):
            parts.append(f"all of it as a multiset of {self.elem} elements ({self.evidence})")
        return "; ".join(parts) or "nothing to compare"


@dataclass
class Calibration:
    """What varied across identical runs: per buffer, the element-aligned byte ranges that differed
    between any two states, and the largest spread (max - min) of a varying element's value."""

    states: int
    margin: float = DEFAULT_MARGIN
    varying: Dict[Key, List[Tuple[int, int]]] = field(default_factory=dict)
    spread: Dict[Key, float] = field(default_factory=dict)
    elem: Dict[Key, str] = field(default_factory=dict)
    #: buffers shown to be scratch: key -> evidence, and the byte ranges skipped (default: the varying ones)
    scratch: Dict[Key, str] = field(default_factory=dict)
    scratch_ranges: Dict[Key, List[Tuple[int, int]]] = field(default_factory=dict)
    #: bytes on which every replay agrees but the recording does not: replay computes something else
    replay_differs: Dict[Key, int] = field(default_factory=dict)
    #: integer buffers whose every state holds the recording's elements in another order: key -> element type
    permuted: Dict[Key, str] = field(default_factory=dict)

    @classmethod
    def learn(cls, expected: Snapshot, runs: Sequence[Snapshot], types: Optional[Mapping[Key, str]] = None,
              margin: float = DEFAULT_MARGIN) -> "Calibration":
        """From the recorded epilogue and at least two baseline replays' states (full snapshots of the
        same layout). Bytes vary when two replays disagree on them; bytes on which the replays agree
        with each other but not with the recording are not nondeterminism (`replay_differs`). The
        spread of a varying float element is taken over all states, the recording included."""
        if len(runs) < 2:
            raise ValueError(f"calibration needs at least 2 baseline replays to see what varies between them, "
                             f"got {len(runs)} (--verify-runs 2 or more)")
        types = dict(types or {})
        cal = cls(states=1 + len(runs), margin=float(margin))
        contents = [_contents(s) for s in (expected, *runs)]
        for kind, key, _base, size in _regions(expected):
            k = (kind, key)
            ref, first = contents[0].get(k), contents[1].get(k)
            if ref is None or first is None or len(first) != len(ref):
                continue
            changed: List[Tuple[int, int]] = []
            elem = types.get(k)
            step = _SIZES.get(elem, 1) if elem else 1
            for other in contents[2:]:
                got = other.get(k)
                if got is not None and len(got) == len(ref):
                    # ranges closer than an element merge in C: _align would merge them anyway, and a permuted
                    # output (every element differs) no longer makes a Python tuple per element
                    changed += diff_ranges(first, got, step)
            if changed:
                cal.varying[k] = _align(changed, step, size)
                if elem in _FMT and elem not in FLOAT_ELEMS:
                    mine = _sorted_elems(ref, elem)
                    if mine is not None and all(_sorted_elems(c[k], elem) == mine for c in contents[1:] if k in c):
                        cal.permuted[k] = elem
                if elem in FLOAT_ELEMS:
                    cal.elem[k] = elem
                    cal.spread[k] = _spread([c[k] for c in contents if k in c], elem, cal.varying[k])
            apart = _subtract(_align(diff_ranges(ref, first, step), step, size), cal.varying.get(k, []))
            if apart:
                cal.replay_differs[k] = sum(n for _, n in apart)
        return cal

    def tolerance(self, key: Key) -> Optional[Tolerance]:
        """The tolerance the calibration allows for a float buffer's varying elements (None: none)."""
        s = self.spread.get(key)
        if s is None or not math.isfinite(s):
            return None
        return Tolerance(self.elem[key], atol=(1.0 + self.margin) * s,
                         source=f"calibration: {self.states} runs of the recorded configuration, spread {s:.3g}, "
                                f"margin {self.margin:g}x")

    def summary(self) -> str:
        parts = [f"{_where(k)}: {sum(n for _, n in r)} B vary" for k, r in self.varying.items()]
        parts += [f"{_where(k)}: {n} B differ from the recording in every replay" for k, n in self.replay_differs.items()]
        parts += [f"{_where(k)}: the same {e} elements in another order in every run" for k, e in self.permuted.items()]
        if not parts:
            return f"calibration: {self.states} runs of the recorded configuration agree bit for bit"
        return f"calibration: {self.states} runs (the recording and {self.states - 1} replays); " + "; ".join(parts)


def _sorted_elems(buf, elem: str) -> Optional[List[int]]:
    """The buffer's elements of `elem` (an integer type), sorted; None when it is no whole number of them."""
    if len(buf) % _SIZES[elem]:
        return None
    return sorted(memoryview(buf).cast("B").cast(_FMT[elem]))


def _contents(s: Snapshot) -> Dict[Key, memoryview]:
    out: Dict[Key, memoryview] = {("blob", b.addr): b.contents for b in s.blobs}
    out.update({("variable", v.name): v.contents for v in s.variables})
    return out


def _merge(ranges: Iterable[Tuple[int, int]], limit: int) -> List[Tuple[int, int]]:
    out: List[List[int]] = []
    for lo, n in sorted(ranges):
        hi = min(lo + n, limit)
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in out]


def _align(ranges: Iterable[Tuple[int, int]], step: int, size: int) -> List[Tuple[int, int]]:
    """`ranges` widened to whole elements of `step` bytes, merged."""
    return _merge([(o - o % step, -(-(o + n) // step) * step - (o - o % step)) for o, n in ranges], size)


def _subtract(ranges: Iterable[Tuple[int, int]], minus: Sequence[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """The parts of `ranges` outside `minus` (both (offset, length), sorted and disjoint): one sweep over both
    (a range-by-range scan of `minus` took 31 s for 10,000 ranges of a permuted 40 MB output)."""
    out: List[Tuple[int, int]] = []
    j = 0
    for lo, n in ranges:
        pos, hi = lo, lo + n
        while j < len(minus) and minus[j][0] + minus[j][1] <= pos:
            j += 1
        k = j
        while k < len(minus) and minus[k][0] < hi:
            mlo, mn = minus[k]
            if mlo > pos:
                out.append((pos, mlo - pos))
            pos = max(pos, mlo + mn)
            k += 1
        if pos < hi:
            out.append((pos, hi - pos))
    return out


def _spread(states: Sequence[memoryview], elem: str, ranges: Sequence[Tuple[int, int]]) -> float:
    size = _SIZES[elem]
    worst = 0.0
    for off, n in ranges:
        for i in range(off // size, (off + n) // size):
            vals = [decode(s, elem, i) for s in states]
            if any(not math.isfinite(v) for v in vals):
                return math.inf if len(set(map(repr, vals))) > 1 else worst
            worst = max(worst, max(vals) - min(vals))
    return worst


def buffer_types(state: Snapshot, arg_elems: Mapping[int, str], arg_names: Sequence[str] = ()
                 ) -> Tuple[Dict[Key, str], Dict[Key, str]]:
    """({blob key: element type}, {blob key: argument name}) of the blobs the kernel's pointer
    arguments point into (`arg_elems`: parameter index -> element type, from the IR). A blob that
    arguments of different element types point into gets none."""
    args = state.args if state.has_args else []
    types: Dict[Key, str] = {}
    names: Dict[Key, str] = {}
    blobs = sorted(state.blobs, key=lambda b: b.addr)
    for index, elem in arg_elems.items():
        if index >= len(args) or len(args[index]) != 8:
            continue
        ptr = int.from_bytes(bytes(args[index]), "little")
        blob = next((b for b in blobs if b.addr <= ptr < b.addr + max(b.size, 1)), None)
        if blob is None:
            continue
        k: Key = ("blob", blob.addr)
        name = arg_names[index] if index < len(arg_names) and arg_names[index] else f"arg{index}"
        names[k] = f"{names[k]}, {name}" if k in names else f"arg {name}"
        if types.get(k, elem) != elem or elem not in _SIZES:
            types[k] = "mixed"
        else:
            types[k] = elem
    return {k: v for k, v in types.items() if v != "mixed"}, names


def policies(expected: Snapshot, *, types: Optional[Mapping[Key, str]] = None,
             names: Optional[Mapping[Key, str]] = None, calibration: Optional[Calibration] = None,
             float_rtol: Optional[float] = None, atol: Optional[float] = None, rtol: Optional[float] = None,
             tol_type: str = "f32", annotations=None) -> List[BufferPolicy]:
    """Every blob and variable of `expected` with how it is compared (rules in the module docstring)."""
    types, names = dict(types or {}), dict(names or {})
    base_plan = verification_plan(expected, atol, rtol, tol_type, annotations)
    by_key: Dict[Key, List[Check]] = {}
    for c in base_plan:
        by_key.setdefault((c.kind, c.key), []).append(c)
    out: List[BufferPolicy] = []
    for kind, key, base, size in _regions(expected):
        k: Key = (kind, key)
        checks = by_key.get(k, [])
        annotated = [c for c in checks if c.source.startswith("annotation")]
        elem = types.get(k)
        elem_source = "IR" if elem else ""
        if not elem and annotated:
            elem, elem_source = annotated[0].elem, "annotation"
        p = BufferPolicy(k, base, size, names.get(k, ""), elem, elem_source)
        if not checks:
            p.how = "exact"
        elif any(not c.exact and c.source == "replay tolerance" for c in checks) or annotated:
            p.checks = checks  # annotations and replay-time tolerances decide, as verification_plan says
            p.how = "annotation" if annotated else "replay tolerance"
            if annotated:
                p.tolerance = Tolerance(annotated[0].elem, max(annotated[0].atol, 0), max(annotated[0].rtol, 0),
                                        annotated[0].source)
            out.append(p)
            continue
        p.checks = _rules(p, base, size, calibration, float_rtol)
        out.append(p)
    return out


def _rules(p: BufferPolicy, base: int, size: int, cal: Optional[Calibration], float_rtol: Optional[float]) -> List[Check]:
    k, elem = p.key, p.elem
    varying = cal.varying.get(k, []) if cal else []
    is_float = elem in FLOAT_ELEMS
    cal_tol = cal.tolerance(k) if (cal and is_float and varying) else None
    if is_float and float_rtol is not None:
        atol = cal_tol.atol if cal_tol else 0.0
        src = "flag --float-rtol" + (f" + {cal_tol.source}" if cal_tol else "")
        p.tolerance = Tolerance(elem, atol, float(float_rtol), src)
        p.how = "tolerance"
        return [p.tolerance.check(k, base, 0, size)]
    if cal and k in cal.replay_differs:
        p.note = (f"{cal.replay_differs[k]} B differ between the recording and every replay, and the replays agree "
                  "with each other: not nondeterminism, replay computes something else than the app did")
    if not varying:
        p.how = "exact"
        return [Check(k[0], k[1], base, 0, size)]
    if cal_tol is not None:
        p.tolerance, p.how = cal_tol, "exact+tolerance"
        ranges = varying
        if len(ranges) > MAX_RANGES:
            lo, last = ranges[0][0], ranges[-1]
            ranges = [(lo, last[0] + last[1] - lo)]
            p.note = f"{len(varying)} varying ranges, compared as one span"
        return _cover(k, base, size, ranges, lambda o, n: cal_tol.check(k, base, o, n))
    n_vary = sum(n for _, n in varying)
    if cal and k in cal.permuted:
        p.how = "exact+multiset"
        p.evidence = (f"calibration: each of {cal.states} runs of the recorded configuration holds the recording's "
                      f"{cal.permuted[k]} elements in another order, {n_vary} B moved")
        return _cover(k, base, size, varying, None)
    if cal and k in cal.scratch:
        skipped = list(cal.scratch_ranges.get(k, varying))
        p.how, p.skipped, p.evidence = ("scratch" if skipped == [(0, size)] else "exact+scratch"), skipped, cal.scratch[k]
        return _cover(k, base, size, skipped, None)
    p.how = "exact"
    what = f"{elem} buffer" if elem else "buffer of unknown element type"
    p.note = p.note + ("; " if p.note else "") + (f"{n_vary} B of this {what} vary between identical runs "
                                                  f"({cal.states} runs) and could not be shown to be scratch; "
                                                  "compared exactly")
    return [Check(k[0], k[1], base, 0, size)]


def _cover(k: Key, base: int, size: int, ranges: Sequence[Tuple[int, int]], special) -> List[Check]:
    """Exact checks between `ranges`; `special(offset, length)` for each range (None: skipped)."""
    out: List[Check] = []
    pos = 0
    for off, n in ranges:
        if off > pos:
            out.append(Check(k[0], k[1], base, pos, off - pos))
        if special is not None:
            out.append(special(off, n))
        pos = off + n
    if pos < size:
        out.append(Check(k[0], k[1], base, pos, size - pos))
    return out


def plan_of(pols: Iterable[BufferPolicy]) -> List[Check]:
    return [c for p in pols for c in p.checks]

