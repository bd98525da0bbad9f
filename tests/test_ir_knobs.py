"""Each code knob (mneme/ir/knobs.py) moves real code: compiled from clang-22 IR with llvmlite and ptxas, the
PTX, the cubin's code or its registers differ from the default compile, and the code hash tells them apart."""

from __future__ import annotations

import re

import pytest

from mneme.config import ExperimentConfiguration, dim3
from mneme.ir.codegen import binary_digest, ptx_instruction_count
from mneme.ir.compile import compile_kernel
from mneme.ir.knobs import CodeKnobs
from mneme.ir.link import link_modules

from irutil import bc_dir, build  # noqa: F401  (fixtures)

DOT, CALLS = "_Z8dot_loopPKfS0_Pfii", "_Z5callsPKfS0_Pfii"


@pytest.fixture(scope="module")
def compiled(build):
    mods = {k: link_modules([build("knobs.cu")], k) for k in (DOT, CALLS)}
    seen = {}

    def get(kernel, **knobs):
        key = (kernel, tuple(sorted(knobs.items())))
        if key not in seen:
            cfg = ExperimentConfiguration(grid=dim3(4), block=dim3(256), **knobs)
            seen[key] = compile_kernel(mods[kernel], kernel, cfg, cache=False)
        return seen[key]

    return get


def test_unroll_count_and_disable_change_the_loop(compiled):
    base, off, eight = compiled(DOT), compiled(DOT, unroll=1), compiled(DOT, unroll=8)
    assert ptx_instruction_count(off.ptx) < ptx_instruction_count(base.ptx) < ptx_instruction_count(eight.ptx)
    assert off.cubin.registers < base.cubin.registers
    assert binary_digest(off.cubin.cubin) != binary_digest(base.cubin.cubin)
    assert len({base.code_hash, off.code_hash, eight.code_hash}) == 3


def test_inline_threshold_keeps_calls(compiled):
    base, low = compiled(CALLS), compiled(CALLS, inline_threshold=5)
    assert low.ptx.count("call") > base.ptx.count("call")
    assert ptx_instruction_count(low.ptx) != ptx_instruction_count(base.ptx)


def test_fma_off_and_fast_math(compiled):
    base, nofma, fast = compiled(DOT), compiled(DOT, fma=False), compiled(CALLS, fast_math=True)
    assert base.ptx.count("fma.rn") > 0 and nofma.ptx.count("fma.rn") == 0
    assert ".ftz" not in compiled(CALLS).ptx and ".ftz" in fast.ptx
    assert ptx_instruction_count(fast.ptx) != ptx_instruction_count(compiled(CALLS).ptx)


@pytest.mark.parametrize("knob", [{"ptxas_opt": 0}, {"max_regs": 16}, {"dlcm": "cg"}])
def test_ptxas_options_change_the_binary_not_the_ptx(compiled, knob):
    base, other = compiled(CALLS), compiled(CALLS, **knob)
    assert other.ptx == base.ptx
    assert binary_digest(other.cubin.cubin) != binary_digest(base.cubin.cubin)
    assert other.code_hash != base.code_hash


def test_register_limit_and_expensive_optimizations_reach_ptxas(compiled):
    assert compiled(CALLS, max_regs=16).cubin.registers < compiled(CALLS).cubin.registers
    assert CodeKnobs(expensive_opts=True, dlcm="ca", max_regs=32, fma=False).ptxas_flags() == [
        "--maxrregcount=32", "-dlcm=ca", "--allow-expensive-optimizations=true", "--fmad=false"]
    assert compiled(DOT, expensive_opts=True).code_hash != compiled(DOT).code_hash


def test_binary_digest_ignores_the_tool_notes_and_defaults_keep_hashes(compiled):
    # dot_loop is unrolled by 4 anyway: asking for 4 gives other PTX metadata but the same machine code
    same = compiled(DOT, unroll=4)
    assert binary_digest(same.cubin.cubin) == binary_digest(compiled(DOT).cubin.cubin)
    a = ExperimentConfiguration(block=dim3(128))
    b = ExperimentConfiguration(block=dim3(128), unroll=0, fma=True, dlcm="")
    assert a.hash() == b.hash() != ExperimentConfiguration(block=dim3(128), unroll=2).hash()
    assert CodeKnobs.of(a).describe() == {} and CodeKnobs.of(ExperimentConfiguration(dlcm="cg")).describe() == {"dlcm": "cg"}
    assert ExperimentConfiguration(unroll=99).problems() and ExperimentConfiguration(dlcm="xx").problems()


def test_identical_ptx_reuses_the_cubin_without_ptxas(build):
    from mneme.ir.compile import CompileCache

    pairs = "_Z5pairsPKfPffi"  # no loop, nothing to inline: O1 and O3 emit the same PTX
    mod = link_modules([build("knobs.cu")], pairs)
    cache = CompileCache()
    first = compile_kernel(mod, pairs, ExperimentConfiguration(grid=dim3(4), block=dim3(256)), cache=cache)
    other = compile_kernel(mod, pairs, ExperimentConfiguration(grid=dim3(4), block=dim3(256), passes="default<O1>"),
                           cache=cache)
    assert other.code_hash != first.code_hash and not other.cache_hit and other.ptx == first.ptx
    assert other.cubin_reused and not first.cubin_reused and other.cubin.cubin == first.cubin.cubin
    assert other.cubin_time < first.cubin_time
    regs = compile_kernel(mod, pairs, ExperimentConfiguration(grid=dim3(4), block=dim3(256), max_regs=32), cache=cache)
    assert regs.ptx == first.ptx and not regs.cubin_reused  # same PTX, other ptxas flags: assembled again
    assert len(cache) == 3


@pytest.mark.parametrize("debug", ["-gline-tables-only", "-g"])
def test_unroll_on_ir_with_debug_info(build, debug):
    """Apps built with -lineinfo or -G (cuda-samples' simpleStreams, reductionMultiBlockCG) carry !DILocation
    nodes: the unroll hint's new metadata id must be above theirs (it once reused one: 'Metadata id is already
    used', 25 of 30 corpus trials compile errors)."""
    mod = link_modules([build("knobs.cu", extra=[debug])], DOT)
    assert "!DILocation" in str(mod)
    base = ExperimentConfiguration(grid=dim3(4), block=dim3(256))
    plain = compile_kernel(mod, DOT, base, cache=False)
    n = {u: ptx_instruction_count(compile_kernel(mod, DOT, ExperimentConfiguration(grid=dim3(4), block=dim3(256),
                                                                                  unroll=u), cache=False).ptx)
         for u in (1, 2, 4, 8)}  # each compiles (no "Metadata id is already used")
    assert n[1] < ptx_instruction_count(plain.ptx) < n[8]
    text = CodeKnobs(unroll=4).rewrite(str(mod))
    ids = [int(x) for x in re.findall(r"^!(\d+) = ", text, flags=re.M)]
    assert len(ids) == len(set(ids))
