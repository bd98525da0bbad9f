"""The errors of the GPU core, and the one place that turns a C status into them.

Every driver result reaches Python with the CUDA error's name; `sticky` says the CUDA context is
broken for good (an illegal address, a trap, a watchdog timeout), so the caller must replace the
process: the replay workers are disposable for exactly this reason.
"""

from __future__ import annotations

from typing import Any, Tuple

from mneme.errors import DeviceError

# enum mnc_status of native/core/core.cdef
NO_DRIVER, UNUSABLE, TIMEOUT, NOT_GRANTED = -1, -2, -3, -4


class CudaError(DeviceError):
    """A CUDA driver call failed: `name` (CUDA_ERROR_...), `code`, and whether the error is sticky."""

    def __init__(self, message: str, name: str, code: int, sticky: bool) -> None:
        super().__init__(message)
        self.name = name
        self.code = code
        self.sticky = sticky


class DeviceTimeout(CudaError):
    """The watchdog stopped waiting for a kernel or copy; the context is unusable from now on."""


class AddressNotGranted(DeviceError):
    """The recorded device or host address range is taken in this process (replay in a fresh one)."""


def lib() -> Tuple[Any, Any]:
    """(ffi, lib) of mneme._native with the replay core in it."""
    from mneme.snapshot import _native

    ffi, native = _native()
    if not hasattr(native, "mnc_device_open"):
        raise DeviceError("mneme._native was built without the replay core (native/core); rebuild it with "
                          "`python native/build_native.py`")
    return ffi, native


def status_name(status: int) -> str:
    ffi, native = lib()
    return ffi.string(native.mnc_status_name(status)).decode()


def check(status: int) -> None:
    """Raises the error that `status` (a C core return value) stands for; 0 passes."""
    if status == 0:
        return
    ffi, native = lib()
    message = ffi.string(native.mnc_error()).decode("utf-8", "replace")
    if status > 0:
        raise CudaError(message, status_name(status), status, bool(native.mnc_is_sticky(status)))
    if status == TIMEOUT:
        raise DeviceTimeout(message, status_name(status), status, True)
    if status == UNUSABLE:
        cause = int(native.mnc_unusable())
        raise (DeviceTimeout if cause == TIMEOUT else CudaError)(message, status_name(cause), cause, True)
    if status == NOT_GRANTED:
        raise AddressNotGranted(message)
    raise DeviceError(message)
