"""The Python face of the replay GPU core (native/core, in mneme._native).

Device and context, memory at the recorded addresses, the loaded prologue with its resets and
verification, modules, kernels, launches and the timed loop. Importing this package needs no driver;
the first call that does raises DeviceError("no NVIDIA driver ...") where none is installed.
"""

from mneme.device.driver import (
    Device,
    DeviceInfo,
    device_info,
    get_device,
    get_device_arch,
    get_device_count,
    set_device,
)
from mneme.device.errors import AddressNotGranted, CudaError, DeviceTimeout
from mneme.device.memory import (
    GPU_COMPARE_MIN_BYTES,
    Arena,
    BufferCheck,
    BufferResult,
    DeviceAllocation,
    HostRegion,
    ReplayState,
    VerifyReport,
    arena_granularity,
    compare_on_device,
    exact_plan,
    host_regions,
    load_compare_kernels,
    managed_spans,
    read,
    write,
    fill,
)
from mneme.device.module import DeviceFunction, DeviceModule, FunctionAttributes, KernelArgs

__all__ = [
    "AddressNotGranted", "Arena", "BufferCheck", "BufferResult", "CudaError", "Device", "DeviceAllocation",
    "DeviceFunction", "DeviceInfo", "DeviceModule", "DeviceTimeout", "FunctionAttributes", "GPU_COMPARE_MIN_BYTES",
    "HostRegion", "KernelArgs", "ReplayState", "VerifyReport", "arena_granularity", "compare_on_device", "device_info", "exact_plan",
    "fill", "get_device", "get_device_arch", "get_device_count", "host_regions", "load_compare_kernels", "managed_spans", "read",
    "set_device", "write",
]
