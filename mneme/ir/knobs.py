"""Code knobs beyond the pipeline: loop unrolling, inlining, vectorization, floating-point contraction and
fast math, and the PTX assembler's options. Each one changes the code that runs, and each is part of the code
hash (only when set, so code hashes of configurations without knobs stay what they were).

How each reaches the code:
- `unroll`: loop metadata on every loop of the module that carries no unroll hint of its own (a source
  `#pragma unroll` wins): n >= 2 writes `llvm.loop.unroll.count` n, 1 writes `llvm.loop.unroll.disable`.
- `inline_threshold`, `vectorize`: llvmlite's PipelineTuningOptions of the default<...> pipelines
  (inlining threshold; loop and SLP vectorization).
- `fma=False`: `contract` is taken off every floating-point instruction and ptxas gets `--fmad=false`.
- `fast_math`: every floating-point instruction gets `fast` (or every fast-math flag but `contract` when fma
  is off), denormals flush to zero (the "denormal-fp-math-f32" attribute and libdevice's nvvm-reflect-ftz).
  Results round differently: such trials need verification by tolerance.
- `ptxas_opt` (-1: the codegen level), `max_regs` (--maxrregcount), `dlcm` (-dlcm=ca|cg|cs, default load
  caching), `expensive_opts` (--allow-expensive-optimizations true): flags of ptxas (or -Xptxas for nvJitLink).
- `whole_program=False`: `ptxas -c` (relocatable code: shared-memory addresses and alignment left to the device
  link), then nvlink, as an app built with -fgpu-rdc / -rdc=true is assembled (ptxas_flags gets "-c").
- `prec_sqrt`: libdevice's `__nvvm_reflect("__CUDA_PREC_SQRT")` answers 1, so sqrtf is sqrt.rn (nvcc's default,
  -nvvm-reflect-add=__CUDA_PREC_SQRT=1 in the app's build); LLVM 22's NVVMReflect reads no module flag for it.
- `contract_all`: after optimization every fadd/fsub/fmul gets `contract`: the backend then fuses (and ptxas may
  fuse) as the app's build did with -ffp-contract=fast, whose backend option (AllowFPOpFusion=Fast) llvmlite's
  target machine does not take. Without it, operations whose IR lacks `contract` (libdevice's, those the
  optimizer created) are emitted with .rn and never fused.
- `cross_unit_inline=False`: the functions the caller names (compile_kernel's `no_inline`: the record's
  OtherUnitFunctions) get `noinline`, so they stay calls as in a separately compiled -rdc app.
- `prec_div=False`: single-precision divisions get `afn` after optimization, so code generation emits
  div.approx as -nvptx-prec-divf32=0 makes it do in the app's build (a code-generation option only: the IR
  the optimizer sees is the same).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List

from mneme.config import KNOB_DEFAULTS


_FP_OPS = re.compile(
    r"(= (?:fadd|fsub|fmul|fdiv|frem|fneg|fcmp)|(?:= |^\s*)(?:tail |notail |musttail )?call)"
    r"((?: (?:fast|contract|reassoc|nnan|ninf|nsz|arcp|afn))*)"
    r"(?= (?:float|double|half|bfloat|<\d+ x (?:float|double|half|bfloat)>|[ou]\w+|true|false)\b)",
    re.M,
)
_FP_CALL_TYPE = re.compile(r"^ (?:float|double|half|bfloat|<\d+ x (?:float|double|half|bfloat)>)\b")
_LOOP_REF = re.compile(r"!llvm\.loop !(\d+)")
_MD_DEF = re.compile(r"^!(\d+) = (distinct )?!\{(.*)\}$", re.M)
#: every numbered metadata node, tuples and specialized ones alike (!DILocation, !DISubprogram... of debug info)
_MD_ANY = re.compile(r"^!(\d+) = ", re.M)
_ATTR_GROUP = re.compile(r"^(attributes #\d+ = \{ )(.*)( \})$", re.M)
_FTZ_FLAG = re.compile(r'(!\{i32 \d+, !"nvvm-reflect-ftz", i32 )0\}')
_DENORMAL = re.compile(r' ?"denormal-fp-math(?:-f32)?"="[^"]*"')
_FAST_NO_CONTRACT = "reassoc nnan ninf nsz arcp afn"


#: knobs that reach only the PTX assembler (ptxas_flags, assembler_opt): the PTX is the same whatever their values,
#: so compile_kernel reuses the PTX of a configuration that differed only in these (fma also rewrites the IR)
ASSEMBLER_ONLY = ("ptxas_opt", "max_regs", "dlcm", "expensive_opts", "whole_program")


class CodeKnobs:
    """The code knobs of one configuration; their names and neutral values are mneme.config.KNOB_DEFAULTS."""

    __slots__ = ("_v",)

    def __init__(self, **values: Any):
        unknown = sorted(set(values) - set(KNOB_DEFAULTS))
        if unknown:
            raise TypeError(f"unknown code knob(s) {unknown}; known: {sorted(KNOB_DEFAULTS)}")
        self._v = {**KNOB_DEFAULTS, **values}

    def __getattr__(self, name: str) -> Any:
        try:
            return self._v[name]
        except KeyError:
            raise AttributeError(name) from None

    @classmethod
    def of(cls, config: Any) -> "CodeKnobs":
        """The knobs of a replay configuration (fields it lacks keep their defaults)."""
        return cls(**{k: getattr(config, k) for k in KNOB_DEFAULTS if hasattr(config, k)})

    def describe(self) -> Dict[str, Any]:
        """The knobs that differ from the defaults (what the code hash sees)."""
        return {k: v for k, v in self._v.items() if v != KNOB_DEFAULTS[k]}

    @property
    def rewrites_ir(self) -> bool:
        return bool(self.unroll) or self.fast_math or not self.fma or self.prec_sqrt

    @property
    def rewrites_optimized(self) -> bool:
        """Whether the optimized IR is rewritten before code generation (rewrite_optimized)."""
        return not self.prec_div or (self.contract_all and self.fma)

    def ptxas_flags(self) -> List[str]:
        """ptxas flags beyond --gpu-name/-O/--verbose (the -O level is the caller's, see assembler_opt)."""
        out: List[str] = []
        if self.max_regs:
            out.append(f"--maxrregcount={int(self.max_regs)}")
        if self.dlcm:
            out.append(f"-dlcm={self.dlcm}")
        if self.expensive_opts:
            out.append("--allow-expensive-optimizations=true")
        if not self.fma:
            out.append("--fmad=false")
        if not self.whole_program:
            out.append("-c")
        return out

    def assembler_opt(self, codegen_opt: int) -> int:
        return int(codegen_opt) if int(self.ptxas_opt) < 0 else int(self.ptxas_opt)

    def rewrite(self, text: str) -> str:
        """Printed IR with the IR-level knobs applied (see the module docstring)."""
        if self.unroll:
            text = _unroll(text, int(self.unroll))
        if self.fast_math or not self.fma:
            text = _fp_flags(text, self.fast_math, self.fma)
        if self.prec_sqrt:
            text = _reflect_answer(text, "__CUDA_PREC_SQRT", 1)
        return text

    def rewrite_optimized(self, text: str) -> str:
        """Optimized IR with the code-generation knobs that LLVM reads from instructions (prec_div)."""
        if self.contract_all and self.fma:
            text = _FP_ARITH.sub(lambda m: m.group(0) if "contract" in m.group(2).split() or "fast" in m.group(2).split()
                                 else f"{m.group(1)}{m.group(2)} contract{m.group(3)}", text)
        if not self.prec_div:
            text = _F32_FDIV.sub(lambda m: m.group(1) + ("" if "afn" in m.group(2).split() else " afn") + m.group(2)
                                 + m.group(3), text)
        return text


_FP_ARITH = re.compile(r"(= (?:fadd|fsub|fmul))((?: (?:fast|contract|reassoc|nnan|ninf|nsz|arcp|afn))*)"
                       r"( (?:float|double|half|<\d+ x (?:float|double|half)>) )")
_F32_FDIV = re.compile(r"(= fdiv)((?: (?:fast|contract|reassoc|nnan|ninf|nsz|arcp|afn))*)( (?:float|<\d+ x float>) )")
_STRING_GLOBAL = re.compile(r'^(@[-\w.$"]+) = [^\n]*?c"([^"]*)\\00"', re.M)
_REFLECT_CALL = re.compile(r"^(\s*)(%[-\w.$]+) = (?:tail |notail )?call i32 @__nvvm_reflect\((?:ptr|i8\*)(?: noundef)? "
                           r"(?:addrspacecast \([^)]*?(@[-\w.$\"]+)[^)]*\)|(@[-\w.$\"]+))\)[^\n]*$", re.M)


def _reflect_answer(text: str, name: str, value: int) -> str:
    """Calls `__nvvm_reflect("<name>")` replaced by the constant `value` (what -nvvm-reflect-add=<name>=<value>
    makes NVVMReflect answer); other reflect queries stay for NVVMReflect."""
    strings = {m.group(1) for m in _STRING_GLOBAL.finditer(text) if m.group(2) == name}
    if not strings:
        return text

    def repl(m: re.Match) -> str:
        if (m.group(3) or m.group(4)) not in strings:
            return m.group(0)
        return f"{m.group(1)}{m.group(2)} = add i32 0, {int(value)}"

    return _REFLECT_CALL.sub(repl, text)


def _unroll(text: str, count: int) -> str:
    nodes = {m.group(1): m for m in _MD_DEF.finditer(text)}
    loops = sorted(set(_LOOP_REF.findall(text)), key=int)
    if not loops:
        return text
    # the new node's id must be above every numbered node: debug info (-lineinfo, -G) adds !DILocation and
    # friends that are not `!{...}` tuples, and reusing one of their ids is "Metadata id is already used"
    new_id = max((int(k) for k in _MD_ANY.findall(text)), default=-1) + 1
    hint = f'!{{!"llvm.loop.unroll.count", i32 {count}}}' if count > 1 else '!{!"llvm.loop.unroll.disable"}'
    edits = []
    for lid in loops:
        m = nodes.get(lid)
        if m is None:
            continue
        refs = re.findall(r"!(\d+)", m.group(3))
        if any("llvm.loop.unroll" in (nodes[r].group(3) if r in nodes else "") for r in refs):
            continue  # the source asked for its own unrolling
        edits.append((m.start(), m.end(), f"!{lid} = {m.group(2) or ''}!{{{m.group(3)}, !{new_id}}}"))
    if not edits:
        return text
    for start, end, repl in reversed(edits):
        text = text[:start] + repl + text[end:]
    return text.rstrip("\n") + f"\n!{new_id} = {hint}\n"


def _fp_flags(text: str, fast: bool, fma: bool) -> str:
    flags = ("fast" if fma else _FAST_NO_CONTRACT) if fast else ""

    def repl(m: re.Match) -> str:
        head, old = m.group(1), m.group(2).split()
        if head.endswith("call") and not _FP_CALL_TYPE.match(m.string[m.end(): m.end() + 40]):
            return m.group(0)
        if fast:
            return f"{head} {flags}"
        kept = [f for f in old if f != "contract"]
        if "fast" in kept:  # fast = all flags: keep all of them but contract
            kept = _FAST_NO_CONTRACT.split()
        return head + "".join(" " + f for f in kept)

    text = _FP_OPS.sub(repl, text)
    if fast:
        text = _FTZ_FLAG.sub(r"\g<1>1}", text)
        text = _ATTR_GROUP.sub(
            lambda m: m.group(1) + _DENORMAL.sub("", m.group(2)) + ' "denormal-fp-math-f32"="preserve-sign,preserve-sign"'
            + m.group(3) if '"target-cpu"' in m.group(2) else m.group(0), text)
    return text
