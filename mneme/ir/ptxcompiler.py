"""ptxas in-process: NVIDIA's PTX compiler library (nvPTXCompiler), the compiler inside ptxas, through ctypes.

A ptxas process costs about 10 ms of start-up and teardown on top of its compile (a trivial kernel: 17 ms as a
process, 7 ms in-process on the dev machine), a third of a small kernel's whole compile. The library takes
ptxas's own options and gives the same machine code (mneme.ir.codegen.binary_digest; only the cubin's
.nv.note.tkinfo, the tool's command line, differs), so it replaces the process where it is the same version.

It is used when native/ptxcompiler/build_ptxcompiler.py built mneme/lib/libmneme_ptxc.so, its recorded version
equals the ptxas that mneme.ir.ptxas.find_ptxas() picks, and MNEME_PTXAS_INPROCESS is not 0. Relocatable code
(`-c`, then nvlink) and split compilation still run the processes.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
from pathlib import Path
from typing import Optional, Sequence, Tuple

from mneme.errors import CompileError

LIB_DIR = Path(__file__).resolve().parent.parent / "lib"
LIB = LIB_DIR / "libmneme_ptxc.so"
META = LIB_DIR / "libmneme_ptxc.json"
ENV = "MNEME_PTXAS_INPROCESS"
#: the library starts a log's continuation lines with "ptxas         . "; the ptxas executable with four spaces
_CONTINUATION = re.compile(r"^ptxas {9}\. ", re.M)


def enabled() -> bool:
    """MNEME_PTXAS_INPROCESS=0 sends every compile to the ptxas process."""
    return os.environ.get(ENV, "1").strip() not in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=None)
def library_version() -> Optional[str]:
    """The PTX compiler version the library was built from (libmneme_ptxc.json), None when there is no library."""
    if not LIB.is_file():
        return None
    try:
        return str(json.loads(META.read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@functools.lru_cache(maxsize=None)
def _load(version_wanted: str) -> Optional[ctypes.CDLL]:
    if library_version() != version_wanted:
        return None
    try:
        lib = ctypes.CDLL(str(LIB))
    except OSError:
        return None
    sz = ctypes.POINTER(ctypes.c_size_t)
    for name, args in (("nvPTXCompilerCreate", [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_char_p]),
                       ("nvPTXCompilerDestroy", [ctypes.POINTER(ctypes.c_void_p)]),
                       ("nvPTXCompilerCompile", [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]),
                       ("nvPTXCompilerGetCompiledProgramSize", [ctypes.c_void_p, sz]),
                       ("nvPTXCompilerGetCompiledProgram", [ctypes.c_void_p, ctypes.c_void_p]),
                       ("nvPTXCompilerGetErrorLogSize", [ctypes.c_void_p, sz]),
                       ("nvPTXCompilerGetErrorLog", [ctypes.c_void_p, ctypes.c_char_p]),
                       ("nvPTXCompilerGetInfoLogSize", [ctypes.c_void_p, sz]),
                       ("nvPTXCompilerGetInfoLog", [ctypes.c_void_p, ctypes.c_char_p])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


def library(ptxas_version: str) -> Optional[ctypes.CDLL]:
    """The loaded library when it may stand in for a ptxas of `ptxas_version` (see the module docstring)."""
    return _load(ptxas_version) if enabled() else None


class Rejected(Exception):
    """nvPTXCompilerCompile refused the PTX: `log` is what ptxas would have printed, `code` the result code."""

    def __init__(self, code: int, log: str):
        super().__init__(f"nvPTXCompilerCompile: {code}")
        self.code, self.log = code, log


def _log(lib: ctypes.CDLL, handle: ctypes.c_void_p, which: str) -> str:
    n = ctypes.c_size_t(0)
    if getattr(lib, f"nvPTXCompilerGet{which}LogSize")(handle, ctypes.byref(n)) != 0 or n.value == 0:
        return ""
    buf = ctypes.create_string_buffer(n.value + 1)
    if getattr(lib, f"nvPTXCompilerGet{which}Log")(handle, buf) != 0:
        return ""
    return buf.value.decode(errors="replace")


def compile_ptx(lib: ctypes.CDLL, ptx: str, options: Sequence[str]) -> Tuple[bytes, str]:
    """(cubin, info log) for `ptx` compiled with ptxas `options` (no file names: the PTX is passed in memory).
    Raises Rejected when the compiler refuses the PTX, CompileError when the library itself fails."""
    data = ptx.encode()
    handle = ctypes.c_void_p()
    rc = lib.nvPTXCompilerCreate(ctypes.byref(handle), len(data), data)
    if rc != 0:
        raise CompileError(f"the PTX compiler library could not take the PTX (nvPTXCompilerCreate: {rc})")
    try:
        argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        rc = lib.nvPTXCompilerCompile(handle, len(options), argv)
        if rc != 0:
            raise Rejected(rc, _log(lib, handle, "Error"))
        size = ctypes.c_size_t(0)
        if lib.nvPTXCompilerGetCompiledProgramSize(handle, ctypes.byref(size)) != 0:
            raise CompileError("the PTX compiler library gave no program size")
        buf = ctypes.create_string_buffer(size.value)
        if lib.nvPTXCompilerGetCompiledProgram(handle, buf) != 0:
            raise CompileError("the PTX compiler library gave no program")
        # what ptxas prints (stdout, then stderr): the info log, then warnings, which the library keeps as errors
        log = _log(lib, handle, "Info") + _log(lib, handle, "Error")
        return buf.raw, _CONTINUATION.sub("", log)
    finally:
        lib.nvPTXCompilerDestroy(ctypes.byref(handle))
