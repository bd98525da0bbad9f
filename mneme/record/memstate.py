"""MemState: a recorded memory state (prologue or epilogue) and the definition of "verified".

A `MemState` is the seeds' MemStateRef over mneme's snapshot files: a handle that is opened (the file is
read and checked), used (`args`, `num_args`, the blobs and variables, `compare`) and closed, also as a
context manager. An epilogue stored as diffs needs its prologue (`prologue_fn`) to become a full state.

What "verified" means — the CPU side here and the GPU core (native/core) implement exactly this:

1. The state is every blob (arena, pinned-host, managed and app-registered host memory, by recorded
   address) and every `__device__`/`__constant__` variable (by name). Expected and actual must hold the
   same blobs with the same sizes and the same variables with the same sizes; a missing, extra or
   resized one is a difference.
2. `verification_plan(expected)` cuts every blob and variable into checks. A part covered by an
   annotation that the app recorded (mneme/tolerance.h) is compared with that annotation's element
   type, norm and tolerance (mode "abs" -> atol = tol, rtol = 0; "rel" -> atol = 0, rtol = tol).
   The annotations are the expected state's (the actual state's when the expected has none); they
   are matched by address and clipped to the blob or variable; where two overlap, the one with the
   lower address wins. Every other byte is compared byte-exact, unless replay-time
   tolerances were given (`atol`/`rtol` with an element type, for apps that carry no annotations):
   then those bytes are compared per element with |a - e| <= atol + rtol * |e|. Annotations take
   precedence over replay-time tolerances. (Replay-time tolerances read every unannotated byte as the
   given element type, integers and pointers included; use them only where that is true.)
3. Each check is one mn_compare_ex call (native/snapshot.h defines the rules: NaN equals NaN at the
   same position, NaN or inf against anything else fails, -0.0 equals 0.0 when a tolerance is given,
   a norm check compares the L1/L2/Linf norm of the error with atol + rtol * the norm of the
   expected values, a trailing partial element is compared byte-exact). The state is verified when
   the layouts agree and every check passes.

For kernels that are not bit-reproducible, mneme.record.verification builds on this plan (tolerances
learned from baseline replays, scratch skipped with evidence, `--float-rtol`) and names each buffer's
comparison in its Verdict (docs/VERIFY.md).

`written_ranges()` of an epilogue lists the bytes the kernel changed (from the diff, or by diffing a
BYTES blob against its prologue); replay resets only those between timed iterations.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from mneme.errors import SnapshotError
from mneme.snapshot import (
    MERGE_GAP,
    Check,
    Annotation,
    Args,
    Blob,
    Encoding,
    Snapshot,
    SnapshotType,
    Variable,
    compare as compare_buffers,
    diff_ranges,
    elem_code,
)

__all__ = ["SnapshotType", "MemState", "Check", "Difference", "CompareReport", "verification_plan", "written_state"]


@dataclass(frozen=True)
class Difference:
    """Why one part of the state differs: a layout problem (`reason`), or a failed check."""

    kind: str
    key: Union[int, str]
    reason: str
    check: Optional[Check] = None
    first_offset: Optional[int] = None
    mismatches: int = 0
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    err_norm: float = 0.0
    ref_norm: float = 0.0

    def __str__(self) -> str:
        where = f"blob 0x{self.key:x}" if self.kind == "blob" else f"variable {self.key}"
        if self.check is None:
            return f"{where}: {self.reason}"
        c = self.check
        unit = "bytes" if c.elem == "bytes" else f"{c.elem} elements"
        text = f"{where}: {self.mismatches} {unit} differ, first at offset {self.first_offset}"
        if not c.exact or c.elem != "bytes":
            text += f" (max abs err {self.max_abs_err:g}, max rel err {self.max_rel_err:g}"
            if c.norm != "element":
                text += f", {c.norm} err {self.err_norm:g} vs ref {self.ref_norm:g}"
            text += f"; {c.source})"
        return text


@dataclass
class CompareReport:
    """The outcome of MemState.compare: `equal` is the verdict, `differences` say where and how much."""

    equal: bool
    differences: List[Difference] = field(default_factory=list)
    checks: int = 0
    bytes_compared: int = 0

    def __bool__(self) -> bool:
        return self.equal

    @property
    def blobs(self) -> List[int]:
        """Addresses of the blobs that differ."""
        return sorted({d.key for d in self.differences if d.kind == "blob"})  # type: ignore[type-var]

    @property
    def variables(self) -> List[str]:
        return sorted({str(d.key) for d in self.differences if d.kind == "variable"})

    def __str__(self) -> str:
        if self.equal:
            return f"equal ({self.checks} checks, {self.bytes_compared} bytes)"
        lines = [f"{len(self.differences)} difference(s) in {self.checks} checks:"]
        lines += [f"  {d}" for d in self.differences[:20]]
        if len(self.differences) > 20:
            lines.append(f"  ... and {len(self.differences) - 20} more")
        return "\n".join(lines)


def _regions(state: Snapshot) -> List[Tuple[str, Union[int, str], int, int]]:
    """(kind, key, recorded address, size) of every blob and variable."""
    return ([("blob", b.addr, b.addr, b.size) for b in state.blobs]
            + [("variable", v.name, v.addr, v.size) for v in state.variables])


def _annotation_check(kind: str, key: Union[int, str], base: int, start: int, end: int, a: Annotation) -> Check:
    atol, rtol = (a.tol, 0.0) if a.mode == "abs" else (0.0, a.tol)
    if a.tol < 0:
        atol = rtol = -1.0
    return Check(kind, key, base, start - base, end - start, a.elem, a.norm, atol, rtol,
                 f"annotation {a.tag}".rstrip())


def verification_plan(expected: Snapshot, atol: Optional[float] = None, rtol: Optional[float] = None,
                      elem: str = "f32", annotations: Optional[Iterable[Annotation]] = None) -> List[Check]:
    """The checks that decide whether a state equals `expected` (rule 2 of the module docstring).
    `annotations` defaults to the expected state's own."""
    annots = sorted(expected.annotations if annotations is None else annotations, key=lambda a: a.addr)
    tolerant = atol is not None or rtol is not None
    if tolerant:
        elem_code(elem)
        default = dict(elem=elem, atol=float(atol or 0.0), rtol=float(rtol or 0.0), source="replay tolerance")
    else:
        default = {}
    plan: List[Check] = []
    for kind, key, base, size in _regions(expected):
        pos, end = base, base + size
        for a in annots:
            lo, hi = max(a.addr, pos), min(a.addr + a.size, end)
            if lo >= hi:
                continue
            if lo > pos:
                plan.append(Check(kind, key, base, pos - base, lo - pos, **default))
            plan.append(_annotation_check(kind, key, base, lo, hi, a))
            pos = hi
        if pos < end:
            plan.append(Check(kind, key, base, pos - base, end - pos, **default))
    return plan


def _layout_differences(expected: Snapshot, actual: Snapshot) -> List[Difference]:
    out = []
    exp_blobs = {b.addr: b.size for b in expected.blobs}
    act_blobs = {b.addr: b.size for b in actual.blobs}
    exp_vars = {v.name: v.size for v in expected.variables}
    act_vars = {v.name: v.size for v in actual.variables}
    for kind, exp, act in (("blob", exp_blobs, act_blobs), ("variable", exp_vars, act_vars)):
        for key, size in exp.items():
            if key not in act:
                out.append(Difference(kind, key, "missing from the actual state"))
            elif act[key] != size:
                out.append(Difference(kind, key, f"{act[key]} bytes, expected {size}"))
        for key in act.keys() - exp.keys():
            out.append(Difference(kind, key, "not in the expected state"))
    return out


def compare_states(expected: Snapshot, actual: Snapshot, atol: Optional[float] = None,
                   rtol: Optional[float] = None, elem: str = "f32") -> CompareReport:
    """Verifies `actual` against `expected` (both full states) per the module docstring."""
    for s in (expected, actual):
        if not s.is_full:
            raise SnapshotError(f"{s.path}: this epilogue holds diffs; open it with its prologue (prologue_fn) "
                                "before comparing")
    report = CompareReport(equal=True, differences=_layout_differences(expected, actual))
    broken = {(d.kind, d.key) for d in report.differences}
    annotations = expected.annotations or actual.annotations
    contents_e = {("blob", b.addr): b.contents for b in expected.blobs}
    contents_e.update({("variable", v.name): v.contents for v in expected.variables})
    contents_a = {("blob", b.addr): b.contents for b in actual.blobs}
    contents_a.update({("variable", v.name): v.contents for v in actual.variables})
    for c in verification_plan(expected, atol, rtol, elem, annotations):
        if (c.kind, c.key) in broken:
            continue
        e = contents_e[(c.kind, c.key)][c.offset:c.offset + c.length]
        a = contents_a[(c.kind, c.key)][c.offset:c.offset + c.length]
        if c.exact:
            r = compare_buffers(e, a, c.elem)
        else:
            r = compare_buffers(e, a, c.elem, norm=c.norm, atol=c.atol, rtol=c.rtol)
        report.checks += 1
        report.bytes_compared += c.length
        if not r.equal:
            first = None if r.first_mismatch is None else c.offset + r.first_mismatch
            report.differences.append(Difference(c.kind, c.key, "contents differ", c, first, r.mismatches,
                                                 r.max_abs_err, r.max_rel_err, r.err_norm, r.ref_norm))
    report.equal = not report.differences
    return report


class MemState:
    """A recorded prologue or epilogue (the seeds' MemStateRef).

    `fn` is the snapshot file, `kernel_name` names the kernel in messages, `snap_type` says which of the
    two the file must be, and `prologue_fn` (epilogues only) is the prologue the diff applies to."""

    def __init__(self, fn: Union[str, "os.PathLike[str]"], kernel_name: str, snap_type: SnapshotType,
                 prologue_fn: Optional[Union[str, "os.PathLike[str]"]] = None) -> None:
        self.fn = os.fspath(fn)
        self.kernel_name = kernel_name
        self.s_type = SnapshotType(snap_type)
        self.prologue_fn = os.fspath(prologue_fn) if prologue_fn is not None else None
        for path, what in ((self.fn, self.s_type.name.lower()), (self.prologue_fn, "prologue")):
            if path is not None and not os.path.isfile(path):
                raise SnapshotError(f"{path}: the {what} snapshot of kernel {kernel_name} does not exist; "
                                    "record the kernel again or fix the path in the record DB")
        if self.prologue_fn is not None and self.s_type != SnapshotType.EPILOGUE:
            raise ValueError(f"{self.fn}: prologue_fn applies to epilogues only")
        self._snap: Optional[Snapshot] = None
        self._written: Optional[List[Tuple[int, int]]] = None
        self._written_vars: Optional[Dict[str, List[Tuple[int, int]]]] = None

    # -- lifetime
    def open(self) -> "MemState":
        """Reads and checks the file (and applies the diff to the prologue); idempotent."""
        if self._snap is not None:
            return self
        snap = Snapshot.read(self.fn)
        try:
            if snap.kind != self.s_type:
                raise SnapshotError(f"{self.fn}: the file is a {snap.kind.name.lower()}, but kernel "
                                    f"{self.kernel_name} lists it as its {self.s_type.name.lower()}")
            if self.prologue_fn is not None:
                with Snapshot.read(self.prologue_fn) as pro:
                    if pro.kind != SnapshotType.PROLOGUE:
                        raise SnapshotError(f"{self.prologue_fn}: not a prologue (kernel {self.kernel_name})")
                    self._written, self._written_vars = written_state(snap, pro)
                    snap.apply(pro)
            elif snap.kind == SnapshotType.EPILOGUE:
                if not snap.is_full:
                    raise SnapshotError(f"{self.fn}: the epilogue of {self.kernel_name} is stored as a diff; "
                                        "give its prologue (prologue_fn) to open it")
                self._written, self._written_vars = written_state(snap, None)
        except BaseException:
            snap.close()
            raise
        self._snap = snap
        return self

    def close(self) -> None:
        if self._snap is not None:
            self._snap.close()
            self._snap = None

    def reset(self) -> None:
        """Returns to the recorded state: re-reads the file(s)."""
        self._loaded("reset")
        self.close()
        self.open()

    def __enter__(self) -> "MemState":
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def loaded(self) -> bool:
        return self._snap is not None

    def _loaded(self, what: str) -> Snapshot:
        if self._snap is None:
            raise RuntimeError(f"{self.fn}: open the memory state before using {what}")
        return self._snap

    # -- contents
    @property
    def snapshot(self) -> Snapshot:
        return self._loaded("snapshot")

    @property
    def args(self) -> Args:
        """The kernel's parameters: args[i] is the bytes of parameter i; `.raw`, `.offsets`, `.sizes`."""
        return self._loaded("args").args

    @property
    def num_args(self) -> int:
        return len(self._loaded("num_args").args)

    @property
    def blobs(self) -> List[Blob]:
        return self._loaded("blobs").blobs

    @property
    def variables(self) -> List[Variable]:
        return self._loaded("variables").variables

    @property
    def annotations(self) -> List[Annotation]:
        return self._loaded("annotations").annotations

    def written_ranges(self) -> List[Tuple[int, int]]:
        """(recorded address, length) of the blob bytes the kernel wrote, sorted (epilogues only).
        Without a prologue, a BYTES blob counts as written in full."""
        self._loaded("written_ranges")
        if self._written is None:
            raise ValueError(f"{self.fn}: written_ranges() needs an epilogue")
        return list(self._written)

    def written_variables(self) -> Dict[str, List[Tuple[int, int]]]:
        """Variable name -> (offset, length) of the bytes the kernel wrote in it (epilogues only)."""
        self._loaded("written_variables")
        if self._written_vars is None:
            raise ValueError(f"{self.fn}: written_variables() needs an epilogue")
        return dict(self._written_vars)

    # -- verification
    def compare(self, other: Union["MemState", Snapshot], atol: Optional[float] = None,
                rtol: Optional[float] = None, elem: str = "f32") -> CompareReport:
        """Verifies `other` against this (expected) state; see the module docstring for the rules."""
        actual = other._loaded("compare") if isinstance(other, MemState) else other
        return compare_states(self._loaded("compare"), actual, atol, rtol, elem)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MemState):
            return NotImplemented
        return self.compare(other).equal

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        state = "open" if self.loaded else "closed"
        return f"MemState({self.fn!r}, {self.kernel_name!r}, {self.s_type.name}, {state})"


def written_state(epi: Snapshot, pro: Optional[Snapshot]) -> Tuple[List[Tuple[int, int]], Dict[str, List[Tuple[int, int]]]]:
    """What the kernel wrote, from the epilogue before apply: the diff's ranges, or a diff against the
    prologue's bytes, or (no prologue) everything."""
    ranges: List[Tuple[int, int]] = []
    for b in epi.blobs:
        if b.encoding == Encoding.DIFF:
            ranges += [(b.addr + off, length) for off, length in b.ranges]
            continue
        base = pro.find_blob(b.addr) if pro is not None else None
        if base is not None and base.addr == b.addr and base.size == b.size:
            ranges += [(b.addr + off, length) for off, length in diff_ranges(base.contents, b.contents, MERGE_GAP)]
        elif b.size:
            ranges.append((b.addr, b.size))
    variables: Dict[str, List[Tuple[int, int]]] = {}
    for v in epi.variables:
        base_v = pro.find_variable(v.name) if pro is not None else None
        if base_v is not None and base_v.size == v.size:
            changed = diff_ranges(base_v.contents, v.contents, MERGE_GAP)
        else:
            changed = [(0, v.size)] if v.size else []
        if changed:
            variables[v.name] = changed
    return sorted(ranges), variables
