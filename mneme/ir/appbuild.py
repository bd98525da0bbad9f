"""The replay baseline compiles the recorded IR as the app was built (issue 16: "the baseline is the app's code").

`mneme cc`/`mneme nvcc` store the device build settings with each module's IR (mneme.cc.embedded.recorded_build;
the record DB keeps the kernel's as extra.BuildSettings). `from_build` turns them into the code fields of a
replay configuration:

| app's build | replay configuration |
|---|---|
| device -O level (clang: the last -O; nvcc: -O3, -G/--dopt off: -O0) | passes `default<On>`, codegen_opt as clang maps it (-Os/-Oz: 2) |
| ptxas -O (clang's mapping of -O, or -Xptxas -O<n>) | ptxas_opt (when it differs from codegen_opt) |
| --fmad=false / -ffp-contract=off | fma=False (the IR has no `contract` then; ptxas --fmad=false as nvcc passes it) |
| --fmad=true / -ffp-contract=fast (CUDA's default) | contract_all=True (the backend fuses every add/mul, not only those the IR marks) |
| --prec-div=false (also --use_fast_math) | prec_div=False (div.approx) |
| --prec-sqrt=true (nvcc's default) | prec_sqrt=True (sqrt.rn) |
| -maxrregcount N, -Xptxas --maxrregcount=N | max_regs |
| -Xptxas -dlcm=X, --allow-expensive-optimizations | dlcm, expensive_opts |
| -rdc=true / -fgpu-rdc (without -dlto) | whole_program=False (ptxas -c + nvlink), internalize=False, and
  cross_unit_inline=False when the kernel calls functions of other translation units (they stay calls) |

What the IR already carries is not repeated: flush-to-zero (the "denormal-fp-math-f32" attribute and the
nvvm-reflect-ftz module flag), clang's -ffast-math flags on instructions, `contract`, approximate
transcendentals (__USE_FAST_MATH__ changed the source). `ir_facts` reads them back for the description.
Without recorded settings (a binary built before they were recorded) the baseline is mneme's defaults, and
`Baseline.reason` says why. The searched spaces keep mneme's defaults as a point (`Baseline.mneme_point`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from mneme.config import ExperimentConfiguration

APP_BUILD = "app-build"
MNEME_DEFAULTS = "mneme-defaults"
KINDS = (APP_BUILD, MNEME_DEFAULTS)

#: the replay-configuration fields a baseline sets (the code; the launch is the recorded one either way)
CODE_FIELDS = ("passes", "codegen_opt", "internalize", "fma", "fast_math", "ptxas_opt", "max_regs", "dlcm",
               "expensive_opts", "whole_program", "prec_div", "prec_sqrt", "contract_all", "cross_unit_inline")
_DEFAULTS = ExperimentConfiguration()
#: mneme's own choice for each code field (what the replay compiled before the app's build was recorded)
MNEME_CODE = {f: getattr(_DEFAULTS, f) for f in CODE_FIELDS}

#: clang's optimization pipelines and code-generation levels for the device -O level
_PIPELINE = {"0": "default<O0>", "1": "default<O1>", "2": "default<O2>", "3": "default<O3>", "4": "default<O3>",
             "fast": "default<O3>", "s": "default<Os>", "z": "default<Oz>", "g": "default<O1>"}
_CODEGEN = {"0": 0, "1": 1, "2": 2, "3": 3, "4": 3, "fast": 3, "s": 2, "z": 2, "g": 1}
#: ptxas options that change no code (reports, warnings, what the log prints)
_NO_CODE = re.compile(r"^--?(v|verbose|warn-on-spills|warn-spills|warn-on-local-memory-usage|warn-lmem-usage|"
                      r"warn-on-double-precision-use|warn-double-usage|suppress-stack-size-warning|"
                      r"suppress-async-bulk-multicast-advisory-warning|Werror|disable-warnings|w|lineinfo|"
                      r"generate-line-info|compile-time)$")


@dataclass(frozen=True)
class Baseline:
    """Which code the baseline replays: the app's build ("app-build") or mneme's defaults, and why."""

    kind: str
    #: the code fields of the replay configuration (CODE_FIELDS)
    fields: Dict[str, Any] = field(default_factory=lambda: dict(MNEME_CODE))
    #: the app's build in a few words ("nvcc -O3", "fmad", "ptxas -O3" ...)
    words: Tuple[str, ...] = ()
    #: why mneme's defaults are the baseline ("" for app-build)
    reason: str = ""
    #: settings of the app's build the replay does not reproduce, each named
    notes: Tuple[str, ...] = ()

    def describe(self) -> str:
        """`app-build (-O3, fmad, ptxas -O3)` / `mneme-defaults (why)`: what `mneme replay`/`mneme tune` print."""
        if self.kind == APP_BUILD:
            return f"{APP_BUILD} ({', '.join(self.words)})" if self.words else APP_BUILD
        return f"{MNEME_DEFAULTS} ({self.reason})" if self.reason else MNEME_DEFAULTS

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "description": self.describe(), "reason": self.reason, "fields": dict(self.fields),
                "build": list(self.words), "notes": list(self.notes)}

    def apply(self, config: ExperimentConfiguration) -> ExperimentConfiguration:
        """`config` with this baseline's code (launch and other fields kept)."""
        return replace(config, **self.fields)

    @property
    def differs_from_mneme(self) -> bool:
        return self.fields != MNEME_CODE

    def differing(self) -> Dict[str, Any]:
        """The code fields whose value differs from mneme's defaults (what a search's mneme point resets)."""
        return {k: v for k, v in self.fields.items() if MNEME_CODE.get(k) != v}


def mneme_defaults(reason: str) -> Baseline:
    return Baseline(MNEME_DEFAULTS, dict(MNEME_CODE), (), reason)


def _ptxas_options(opts: List[str]) -> Tuple[Dict[str, Any], List[str]]:
    """(fields, options not reproduced) of an app's -Xptxas list."""
    out: Dict[str, Any] = {}
    skipped: List[str] = []
    i = 0
    while i < len(opts):
        a = str(opts[i]).strip()
        nxt = str(opts[i + 1]) if i + 1 < len(opts) else None
        name, eq, value = a.partition("=")
        if not eq and name in ("-O", "--opt-level", "-maxrregcount", "--maxrregcount", "-dlcm", "--def-load-cache",
                               "--allow-expensive-optimizations", "-allow-expensive-optimizations", "--fmad",
                               "-fmad") and nxt is not None:
            value, i = nxt, i + 1
        elif not eq and re.fullmatch(r"-O\d", a):
            name, value = "-O", a[2:]
        i += 1
        if name in ("-O", "--opt-level") and value.isdigit():
            out["ptxas_opt"] = int(value)
        elif name in ("-maxrregcount", "--maxrregcount") and value.isdigit():
            out["maxrregcount"] = int(value)
        elif name in ("-dlcm", "--def-load-cache") and value in ("ca", "cg", "cs"):
            out["dlcm"] = value
        elif name in ("--allow-expensive-optimizations", "-allow-expensive-optimizations"):
            out["expensive_opts"] = value.lower() in ("true", "1", "")
        elif name in ("--fmad", "-fmad"):
            out["fmad"] = value.lower() not in ("false", "0")
        elif _NO_CODE.match(a):
            continue
        elif a:
            skipped.append(a + (f" {value}" if not eq and value and name != a else ""))
    return out, skipped


def ir_facts(ir_text: str, kernel: Optional[str] = None) -> Dict[str, bool]:
    """What the IR says about floating point: ftz (denormal attribute or nvvm-reflect-ftz), fast (clang
    -ffast-math: `fast`/`afn` flags or "unsafe-fp-math"="true"), contract (FMA contraction allowed)."""
    return {
        "ftz": bool(re.search(r'"denormal-fp-math(?:-f32)?"="preserve-sign|!"nvvm-reflect-ftz", i32 1\}', ir_text)),
        "fast": bool(re.search(r'= (?:fadd|fsub|fmul|fdiv)(?: \w+)* (?:fast|afn)\b|"unsafe-fp-math"="true"', ir_text)),
        "contract": bool(re.search(r"= (?:fadd|fsub|fmul|fdiv)(?: \w+)* (?:fast|contract)\b", ir_text)),
    }


def from_build(build: Optional[Mapping[str, Any]], arch: Optional[str] = None, ir_text: str = "",
               other_unit: Sequence[str] = ()) -> Baseline:
    """The baseline for a kernel whose module was built with `build` (extra.BuildSettings); `arch` is the GPU
    the replay compiles for, `ir_text` the kernel's IR (for what it carries itself), `other_unit` the functions
    of its closure that other translation units define (extra.OtherUnitFunctions)."""
    if not build:
        return mneme_defaults("the record has no build settings: the app was built or recorded before mneme recorded "
                              "them; rebuild it with this mneme's `mneme cc`/`mneme nvcc` and record again")
    if str(build.get("compiler", "unknown")) == "unknown":
        return mneme_defaults("the app's binary carries no build settings (built before mneme recorded them); rebuild "
                              "it with this mneme's `mneme cc`/`mneme nvcc` and record again")
    compiler = str(build.get("compiler"))
    level = str(build.get("opt_level", "3")).lower()
    notes: List[str] = []
    if level not in _PIPELINE:
        notes.append(f"device -O{level} is unknown to mneme: replayed at -O3")
        level = "3"
    f = dict(MNEME_CODE)
    f["passes"], f["codegen_opt"] = _PIPELINE[level], _CODEGEN[level]
    ptxas_opt = build.get("ptxas_opt")
    if ptxas_opt is None:  # settings version 1: the driver's own mapping
        ptxas_opt = 0 if level == "0" else (3 if compiler == "nvcc" else {"1": 1, "2": 2, "s": 2, "z": 2}.get(level, 3))
    px, skipped = _ptxas_options(list(build.get("ptxas") or []))
    ptxas_opt = int(px.get("ptxas_opt", ptxas_opt))
    f["ptxas_opt"] = -1 if ptxas_opt == f["codegen_opt"] else ptxas_opt
    f["fma"] = bool(build.get("fmad", True)) and bool(px.get("fmad", True))
    contract = [str(a).split("=", 1)[1] for a in build.get("fp_flags") or [] if str(a).startswith("-ffp-contract=")]
    f["contract_all"] = f["fma"] and (contract[-1] if contract else "fast") in ("fast", "fast-honor-pragmas")
    f["prec_div"] = bool(build.get("prec_div", True))
    f["prec_sqrt"] = bool(build.get("prec_sqrt", compiler == "nvcc"))
    regs = px.get("maxrregcount", build.get("maxrregcount"))
    if regs:
        regs = int(regs)
        if not 16 <= regs <= 255:
            notes.append(f"maxrregcount {regs} is outside 16..255: replayed with {min(max(regs, 16), 255)}")
        f["max_regs"] = min(max(regs, 16), 255)
    f["dlcm"] = px.get("dlcm", "")
    f["expensive_opts"] = bool(px.get("expensive_opts", False))
    relocatable = build.get("relocatable")
    if relocatable is None:
        relocatable = bool(build.get("rdc")) and not build.get("dlto")
    if relocatable:
        f["whole_program"], f["internalize"] = False, False
        if other_unit:
            f["cross_unit_inline"] = False
    for opt in skipped:
        notes.append(f"ptxas option {opt} of the app's build is not reproduced")
    if build.get("device_debug"):
        notes.append("the app was built with -G (device debug): the replay has no debug code")
    built_for = [str(a) for a in (build.get("archs") or [build.get("arch")]) if a]
    if arch and built_for and arch not in built_for:
        notes.append(f"the app was built for {', '.join(built_for)} and the replay compiles for {arch} (the GPU ran "
                     f"the app's PTX JIT-compiled, or another architecture's code)")
    facts = ir_facts(ir_text) if ir_text else {}
    words = [f"{compiler} -O{level}", "fmad" if f["fma"] else "no-fmad"]
    if facts.get("ftz") or (not ir_text and build.get("ftz")):
        words.append("ftz")
    if facts.get("fast"):
        words.append("fast-math flags")
    words += ["prec-div" if f["prec_div"] else "approx-div", "prec-sqrt" if f["prec_sqrt"] else "approx-sqrt"]
    words.append(f"ptxas -O{ptxas_opt}")
    if f["max_regs"]:
        words.append(f"maxrregcount={f['max_regs']}")
    if f["dlcm"]:
        words.append(f"dlcm={f['dlcm']}")
    if f["expensive_opts"]:
        words.append("expensive-opts")
    if relocatable:
        words.append("rdc (ptxas -c + nvlink)")
        if other_unit:
            words.append(f"{len(other_unit)} call(s) into other translation units kept")
    if ir_text and bool(build.get("ftz")) != facts.get("ftz"):
        notes.append(f"the build settings say ftz={bool(build.get('ftz'))}, the IR says {facts.get('ftz')}: the IR decides")
    return Baseline(APP_BUILD, f, tuple(words), "", tuple(notes))


def choose(kind: str, build: Optional[Mapping[str, Any]], arch: Optional[str] = None, ir_text: str = "",
           other_unit: Sequence[str] = ()) -> Baseline:
    """`kind` "app-build" (from_build) or "mneme-defaults" (asked for)."""
    if kind == MNEME_DEFAULTS:
        return mneme_defaults("asked for")
    if kind != APP_BUILD:
        from mneme.errors import ConfigurationError

        raise ConfigurationError(f"baseline {kind!r}: choose {APP_BUILD} or {MNEME_DEFAULTS}")
    return from_build(build, arch, ir_text, other_unit)


__all__ = ["APP_BUILD", "MNEME_DEFAULTS", "KINDS", "CODE_FIELDS", "MNEME_CODE", "Baseline", "mneme_defaults",
           "from_build", "choose", "ir_facts"]
