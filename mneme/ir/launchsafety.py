"""Which launch quantities a kernel's code depends on, read from its IR (no GPU).

A tuner that reshapes a launch must know what the kernel assumes about it. `analyze_launch` reads, from the
kernel and every function it calls (after a light `default<O1>` on a clone, so clang's
`__fetch_builtin_*` wrappers and allocas are gone):

- the special registers it reads: threadIdx (`tid`), blockDim (`ntid`), blockIdx (`ctaid`), gridDim (`nctaid`)
  per axis, and cluster registers;
- its statically sized `__shared__` arrays (addrspace(3) globals) and which threadIdx axes reach their
  addresses (a backward slice from every address derived from the array);
- launch bounds: `"nvvm.maxntid"`, `"nvvm.reqntid"`, `"nvvm.cluster_dim"` attributes (and the older
  `!nvvm.annotations`);
- cooperative launches: grid synchronization reads the grid workspace from `%envreg1/2`;
- how blockIdx is scaled: `blockIdx.y * 32` (a constant, or any value not derived from blockDim.y) means each
  block owns a compile-time tile along y, whatever blockDim.y is; `blockIdx.x * blockDim.x` means the block's
  share follows its shape.

`LaunchFacts.rules(block)` turns the facts into what a block shape must keep (LaunchRules): axes fixed to the
recorded extent, a thread cap, and whether block.x must stay a whole number of warps. Each rule carries the
reason a person can check against the source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import llvmlite.binding as llvm

from mneme.config import dim3
from mneme.errors import MnemeError

AXES = "xyz"
WARP = 32
_NAME = r'(?:"(?:[^"\\]|\\.)*"|[-a-zA-Z$._0-9]+)'
_LOCAL = re.compile(r"%" + _NAME)
_DEFINE = re.compile(r"^define [^\n]*?@(" + _NAME + r")\(", re.M)
_CALLEE = re.compile(r"@(" + _NAME + r")\(")
_SREG = re.compile(r"@llvm\.nvvm\.read\.ptx\.sreg\.(tid|ntid|ctaid|nctaid)\.([xyz])\(\)")
_CLUSTER_SREG = re.compile(r"@llvm\.nvvm\.read\.ptx\.sreg\.(?:cluster|ncluster)\w*")
_ENVREG = re.compile(r"%envreg[12]\b")
_SHARED = re.compile(r"^@(" + _NAME + r") = [^\n]*?addrspace\(3\) global (\[[^=\n]*?\]) ", re.M)
_ARRAY = re.compile(r"\[(\d+) x ")
_ELEM_BYTES = {"i8": 1, "i16": 2, "half": 2, "bfloat": 2, "i32": 4, "float": 4, "i64": 8, "double": 8}
_ATTR_GROUP = re.compile(r"^attributes #(\d+) = \{ (.*) \}$", re.M)
_ATTR = re.compile(r'"nvvm\.(maxntid|reqntid|cluster_dim|minctasm)"="([^"]*)"')
_DEF_LINE = re.compile(r"^\s*(%" + _NAME + r") = (.*)$")


@dataclass
class SharedTile:
    """A statically sized __shared__ array: its dimensions (outermost first), bytes, and the threadIdx axes
    that reach its addresses."""

    name: str
    shape: Tuple[int, ...]
    bytes: int
    tid_axes: str = ""

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class LaunchFacts:
    """What the IR says about the kernel's dependence on its launch (see the module docstring)."""

    kernel: str
    reads: Dict[str, str] = field(default_factory=dict)  # sreg -> axes read, e.g. {"ntid": "x", "tid": "xy"}
    tiles: List[SharedTile] = field(default_factory=list)
    max_threads: Optional[int] = None  # "nvvm.maxntid" (__launch_bounds__)
    req_threads: Optional[Tuple[int, ...]] = None  # "nvvm.reqntid"
    cluster: Optional[str] = None  # why the kernel is tied to a cluster launch
    cooperative: bool = False
    #: axis -> what blockIdx is multiplied by when that is not blockDim of the axis ("32", "a value not derived
    #: from blockDim.x"); axes also scaled by their blockDim somewhere are left out
    tile_scale: Dict[str, str] = field(default_factory=dict)
    #: axes whose blockIdx alone indexes a store (one result per block: a reduction's partial sums), so the
    #: results' layout and values depend on the block's extent along them
    block_outputs: str = ""
    analyzed: str = "default<O1> clone"

    def read(self, reg: str, axis: str) -> bool:
        return axis in self.reads.get(reg, "")

    def rules(self, block) -> "LaunchRules":
        """What a block shape must keep, for a kernel recorded with `block`."""
        rec = dim3.from_dict(block)
        r = LaunchRules(recorded=rec)
        if self.cooperative:
            r.fix_launch("it synchronizes the whole grid (cooperative launch, reads the grid workspace)")
        if self.cluster:
            r.fix_launch(f"it is a cluster kernel ({self.cluster})")
        if self.req_threads:
            r.fix_launch(f"__launch_bounds__/reqntid requires {self.req_threads} threads")
        for d, axis in enumerate(AXES):
            extent = int(list(rec)[d])
            if self.read("ntid", axis):
                if axis in self.tile_scale:
                    r.fix_axis(d, f"blockIdx.{axis} is multiplied by {self.tile_scale[axis]}, never by blockDim.{axis}: "
                                  f"each block's tile along {axis} is fixed in the code, so block.{axis} stays {extent}")
                elif axis in self.block_outputs:
                    r.fix_axis(d, f"blockIdx.{axis} alone indexes a store (one result per block, like a reduction's "
                                  f"partial sums): another block.{axis} changes the results, so it stays {extent}")
                continue
            uses_tid = self.read("tid", axis)
            if extent == 1 and not uses_tid:
                continue  # an unspanned axis the code ignores: the launch policy decides
            why = f"blockDim.{axis} is never read"
            tiles = [t.name for t in self.tiles if axis in t.tid_axes]
            if tiles:
                why += f" and threadIdx.{axis} indexes the compile-time-sized shared array(s) {', '.join(tiles)}"
            elif uses_tid:
                why += f", so threadIdx.{axis} is combined with the recorded extent {extent} as a constant"
            r.fix_axis(d, f"{why}: block.{axis} stays {extent}")
        free_tiles = [t for t in self.tiles if any(a in t.tid_axes for a in AXES if r.free(AXES.index(a)))]
        if free_tiles:
            cap = min(t.elements for t in free_tiles)
            r.cap(cap, f"threadIdx indexes shared array {min(free_tiles, key=lambda t: t.elements).name} of {cap} elements")
        if self.max_threads:
            r.cap(self.max_threads, f"__launch_bounds__ allows at most {self.max_threads} threads")
        if r.free(0) and self.read("tid", "x"):
            r.x_warps = True
            r.notes.append("block.x is the coalescing dimension (threadIdx.x is read): it stays a multiple of 32 "
                           f"or the recorded {rec.x}")
        return r

    def describe(self) -> Dict[str, object]:
        return {
            "kernel": self.kernel,
            "reads": {k: v for k, v in self.reads.items() if v},
            "shared_tiles": [{"name": t.name, "shape": list(t.shape), "bytes": t.bytes, "threadIdx": t.tid_axes}
                             for t in self.tiles],
            "max_threads": self.max_threads,
            "req_threads": list(self.req_threads) if self.req_threads else None,
            "cluster": self.cluster,
            "cooperative": self.cooperative,
            "tile_scale": dict(self.tile_scale),
            "block_outputs": self.block_outputs,
            "analyzed": self.analyzed,
        }


@dataclass
class LaunchRules:
    """Constraints on block shapes derived from LaunchFacts; `why(block)` says what a shape breaks."""

    recorded: dim3
    fixed: Dict[int, str] = field(default_factory=dict)  # axis -> reason
    max_threads: Optional[int] = None
    cap_reason: str = ""
    x_warps: bool = False
    launch_fixed: str = ""
    notes: List[str] = field(default_factory=list)

    def fix_axis(self, d: int, why: str) -> None:
        self.fixed.setdefault(d, why)

    def fix_launch(self, why: str) -> None:
        if not self.launch_fixed:
            self.launch_fixed = why
        for d in range(3):
            self.fix_axis(d, f"the launch stays as recorded: {why}")

    def free(self, d: int) -> bool:
        return d not in self.fixed

    def cap(self, n: int, why: str) -> None:
        if self.max_threads is None or n < self.max_threads:
            self.max_threads, self.cap_reason = int(n), why

    def why(self, block, soft: bool = True) -> Optional[str]:
        """None when `block` is allowed; else the first rule it breaks. `soft=False` skips the coalescing rule."""
        b = [int(v) for v in dim3.from_dict(block)]
        rec = [int(v) for v in self.recorded]
        for d, reason in sorted(self.fixed.items()):
            if b[d] != rec[d]:
                return reason
        if self.max_threads is not None and b[0] * b[1] * b[2] > max(self.max_threads, rec[0] * rec[1] * rec[2]):
            return f"{b[0] * b[1] * b[2]} threads > {self.max_threads}: {self.cap_reason}"
        if soft and self.x_warps and b[0] % WARP and b[0] != rec[0]:
            return f"block.x={b[0]} is not a multiple of {WARP} (threadIdx.x is the coalescing dimension)"
        return None

    def lines(self) -> List[str]:
        out = [f"block.{AXES[d]} fixed: {why}" for d, why in sorted(self.fixed.items())]
        if self.launch_fixed:
            out = [f"launch fixed: {self.launch_fixed}"]
        if self.max_threads is not None:
            out.append(f"threads per block <= {self.max_threads}: {self.cap_reason}")
        out += self.notes
        if not out:
            out.append("no launch quantity is fixed by the code")
        return out

    def describe(self) -> Dict[str, object]:
        return {"fixed": {AXES[d]: why for d, why in sorted(self.fixed.items())}, "max_threads": self.max_threads,
                "x_warp_multiple": self.x_warps, "launch_fixed": self.launch_fixed or None, "lines": self.lines()}


# ----------------------------------------------------------------------------------------------
# reading the IR


def _bodies(text: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for m in _DEFINE.finditer(text):
        end = text.find("\n}\n", m.end())
        out[m.group(1).strip('"')] = text[m.start(): end if end >= 0 else len(text)]
    return out


def _reachable(bodies: Dict[str, str], kernel: str) -> List[str]:
    seen, todo = {kernel}, [kernel]
    while todo:
        for callee in _CALLEE.findall(bodies.get(todo.pop(), "")):
            name = callee.strip('"')
            if name in bodies and name not in seen:
                seen.add(name)
                todo.append(name)
    return sorted(seen)


def _shape(ty: str) -> Tuple[Tuple[int, ...], int]:
    dims = tuple(int(n) for n in _ARRAY.findall(ty))
    elem = ty.replace("[", " ").replace("]", " ").split()[-1]
    size = _ELEM_BYTES.get(elem, 4)
    n = 1
    for d in dims:
        n *= d
    return dims, n * size


def _defs(body: str) -> Dict[str, str]:
    """One function's SSA values: name -> the instruction that defines it (metadata attachments dropped)."""
    defs: Dict[str, str] = {}
    for line in body.splitlines():
        m = _DEF_LINE.match(line)
        if m:
            defs[m.group(1)] = m.group(2).split(", !")[0]
    return defs


def _tid_axes_of(defs: Dict[str, str], tile: str) -> str:
    """threadIdx axes that reach an address derived from the shared global `tile` in one function (`_defs`)."""
    token = "@" + tile
    derived: Set[str] = set()
    changed = True
    while changed:  # pointers derived from the tile (GEP chains, casts, phis, selects)
        changed = False
        for name, rhs in defs.items():
            if name in derived:
                continue
            if re.search(re.escape(token) + r"\b", rhs) or (
                rhs.startswith(("getelementptr", "phi", "select", "addrspacecast", "bitcast"))
                and any(t in derived for t in _LOCAL.findall(rhs))
            ):
                derived.add(name)
                changed = True
    axes: Set[str] = set()
    seen: Set[str] = set(derived)
    todo = [t for n in derived for t in _LOCAL.findall(defs[n]) if t not in derived]
    # direct uses of the global in loads/stores without a GEP (element 0): nothing to slice
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        rhs = defs.get(name)
        if rhs is None:
            continue
        m = _SREG.search(rhs)
        if m and m.group(1) == "tid":
            axes.add(m.group(2))
            continue
        todo.extend(t for t in _LOCAL.findall(rhs) if t not in seen)
    return "".join(a for a in AXES if a in axes)


_SCALE = re.compile(r"^(mul|shl)\b[^%]*?(%" + _NAME + r"), (%" + _NAME + r"|-?\d+)\s*$")
_CAST = ("zext", "sext", "trunc")


def _sregs(defs: Dict[str, str]) -> Dict[str, Tuple[str, str]]:
    """name -> (special register, axis) of the values that are one, through integer casts."""
    sreg: Dict[str, Tuple[str, str]] = {}
    for name, rhs in defs.items():
        m = _SREG.search(rhs)
        if m:
            sreg[name] = (m.group(1), m.group(2))
    changed = True
    while changed:
        changed = False
        for name, rhs in defs.items():
            if name not in sreg and rhs.startswith(_CAST):
                ops = [t for t in _LOCAL.findall(rhs) if t in sreg]
                if ops:
                    sreg[name] = sreg[ops[0]]
                    changed = True
    return sreg


_STORE_PTR = re.compile(r"^\s*store\b.*, ptr (%" + _NAME + r")")
_GEP = re.compile(r"^getelementptr\b")
_ELEM_SCALE = re.compile(r"^(?:shl|mul)\b[^%]*(%" + _NAME + r"), \d+\s*$")


def _block_outputs(defs: Dict[str, str], sreg: Dict[str, Tuple[str, str]], body: str) -> Set[str]:
    """In one function (`_defs`, `_sregs`): the axes whose blockIdx, alone (through casts, or scaled by a
    constant element size in a byte-offset GEP), is the last index of a store's address."""
    def ctaid_axis(name: str) -> Optional[str]:
        for _ in range(4):
            if sreg.get(name, ("",))[0] == "ctaid":
                return sreg[name][1]
            m = _ELEM_SCALE.match(defs.get(name, ""))
            if not m:
                return None
            name = m.group(1)
        return None

    out: Set[str] = set()
    for line in body.splitlines():
        m = _STORE_PTR.match(line)
        gep = defs.get(m.group(1), "") if m else ""
        if not _GEP.match(gep):
            continue
        ops = _LOCAL.findall(gep.split(" ptr ", 1)[-1])
        axis = ctaid_axis(ops[-1]) if len(ops) >= 2 else None
        if axis:
            out.add(axis)
    return out


def _block_scales(defs: Dict[str, str], sreg: Dict[str, Tuple[str, str]]) -> Tuple[Dict[str, str], Set[str]]:
    """In one function (`_defs`, `_sregs`): (axis -> what blockIdx.axis is multiplied by, when not derived from
    blockDim.axis; axes whose blockIdx is multiplied by a value derived from their blockDim)."""

    def from_ntid(name: str, axis: str) -> bool:
        seen, todo = set(), [name]
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            if sreg.get(n) == ("ntid", axis):
                return True
            todo.extend(_LOCAL.findall(defs.get(n, "")))
        return False

    const: Dict[str, str] = {}
    by_ntid: Set[str] = set()
    for rhs in defs.values():
        m = _SCALE.match(rhs)
        if not m:
            continue
        op, a, b = m.groups()
        for mine, other in ((a, b), (b, a)) if op == "mul" else ((a, b),):
            reg = sreg.get(mine)
            if not reg or reg[0] != "ctaid":
                continue
            axis = reg[1]
            if other.startswith("%") and from_ntid(other, axis):
                by_ntid.add(axis)
            elif not other.startswith("%"):
                const.setdefault(axis, str(int(other) if op == "mul" else 1 << int(other)))
            else:
                const.setdefault(axis, f"a value not derived from blockDim.{axis}")
    return const, by_ntid


def _bounds(text: str, kernel_body: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    head = kernel_body.split("\n", 1)[0]
    groups = dict(_ATTR_GROUP.findall(text))
    for ref in re.findall(r" #(\d+)\b", head[head.rfind(")"):]):
        out.update(dict(_ATTR.findall(groups.get(ref, ""))))
    out.update(dict(_ATTR.findall(head)))
    return out


def _annotations(text: str, kernel: str) -> Dict[str, str]:
    """Older `!nvvm.annotations = !{!{ptr @k, !"maxntidx", i32 256}}` form."""
    out: Dict[str, List[str]] = {}
    for m in re.finditer(r'!\{ptr @' + re.escape(kernel) + r'"?, (!"[^"]+", i32 \d+(?:, !"[^"]+", i32 \d+)*)\}', text):
        for key, val in re.findall(r'!"(\w+)", i32 (\d+)', m.group(1)):
            out.setdefault(key, []).append(val)
    res: Dict[str, str] = {}
    for kind, prefix in (("maxntid", "maxntid"), ("reqntid", "reqntid"), ("cluster_dim", "cluster_dim_")):
        vals = [out.get(prefix + a, [None])[0] for a in AXES]
        if any(vals):
            res[kind] = ",".join(v or "1" for v in vals)
    return res


def _ints(text: str) -> Tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"\d+", text))


def analyze_text(text: str, kernel: str, analyzed: str = "as given") -> LaunchFacts:
    """LaunchFacts from printed IR (best after inlining; see analyze_launch)."""
    bodies = _bodies(text)
    if kernel not in bodies:
        raise MnemeError(f"launch analysis: kernel {kernel!r} has no definition in the module")
    funcs = _reachable(bodies, kernel)
    defs = {f: _defs(bodies[f]) for f in funcs}  # each function's values, read once for the slices below
    reads: Dict[str, Set[str]] = {r: set() for r in ("tid", "ntid", "ctaid", "nctaid")}
    cluster, coop = None, False
    scale: Dict[str, str] = {}
    by_ntid: Set[str] = set()
    outputs: Set[str] = set()
    for f in funcs:
        body = bodies[f]
        sreg = _sregs(defs[f])
        outputs |= _block_outputs(defs[f], sreg, body)
        const, scaled = _block_scales(defs[f], sreg)
        for axis, what in const.items():
            scale.setdefault(axis, what)
        by_ntid |= scaled
        for reg, axis in _SREG.findall(body):
            reads[reg].add(axis)
        if _CLUSTER_SREG.search(body):
            cluster = "it reads cluster special registers"
        if _ENVREG.search(body):
            coop = True
    tiles = []
    for m in _SHARED.finditer(text):
        name = m.group(1).strip('"')
        shape, size = _shape(m.group(2))
        if not shape:
            continue
        axes = "".join(sorted(set("".join(_tid_axes_of(defs[f], m.group(1)) for f in funcs))))
        used = any(re.search("@" + re.escape(m.group(1)) + r"\b", bodies[f]) for f in funcs)
        if used:
            tiles.append(SharedTile(name, shape, size, "".join(a for a in AXES if a in axes)))
    attrs = {**_annotations(text, kernel), **_bounds(text, bodies[kernel])}
    max_threads = req = None
    if attrs.get("maxntid"):
        n = 1
        for v in _ints(attrs["maxntid"]):
            n *= v
        max_threads = n
    if attrs.get("reqntid"):
        req = _ints(attrs["reqntid"]) + (1,) * (3 - len(_ints(attrs["reqntid"])))
    if attrs.get("cluster_dim") and any(v > 1 for v in _ints(attrs["cluster_dim"])):
        cluster = f"__cluster_dims__({attrs['cluster_dim']})"
    return LaunchFacts(
        kernel=kernel, reads={r: "".join(a for a in AXES if a in s) for r, s in reads.items()}, tiles=tiles,
        max_threads=max_threads, req_threads=req, cluster=cluster, cooperative=coop,
        tile_scale={a: w for a, w in sorted(scale.items()) if a not in by_ntid}, analyzed=analyzed,
        block_outputs="".join(a for a in AXES if a in outputs),
    )


def analyze_launch(mod: llvm.ModuleRef, kernel: str, pipeline: str = "default<O1>") -> LaunchFacts:
    """LaunchFacts of `kernel` in `mod` (left unchanged): read after `pipeline` on a clone, so reads hidden in
    inlined helpers and allocas are seen as the optimized code sees them (reads the optimizer removes do not
    count). Falls back to the IR as given if the pipeline fails."""
    from mneme.ir.pipeline import optimize

    try:
        clone = mod.clone()
        optimize(clone, pipeline)
        return analyze_text(str(clone), kernel, f"{pipeline} clone")
    except (RuntimeError, MnemeError):
        return analyze_text(str(mod), kernel, "unoptimized IR (the pipeline failed)")


def rules_for(facts: Optional[LaunchFacts], block: Sequence[int]) -> Optional[LaunchRules]:
    return facts.rules(block) if facts is not None else None

