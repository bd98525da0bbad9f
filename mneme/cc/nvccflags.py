"""Reading an nvcc command line (nvcc's own option syntax, as in NVIDIA's "NVCC command options").

nvcc options have a long name (`--gpu-architecture`) and most a short one (`-arch`); either may be
written with one or two dashes; a value follows as `=value`, as the next argument, or (for a few
short names: -I -D -U -L -l -O -o -x) joined. List-valued options split their value at commas
(`-Xcompiler -fPIC,-Wall`, `-I a,b`). `@file` and `--options-file` splice files of options.

`parse()` returns an `NvccCommand`: the phase (compile, link, device link, ...), the inputs in order,
and every option sorted by what it affects; mneme.cc.nvcc turns that into clang-22 command lines.
Unknown options are an error naming the option (unless -forward-unknown-to-host-compiler), so that
nothing is silently ignored or misread.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mneme.errors import ConfigurationError

PROG = "mneme nvcc"

#: long name -> short name; None: no short name
_OPTIONS: Dict[str, Optional[str]] = {
    # phases
    "compile": "c", "device-c": "dc", "device-w": "dw", "device-link": "dlink", "link": None, "lib": None,
    "ptx": None, "cubin": None, "fatbin": None, "preprocess": "E", "generate-dependencies": "M",
    "generate-nonsystem-dependencies": "MM", "generate-dependencies-with-compile": "MD",
    "generate-nonsystem-dependencies-with-compile": "MMD", "run": None, "optix-ir": None,
    "dlink-time-opt": "dlto",
    # files and paths
    "output-file": "o", "output-directory": "odir", "dependency-output": "MF", "dependency-target-name": "MT",
    "pre-include": "include", "library": "l", "define-macro": "D", "undefine-macro": "U", "include-path": "I",
    "system-include": "isystem", "library-path": "L", "compiler-bindir": "ccbin", "cudart": None,
    "cudadevrt": None, "options-file": "optf", "keep": None, "keep-dir": None, "save-temps": None,
    "dryrun": None, "verbose": "v", "version": "V", "x": None, "std": None, "machine": "m",
    "shared": None, "relocatable-device-code": "rdc", "compiler-options": "Xcompiler",
    "linker-options": "Xlinker", "ptxas-options": "Xptxas", "nvlink-options": "Xnvlink",
    "archive-options": "Xarchive", "Xcudafe": None, "gpu-architecture": "arch", "gpu-code": "code",
    "generate-code": "gencode", "use_fast_math": "use_fast_math", "ftz": None, "prec-div": None,
    "prec-sqrt": None, "fmad": None, "maxrregcount": None, "generate-line-info": "lineinfo",
    "device-debug": "G", "debug": "g", "optimize": "O", "dopt": None, "extended-lambda": None,
    "expt-extended-lambda": None, "expt-relaxed-constexpr": None, "default-stream": None, "threads": "t",
    "Werror": None, "disable-warnings": "w", "Wno-deprecated-gpu-targets": None,
    "Wno-deprecated-declarations": None, "Wreorder": None, "Wdefault-stream-launch": None,
    "Wmissing-launch-bounds": None, "Wext-lambda-captures-this": None, "diag-suppress": None,
    "diag-error": None, "diag-warn": None, "display-error-number": None, "no-display-error-number": None,
    "resource-usage": "res-usage", "forward-unknown-to-host-compiler": None,
    "forward-unknown-to-host-linker": None, "forward-unknown-opts": None, "list-gpu-arch": None,
    "list-gpu-code": None, "help": "h", "allow-unsupported-compiler": None, "keep-device-functions": None,
    "source-in-ptx": None, "restrict": None, "no-host-device-initializer-list": None,
    "no-host-device-move-forward": None, "extra-device-vectorization": None, "gpu-name": None,
    "deviceemu": None,
}
_SHORT = {s: l for l, s in _OPTIONS.items() if s}
#: options taking a value
_VALUED = {
    "output-file", "output-directory", "dependency-output", "dependency-target-name", "pre-include", "library",
    "define-macro", "undefine-macro", "include-path", "system-include", "library-path", "compiler-bindir",
    "cudart", "cudadevrt", "options-file", "keep-dir", "x", "std", "machine", "relocatable-device-code",
    "compiler-options", "linker-options", "ptxas-options", "nvlink-options", "archive-options", "Xcudafe",
    "gpu-architecture", "gpu-code", "generate-code", "ftz", "prec-div", "prec-sqrt", "fmad", "maxrregcount",
    "optimize", "dopt", "default-stream", "threads", "Werror", "diag-suppress", "diag-error", "diag-warn",
    "gpu-name",
}
#: valued options whose value is a comma-separated list (nvcc splits them)
_LISTS = {
    "pre-include", "library", "define-macro", "undefine-macro", "include-path", "system-include", "library-path",
    "compiler-options", "linker-options", "ptxas-options", "nvlink-options", "archive-options", "Xcudafe",
    "gpu-architecture", "gpu-code", "Werror", "diag-suppress", "diag-error", "diag-warn",
}
#: short options whose value may be joined (-I/usr/include, -DX=1, -O3, -lfoo)
_JOINED = {"I": "include-path", "D": "define-macro", "U": "undefine-macro", "L": "library-path", "l": "library",
           "O": "optimize", "o": "output-file", "x": "x", "m": "machine"}
_BOOL = {"true": True, "false": False}
#: options nvcc has that mneme cannot honour, with the reason
_REFUSED = {
    "run": "runs the program after building it; run it yourself",
    "optix-ir": "OptiX IR output needs NVIDIA's cicc",
    "deviceemu": "device emulation was removed from CUDA years ago; drop it",
    "gpu-name": "is an obsolete spelling: use -arch=sm_NN",
    "list-gpu-code": "ask NVIDIA's nvcc",
    "list-gpu-arch": "ask NVIDIA's nvcc",
}
PHASES = {"compile": "compile", "device-c": "dc", "device-w": "dw", "device-link": "dlink", "link": "link",
          "lib": "lib", "ptx": "ptx", "cubin": "cubin", "fatbin": "fatbin", "preprocess": "E",
          "generate-dependencies": "M", "generate-nonsystem-dependencies": "MM"}
CUDA_EXTS = {".cu"}
HOST_EXTS = {".c": "c", ".cc": "c++", ".cpp": "c++", ".cxx": "c++", ".C": "c++", ".c++": "c++", ".i": "c",
             ".ii": "c++"}
_LANGS = {"cu": "cuda", "c": "c", "c++": "c++", "cuda": "cuda", "none": ""}


@dataclass
class Input:
    path: str
    lang: str  #: cuda | c | c++ | obj (objects, archives, shared libraries: link inputs)


@dataclass
class NvccCommand:
    """An nvcc command line, sorted by what each option affects."""

    phase: str = "link"  #: compile dc dw dlink link lib ptx cubin fatbin E M MM version help
    inputs: List[Input] = field(default_factory=list)
    output: Optional[str] = None
    output_dir: Optional[str] = None
    arch_values: List[Tuple[str, str]] = field(default_factory=list)  #: ("arch"|"code"|"gencode", value)
    pp: List[str] = field(default_factory=list)  #: preprocessor flags, both sides, every language
    std: Optional[str] = None
    host: List[str] = field(default_factory=list)  #: host compiler flags (-Xcompiler, forwarded unknowns)
    link: List[str] = field(default_factory=list)  #: -L/-l/-Xlinker in order
    ptxas: List[str] = field(default_factory=list)
    nvlink: List[str] = field(default_factory=list)
    archive: List[str] = field(default_factory=list)
    deps: List[str] = field(default_factory=list)  #: -MD -MMD -MF f -MT t (clang spelling)
    opt: Optional[str] = None  #: host -O level
    rdc: bool = False
    fast_math: bool = False
    ftz: Optional[bool] = None
    prec_div: Optional[bool] = None
    prec_sqrt: Optional[bool] = None
    fmad: Optional[bool] = None
    maxrregcount: Optional[int] = None
    lineinfo: bool = False
    device_debug: bool = False
    host_debug: bool = False
    dopt: Optional[bool] = None
    cudart: str = "static"
    cudadevrt: str = "static"
    ccbin: Optional[str] = None
    shared: bool = False
    verbose: bool = False
    dryrun: bool = False
    keep_dir: Optional[str] = None
    resource_usage: bool = False
    werror: bool = False
    no_warnings: bool = False
    default_stream: Optional[str] = None
    extended_lambda: bool = False
    relaxed_constexpr: bool = False
    dlto: bool = False  #: -dlto: device code as LLVM bitcode, optimized and compiled at the device link
    accepted: List[str] = field(default_factory=list)  #: options accepted with no clang counterpart (shown by -v)

    @property
    def ftz_on(self) -> bool:
        return self.ftz if self.ftz is not None else self.fast_math

    @property
    def prec_div_on(self) -> bool:
        return self.prec_div if self.prec_div is not None else not self.fast_math

    @property
    def prec_sqrt_on(self) -> bool:
        return self.prec_sqrt if self.prec_sqrt is not None else not self.fast_math

    @property
    def fmad_on(self) -> bool:
        return self.fmad if self.fmad is not None else True

    def device_settings(self) -> Dict[str, object]:
        """The device-code settings of this build, as recorded in the embedded IR's metadata."""
        from mneme.cc.embedded import BUILD_VERSION

        level = "0" if self.device_debug or self.dopt is False else "3"
        return {
            "version": BUILD_VERSION, "ptxas_opt": int(level), "relocatable": self.rdc and not self.dlto_on,
            "compiler": "nvcc", "ftz": self.ftz_on, "prec_div": self.prec_div_on, "prec_sqrt": self.prec_sqrt_on,
            "fmad": self.fmad_on, "fast_math": self.fast_math, "maxrregcount": self.maxrregcount,
            "ptxas": list(self.ptxas), "device_debug": self.device_debug, "lineinfo": self.lineinfo,
            "opt_level": level, "host_opt_level": self.opt or "0",
            "rdc": self.rdc, "dlto": self.dlto_on,
        }

    @property
    def dlto_on(self) -> bool:
        """-dlto, or MNEME_NVCC_DLTO=1 for every relocatable compile and device link of a build."""
        return self.dlto or os.environ.get("MNEME_NVCC_DLTO", "") not in ("", "0")


def _read_options_file(path: str, what: str) -> List[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return shlex.split(fh.read())
    except OSError as e:
        raise ConfigurationError(f"{what} {path}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise ConfigurationError(f"{what} {path}: unreadable ({e})") from None


def expand(argv: List[str], depth: int = 0) -> List[str]:
    """Splice `@file`, `--options-file file` and `-optf file` (and their `=` forms)."""
    out: List[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if depth > 8:
            raise ConfigurationError("options files nest more than 8 deep")
        if a.startswith("@") and len(a) > 1:
            out += expand(_read_options_file(a[1:], "@"), depth + 1)
        elif a in ("--options-file", "-options-file", "-optf", "--optf"):
            if i + 1 >= len(argv):
                raise ConfigurationError(f"{a}: the file name is missing")
            for f in argv[i + 1].split(","):
                out += expand(_read_options_file(f, a), depth + 1)
            i += 1
        elif re.match(r"^--?(options-file|optf)=", a):
            name, value = a.split("=", 1)
            for f in value.split(","):
                out += expand(_read_options_file(f, name), depth + 1)
        else:
            out.append(a)
        i += 1
    return out


def _bool(name: str, value: str) -> bool:
    v = value.lower()
    if v not in _BOOL:
        raise ConfigurationError(f"--{name}={value}: expected true or false")
    return _BOOL[v]


def _lookup(a: str) -> Tuple[Optional[str], Optional[str]]:
    """(long name, joined/`=` value) of option `a`, or (None, None) when it is not an nvcc option."""
    body = a.lstrip("-")
    name, eq, value = body.partition("=")
    if name in _OPTIONS:
        return name, value if eq else None
    if name in _SHORT:
        return _SHORT[name], value if eq else None
    if a.startswith("-") and not a.startswith("--"):
        if re.fullmatch(r"m(32|64)", body):
            return "machine", body[1:]
        for short in sorted(_JOINED, key=len, reverse=True):
            if body.startswith(short) and len(body) > len(short):
                return _JOINED[short], body[len(short):]
    return None, None


def parse(argv: List[str]) -> NvccCommand:
    """Read nvcc's command line `argv` (without the program name)."""
    cmd = NvccCommand()
    args = expand(list(argv))
    forced = ""
    forward_unknown = any(a.lstrip("-") in ("forward-unknown-to-host-compiler", "forward-unknown-opts") for a in args)
    forward_link = any(a.lstrip("-") == "forward-unknown-to-host-linker" for a in args)
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if not a.startswith("-") or a == "-":
            ext = os.path.splitext(a)[1]
            lang = forced or ("cuda" if ext in CUDA_EXTS else HOST_EXTS.get(ext, "obj"))
            cmd.inputs.append(Input(a, lang))
            continue
        name, value = _lookup(a)
        if name is None:
            if forward_unknown:
                cmd.host.append(a)
                continue
            if forward_link:
                cmd.link.append(a)
                continue
            raise ConfigurationError(
                f"{a}: not an nvcc option mneme knows (nvcc would reject it too, unless it is new: "
                f"pass host compiler flags with -Xcompiler {a})"
            )
        if name in _VALUED and value is None:
            if i >= len(args):
                raise ConfigurationError(f"{a}: its value is missing")
            value = args[i]
            i += 1
        elif name not in _VALUED and value is not None and name != "machine":
            raise ConfigurationError(f"{a}: --{name} takes no value")
        _apply(cmd, name, value, a)
        if name == "x":
            forced = _LANGS.get(value, None)
            if forced is None:
                raise ConfigurationError(f"-x {value}: unknown language (nvcc knows cu, c, c++, none)")
    return cmd


def _items(name: str, value: str) -> List[str]:
    return [v for v in value.split(",") if v != ""] if name in _LISTS else [value]


def _apply(cmd: NvccCommand, name: str, value: Optional[str], written: str) -> None:
    if name in _REFUSED:
        raise ConfigurationError(f"{written}: not supported by {PROG}: {_REFUSED[name]}")
    if name in PHASES:
        # -dc is -c with relocatable device code; a later -c keeps the RDC (`-dc ... -c` in real Makefiles)
        if cmd.phase in ("dc", "dw") and PHASES[name] == "compile":
            return
        cmd.phase = PHASES[name]
        cmd.rdc = cmd.rdc or name == "device-c"
        return
    if name in ("version", "help"):
        cmd.phase = name
        return
    vals = _items(name, value) if value is not None else []
    simple = {
        "output-file": lambda: setattr(cmd, "output", value),
        "output-directory": lambda: setattr(cmd, "output_dir", value),
        "std": lambda: setattr(cmd, "std", value),
        "compiler-bindir": lambda: setattr(cmd, "ccbin", value),
        "keep-dir": lambda: setattr(cmd, "keep_dir", value),
        "default-stream": lambda: setattr(cmd, "default_stream", value),
    }
    if name in simple:
        simple[name]()
    elif name in ("include-path", "system-include", "define-macro", "undefine-macro", "pre-include"):
        flag = {"include-path": "-I", "system-include": "-isystem", "define-macro": "-D", "undefine-macro": "-U",
                "pre-include": "-include"}[name]
        for v in vals:
            cmd.pp += [flag, v] if flag in ("-isystem", "-include") else [flag + v]
    elif name == "library":
        cmd.link += ["-l" + v for v in vals]
    elif name == "library-path":
        cmd.link += ["-L" + v for v in vals]
    elif name == "linker-options":
        for v in vals:
            cmd.link += ["-Xlinker", v]
    elif name == "compiler-options":
        cmd.host += [v for v in vals]
    elif name == "ptxas-options":
        cmd.ptxas += vals
    elif name == "nvlink-options":
        cmd.nvlink += vals
    elif name == "archive-options":
        cmd.archive += vals
    elif name in ("gpu-architecture", "gpu-code", "generate-code"):
        kind = {"gpu-architecture": "arch", "gpu-code": "code", "generate-code": "gencode"}[name]
        if kind == "gencode":
            cmd.arch_values.append((kind, value))
        else:
            cmd.arch_values += [(kind, v) for v in vals]
    elif name == "relocatable-device-code":
        cmd.rdc = _bool(name, value)
    elif name in ("ftz", "prec-div", "prec-sqrt", "fmad"):
        setattr(cmd, name.replace("-", "_"), _bool(name, value))
    elif name == "use_fast_math":
        cmd.fast_math = True
    elif name == "maxrregcount":
        if not value.isdigit():
            raise ConfigurationError(f"{written} {value}: expected a register count")
        cmd.maxrregcount = int(value)
    elif name == "generate-line-info":
        cmd.lineinfo = True
    elif name == "device-debug":
        cmd.device_debug = True
    elif name == "debug":
        cmd.host_debug = True
    elif name == "optimize":
        if value not in ("0", "1", "2", "3", "s", "fast", "g", "z"):
            raise ConfigurationError(f"{written}: unknown optimization level {value!r}")
        cmd.opt = value
    elif name == "dopt":
        if value not in ("on", "off"):
            raise ConfigurationError(f"{written} {value}: expected on or off")
        cmd.dopt = value == "on"
    elif name in ("cudart", "cudadevrt"):
        if value not in ("static", "shared", "none"):
            raise ConfigurationError(f"--{name} {value}: expected static, shared or none")
        setattr(cmd, name, value)
    elif name == "machine":
        if value != "64":
            raise ConfigurationError(f"{written}: only 64-bit host code is supported (-m64)")
    elif name == "x":
        pass
    elif name in ("generate-dependencies-with-compile", "generate-nonsystem-dependencies-with-compile"):
        cmd.deps.append("-MD" if name.startswith("generate-dep") else "-MMD")
    elif name in ("dependency-output", "dependency-target-name"):
        cmd.deps += ["-MF" if name == "dependency-output" else "-MT", value]
    elif name == "shared":
        cmd.shared = True
    elif name == "verbose":
        cmd.verbose = True
    elif name == "dryrun":
        cmd.dryrun = cmd.verbose = True
    elif name == "resource-usage":
        cmd.resource_usage = True
    elif name == "Werror":
        cmd.werror = cmd.werror or "all-warnings" in vals
        cmd.accepted += [f"-Werror {v}" for v in vals if v != "all-warnings"]
    elif name == "disable-warnings":
        cmd.no_warnings = True
    elif name in ("extended-lambda", "expt-extended-lambda"):
        cmd.extended_lambda = True
    elif name == "dlink-time-opt":
        cmd.dlto = True
    elif name == "expt-relaxed-constexpr":
        cmd.relaxed_constexpr = True
    elif name == "Xcudafe":
        for v in vals:
            if not re.match(r"^--?(diag_suppress|diag-suppress|display_error_number|no_display_error_number)", v):
                raise ConfigurationError(
                    f"-Xcudafe {v}: not supported by {PROG} (clang has no cudafe; only "
                    "--diag_suppress/--display_error_number are accepted)"
                )
            cmd.accepted.append(f"-Xcudafe {v}")
    else:
        # accepted without a clang counterpart: threads, keep, save-temps, warnings about GPU targets and
        # EDG diagnostic numbers, forwarding switches, host compiler checks
        cmd.accepted.append(written + (f" {value}" if value is not None and "=" not in written else ""))
