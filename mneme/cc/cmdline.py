"""Reading a gcc/clang-style compiler command line the way `mneme cc` needs it.

The wrapper must know which arguments are inputs (and in which language), where the output goes,
what the invocation does (compile, link, preprocess), which GPU architectures are asked for, and which
flags shape the device code (those are repeated for the device-bitcode compile). Everything else is
passed to clang untouched, in order.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

from mneme.errors import ConfigurationError

CUDA_EXTS = {".cu"}
CXX_EXTS = {".cc", ".cpp", ".cxx", ".c++", ".C", ".cp", ".CPP", ".ii", ".cppm"}
C_EXTS = {".c", ".i"}
ASM_EXTS = {".s", ".S", ".sx"}
_LANG_ALIASES = {"cu": "cuda", "cuda": "cuda", "c++": "c++", "c": "c", "none": ""}

#: flags whose value is the next argument when not joined
SEPARATE = {
    "-o", "-I", "-D", "-U", "-L", "-l", "-x", "-include", "-imacros", "-isystem", "-iquote", "-idirafter",
    "-isysroot", "-iprefix", "-iwithprefix", "-iwithprefixbefore", "-MF", "-MT", "-MQ", "-MJ", "-Xlinker",
    "-Xclang", "-Xarch_device", "-Xarch_host", "-Xcuda-ptxas", "-Xcuda-fatbinary", "-Xassembler",
    "-Xpreprocessor", "-Xoffload-linker", "-mllvm", "-target", "-u", "-z", "-T", "-arch", "--arch",
    "--gpu-architecture", "--param", "--sysroot", "-dependency-file", "-serialize-diagnostics",
    "--serialize-diagnostics",
}
ARCH_FLAGS = ("--cuda-gpu-arch", "--offload-arch", "-arch", "--arch", "--gpu-architecture")
DEP_FLAGS = {"-MD", "-MMD", "-MP", "-MG", "-MV", "-MF", "-MT", "-MQ", "-MJ"}
_STOP_MODES = ("-E", "-fsyntax-only", "-M", "-MM")

#: separate-value flags repeated in the device-bitcode compile (they shape preprocessing or device code)
IR_SEPARATE = {"-I", "-D", "-U", "-include", "-imacros", "-isystem", "-iquote", "-idirafter", "-isysroot", "--sysroot",
               "-Xarch_device", "-Xclang", "-mllvm"}
#: prefixes of single-token flags repeated in the device-bitcode compile
IR_PREFIXES = (
    "-I", "-D", "-U", "-std=", "-isystem", "-iquote", "-idirafter", "-nocudainc", "-nocudalib",
    "-nogpulib", "-nogpuinc", "-nostdinc", "-nostdlibinc", "-stdlib=", "--gcc-toolchain=", "--gcc-install-dir=",
    "--sysroot", "-fgpu-", "-fno-gpu-", "-fcuda-", "-fno-cuda-", "-ffast-math", "-fno-fast-math", "-ffp-",
    "-fno-fp-", "-fdenormal-fp-math", "-funsafe-math", "-fno-unsafe-math", "-ffinite-math", "-fno-finite-math",
    "-fhonor-", "-fno-honor-", "-fassociative-math", "-fno-associative-math", "-freciprocal-math",
    "-fno-reciprocal-math", "-fsigned-zeros", "-fno-signed-zeros", "-ftrapping-math", "-fno-trapping-math",
    "-fapprox-func", "-fno-approx-func", "-fmath-errno", "-fno-math-errno", "-fcomplex-arithmetic=",
    "-ftrivial-auto-var-init", "-fbuiltin", "-fno-builtin", "-fsigned-char", "-funsigned-char", "-fchar8_t",
    "-fno-char8_t", "-fms-extensions", "-fno-ms-extensions", "-fdeclspec", "-fgnu-keywords",
    "-fno-gnu-keywords", "-fpermissive", "-fno-permissive", "-fwrapv", "-fno-wrapv", "-fstrict-aliasing",
    "-fno-strict-aliasing", "-ffp-contract=", "-fcuda-flush-denormals-to-zero", "-fopenmp-simd", "-cuid=",
    "-fuse-cuid=",
)


@dataclass
class Source:
    path: str
    lang: str  #: "cuda", "c++", "c", "asm" or "" (let clang decide)


@dataclass
class Invocation:
    """A parsed command line. `items` keeps every argument group in order; an input group holds a
    single path and is replaced by an object when linking."""

    items: List[Tuple[str, List[str]]] = field(default_factory=list)  # (kind, args): kind in input/flag/ir/dep
    sources: List[Source] = field(default_factory=list)
    output: Optional[str] = None
    archs: List[str] = field(default_factory=list)
    cuda_path: Optional[str] = None
    verbose: bool = False
    mode: str = "link"  #: info | preprocess | asm | compile | link | relocatable

    @property
    def is_rdc(self) -> bool:
        return any(a == "-fgpu-rdc" for k, g in self.items for a in g) and not any(
            a == "-fno-gpu-rdc" for k, g in self.items for a in g
        )

    @property
    def wants_deps(self) -> bool:
        return any(g[0] in ("-MD", "-MMD") for k, g in self.items if k == "dep")

    def flags(self, kinds=("flag", "ir", "dep")) -> List[str]:
        return [a for k, g in self.items if k in kinds for a in g]

    def ir_flags(self) -> List[str]:
        return self.flags(("ir",))

    def has(self, flag: str) -> bool:
        return any(a == flag for k, g in self.items if k != "input" for a in g)


def expand_response_files(argv: List[str], depth: int = 0) -> List[str]:
    """Splice `@file` arguments (CMake uses them for long command lines)."""
    out: List[str] = []
    for a in argv:
        if a.startswith("@") and len(a) > 1 and depth < 8 and os.path.isfile(a[1:]):
            with open(a[1:], encoding="utf-8") as fh:
                out += expand_response_files(shlex.split(fh.read()), depth + 1)
        else:
            out.append(a)
    return out


def _lang_of(path: str, forced: str) -> str:
    if forced:
        return forced
    ext = os.path.splitext(path)[1]
    if ext in CUDA_EXTS:
        return "cuda"
    if ext in CXX_EXTS:
        return "c++"
    if ext in C_EXTS:
        return "c"
    if ext in ASM_EXTS:
        return "asm"
    return ""


def _normalize_arch(value: str, written: str) -> List[str]:
    archs = []
    for a in value.split(","):
        a = a.strip()
        if a.startswith("compute_"):
            a = "sm_" + a[len("compute_") :]
        if not a.startswith(("sm_", "gfx")) or a == "sm_":
            raise ConfigurationError(f"{written}: {a!r} is not a GPU architecture (expected sm_NN, e.g. sm_90)")
        archs.append(a)
    return archs


def parse(argv: List[str]) -> Invocation:
    """Classify `argv` (the arguments after `mneme cc`)."""
    inv = Invocation()
    args = expand_response_files(list(argv))
    forced = ""
    i = 0
    while i < len(args):
        a = args[i]
        nxt = args[i + 1] if i + 1 < len(args) else None

        def take() -> List[str]:
            if nxt is None:
                raise ConfigurationError(f"argument to {a!r} is missing")
            return [a, nxt]

        if a == "-" or not a.startswith("-") or a == "":
            lang = _lang_of(a, forced)
            if a != "-" and lang in ("cuda", "c++", "c", "asm"):
                inv.sources.append(Source(a, lang))
                inv.items.append(("input", [a]))
            else:
                inv.items.append(("object", [a]))
            i += 1
            continue
        arch_flag = next((f for f in ARCH_FLAGS if a == f or a.startswith(f + "=")), None)
        if arch_flag:
            if a == arch_flag:
                inv.archs += _normalize_arch(take()[1], f"{a} {nxt}")
                i += 2
            else:
                inv.archs += _normalize_arch(a.split("=", 1)[1], a)
                i += 1
            continue
        if a.startswith("-x"):
            value = take()[1] if a == "-x" else a[2:]
            forced = _LANG_ALIASES.get(value, value)
            i += 2 if a == "-x" else 1
            continue
        if a == "-o" or (a.startswith("-o") and not a.startswith(("-objc", "-object"))):
            inv.output = take()[1] if a == "-o" else a[2:]
            i += 2 if a == "-o" else 1
            continue
        if a.startswith("--cuda-path="):
            inv.cuda_path = a.split("=", 1)[1]
            i += 1
            continue
        if a == "-v":
            inv.verbose = True
        group = take() if a in SEPARATE else [a]
        head = group[0]
        if head in DEP_FLAGS:
            kind = "dep"
        elif head in IR_SEPARATE or (len(group) == 1 and head.startswith(IR_PREFIXES)):
            kind = "ir"
        else:
            kind = "flag"
        inv.items.append((kind, group))
        i += len(group)

    inv.mode = _mode(inv)
    if inv.mode == "compile" and inv.output and len(inv.sources) > 1:
        raise ConfigurationError(f"-o {inv.output} with -c and {len(inv.sources)} sources: compile them one at a time")
    return inv


def _mode(inv: Invocation) -> str:
    if not inv.sources and not any(k == "object" for k, _ in inv.items):
        return "info"
    flags = set(inv.flags())
    if flags & {"-E", "-fsyntax-only"} or (flags & {"-M", "-MM"} and not flags & {"-MD", "-MMD"}):
        return "preprocess"
    if flags & {"-S", "-emit-llvm", "--cuda-device-only", "--cuda-host-only", "--offload-device-only",
                "--offload-host-only"}:
        return "asm"
    if "-c" in flags:
        return "compile"
    if "-r" in flags:
        return "relocatable"
    return "link"


def default_object(source: str) -> str:
    """Where clang puts the object of `source` under -c without -o: the current directory."""
    return Path(source).with_suffix(".o").name
