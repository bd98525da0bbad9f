"""Reading device LLVM modules and naming their kernels (no GPU needed)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import re
from pathlib import Path
from typing import List, Optional, Union

import llvmlite.binding as llvm

from mneme.errors import CompileError, RecordError

NVPTX_TRIPLE = "nvptx64-nvidia-cuda"

# LLVM >= 20 marks CUDA kernels with the ptx_kernel calling convention on the definition line.
_KERNEL_DEF = re.compile(r'^define\b[^@\n]*\bptx_kernel\b[^@\n]*@("(?:[^"\\]|\\.)*"|[-\w$.]+)\(', re.M)


@functools.lru_cache(maxsize=None)
def _init_targets() -> None:
    # llvm.initialize() is deprecated in llvmlite 0.50 and raises; the target registries still need this.
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


_PENDING_CONTEXTS: list = []
_collecting = False


def _gc_phase(phase: str, info: dict) -> None:
    global _collecting
    _collecting = phase == "start"
    if phase == "stop":
        while _PENDING_CONTEXTS:
            llvm.ffi.lib.LLVMPY_ContextDispose(_PENDING_CONTEXTS.pop())


gc.callbacks.append(_gc_phase)


class _PrivateContext(llvm.ContextRef):
    """A context that outlives its modules even when the garbage collector frees them together.

    Disposing an LLVM context deletes the modules still in it, and a ModuleRef disposed after that
    crashes the process. Reference counting frees a context only after its last module (every
    ModuleRef holds its context). The cycle collector, though, finalizes everything it frees in no
    particular order, so a context freed during a collection is disposed when the collection ends.
    """

    def _dispose(self):
        if _collecting:
            _PENDING_CONTEXTS.append(self._ptr)
        else:
            super()._dispose()


def new_context() -> llvm.ContextRef:
    """A private LLVM context.

    Every parse into the shared global context renames struct types that already exist there
    (`%struct.Params` becomes `%struct.Params.195`), so IR printed from it depends on what the process
    parsed before, and nothing parsed into it is ever freed. Each linked kernel and each specialized
    variant gets its own context instead (clones share their original's).
    """
    _init_targets()
    return _PrivateContext(llvm.ffi.lib.LLVMPY_ContextCreate())


def parse_module(
    src: Union[str, Path, bytes], name: str = "", context: Optional[llvm.ContextRef] = None
) -> llvm.ModuleRef:
    """Parse bitcode (bytes or a .bc path) or textual IR (a .ll path), naming the file on failure."""
    _init_targets()
    label = name or (str(src) if not isinstance(src, bytes) else "<bitcode>")
    try:
        if isinstance(src, bytes):
            data = src
        else:
            p = Path(src)
            if not p.exists():
                raise RecordError(f"IR module {p} does not exist")
            data = p.read_bytes()
        if data[:2] == b"BC" or data[:4] == b"\xde\xc0\x17\x0b":
            mod = llvm.parse_bitcode(data, context=context)
        else:
            mod = llvm.parse_assembly(data.decode(), context=context)
    except RuntimeError as e:
        raise RecordError(f"{label}: not a readable LLVM module ({e})") from None
    return mod


def module_kernels(mod: Union[llvm.ModuleRef, str]) -> List[str]:
    """Names of the kernels (ptx_kernel definitions) a module (or its text) defines, in module order."""
    text = mod if isinstance(mod, str) else str(mod)
    return [unquote_symbol(m) for m in _KERNEL_DEF.findall(text)]


_BARE_SYMBOL = re.compile(r"[-a-zA-Z$._][-a-zA-Z$._0-9]*\Z")
_SYMBOL_REF = re.compile(r'@("(?:[^"\\]|\\.)*"|[-a-zA-Z$._][-a-zA-Z$._0-9]*)')
_TOP_DEF = re.compile(r'^(?:(?P<fn>define\b)|(?P<other>declare\b|attributes\b|!|\$|%|source_filename\b|target\b)'
                      r'|@(?P<var>"(?:[^"\\]|\\.)*"|[-a-zA-Z$._][-a-zA-Z$._0-9]*)\s*=)', re.M)


def symbol_references(mod: Union[llvm.ModuleRef, str]) -> dict:
    """{symbol: symbols its definition names} for every function body and variable initializer of a
    module, read from its text in one pass — a kernel's reach is a walk over this graph, which costs
    nothing like pruning a copy of the module per kernel (213 kernels of a corpus program: 65 s)."""
    text = mod if isinstance(mod, str) else str(mod)
    refs: dict = {}
    starts = list(_TOP_DEF.finditer(text))
    for i, m in enumerate(starts):
        if m.group("other") is not None:
            continue
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        chunk = text[m.start():end]
        if m.group("var") is not None:  # a variable (or alias): its name, then its initializer
            name, body = unquote_symbol(m.group("var")), chunk[m.end() - m.start():]
        else:  # define <attrs> <type> @name(...) ... { body }
            head = _SYMBOL_REF.search(chunk)
            if head is None:
                continue
            name, body = unquote_symbol(head.group(1)), chunk[head.end():]
        refs[name] = {unquote_symbol(t) for t in _SYMBOL_REF.findall(body)} - {name}
    return refs


def reachable_symbols(refs: dict, root: str) -> set:
    """Every symbol `root` reaches through `refs` (symbol_references), root included."""
    seen, todo = {root}, [root]
    while todo:
        for nxt in refs.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def symbol_token(name: str) -> str:
    """How textual IR spells a name after its sigil: bare when it can be, quoted and escaped otherwise."""
    if _BARE_SYMBOL.match(name):
        return name
    out = []
    for b in name.encode():
        c = chr(b)
        out.append(c if 32 <= b < 127 and c not in '"\\' else f"\\{b:02X}")
    return '"' + "".join(out) + '"'


def unquote_symbol(token: str) -> str:
    """The name a (possibly quoted and escaped) textual IR symbol token stands for."""
    if not token.startswith('"'):
        return token
    raw = re.sub(rb"\\([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), token[1:-1].encode())
    return raw.decode(errors="surrogateescape")


def kernel_function(mod: llvm.ModuleRef, kernel_name: str) -> llvm.ValueRef:
    """The kernel's function definition, or a CompileError that lists the kernels the module defines."""
    try:
        fn = mod.get_function(kernel_name)
    except NameError:
        fn = None
    if fn is None or fn.is_declaration:
        raise CompileError(
            f"kernel {kernel_name!r} is not defined in this module; it defines {module_kernels(mod) or 'no kernels'}"
        )
    return fn


@functools.lru_cache(maxsize=None)
def _cxa_demangle():
    lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
    fn = lib.__cxa_demangle
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
    return fn


@functools.lru_cache(maxsize=4096)
def demangle(name: str) -> str:
    """The C++ name of an Itanium-mangled symbol (the name itself when it is not mangled)."""
    if not name.startswith("_Z"):
        return name
    status = ctypes.c_int()
    ptr = _cxa_demangle()(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not ptr:
        return name
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(ptr))
