"""Specializations: recorded argument values, launch dimensions and launch bounds, written into the IR.

llvmlite reads and prints modules but cannot edit instructions, so each specialization is a small,
exact rewrite of the module's printed IR (LLVM's own canonical printing, not user-written text),
followed by one parse into a fresh context. All requested specializations are applied in a single
print/parse round trip; the input module is never changed.

- args: every use of a scalar parameter inside the kernel becomes the constant; the parameter stays
  in the signature so the recorded argument buffer still matches the launch.
- dims: reads of blockDim/gridDim (`llvm.nvvm.read.ptx.sreg.ntid.*`/`nctaid.*`, also inside clang's
  `__cuda_builtin_blockDim_t::__fetch_builtin_*` wrappers) become constants; threadIdx/blockIdx reads
  get the ranges [0, block) and [0, grid) — in the code that runs under the kernel's own launch only, not in
  the kernels it launches from the device nor in what they share with it (mneme.ir.dimscope).
- dims-assume: the same knowledge only as `range(...)` return attributes on every read.
- launch bounds: the kernel gets its own attribute group carrying "nvvm.maxntid" and "nvvm.minctasm",
  which LLVM 22's NVPTX backend prints as `.maxntid` and `.minnctapersm`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import llvmlite.binding as llvm

from mneme.errors import CompileError, ConfigurationError
from mneme.ir.dimscope import rewrite_in_scope
from mneme.ir.module import kernel_function, new_context, symbol_token
from mneme.ir.params import ParamInfo, Scalar, canonical_args, ir_constant, kernel_params
from mneme.ir.target import check_arch

Dim3 = Tuple[int, int, int]

_SREG_CALL = re.compile(
    r'^(?P<indent>[ \t]*)(?P<lhs>(?:%"(?:[^"\\]|\\.)*"|%[-a-zA-Z$._0-9]+) = )?(?P<tail>(?:tail |musttail |notail )?)'
    r"call (?P<ret>[^@\n]*?)i32 @llvm\.nvvm\.read\.ptx\.sreg\.(?P<reg>tid|ntid|ctaid|nctaid)\.(?P<axis>[xyz])\(\)"
    r"(?P<rest>[^\n]*)",
    re.M,
)
_RANGE_ATTR = re.compile(r"range\(i32 -?\d+, -?\d+\) ?")
_DBG_ATTACHMENT = re.compile(r", !dbg ![0-9]+")
_TOKEN = re.compile(r'%"(?:[^"\\]|\\.)*"|%[-a-zA-Z$._0-9]+|"(?:[^"\\]|\\.)*"')
_ATTR_GROUP = re.compile(r"^attributes #(\d+) = \{ (.*) \}$", re.M)
_LAUNCH_BOUND_ATTRS = re.compile(r' ?"nvvm\.(?:maxntid|minctasm)"="[^"]*"')
_TARGET_CPU = re.compile(r'"target-cpu"="sm_[0-9]+[af]?"')
_TARGET_SM_FEATURE = re.compile(r'(?<=[",])\+sm_[0-9]+[af]?(?=[",])')
_AXES = "xyz"
MAX_THREADS = 1024


@dataclass(frozen=True)
class Specialization:
    """What to write into a kernel's IR; `describe()` is what the code hash sees."""

    args: Tuple[Tuple[int, Scalar], ...] = ()
    grid: Optional[Dim3] = None
    block: Optional[Dim3] = None
    #: "const": dimension reads become constants; "assume": they only get ranges
    dims_mode: str = "const"
    launch_bounds: Optional[Tuple[int, int]] = None

    @property
    def has_dims(self) -> bool:
        return self.grid is not None and self.block is not None

    def __bool__(self) -> bool:
        return bool(self.args) or self.has_dims or self.launch_bounds is not None

    def describe(self) -> Dict[str, object]:
        d: Dict[str, object] = {}
        if self.args:
            # floats by their exact bits, so 0.1 and 0.1+1ulp never share a code hash
            d["args"] = {str(i): (v.hex() if isinstance(v, float) else v) for i, v in self.args}
        if self.has_dims:
            d["dims" if self.dims_mode == "const" else "dims_assume"] = {"grid": list(self.grid), "block": list(self.block)}
        if self.launch_bounds is not None:
            d["launch_bounds"] = list(self.launch_bounds)
        return d


def _dim3(v, what: str) -> Dim3:
    t = tuple(int(x) for x in v)
    if len(t) != 3 or min(t) < 1:
        raise ConfigurationError(f"{what} dimensions {t} must be three positive integers")
    return t  # type: ignore[return-value]


def make_specialization(
    params: Optional[Sequence[ParamInfo]] = None,
    args: Optional[Mapping[int, object]] = None,
    grid=None,
    block=None,
    dims_mode: str = "const",
    launch_bounds: Optional[Tuple[int, int]] = None,
) -> Specialization:
    """Validate and canonicalize what to specialize (argument values need the kernel's `params`)."""
    canon: Tuple[Tuple[int, Scalar], ...] = ()
    if args:
        if params is None:
            raise ValueError("specializing arguments needs the kernel's parameters")
        canon = tuple(canonical_args(list(params), dict(args)).items())
    if (grid is None) != (block is None):
        raise ConfigurationError("specializing dimensions needs both grid and block")
    if dims_mode not in ("const", "assume"):
        raise ValueError(f"dims_mode {dims_mode!r} must be 'const' or 'assume'")
    g = _dim3(grid, "grid") if grid is not None else None
    b = _dim3(block, "block") if block is not None else None
    lb = None
    if launch_bounds is not None:
        max_threads, min_blocks = int(launch_bounds[0]), int(launch_bounds[1])
        if not 1 <= max_threads <= MAX_THREADS:
            raise ConfigurationError(f"max_threads={max_threads} must be 1..{MAX_THREADS} (launch bounds)")
        if min_blocks < 0:
            raise ConfigurationError(f"min_blocks_per_sm={min_blocks} must not be negative (launch bounds)")
        lb = (max_threads, min_blocks)
    return Specialization(canon, g, b, dims_mode, lb)


# ----------------------------------------------------------------------------------------------
# text rewriting


def _kernel_span(text: str, kernel: str) -> Tuple[int, int, int]:
    """(start of the define line, end of it, end of the body) of the kernel's definition."""
    m = re.search(r"^define [^\n]*?@" + re.escape(symbol_token(kernel)) + r"\(", text, re.M)
    if m is None:
        raise CompileError(f"kernel {kernel!r}: no definition in the module's IR")
    line_end = text.index("\n", m.start())
    body_end = text.index("\n}\n", line_end) + 2
    return m.start(), line_end, body_end


def _params_close(line: str, open_paren: int) -> int:
    depth, i, n = 0, open_paren, len(line)
    while i < n:
        c = line[i]
        if c == '"':
            i = line.index('"', i + 1)
            while line[i - 1] == "\\":
                i = line.index('"', i + 1)
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise CompileError("unbalanced parameter list in a define line")


def _arg_tokens(fn: llvm.ValueRef) -> List[str]:
    out, unnamed = [], 0
    for arg in fn.arguments:
        if arg.name:
            out.append("%" + symbol_token(arg.name))
        else:
            out.append(f"%{unnamed}")
            unnamed += 1
    return out


def _rewrite_args(text: str, kernel: str, fn: llvm.ValueRef, params: Sequence[ParamInfo], args) -> str:
    tokens = _arg_tokens(fn)
    subst = {tokens[i]: ir_constant(params[i], v) for i, v in args}
    _, line_end, body_end = _kernel_span(text, kernel)
    body = _TOKEN.sub(lambda m: subst.get(m.group(0), m.group(0)), text[line_end:body_end])
    return text[:line_end] + body + text[body_end:]


def _i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >> 31 else v


def _range(lo: int, hi: int) -> str:
    return f"range(i32 {_i32(lo)}, {_i32(hi)}) "


def _rewrite_dims(text: str, kernel: str, grid: Dim3, block: Dim3, mode: str) -> str:
    def repl(m: re.Match) -> str:
        reg, axis = m.group("reg"), _AXES.index(m.group("axis"))
        extent = (block if reg in ("tid", "ntid") else grid)[axis]
        lhs, rest = m.group("indent") + (m.group("lhs") or ""), m.group("rest")
        if reg.startswith("n") and mode == "const":
            dbg = "".join(_DBG_ATTACHMENT.findall(rest))
            return f"{lhs}add i32 {extent}, 0{dbg}" if m.group("lhs") else ""
        lo, hi = (extent, extent + 1) if reg.startswith("n") else (0, extent)
        ret = _RANGE_ATTR.sub("", m.group("ret"))
        call = f"i32 @llvm.nvvm.read.ptx.sreg.{reg}.{m.group('axis')}()"
        return f"{lhs}{m.group('tail')}call {_range(lo, hi)}{ret}{call}{rest}"

    return rewrite_in_scope(text, kernel, lambda body: _SREG_CALL.sub(repl, body))


def _rewrite_launch_bounds(text: str, kernel: str, max_threads: int, min_blocks: int) -> str:
    start, line_end, _ = _kernel_span(text, kernel)
    line = text[start:line_end]
    close = _params_close(line, line.index("@" + symbol_token(kernel) + "(") + len(symbol_token(kernel)) + 1)
    head, tail = line[: close + 1], line[close + 1 :]
    groups = {int(n): body for n, body in _ATTR_GROUP.findall(text)}
    new = max(groups, default=-1) + 1
    ref = re.search(r" #(\d+)\b", tail)
    body = _LAUNCH_BOUND_ATTRS.sub("", groups.get(int(ref.group(1)), "") if ref else "").strip()
    bounds = f'"nvvm.maxntid"="{max_threads}"'
    if min_blocks > 0:
        bounds += f' "nvvm.minctasm"="{min_blocks}"'
    if ref:
        tail = tail[: ref.start()] + f" #{new}" + tail[ref.end() :]
    else:
        kw = re.match(r"(?: (?:local_unnamed_addr|unnamed_addr|addrspace\(\d+\)))*", tail)
        tail = tail[: kw.end()] + f" #{new}" + tail[kw.end() :]
    text = text[:start] + head + tail + text[line_end:]
    return text.rstrip("\n") + f"\n\nattributes #{new} = {{ {(body + ' ' + bounds).strip()} }}\n"


def _retarget(text: str, arch: str) -> str:
    text = _TARGET_CPU.sub(f'"target-cpu"="{arch}"', text)
    return _TARGET_SM_FEATURE.sub(f"+{arch}", text)


def rewrite_ir(
    text: str,
    kernel: str,
    spec: Specialization,
    fn: Optional[llvm.ValueRef] = None,
    params: Optional[Sequence[ParamInfo]] = None,
    arch: Optional[str] = None,
) -> str:
    """Apply `spec` (and, with `arch`, retarget every function to it) to printed IR."""
    if spec.args:
        if fn is None or params is None:
            raise ValueError("specializing arguments needs the kernel function and its parameters")
        text = _rewrite_args(text, kernel, fn, params, spec.args)
    if spec.has_dims:
        text = _rewrite_dims(text, kernel, spec.grid, spec.block, spec.dims_mode)
    if spec.launch_bounds is not None:
        text = _rewrite_launch_bounds(text, kernel, *spec.launch_bounds)
    if arch is not None:
        text = _retarget(text, check_arch(arch))
    return text


def reparse(text: str, kernel: str) -> llvm.ModuleRef:
    try:
        return llvm.parse_assembly(text, context=new_context())
    except RuntimeError as e:
        raise CompileError(f"kernel {kernel!r}: specialized IR does not parse ({e}); this is a bug in mneme.ir") from None


def specialize(mod: llvm.ModuleRef, kernel: str, spec: Specialization, arch: Optional[str] = None) -> llvm.ModuleRef:
    """A new module with `spec` applied (one print/parse round trip); `mod` is left as it was."""
    fn = kernel_function(mod, kernel)
    params = kernel_params(mod, kernel) if spec.args else None
    return reparse(rewrite_ir(str(mod), kernel, spec, fn, params, arch), kernel)


# ----------------------------------------------------------------------------------------------
# one function per specialization (each returns a new module)


def specialize_args(mod: llvm.ModuleRef, kernel: str, values: Mapping[int, object]) -> llvm.ModuleRef:
    """Replace the uses of scalar parameters {index: value} with constants (ints, floats or raw bytes)."""
    return specialize(mod, kernel, make_specialization(kernel_params(mod, kernel), args=values))


def specialize_dims(mod: llvm.ModuleRef, kernel: str, grid, block) -> llvm.ModuleRef:
    """Block/grid dimension reads become constants; thread/block indices are bounded by them."""
    return specialize(mod, kernel, make_specialization(grid=grid, block=block))


def specialize_dims_assume(mod: llvm.ModuleRef, kernel: str, grid, block) -> llvm.ModuleRef:
    """The same knowledge as `specialize_dims`, as range attributes on the reads instead of constants."""
    return specialize(mod, kernel, make_specialization(grid=grid, block=block, dims_mode="assume"))


def set_launch_bounds(mod: llvm.ModuleRef, kernel: str, max_threads: int, min_blocks_per_sm: int = 0) -> llvm.ModuleRef:
    """Launch bounds as LLVM 22's NVPTX reads them: "nvvm.maxntid"/"nvvm.minctasm" kernel attributes."""
    return specialize(mod, kernel, make_specialization(launch_bounds=(max_threads, min_blocks_per_sm)))
