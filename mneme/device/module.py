"""Loaded device code: DeviceModule (a cubin on the GPU, its recorded variables) and DeviceFunction
(launch, the timed loop, resources, occupancy).

A function is only as alive as its module: unloading the module invalidates every DeviceFunction
taken from it, so no launch can reach freed driver handles.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from mneme.config import dim3
from mneme.device.driver import Device, get_device
from mneme.device.errors import check, lib
from mneme.errors import DeviceError, MnemeError
from mneme.snapshot import pack_args

Dims = Union[dim3, Sequence[int], int]


def _dims(d: Dims, what: str) -> Any:
    ffi, _ = lib()
    if isinstance(d, int):
        xyz = (d, 1, 1)
    else:
        xyz = tuple(int(v) for v in d)
        xyz = xyz + (1,) * (3 - len(xyz))
    if len(xyz) != 3 or any(v < 1 or v > 0xFFFFFFFF for v in xyz):
        raise DeviceError(f"{what} {xyz} must be three positive dimensions")
    return ffi.new("uint32_t[3]", list(xyz))


class KernelArgs:
    """A kernel's parameter buffer and the pointer array cuLaunchKernel takes.

    `raw` holds every parameter at its offset (as recorded, or as `pack_args` lays them out); the
    pointers aim into one C copy of it that lives as long as this object."""

    def __init__(self, raw: bytes, offsets: Sequence[int], sizes: Sequence[int]) -> None:
        ffi, native = lib()
        if len(offsets) != len(sizes):
            raise DeviceError(f"{len(offsets)} parameter offsets but {len(sizes)} sizes")
        self.raw = bytes(raw)
        self.offsets, self.sizes = tuple(offsets), tuple(sizes)
        self._buf = ffi.new("uint8_t[]", max(1, len(self.raw)))
        ffi.memmove(self._buf, self.raw, len(self.raw))
        self.params = ffi.new("void *[]", max(1, len(self.offsets)))
        offs = ffi.new("uint32_t[]", list(self.offsets) or [0])
        szs = ffi.new("uint32_t[]", list(self.sizes) or [0])
        check(native.mnc_args_pointers(self._buf, len(self.raw), offs, szs, len(self.offsets), self.params))

    @classmethod
    def from_values(cls, params: Sequence[Any]) -> "KernelArgs":
        """One bytes-like value per parameter (struct.pack('<Q', ptr), numpy scalars, ...)."""
        return cls(*pack_args(params))

    @classmethod
    def of(cls, args: Any) -> "KernelArgs":
        """KernelArgs from what callers have: KernelArgs, a snapshot's Args, values, or None."""
        if isinstance(args, KernelArgs):
            return args
        if args is None:
            return cls(b"", (), ())
        if hasattr(args, "raw") and hasattr(args, "offsets"):
            return cls(bytes(args.raw), args.offsets, args.sizes)
        return cls.from_values(list(args))

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True)
class FunctionAttributes:
    """What the driver reports for a loaded kernel (bytes are per thread for local memory)."""

    num_regs: int
    local_bytes: int
    const_bytes: int
    static_shared_bytes: int
    max_threads_per_block: int
    ptx_version: int
    binary_version: int
    max_dynamic_shared_bytes: int


class DeviceModule:
    """A cubin (or PTX) image loaded on the open device; a context manager that unloads on exit."""

    def __init__(self, handle: Any, device: Device) -> None:
        self._h = handle
        self.device = device
        self._functions: "weakref.WeakSet[DeviceFunction]" = weakref.WeakSet()
        self._by_name: Dict[str, DeviceFunction] = {}
        self.variables_loaded = False
        self.skipped_variables: List[str] = []
        self._variables_from: Any = None
        self._finalizer = weakref.finalize(self, lib()[1].mnc_module_unload, handle)

    @classmethod
    def from_cubin(cls, image: bytes, device: Optional[Device] = None) -> "DeviceModule":
        """Loads a cubin; PTX text works too (the driver JITs it). Driver JIT errors land in the message."""
        device = device or get_device()
        ffi, native = lib()
        data = ffi.from_buffer(bytes(image))
        out = ffi.new("mnc_module **")
        check(native.mnc_module_load(data, len(data), out))
        return cls(out[0], device)

    def _handle(self) -> Any:
        if self._h is None:
            raise DeviceError("the device module was unloaded")
        return self._h

    @property
    def loaded(self) -> bool:
        return self._h is not None

    def get_function(self, name: str) -> "DeviceFunction":
        if name not in self._by_name:
            ffi, native = lib()
            out = ffi.new("mnc_function **")
            check(native.mnc_module_function(self._handle(), name.encode(), out))
            fn = DeviceFunction(out[0], self, name)
            self._functions.add(fn)
            self._by_name[name] = fn
        return self._by_name[name]

    def load_variables(self, prologue: Any) -> List[str]:
        """Writes the prologue's __device__/__constant__ variables into this module, relocating the
        words that hold other variables' addresses, and keeps a device copy for resets. Returns the
        variables the module lacks (optimized away), which are skipped. The snapshot must stay open
        while the module lives (reset_all rewrites the variables from it)."""
        from mneme.device.memory import _snapshot_ptr

        ffi, native = lib()
        ptr = _snapshot_ptr(prologue)
        n = ffi.new("uint32_t *")
        check(native.mnc_module_load_vars(self._handle(), ptr, n))
        self.skipped_variables = [ffi.string(native.mnc_module_skipped(self._h, i)).decode() for i in range(n[0])]
        self.variables_loaded = True
        self._variables_from = prologue
        return list(self.skipped_variables)

    def set_code_map(self, pairs: Dict[int, int]) -> None:
        """App addresses of device functions -> this module's (mneme.replay.codemap): every write of the recorded
        variables, and the expected values they are compared with, hold this module's. Before load_variables."""
        ffi, native = lib()
        items = sorted(pairs.items())
        src = ffi.new("uint64_t[]", [a for a, _ in items] or [0])
        dst = ffi.new("uint64_t[]", [b for _, b in items] or [0])
        check(native.mnc_module_set_code_map(self._handle(), len(items), src, dst))

    def read_global(self, name: str) -> Optional[bytes]:
        """A variable's current bytes in this module (None when the module lacks it)."""
        from mneme.device.memory import read

        try:
            addr, size = self.global_address(name)
        except MnemeError:
            return None
        return read(addr, size)

    def global_address(self, name: str) -> Tuple[int, int]:
        """(device address, size) of a variable of this module."""
        ffi, native = lib()
        addr, size = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        check(native.mnc_module_global(self._handle(), name.encode(), addr, size))
        return int(addr[0]), int(size[0])

    def unload(self) -> None:
        if self._h is None:
            return
        for fn in list(self._functions):
            fn.invalidate()
        self._functions.clear()
        self._by_name.clear()
        h, self._h = self._h, None
        self._finalizer.detach()
        check(lib()[1].mnc_module_unload(h))

    close = unload

    def __enter__(self) -> "DeviceModule":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unload()


class DeviceFunction:
    """One kernel of a DeviceModule; invalid once the module is unloaded."""

    def __init__(self, handle: Any, module: DeviceModule, name: str) -> None:
        self._h = handle
        self._module_ref = weakref.ref(module)
        self.name = name
        self._attrs: Optional[FunctionAttributes] = None

    def invalidate(self) -> None:
        self._h = None

    @property
    def valid(self) -> bool:
        m = self._module_ref()
        return self._h is not None and m is not None and m.loaded

    @property
    def module(self) -> DeviceModule:
        m = self._module_ref()
        if m is None or not self.valid:
            raise DeviceError(f"kernel {self.name}: its module was unloaded")
        return m

    def _handle(self) -> Any:
        self.module  # raises when invalid
        return self._h

    # -- resources
    def attributes(self) -> FunctionAttributes:
        if self._attrs is None:
            ffi, native = lib()
            a = ffi.new("mnc_func_attrs *")
            check(native.mnc_function_attrs(self._handle(), a))
            self._attrs = FunctionAttributes(a.num_regs, a.local_bytes, a.const_bytes, a.static_shared_bytes,
                                             a.max_threads_per_block, a.ptx_version, a.binary_version,
                                             a.max_dynamic_shared_bytes)
        return self._attrs

    @property
    def reg_usage(self) -> int:
        return self.attributes().num_regs

    @property
    def local_mem(self) -> int:
        return self.attributes().local_bytes

    @property
    def const_mem(self) -> int:
        return self.attributes().const_bytes

    @property
    def shared_mem(self) -> int:
        return self.attributes().static_shared_bytes

    def active_blocks(self, block: Dims, shared_mem: int = 0) -> int:
        """Blocks of this shape resident per SM (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
        ffi, native = lib()
        b = _dims(block, "block")
        out = ffi.new("int *")
        check(native.mnc_function_occupancy(self._handle(), b[0] * b[1] * b[2], int(shared_mem), out))
        return int(out[0])

    def occupancy(self, block: Dims, shared_mem: int = 0) -> float:
        """Active warps per SM over the SM's maximum, for this block shape and dynamic shared memory."""
        b = _dims(block, "block")
        info = self.module.device.info
        warps = -(-(b[0] * b[1] * b[2]) // info.warp_size)
        return self.active_blocks(block, shared_mem) * warps / info.max_warps_per_sm

    @property
    def params(self) -> Optional[List[Tuple[int, int]]]:
        """(offset, size) of each parameter as the driver lays them out; None where the driver is older
        than CUDA 12.4 and cannot tell."""
        if not hasattr(self, "_params"):
            ffi, native = lib()
            count = ffi.new("int *")
            check(native.mnc_function_params(self._handle(), count, ffi.NULL, ffi.NULL, 0))
            if count[0] < 0:
                self._params = None
            else:
                offs, sizes = ffi.new("uint32_t[]", max(1, count[0])), ffi.new("uint32_t[]", max(1, count[0]))
                check(native.mnc_function_params(self._h, count, offs, sizes, count[0]))
                self._params = [(int(offs[i]), int(sizes[i])) for i in range(count[0])]
        return self._params

    def _args(self, args: Any) -> Tuple[KernelArgs, Any, int]:
        """The arguments, their pointer array and count, checked against the kernel's own layout. The
        caller holds the KernelArgs until the launch returns: the pointers aim into its memory."""
        a = KernelArgs.of(args)
        expected = self.params
        if expected is not None:
            if len(a) != len(expected):
                raise DeviceError(f"kernel {self.name} takes {len(expected)} parameter(s), {len(a)} given")
            for i, ((_, want), got) in enumerate(zip(expected, a.sizes)):
                if want != got:
                    raise DeviceError(f"kernel {self.name}: parameter {i} has {want} bytes, the argument {got}")
        ffi, _ = lib()
        return a, (a.params if len(a) else ffi.NULL), len(a)

    # -- running
    def set_cooperative(self, cooperative: bool = True) -> None:
        """Launch through cuLaunchCooperativeKernel (kernels that synchronize the whole grid)."""
        check(lib()[1].mnc_function_set_cooperative(self._handle(), int(bool(cooperative))))

    def launch(self, grid: Dims, block: Dims, shared_mem: int = 0, args: Any = None) -> None:
        """Launches once and waits (the watchdog bounds the wait)."""
        keep, params, n = self._args(args)
        check(lib()[1].mnc_launch(self._handle(), _dims(grid, "grid"), _dims(block, "block"), int(shared_mem),
                                  params, n))
        del keep

    def profile(self, grid: Dims, block: Dims, shared_mem: int = 0, args: Any = None, iterations: int = 10,
                warmup: int = 2, l2_flush: bool = False, state: Any = None) -> List[int]:
        """Runs warmup + iterations times; before each run restores what `state` planned to reset
        (ReplayState.plan_resets) and optionally flushes L2. Returns each timed run's nanoseconds."""
        from mneme.device.memory import load_compare_kernels

        ffi, native = lib()
        keep, params, n = self._args(args)
        load_compare_kernels()  # the hold kernel keeps launch latency out of the timings
        ns = ffi.new("uint64_t[]", max(1, int(iterations)))
        st = state._live() if state is not None else ffi.NULL
        check(native.mnc_profile(self._handle(), st, _dims(grid, "grid"), _dims(block, "block"), int(shared_mem),
                                 params, n, int(warmup), int(iterations), int(bool(l2_flush)), ns))
        del keep
        return [int(ns[i]) for i in range(int(iterations))]

    def __repr__(self) -> str:
        return f"DeviceFunction({self.name!r}{'' if self.valid else ', unloaded'})"
