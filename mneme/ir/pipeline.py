"""Optimization pipelines written in opt's syntax, run through llvmlite's new pass manager.

llvmlite has no entry point for a textual pipeline, so this module parses one:

    pipeline := element ("," element)*
    element  := "default<" LEVEL ">" | PASS | ("module" | "function" | "loop") "(" pipeline ")"

`default<O0..O3>` is LLVM's own per-module pipeline (PassBuilder with a PipelineTuningOptions of that
speed level). llvmlite 0.50 cannot build the Os/Oz pipelines (its builder takes a speed level
only), so `default<Os>`/`default<Oz>` run the O2 pipeline the way clang prepares for them: every
function gets `optsize` (Oz: also `minsize`) and the inliner threshold drops to LLVM's size
thresholds (50 and 5). Single passes use opt's names and map onto llvmlite's `add_*_pass`; the
adaptors check that a pass fits its nesting (no module pass inside `function(...)`, only loop
passes inside `loop(...)`) and then run in order, as opt runs them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

import llvmlite.binding as llvm

from mneme.errors import PipelineError
from mneme.ir.target import pass_builder, target_machine

MODULE, FUNCTION, LOOP = "module", "function", "loop"

#: opt name -> (innermost level it runs at, llvmlite ModulePassManager method)
PASSES = {
    # module passes
    "always-inline": (MODULE, "add_always_inliner_pass"),
    "argpromotion": (MODULE, "add_argument_promotion_pass"),
    "constmerge": (MODULE, "add_constant_merge_pass"),
    "deadargelim": (MODULE, "add_dead_arg_elimination_pass"),
    "function-attrs": (MODULE, "add_post_order_function_attributes_pass"),
    "globaldce": (MODULE, "add_global_dead_code_eliminate_pass"),
    "globalopt": (MODULE, "add_global_opt_pass"),
    "ipsccp": (MODULE, "add_ipsccp_pass"),
    "mergefunc": (MODULE, "add_merge_functions_pass"),
    "partial-inliner": (MODULE, "add_partial_inliner_pass"),
    "rpo-function-attrs": (MODULE, "add_rpo_function_attrs_pass"),
    "strip-dead-prototypes": (MODULE, "add_strip_dead_prototype_pass"),
    # function passes
    "adce": (FUNCTION, "add_aggressive_dce_pass"),
    "aggressive-instcombine": (FUNCTION, "add_aggressive_instcombine_pass"),
    "break-crit-edges": (FUNCTION, "add_break_critical_edges_pass"),
    "dce": (FUNCTION, "add_dead_code_elimination_pass"),
    "dse": (FUNCTION, "add_dead_store_elimination_pass"),
    "instcombine": (FUNCTION, "add_instruction_combine_pass"),
    "jump-threading": (FUNCTION, "add_jump_threading_pass"),
    "lcssa": (FUNCTION, "add_lcssa_pass"),
    "loop-simplify": (FUNCTION, "add_loop_simplify_pass"),
    "loop-unroll": (FUNCTION, "add_loop_unroll_pass"),
    "lower-switch": (FUNCTION, "add_lower_switch_pass"),
    "memcpyopt": (FUNCTION, "add_mem_copy_opt_pass"),
    "mergereturn": (FUNCTION, "add_unify_function_exit_nodes_pass"),
    "newgvn": (FUNCTION, "add_new_gvn_pass"),
    "reassociate": (FUNCTION, "add_reassociate_pass"),
    "reg2mem": (FUNCTION, "add_register_to_memory_pass"),
    "sccp": (FUNCTION, "add_sccp_pass"),
    "simplifycfg": (FUNCTION, "add_simplify_cfg_pass"),
    "sink": (FUNCTION, "add_sinking_pass"),
    "sroa": (FUNCTION, "add_sroa_pass"),
    "tailcallelim": (FUNCTION, "add_tail_call_elimination_pass"),
    # loop passes
    "loop-deletion": (LOOP, "add_loop_deletion_pass"),
    "loop-reduce": (LOOP, "add_loop_strength_reduce_pass"),
    "loop-rotate": (LOOP, "add_loop_rotate_pass"),
    "loop-unroll-and-jam": (LOOP, "add_loop_unroll_and_jam_pass"),
}
#: accepted, but not offered to the tuner: it changes no code
CHECKS = {"verify": (MODULE, "add_verifier")}
#: passes llvmlite has that are left out on purpose: printers/viewers (write files, open windows),
#: internalize (would hide the kernel itself), lower-atomic (breaks GPU atomics), and passes that
#: only rename or strip symbols
LEVELS = {"O0": (0, 0), "O1": (1, 0), "O2": (2, 0), "O3": (3, 0), "Os": (2, 1), "Oz": (2, 2)}
_SIZE_INLINE_THRESHOLD = {1: 50, 2: 5}
_ADAPTORS = (MODULE, FUNCTION, LOOP)
_ALLOWED_IN = {MODULE: {MODULE, FUNCTION, LOOP}, FUNCTION: {FUNCTION, LOOP}, LOOP: {LOOP}}


def available_passes() -> List[str]:
    """The single passes a pipeline may name (what the tuner draws from), sorted."""
    return sorted(PASSES)


def _valid_names() -> str:
    levels = ", ".join(f"default<{lv}>" for lv in LEVELS)
    return f"valid: {levels}; passes: {', '.join(sorted(PASSES) + sorted(CHECKS))}; nesting: module(...), function(...), loop(...)"


@dataclass(frozen=True)
class Stage:
    """One step: a default pipeline (`level` set) or a run of single passes (`passes` set)."""

    level: Optional[str] = None
    passes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Pipeline:
    """A parsed pipeline: `text` as given, `stages` as they run."""

    text: str
    stages: Tuple[Stage, ...]

    @property
    def canonical(self) -> str:
        """What runs, spelled one way (`O3` and `default<O3>`, or `function(a,b)` and `a,b`, run the
        same passes in the same order): what the code hash sees."""
        return ",".join(f"default<{s.level}>" if s.level else ",".join(s.passes) for s in self.stages)


_TOKEN = re.compile(r"\s*(?:([A-Za-z0-9][-A-Za-z0-9_.]*)(?:<([^<>()]*)>)?|([(),]))")


def _tokens(text: str) -> List[Tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise PipelineError(f"pipeline {text!r}: unexpected {text[pos:].strip()[:20]!r} at offset {pos}; {_valid_names()}")
        if m.group(3):
            out.append(("punct", m.group(3), pos))
        else:
            out.append(("name", m.group(1) + (f"<{m.group(2)}>" if m.group(2) is not None else ""), pos))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.flat: List[Tuple[str, Optional[str]]] = []  # ("level", L) or ("pass", name)

    def error(self, what: str) -> PipelineError:
        return PipelineError(f"pipeline {self.text!r}: {what}; {_valid_names()}")

    def peek(self) -> Optional[Tuple[str, str, int]]:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def parse(self) -> None:
        if not self.toks:
            raise self.error("empty pipeline")
        self.sequence(MODULE)
        if self.peek() is not None:
            raise self.error(f"unexpected {self.peek()[1]!r} at offset {self.peek()[2]}")

    def sequence(self, scope: str) -> None:
        while True:
            self.element(scope)
            tok = self.peek()
            if tok is None or tok[1] != ",":
                return
            self.i += 1

    def element(self, scope: str) -> None:
        tok = self.peek()
        if tok is None or tok[0] != "name":
            raise self.error("expected a pass name" + (f" at offset {tok[2]}, got {tok[1]!r}" if tok else " at the end"))
        self.i += 1
        name = tok[1]
        nxt = self.peek()
        if nxt is not None and nxt[1] == "(":
            if name not in _ADAPTORS:
                raise self.error(f"{name!r} cannot nest passes (only module, function, loop can)")
            if name not in _ALLOWED_IN[scope]:
                raise self.error(f"{name}(...) cannot appear inside {scope}(...)")
            self.i += 1
            self.sequence(name)
            close = self.peek()
            if close is None or close[1] != ")":
                raise self.error(f"missing ')' for {name}( at offset {tok[2]}")
            self.i += 1
            return
        m = re.fullmatch(r"default<(\w+)>", name)
        if m or name in LEVELS:
            level = m.group(1) if m else name
            if level not in LEVELS:
                raise self.error(f"unknown optimization level {level!r}")
            if scope != MODULE:
                raise self.error(f"default<{level}> is a module pipeline and cannot appear inside {scope}(...)")
            self.flat.append(("level", level))
            return
        if "<" in name:
            raise self.error(f"pass parameters are not supported ({name!r}); write the bare pass name")
        entry = PASSES.get(name) or CHECKS.get(name)
        if entry is None:
            raise self.error(f"unknown pass {name!r}")
        if entry[0] not in _ALLOWED_IN[scope]:
            raise self.error(f"{name!r} is a {entry[0]} pass and cannot appear inside {scope}(...)")
        self.flat.append(("pass", name))


@functools.lru_cache(maxsize=512)
def parse_pipeline(text: str) -> Pipeline:
    """Parse a pipeline string; PipelineError (listing the valid names) when it is malformed."""
    if not isinstance(text, str):
        raise PipelineError(f"pipeline must be a string, got {type(text).__name__}; {_valid_names()}")
    p = _Parser(text)
    p.parse()
    stages: List[Stage] = []
    for kind, value in p.flat:
        if kind == "level":
            stages.append(Stage(level=value))
        elif stages and stages[-1].level is None:
            stages[-1] = Stage(passes=stages[-1].passes + (value,))
        else:
            stages.append(Stage(passes=(value,)))
    return Pipeline(text, tuple(stages))


def _mark_size(mod: llvm.ModuleRef, size_level: int) -> None:
    attrs = ("optsize",) if size_level == 1 else ("optsize", "minsize")
    for fn in mod.functions:
        if fn.is_declaration or any(b"optnone" in a for a in fn.attributes):
            continue  # optnone excludes optsize/minsize
        for a in attrs:
            fn.add_function_attribute(a)


def _run_level(mod: llvm.ModuleRef, tm: llvm.TargetMachine, level: str, tuning=None) -> None:
    speed, size = LEVELS[level]
    pto = llvm.create_pipeline_tuning_options(speed_level=speed)
    if tuning is not None:  # mneme.ir.knobs.CodeKnobs
        if tuning.inline_threshold:
            pto.inlining_threshold = int(tuning.inline_threshold)
        if not tuning.vectorize:
            pto.loop_vectorization = False
            pto.slp_vectorization = False
    if size:
        _mark_size(mod, size)
        # llvmlite declares this setter's C parameter as bool but stores the byte; below 256 it holds
        pto.inlining_threshold = _SIZE_INLINE_THRESHOLD[size]
        if size == 2:
            pto.loop_vectorization = False
            pto.slp_vectorization = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


def _run_passes(mod: llvm.ModuleRef, tm: llvm.TargetMachine, names: Tuple[str, ...]) -> None:
    pm = llvm.create_new_module_pass_manager()
    for name in names:
        getattr(pm, (PASSES.get(name) or CHECKS[name])[1])()
    pm.run(mod, pass_builder(tm))


def optimize(mod: llvm.ModuleRef, passes="default<O3>", arch: str = "sm_90", codegen_opt: int = 3,
             tuning=None) -> llvm.ModuleRef:
    """Run a pipeline (string or parsed) on `mod` in place and return it. `tuning` (mneme.ir.knobs.CodeKnobs)
    sets the default pipelines' inlining threshold and vectorization.

    The target machine (arch, codegen level) lets the NVPTX backend add its own IR passes and cost
    model to the default pipelines, as clang does.
    """
    pipeline = passes if isinstance(passes, Pipeline) else parse_pipeline(passes)
    tm = target_machine(arch, codegen_opt)
    for stage in pipeline.stages:
        if stage.level is not None:
            _run_level(mod, tm, stage.level, tuning)
        else:
            _run_passes(mod, tm, stage.passes)
    return mod
