"""Which code runs under the replayed kernel's launch dimensions: the scope of the dims specialization.

A kernel that launches kernels from device code (dynamic parallelism) shares its module with them, and each
child grid runs with the grid and block its launch gave it, not the parent's. Writing the parent's dimensions
into every `llvm.nvvm.read.ptx.sreg.*` read of the module made the children compute with the parent's
blockDim (and threadIdx ranges the parent's block bounds: poison for the children's other threads).

So the dimensions go only into the functions the kernel reaches (calls, and through variables' initializers)
without going through another kernel, and that no other kernel reaches. A function both reach (clang's
`__cuda_builtin_*::__fetch_builtin_*` wrappers of blockDim/threadIdx, a shared `__device__` helper) that
reads the special registers, itself or through what it calls, is copied for the kernel (`<name>.mneme.dims`,
internal, without debug info) and the kernel's own code calls the copy; the original stays as it was for the
others. While the module has other kernels, a function whose address is taken counts as shared (a child may
call it through a pointer), and its address keeps naming the original. A kernel that launches itself (reached
from the kernels it launches, or naming itself) runs under dimensions nobody knows: nothing is rewritten.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, Set, Tuple

from mneme.ir.module import module_kernels, reachable_symbols, symbol_references, symbol_token, unquote_symbol

_NAME = r'(?:"(?:[^"\\]|\\.)*"|[-a-zA-Z$._][-a-zA-Z$._0-9]*)'
_DEFINE = re.compile(r"^define [^@\n]*@(" + _NAME + r")\(", re.M)
_REF = re.compile(r"@(" + _NAME + r")")
#: a direct call's callee: the first symbol after `call` on the line, followed by its argument list
_CALLEE = re.compile(r"\bcall\b[^@\n]*@(" + _NAME + r")\(")
_SREG_READ = re.compile(r"@llvm\.nvvm\.read\.ptx\.sreg\.(?:tid|ntid|ctaid|nctaid)\.[xyz]\(")
_LINKAGE_WORDS = re.compile(
    r" (?:private|internal|available_externally|linkonce|linkonce_odr|weak|weak_odr|common|appending|extern_weak"
    r"|external|dso_local|dso_preemptable|hidden|protected|default|dllimport|dllexport)\b"
)
_COMDAT = re.compile(r" comdat(?:\(\$" + _NAME + r"\))?")
_DBG_ATTACHMENT = re.compile(r",? !dbg ![0-9]+")
_DBG_RECORD = re.compile(r"^[ \t]*#dbg_\w+\(.*\n", re.M)
CLONE_SUFFIX = ".mneme.dims"


def _definitions(text: str) -> Dict[str, Tuple[int, int]]:
    """{function: (start of its define line, end of its closing brace)}."""
    out = {}
    for m in _DEFINE.finditer(text):
        out[unquote_symbol(m.group(1))] = (m.start(), text.index("\n}\n", m.end()) + 2)
    return out


def _reach(refs: dict, root: str, stop: Set[str]) -> Set[str]:
    """What `root` reaches through `refs` without entering the symbols in `stop` (other kernels: a reference
    to one is a launch, whose code runs under its own dimensions)."""
    seen, todo = {root}, [root]
    while todo:
        for nxt in refs.get(todo.pop(), ()):
            if nxt not in seen and nxt not in stop:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _names_itself(body: str, name: str) -> bool:
    return re.search(re.escape("@" + symbol_token(name)) + r"(?![-a-zA-Z$._0-9])", body) is not None


def _address_taken(text: str, spans: Dict[str, Tuple[int, int]], refs: dict) -> Set[str]:
    """Symbols named anywhere but as a direct call's callee (function bodies and variable initializers)."""
    taken: Set[str] = set()
    for start, end in spans.values():
        body = text[text.index("\n", start):end]
        taken |= {unquote_symbol(t) for t in _REF.findall(_CALLEE.sub("", body))}
    for name, named in refs.items():
        if name not in spans:  # a variable: its initializer
            taken |= named
    return taken


def _clone(definition: str, token: str) -> str:
    """The definition renamed to `token`, internal, outside any comdat and without debug info."""
    line_end = definition.index("\n")
    head, body = definition[:line_end], definition[line_end:]
    at = _DEFINE.match(head)
    before, after = head[len("define"):at.start(1) - 1], head[at.end(1):]
    head = "define internal" + _LINKAGE_WORDS.sub("", before) + "@" + token + _DBG_ATTACHMENT.sub("", _COMDAT.sub("", after))
    return head + _DBG_RECORD.sub("", _DBG_ATTACHMENT.sub("", body))


def rewrite_in_scope(text: str, kernel: str, rewrite: Callable[[str], str]) -> str:
    """`rewrite` applied to the bodies of the functions that run under `kernel`'s launch dimensions (see the
    module doc), with shared functions that read them copied for the kernel."""
    spans = _definitions(text)
    if kernel not in spans:
        return text
    refs = symbol_references(text)
    others = set(module_kernels(text)) - {kernel}
    ours = _reach(refs, kernel, others) & set(spans)
    theirs: Set[str] = set()
    for k in others:
        theirs |= reachable_symbols(refs, k)
    start, end = spans[kernel]
    if kernel in theirs or _names_itself(text[text.index("\n", start):end], kernel) or any(
        kernel in refs.get(f, ()) for f in ours
    ):
        return text
    taken = _address_taken(text, spans, refs) if others else set()
    shared: Set[str] = set()
    for f in ours - {kernel}:
        if f in theirs or f in taken:  # and what it reaches: the others run that too
            shared |= _reach(refs, f, others) & ours
    reads = {f for f in ours if _SREG_READ.search(text, *spans[f])}
    grew = True
    while grew:  # and what calls them
        more = {f for f in ours - reads if refs.get(f, set()) & reads}
        grew = bool(more)
        reads |= more
    clones: Dict[str, str] = {}
    for f in sorted(shared & reads):
        name = f + CLONE_SUFFIX
        while name in refs or name in spans:
            name += "_"
        clones[f] = name

    def redirect(body: str) -> str:
        def callee(m: re.Match) -> str:
            to = clones.get(unquote_symbol(m.group(1)))
            if to is None:
                return m.group(0)
            return m.group(0)[: m.start(1) - m.start(0)] + symbol_token(to) + "("
        return _CALLEE.sub(callee, body)

    out, pos = [], 0
    for f, (s, e) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        if f not in ours:
            continue
        out.append(text[pos:s])
        definition = text[s:e]
        if f not in shared:
            definition = rewrite(redirect(definition))
        elif f in clones:
            definition += "\n\n" + rewrite(redirect(_clone(definition, symbol_token(clones[f]))))
        out.append(definition)
        pos = e
    out.append(text[pos:])
    return "".join(out)
