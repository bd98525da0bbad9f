"""Code addresses in device variables: which words of a module's variables hold the address of a device function.

A device function's address is a property of the loaded module: the app's `twice` and the replay module's
`twice` live at different addresses. The app hands such addresses to its kernels through variables whose
initializers name functions (`__device__ fn_t d_table[] = {twice, plusOne};`, C++ vtables) — read back by the
host (`cudaMemcpyFromSymbol`) and passed as arguments, or loaded by the kernel. These *code tables* are what
replay relocates by: the recorded words at a table's function offsets are the app's addresses of those
functions, the same words of replay's freshly loaded module are its own (mneme.device.module.code_map).

`code_tables(mod)` reads the tables from each variable's initializer, typed by LLVM's data layout (llvmlite
does not expose initializers, so the printed initializer is walked in step with the variable's type).
`closure_roots(mod, kernel)` keeps a module's code tables in the pruned closure of a kernel that calls through
a pointer: without them the replay module would not even hold the functions the app's pointers name.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Set, Tuple

import llvmlite.binding as llvm

from mneme.ir.module import unquote_symbol

#: a call through a value rather than a named function (`call float %5(float %x)`)
INDIRECT_CALL = re.compile(r"\bcall\b[^\n]*?\s%([-\w.$]+)\(")
_LOCAL = (llvm.Linkage.internal, llvm.Linkage.private)
#: definitions the optimizer drops when nothing references them, roots or not
_DISCARDABLE = (llvm.Linkage.linkonce_any, llvm.Linkage.linkonce_odr, llvm.Linkage.available_externally)
_KIND = re.compile(r"\s=\s[^\n]*?\b(?:global|constant)\s")
_WORD = re.compile(r"[-\w.$+]+")
_SYMBOL = re.compile(r'@("(?:[^"\\]|\\.)*"|[-a-zA-Z$._][-a-zA-Z$._0-9]*)')
_CASTS = ("addrspacecast", "bitcast")

CodeWords = List[Tuple[int, str]]


class _Init:
    """A cursor over one printed initializer."""

    def __init__(self, text: str, td, functions: Set[str]) -> None:
        self.s, self.i, self.td, self.functions = text, 0, td, functions
        self.out: CodeWords = []

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t\n":
            self.i += 1

    def peek(self, lit: str) -> bool:
        self.ws()
        return self.s.startswith(lit, self.i)

    def eat(self, lit: str) -> None:
        if not self.peek(lit):
            raise ValueError(f"expected {lit!r} at {self.s[self.i:self.i + 40]!r}")
        self.i += len(lit)

    def word(self) -> str:
        self.ws()
        m = _WORD.match(self.s, self.i)
        if not m:
            raise ValueError(f"expected a word at {self.s[self.i:self.i + 40]!r}")
        self.i = m.end()
        return m.group(0)

    def balanced(self, open_: str, close: str) -> str:
        """Skips from an opening bracket to its match; returns what lay between."""
        self.eat(open_)
        start, depth = self.i, 1
        while depth:
            c = self.s[self.i]
            if c == '"':
                self.i = self.s.index('"', self.i + 1)
            elif c == open_:
                depth += 1
            elif c == close:
                depth -= 1
            self.i += 1
        return self.s[start:self.i - 1]

    def skip_type(self) -> None:
        self.ws()
        if self.peek("<{"):
            self.i += 1
            self.balanced("{", "}")
            self.eat(">")
        elif self.peek("{"):
            self.balanced("{", "}")
        elif self.peek("["):
            self.balanced("[", "]")
        elif self.peek("<"):
            self.balanced("<", ">")
        elif self.peek("%"):
            self.i += 1
            if self.peek('"'):
                self.i = self.s.index('"', self.i + 1) + 1
            else:
                self.word()
        else:
            w = self.word()
            if w == "ptr" and self.peek("addrspace("):
                self.word()
                self.balanced("(", ")")

    def value(self, ty, off: int) -> None:
        self.ws()
        if self.peek("<{") or (self.peek("{") and ty.is_struct):
            packed = self.peek("<{")
            self.eat("<{" if packed else "{")
            for k, elem in enumerate(ty.elements):
                if k:
                    self.eat(",")
                self.skip_type()
                self.value(elem, off + self.td.get_element_offset(ty, k))
            self.eat("}>" if packed else "}")
        elif self.peek("[") or (self.peek("<") and ty.is_vector):
            close = "]" if self.peek("[") else ">"
            self.eat("[" if close == "]" else "<")
            elem = next(iter(ty.elements))
            stride = self.td.get_abi_size(elem)
            for k in range(ty.element_count):
                if k:
                    self.eat(",")
                self.skip_type()
                self.value(elem, off + k * stride)
            self.eat(close)
        elif self.peek('c"'):
            self.i = self.s.index('"', self.i + 2) + 1
        elif self.peek("@"):
            m = _SYMBOL.match(self.s, self.i)
            self.i = m.end()
            self._named(unquote_symbol(m.group(1)), off)
        else:
            w = self.word()
            if self.peek("("):  # a constant expression: `addrspacecast (ptr @f to ptr addrspace(1))`
                inner = self.balanced("(", ")")
                m = _SYMBOL.search(inner)
                if w in _CASTS and m:
                    self._named(unquote_symbol(m.group(1)), off)

    def _named(self, name: str, off: int) -> None:
        if name in self.functions:
            self.out.append((off, name))


def code_words(gv, td, functions: Set[str]) -> CodeWords:
    """(byte offset, function name) of each word of a variable's initializer that holds a function's address;
    [] for a declaration or an initializer this reader cannot follow."""
    if gv.is_declaration:
        return []
    text = str(gv)
    m = _KIND.search(text)
    if not m or "@" not in text[m.end():]:
        return []
    cur = _Init(text[m.end():], td, functions)
    try:
        cur.skip_type()
        cur.value(gv.global_value_type, 0)
    except (ValueError, IndexError, StopIteration):
        return []
    return cur.out


def code_tables(mod: llvm.ModuleRef, kept: bool = False) -> Dict[str, CodeWords]:
    """The module's visible variables whose initializers hold device function addresses, with those words;
    `kept`: only those a pruned module keeps when nothing uses them (not linkonce: vtables of classes the
    kernel never constructs go)."""
    functions = {f.name for f in mod.functions}
    if not functions:
        return {}
    td = llvm.create_target_data(mod.data_layout)
    out: Dict[str, CodeWords] = {}
    for gv in mod.global_variables:
        if gv.name.startswith("llvm.") or gv.linkage in _LOCAL or (kept and gv.linkage in _DISCARDABLE):
            continue
        words = code_words(gv, td, functions)
        if words:
            out[gv.name] = words
    return out


def calls_through_pointers(mod: llvm.ModuleRef, names: Iterable[str]) -> bool:
    """Whether any defined function among `names` calls through a pointer."""
    want = set(names)
    return any(not f.is_declaration and f.name in want and INDIRECT_CALL.search(str(f)) for f in mod.functions)


def closure_roots(mod: llvm.ModuleRef, kernel: str, refs: Optional[dict] = None,
                  tables: Optional[Dict[str, CodeWords]] = None) -> List[str]:
    """What a kernel's pruned closure keeps: the kernel, and — when its code calls through a pointer — every code
    table of the module, so that the functions the app's pointers may name are in replay's module with tables
    that say where. The same answer from the app's module and from the recorded closure (the tables the
    closure kept are all of the module's it could need). `refs` and `tables` (code_tables(mod, kept=True)), when
    given, are the module's, read once for all its kernels."""
    tables = code_tables(mod, kept=True) if tables is None else tables
    if not tables:
        return [kernel]
    from mneme.ir.module import reachable_symbols, symbol_references

    reach = reachable_symbols(refs if refs is not None else symbol_references(mod), kernel)
    if not calls_through_pointers(mod, reach):
        return [kernel]
    return [kernel] + sorted(t for t in tables if t not in reach)
