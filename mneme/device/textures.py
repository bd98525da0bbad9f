"""Texture and surface objects in replay (native/core/textures.c): the prologue's CUDA arrays and
objects recreated with their recorded descriptors and contents."""

from __future__ import annotations

from typing import Any, Optional

from mneme.device.driver import Device, get_device
from mneme.device.errors import check, lib
from mneme.device.memory import _Native, _snapshot_ptr


class Textures(_Native):
    """The prologue's arrays (contents uploaded) and texture/surface objects, recreated on `device`.
    The prologue must stay open as long as this object."""

    def __init__(self, device: Optional[Device], prologue: Any) -> None:
        self.device = device or get_device()
        ffi, native = lib()
        out = ffi.new("mnc_textures **")
        check(native.mnc_textures_create(_snapshot_ptr(prologue), out))
        self._prologue = prologue
        super().__init__(out[0], native.mnc_textures_free)

    def handle(self, recorded: int) -> int:
        """The handle of the object recreated for the recorded handle."""
        ffi, native = lib()
        now = ffi.new("uint64_t *")
        check(native.mnc_textures_handle(self._handle(), int(recorded), now))
        return int(now[0])

    def reset(self) -> None:
        """Uploads every array's prologue contents again (after surface writes)."""
        check(lib()[1].mnc_textures_reset(self._handle()))

    def read(self, recorded_array: int, size: int) -> bytes:
        """The replayed contents of the array recorded as `recorded_array` (`size` bytes, every level)."""
        ffi, native = lib()
        buf = ffi.new("uint8_t[]", max(1, int(size)))
        check(native.mnc_textures_read(self._handle(), int(recorded_array), buf, int(size)))
        return bytes(ffi.buffer(buf, int(size)))
