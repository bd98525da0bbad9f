"""Replay memory: the arena and pinned host memory at the recorded addresses, the loaded prologue,
the resets between runs, and verification against the expected epilogue.

The recorded pointers (in arguments, in memory, in variables) stay valid only because everything
lives where it lived in the app: the device arena at the record DB's VAddr, pinned host buffers at
their recorded host addresses. `ReplayState` loads a prologue there, keeps a device-side copy for
device-to-device resets of the bytes the kernel writes, and compares the replayed state with the
expected one, large buffers on the GPU. What to compare, and how tolerantly, is the caller's plan
(mneme.record.memstate.verification_plan); by default every byte must match.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

from mneme.device.driver import Device, get_device
from mneme.device.errors import AddressNotGranted, CudaError, check, lib
from mneme.device.placement import MANAGED_WINDOWS, host_regions, managed_spans, managed_windows, not_placed
from mneme.errors import DeviceError
from mneme.snapshot import NORMS, Check, CompareResult, Snapshot, Space, _bytes_arg, elem_code

Address = Union[int, str]
#: Buffers at least this large are compared on the GPU (smaller ones are copied back).
GPU_COMPARE_MIN_BYTES = 4 << 20
#: Written ranges closer than this are reset by one copy (the bytes between are prologue bytes anyway).
RESET_MERGE_GAP = 4096


def _address(a: Address) -> int:
    """The record DB stores VAddr as a hex string; accept that or an int."""
    return int(a, 0) if isinstance(a, str) else int(a)


def _snapshot_ptr(s: Any) -> Any:
    """The mn_snapshot* of a Snapshot (or of a MemState's snapshot), refusing closed ones."""
    snap = getattr(s, "snapshot", s)
    if not isinstance(snap, Snapshot):
        raise TypeError(f"expected a Snapshot or MemState, got {type(s).__name__}")
    return snap._snap()


class _Native:
    """Owns one C handle: `close()` frees it once, and so does garbage collection."""

    def __init__(self, handle: Any, free: Any) -> None:
        self._h = handle
        self._free = free
        self._finalizer = weakref.finalize(self, free, handle)

    def _handle(self) -> Any:
        if self._h is None:
            raise DeviceError(f"{type(self).__name__} was closed")
        return self._h

    @property
    def closed(self) -> bool:
        return self._h is None

    def close(self) -> None:
        if self._h is not None:
            h, self._h = self._h, None
            self._finalizer.detach()
            self._release(h)

    def _release(self, h: Any) -> None:
        check(self._free(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Arena(_Native):
    """Device memory reserved and backed at exactly [vaddr, vaddr + vasize) (rounded up to the
    allocation granularity); AddressNotGranted when the driver offers another address. `window`
    (base, size): reserve that larger range instead and back only the arena inside it."""

    def __init__(self, device: Optional[Device], vaddr: Address, vasize: int,
                 window: Optional[Tuple[int, int]] = None) -> None:
        self.device = device or get_device()
        ffi, native = lib()
        out = ffi.new("mnc_arena **")
        if window is None:
            check(native.mnc_arena_create(_address(vaddr), int(vasize), out))
        else:
            check(native.mnc_arena_create_within(_address(vaddr), int(vasize), int(window[0]), int(window[1]), out))
        self.window = window
        base, size = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        check(native.mnc_arena_size(out[0], base, size))
        self.base, self.size = int(base[0]), int(size[0])
        super().__init__(out[0], native.mnc_arena_destroy)

    def __contains__(self, addr: int) -> bool:
        return self.base <= addr < self.base + self.size

    def __repr__(self) -> str:
        return f"Arena(0x{self.base:x}, {self.size})"


class HostRegion(_Native):
    """Pinned, device-mapped host memory at exactly `addr` (page-aligned), seen by the GPU at the same
    address: where the recorder served cudaMallocHost from."""

    def __init__(self, device: Optional[Device], addr: Address, size: int) -> None:
        self.device = device or get_device()
        ffi, native = lib()
        out = ffi.new("mnc_host_region **")
        check(native.mnc_host_region_create(_address(addr), int(size), out))
        self.addr, self.size = _address(addr), int(size)
        super().__init__(out[0], native.mnc_host_region_destroy)

    def __repr__(self) -> str:
        return f"HostRegion(0x{self.addr:x}, {self.size})"


def arena_granularity(device: Optional[Device] = None) -> int:
    """The granularity arenas are reserved in: their addresses and sizes are multiples of it."""
    if device is None:
        get_device()  # opens the device: the granularity is the device's
    ffi, native = lib()
    out = ffi.new("uint64_t *")
    check(native.mnc_arena_granularity(out))
    return int(out[0])


def _managed_arenas(device: Device, prologue: Any) -> List[Arena]:
    """Device memory at the recorded addresses of the prologue's managed-memory blobs: the exact spans, else
    (not granted) each group of spans inside a reserved window of MANAGED_WINDOWS' sizes in turn."""
    if not any(Space(b.space) == Space.MANAGED for b in prologue.blobs):
        return []
    spans = managed_spans(prologue.blobs, arena_granularity(device))
    tried: List[str] = []
    for unit in (None, *MANAGED_WINDOWS):
        placed = [(a, n, a, n) for a, n in spans] if unit is None else managed_windows(spans, unit)
        out: List[Arena] = []
        try:
            for wbase, wsize, addr, size in placed:
                out.append(Arena(device, addr, size, None if unit is None else (wbase, wsize)))
            return out
        except AddressNotGranted as e:
            tried.append(f"{'exact spans' if unit is None else f'{unit >> 20} MB windows'}: {e}"
                         f"{not_placed(wbase, wsize)}")
        finally:
            if len(out) != len(placed):
                for a in out:
                    a.close()
    raise AddressNotGranted(
        f"{prologue.path}: the app's managed memory (cudaMallocManaged, {len(spans)} span(s) from 0x{spans[0][0]:x}) "
        "cannot be placed at its recorded addresses in this process; tried " + "; ".join(tried))


#: one check of a verification plan: the very class the CPU side plans with
BufferCheck = Check


@dataclass(frozen=True)
class BufferResult(CompareResult):
    """The outcome of one check: mn_compare's report on it; `first_mismatch` is a byte offset inside the buffer."""

    check: Any = None

    def __str__(self) -> str:
        c = self.check
        where = f"blob 0x{c.key:x}" if c.kind == "blob" else f"variable {c.key}"
        unit = "bytes" if c.elem == "bytes" else f"{c.elem} elements"
        text = f"{where} [{c.offset}, +{c.length}): {self.mismatches} {unit} differ"
        if self.first_mismatch is not None:
            text += f", first at offset {self.first_mismatch}"
        if c.elem != "bytes":
            text += f" (max abs err {self.max_abs_err:g}, max rel err {self.max_rel_err:g}"
            if c.norm != "element":
                text += f", {c.norm} err {self.err_norm:g} vs ref {self.ref_norm:g}"
            text += ")"
        return text


@dataclass
class VerifyReport:
    """Whether the replayed state equals the expected one; `results` per check, `differences` for
    layout problems (a blob the replay lacks, a resized one), `skipped` for what could not be compared
    (variables the recompiled module no longer has)."""

    equal: bool
    results: List[BufferResult] = field(default_factory=list)
    differences: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)
    bytes_compared: int = 0

    def __bool__(self) -> bool:
        return self.equal

    @property
    def failures(self) -> List[BufferResult]:
        return [r for r in self.results if not r.equal]

    def __str__(self) -> str:
        if self.equal:
            return f"verified ({len(self.results)} checks, {self.bytes_compared} bytes)"
        lines = [f"not verified: {len(self.differences) + len(self.failures)} difference(s)"]
        lines += [f"  {d}" for d in self.differences]
        lines += [f"  {r}" for r in self.failures[:20]]
        return "\n".join(lines)


def exact_plan(expected: Snapshot) -> List[BufferCheck]:
    """Every blob and variable of `expected`, byte-exact."""
    return ([BufferCheck("blob", b.addr, b.addr, 0, b.size) for b in expected.blobs]
            + [BufferCheck("variable", v.name, v.addr, 0, v.size) for v in expected.variables])


def _module_handle(module: Any) -> Any:
    """The module's C handle; refuses one whose variables came from a snapshot closed since (the core
    reads the recorded variables from it)."""
    ffi, _ = lib()
    if module is None:
        return ffi.NULL
    if module.variables_loaded:
        _snapshot_ptr(module._variables_from)
    return module._handle()


_compare_unavailable: Optional[str] = None


def load_compare_kernels() -> bool:
    """Loads the core's kernels (package data mneme/data/compare.ptx: compare, hold) into the open device.
    Where the driver cannot load them, says so once and returns False: verification then runs on the
    host and timings go without the hold kernel."""
    global _compare_unavailable
    ffi, native = lib()
    if native.mnc_compare_loaded():
        return True
    if _compare_unavailable is not None:
        return False
    ptx = resources.files("mneme").joinpath("data/compare.ptx").read_bytes()
    try:
        check(native.mnc_compare_load(ffi.from_buffer(ptx), len(ptx)))
    except CudaError as e:
        if e.sticky:
            raise
        _compare_unavailable = str(e)
        warnings.warn(f"the GPU compare kernels (mneme/data/compare.ptx) do not load here ({e}); verification "
                      "runs on the host and timings include launch latency", RuntimeWarning, stacklevel=2)
        return False
    return True


class ReplayState(_Native):
    """A prologue loaded at its recorded addresses, ready for runs, resets and verification.

    The device blobs must lie in an `Arena`; managed-memory blobs (the app's cudaMallocManaged ranges)
    get arenas of device memory here, at their recorded addresses (`managed` holds them), so that
    pointers to them in arguments and in memory stay valid; pinned-host blobs get `HostRegion`s here
    (the regions given, else pages around the blobs). The prologue snapshot must stay open while the
    state lives: the state borrows its bytes for `reset_all`."""

    def __init__(self, device: Optional[Device], prologue: Any,
                 regions: Optional[Sequence[Tuple[Address, int]]] = None) -> None:
        device = device or get_device()
        self.device = device
        self.prologue = getattr(prologue, "snapshot", prologue)
        ptr = _snapshot_ptr(self.prologue)
        wanted = regions if regions is not None else host_regions(self.prologue.blobs)
        self.regions: List[HostRegion] = []
        self.managed: List[Arena] = []
        try:
            self.managed = _managed_arenas(device, self.prologue)
            self.regions = [HostRegion(device, a, n) for a, n in wanted]
            ffi, native = lib()
            out = ffi.new("mnc_state **")
            check(native.mnc_state_load(ptr, out))
        except BaseException:
            self._close_placed()
            raise
        super().__init__(out[0], native.mnc_state_free)

    def _close_placed(self) -> None:
        for r in [*self.regions, *self.managed]:
            r.close()

    def _release(self, h: Any) -> None:
        try:
            super()._release(h)
        finally:
            self._close_placed()

    def _live(self) -> Any:
        h = self._handle()
        _snapshot_ptr(self.prologue)  # refuses a closed prologue before C reads freed memory
        return h

    # -- resets
    def plan_resets(self, ranges: Iterable[Tuple[int, int]], module: Any = None,
                    merge_gap: int = RESET_MERGE_GAP) -> Tuple[int, int]:
        """Sets what `reset_written` and timed runs restore: (recorded address, length) ranges in blobs
        or in `module`'s variables (at the variable's recorded address + offset). Returns (copies,
        bytes) after merging ranges closer than `merge_gap`."""
        ffi, native = lib()
        rs = [(int(a), int(n)) for a, n in ranges]
        arr = ffi.new("mn_range[]", max(1, len(rs)))
        for i, (a, n) in enumerate(rs):
            arr[i].offset, arr[i].length = a, n
        check(native.mnc_state_plan(self._live(), _module_handle(module), arr, len(rs), merge_gap))
        ops, nbytes = ffi.new("uint32_t *"), ffi.new("uint64_t *")
        check(native.mnc_state_plan_size(self._handle(), ops, nbytes))
        return int(ops[0]), int(nbytes[0])

    def reset_written(self, ranges: Optional[Iterable[Tuple[int, int]]] = None, module: Any = None) -> None:
        """Restores the written ranges from the device-side copy (device to device)."""
        if ranges is not None:
            self.plan_resets(ranges, module)
        check(lib()[1].mnc_state_reset_written(self._live(), _module_handle(module)))

    def reset_all(self, module: Any = None) -> None:
        """Restores every blob (and `module`'s variables) from the host copy: after a failed
        verification or an error, so that nothing of a bad run leaks into the next."""
        check(lib()[1].mnc_state_reset_all(self._live(), _module_handle(module)))

    # -- verification
    def verify(self, expected: Any, plan: Optional[Iterable[Any]] = None, module: Any = None,
               gpu_min_bytes: int = GPU_COMPARE_MIN_BYTES) -> VerifyReport:
        """Compares the replayed state with `expected` (a full epilogue Snapshot or MemState) under
        `plan` (checks with BufferCheck's fields; default: everything byte-exact). Variables are read
        from `module`; those it lacks are reported as skipped."""
        ffi, native = lib()
        exp = getattr(expected, "snapshot", expected)
        if not exp.is_full:
            raise DeviceError(f"{exp.path}: the expected epilogue holds diffs; apply it to its prologue first")
        checks = list(plan) if plan is not None else exact_plan(exp)
        report = VerifyReport(equal=True)
        have_blobs = {b.addr: b.size for b in self.prologue.blobs}
        present = self._module_variables(module, exp)
        contents = {}
        for b in exp.blobs:
            if b.addr not in have_blobs:
                report.differences.append(f"blob 0x{b.addr:x} ({b.size} bytes) is not in the replayed state")
            elif have_blobs[b.addr] != b.size:
                report.differences.append(f"blob 0x{b.addr:x} has {have_blobs[b.addr]} bytes in the replayed "
                                          f"state, {b.size} expected")
            else:
                contents[("blob", b.addr)] = b.contents
        for v in exp.variables:
            if v.name in present:
                contents[("variable", v.name)] = v.contents
            else:
                report.skipped.append(f"variable {v.name}: not in the module"
                                      + (" (none given)" if module is None else " (optimized away)"))
        jobs = [c for c in checks if (c.kind, c.key) in contents and c.length > 0]
        if jobs:
            arr = ffi.new("mnc_cmp_job[]", len(jobs))
            keep = []
            for i, c in enumerate(jobs):
                view = contents[(c.kind, c.key)][c.offset:c.offset + c.length]
                ptr, _ = _bytes_arg(view)
                keep.append(ptr)
                j = arr[i]
                j.addr, j.length, j.expected = c.base + c.offset, c.length, ptr
                j.elem, j.norm = elem_code(c.elem), NORMS[c.norm]
                j.atol, j.rtol = (c.atol, c.rtol) if c.elem != "bytes" else (-1.0, -1.0)
            if any(c.length >= gpu_min_bytes for c in jobs):
                load_compare_kernels()
            reps = ffi.new("mn_cmp_report[]", len(jobs))
            eq = ffi.new("int[]", len(jobs))
            check(native.mnc_verify(self._live(), _module_handle(module), arr, len(jobs), gpu_min_bytes, reps, eq))
            for i, c in enumerate(jobs):
                report.results.append(BufferResult.of(eq[i], reps[i], c.offset, check=c))
                report.bytes_compared += c.length
        report.equal = not report.differences and all(r.equal for r in report.results)
        return report

    @staticmethod
    def _module_variables(module: Any, expected: Snapshot) -> set:
        """Names of the expected variables that `module` holds with the prologue's values."""
        if module is None or not module.variables_loaded:
            return set()
        source = getattr(module._variables_from, "snapshot", module._variables_from)
        loaded = {v.name for v in source.variables} - set(module.skipped_variables)
        return {v.name for v in expected.variables if v.name in loaded}


# ---- raw device memory (tests, tools) ----

class DeviceAllocation(_Native):
    """Plain device memory (cuMemAlloc) outside the arena."""

    def __init__(self, size: int) -> None:
        get_device()
        ffi, native = lib()
        addr = ffi.new("uint64_t *")
        check(native.mnc_mem_alloc(int(size), addr))
        self.addr, self.size = int(addr[0]), int(size)
        super().__init__(self.addr, native.mnc_mem_free)


def write(addr: int, data: Any) -> None:
    """Copies host bytes to device address `addr` (through pinned staging) and waits."""
    ptr, n = _bytes_arg(data)
    if n:
        check(lib()[1].mnc_memcpy_htod(int(addr), ptr, n))


def read(addr: int, n: int) -> bytes:
    ffi, native = lib()
    buf = ffi.new("uint8_t[]", max(1, int(n)))
    if n:
        check(native.mnc_memcpy_dtoh(buf, int(addr), int(n)))
    return bytes(ffi.buffer(buf, int(n)))


def fill(addr: int, value: int, n: int) -> None:
    check(lib()[1].mnc_memset(int(addr), int(value) & 0xFF, int(n)))


def compare_on_device(expected: int, actual: int, n: int, elem: str = "bytes", norm: str = "element",
                      atol: float = -1.0, rtol: float = -1.0) -> BufferResult:
    """Runs the GPU compare kernels on two device ranges (the semantics of mn_compare_ex)."""
    ffi, native = lib()
    load_compare_kernels()
    rep, eq = ffi.new("mn_cmp_report *"), ffi.new("int *")
    check(native.mnc_compare_device(int(expected), int(actual), int(n), elem_code(elem), NORMS[norm],
                                    float(atol), float(rtol), rep, eq))
    c = BufferCheck("blob", int(actual), int(actual), 0, int(n), elem, norm, atol, rtol)
    return BufferResult.of(eq[0], rep, check=c)
