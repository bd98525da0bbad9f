"""Static hash (which kernel code was recorded) and code hash (which variant of it is compiled).

The static hash is taken over a canonical print of the kernel's pruned closure, so it is the same
in every process and does not move when code the kernel cannot reach changes:
- pruning drops other kernels, their helpers and variables, and llvm.(compiler.)used;
- helper functions get external linkage for the print, so stripping keeps their (mangled) names;
- so does the kernel: replay's internalize makes a weak_odr kernel (a template instantiated with
  -fgpu-rdc) external, and the module it compiles must hash as the recorded closure did;
- debug info (with its module flags), local value names and struct type names are stripped (line shifts, `-g`, renamed
  locals and `%struct.T.195` suffixes from a shared LLVM context change no code);
- module identity (source_filename, llvm.ident) is dropped;
- definitions are printed kernel first, then by name, so the order in which a translation unit
  happened to first use a helper or intrinsic does not matter; re-parsing renumbers attribute
  groups, types and metadata in that order.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, List, Mapping, Optional, Union

import llvmlite.binding as llvm

from mneme.ir.codeaddr import closure_roots
from mneme.ir.link import prune
from mneme.ir.module import kernel_function, new_context, symbol_token
from mneme.ir.pipeline import Pipeline, parse_pipeline
from mneme.ir.specialize import Specialization
from mneme.ir.target import pass_builder, target_machine

_DROP = re.compile(r"^(?:;.*|source_filename = .*|!llvm\.ident = .*)$")
_DEFINE_NAME = re.compile(r'^define [^@]*@("(?:[^"\\]|\\.)*"|[-a-zA-Z$._0-9]+)\(')
_DECLARE_NAME = re.compile(r'^declare [^@]*@("(?:[^"\\]|\\.)*"|[-a-zA-Z$._0-9]+)\(')
_DEBUG_FLAG = re.compile(r'^(![0-9]+) = !\{i32 \d+, !"(?:Dwarf Version|Debug Info Version|CodeView)"')
_MODULE_FLAGS = re.compile(r"^!llvm\.module\.flags = !\{(.*)\}$")


def _drop_debug_flags(lines: List[str]) -> List[str]:
    debug = {m.group(1) for m in map(_DEBUG_FLAG.match, lines) if m}
    out = []
    for line in lines:
        m = _MODULE_FLAGS.match(line)
        if m:
            kept = [ref for ref in m.group(1).split(", ") if ref not in debug]
            line = f"!llvm.module.flags = !{{{', '.join(kept)}}}"
        out.append(line)
    return out


def _sorted_definitions(text: str, kernel_token: str) -> str:
    head: List[str] = []
    defines: List[tuple] = []
    declares: List[tuple] = []
    tail: List[str] = []
    lines = iter(text.splitlines())
    for line in lines:
        if _DROP.match(line) or not line.strip():
            continue
        m = _DEFINE_NAME.match(line)
        if m:
            block = [line]
            for body in lines:
                block.append(body)
                if body == "}":
                    break
            defines.append((m.group(1) != kernel_token, m.group(1), "\n".join(block)))
            continue
        m = _DECLARE_NAME.match(line)
        if m:
            declares.append((m.group(1), line))
        elif line.startswith(("attributes ", "!")):
            tail.append(line)
        else:
            head.append(line)
    body = [d[2] for d in sorted(defines)] + [d[1] for d in sorted(declares)]
    return "\n".join(head + body + _drop_debug_flags(tail)) + "\n"


def canonical_ir(mod: llvm.ModuleRef, kernel_name: str) -> str:
    """The kernel's closure printed canonically (what the static hash is taken over)."""
    kernel_function(mod, kernel_name)
    # a private copy, not a clone: stripping renames struct types, which belong to the context
    c = llvm.parse_bitcode(mod.as_bitcode(), context=new_context())
    c = prune(c, closure_roots(c, kernel_name))
    for fn in c.functions:
        if fn.is_declaration:
            continue
        if fn.name != kernel_name:
            fn.visibility = llvm.Visibility.default
        fn.linkage = llvm.Linkage.external
    pm = llvm.create_new_module_pass_manager()
    pm.add_strip_symbols_pass()
    pm.run(c, pass_builder(target_machine()))
    text = _sorted_definitions(str(c), symbol_token(kernel_name))
    return str(llvm.parse_assembly(text, context=new_context()))


def static_hash(mod: llvm.ModuleRef, kernel_name: str) -> str:
    """SHA-256 (hex) over the kernel name and the canonical IR of its closure."""
    h = hashlib.sha256(b"mneme-static-v1\0")
    h.update(kernel_name.encode() + b"\0")
    h.update(canonical_ir(mod, kernel_name).encode())
    return h.hexdigest()


def code_hash(
    static_hash: str,
    specializations: Union[Specialization, Mapping[str, Any], None],
    passes: Union[str, Pipeline],
    codegen_opt: int,
    codegen_method: str,
    arch: str,
    assembler: str = "ptxas",
    toolchain: str = "",
    knobs: Optional[Mapping[str, Any]] = None,
) -> str:
    """SHA-256 (hex) naming one compiled variant: equal hashes mean identical code. `static_hash` must be
    the hash of the IR being compiled (not a DB's word for it); the PTX assembler (whole-program ptxas or
    relocatable nvJitLink) and the toolchain's versions (`toolchain`: LLVM and assembler) are part of it."""
    spec = specializations.describe() if isinstance(specializations, Specialization) else dict(specializations or {})
    pipeline = passes if isinstance(passes, Pipeline) else parse_pipeline(passes)
    doc = {
        "v": 1,
        "static": static_hash,
        "spec": spec,
        "passes": pipeline.canonical,
        "codegen_opt": int(codegen_opt),
        "codegen_method": codegen_method,
        "arch": arch,
        "assembler": assembler,
    }
    if toolchain:
        doc["toolchain"] = toolchain
    if knobs:  # only set knobs (mneme.ir.knobs): hashes of code without them stay as they were
        doc["knobs"] = dict(knobs)
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
