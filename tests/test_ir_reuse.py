"""What compile_kernel skips for a configuration that repeats an earlier one's inputs changes nothing it produces:
PTX reused by its IR-side inputs, and the cubin's sections read without pyelftools."""

import hashlib
import io
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mneme.ir import CompileCache, compile_kernel
from mneme.ir.codegen import binary_digest
from mneme.ir.cubinelf import _elftools_sections, _fast_sections, sections
from mneme.ir.launchsafety import analyze_launch
from mneme.replay.pipeline import ReplayPipeline
from mneme.tune.presets import preset_space
from mneme.tune.space import SpaceContext

ROOT = Path(__file__).resolve().parent.parent
MATMUL = sorted((ROOT / "tests" / "fixtures" / "matmul").glob("*.json"))[0]


@pytest.fixture(scope="module")
def matmul():
    """A recorded kernel of the H200 fixtures, linked once, with its standard space."""
    pipe = ReplayPipeline(str(MATMUL), None, device_id=None)
    linked = pipe.linked()
    ctx = SpaceContext(pipe.baseline_config(), pipe.record, pipe.instance,
                       launch_facts=analyze_launch(linked, pipe.kernel_name))
    return pipe, linked, preset_space("standard", ctx)


def _compile(pipe, linked, cfg, cache):
    return compile_kernel(linked, pipe.kernel_name, cfg, arch=pipe.arch, static_hash=pipe.record.static_hash,
                          arg_values=pipe.arg_values() if cfg.specialize else None, cache=cache)


def _same_code(reused, fresh):
    assert reused.ptx == fresh.ptx
    assert reused.binary == fresh.binary
    assert (reused.cubin.registers, reused.cubin.spill_stores, reused.cubin.const_mem, reused.cubin.param_mem) == \
        (fresh.cubin.registers, fresh.cubin.spill_stores, fresh.cubin.const_mem, fresh.cubin.param_mem)


def test_assembler_only_changes_reuse_the_ptx_and_give_what_a_fresh_compile_gives(matmul):
    pipe, linked, _ = matmul
    base = pipe.baseline_config()
    cache = CompileCache()
    first = _compile(pipe, linked, base, cache)
    assert not first.ptx_reused
    variants = [replace(base, max_regs=32), replace(base, dlcm="cg"), replace(base, expensive_opts=True),
                replace(base, ptxas_opt=1), replace(base, max_regs=64, dlcm="ca")]
    for cfg in variants:
        ck = _compile(pipe, linked, cfg, cache)
        assert ck.ptx_reused and not ck.cache_hit and ck.opt_time == 0 and ck.ptx_time == 0
        _same_code(ck, _compile(pipe, linked, cfg, False))
    regs = _compile(pipe, linked, replace(base, max_regs=32), False)
    assert regs.cubin.registers <= 32


def test_changes_that_reach_the_ir_compile_again(matmul):
    pipe, linked, _ = matmul
    base = pipe.baseline_config()
    cache = CompileCache()
    _compile(pipe, linked, base, cache)
    for cfg in (replace(base, unroll=2), replace(base, passes="default<O1>"), replace(base, codegen_opt=2),
                replace(base, specialize_dims=True)):
        ck = _compile(pipe, linked, cfg, cache)
        assert not ck.ptx_reused and ck.opt_time > 0
        _same_code(ck, _compile(pipe, linked, cfg, False))


def test_standard_space_draws_compile_to_the_same_code_with_and_without_reuse(matmul):
    pipe, linked, space = matmul
    rng = random.Random(7)
    draws = [space.derived(space.sample_random(rng)) for _ in range(10)]
    # the same draws again with only assembler knobs changed: the reuse path must serve them
    draws += [replace(c, max_regs=0 if c.max_regs else 64, expensive_opts=not c.expensive_opts) for c in draws[:4]]
    cache = CompileCache()
    reused = 0
    for cfg in draws:
        ck = _compile(pipe, linked, cfg, cache)
        reused += ck.ptx_reused
        _same_code(ck, _compile(pipe, linked, cfg, False))
    assert reused >= 4


def _old_digest(cubin: bytes) -> str:
    """binary_digest as it was computed with pyelftools (the digests the tuner compares must not change)."""
    from elftools.elf.elffile import ELFFile

    h = hashlib.sha256(b"mneme-binary-v1\0")
    secs = sorted((s.name, s.data()) for s in ELFFile(io.BytesIO(cubin)).iter_sections()
                  if s.name != ".note.nv.tkinfo" and s.header.sh_type != "SHT_NOBITS")
    for name, data in secs:
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def test_the_section_reader_agrees_with_pyelftools_on_cubins_and_host_elfs(matmul):
    pipe, linked, _ = matmul
    cfg = replace(pipe.baseline_config(), specialize_dims=True, set_launch_bounds=True,
                  max_threads=pipe.baseline_config().block.total(), min_blocks_per_sm=2)
    cubins = [_compile(pipe, linked, c, False).cubin.cubin for c in (pipe.baseline_config(), cfg)]
    host = Path(sys.executable).resolve().read_bytes()  # a 64-bit ELF with .bss (NOBITS) and many sections
    for elf in cubins + [host]:
        fast = _fast_sections(elf)  # the struct reader itself, not its pyelftools fallback
        assert fast is not None and fast == sections(elf) == _elftools_sections(elf)
        assert len(fast) > 5 and fast[0] == ("", False, 0, b"")
    assert any(s.nobits for s in sections(host))
    for cubin in cubins:
        assert binary_digest(cubin) == _old_digest(cubin)
    assert any(s.name.startswith(".nv.constant0.") for s in sections(cubins[0]))


def test_unreadable_bytes_are_refused():
    with pytest.raises(ValueError):
        sections(b"not an ELF at all")
    assert binary_digest(b"junk") == hashlib.sha256(b"junk").hexdigest()
