"""PTX from llvmlite and cubins with resource usage from both assemblers (whole-program ptxas, relocatable
nvJitLink; CUDA 13.0), no GPU involved."""

import pytest
from irutil import bc_dir, build  # noqa: F401  (fixtures)

from mneme.errors import CompileError
from mneme.ir import emit_ptx, link_cubin, link_modules, optimize, parse_info_log, set_launch_bounds
from mneme.ir import ptxas
from mneme.ir.codegen import ASSEMBLERS, assembler, nvjitlink_options

PRESSURE = "_Z8pressurePKfPfii"
SCRATCH = "_Z7scratchPKiPfi"
SAXPY = "_Z5saxpyfPKfPfii"


@pytest.fixture(scope="module")
def pressure_ptx(build):
    mod = link_modules([build("spill.cu")], PRESSURE)
    plain = emit_ptx(optimize(mod.clone(), "default<O3>"))
    tight = emit_ptx(optimize(set_launch_bounds(mod, PRESSURE, 1024, 2), "default<O3>"))
    return plain, tight


@pytest.fixture(scope="module")
def scratch_ptx(build):
    return emit_ptx(optimize(link_modules([build("spill.cu")], SCRATCH), "default<O3>"))


def test_ptx_header_matches_the_ir_and_the_arch(build):
    mod = optimize(link_modules([build("vecadd.cu")], "_Z6vecAddPKfS0_Pfi"), "default<O3>")
    for opt in range(4):
        ptx = emit_ptx(mod.clone(), "sm_90", opt)
        assert ".version 8.8" in ptx and ".target sm_90" in ptx and ".visible .entry _Z6vecAddPKfS0_Pfi(" in ptx
    assert ".version 8.6" in emit_ptx(mod.clone(), "sm_90", 3, ptx=86)


@pytest.mark.parametrize("using", ASSEMBLERS)
def test_local_memory_registers_and_spills_come_from_the_assembler(pressure_ptx, scratch_ptx, using):
    plain, tight = pressure_ptx
    s = link_cubin(scratch_ptx, "sm_90", 3, kernel=SCRATCH, using=using)
    assert s.cubin[:4] == b"\x7fELF" and s.size == len(s.cubin) > 0
    assert s.local_mem >= 1024 and s.stack >= 1024  # the 256-float private array lives in the frame
    assert s.param_mem > 0 and s.functions[SCRATCH]["registers"] == s.registers
    r = link_cubin(plain, "sm_90", 3, kernel=PRESSURE, using=using)
    assert r.registers > 32
    t = link_cubin(tight, "sm_90", 3, kernel=PRESSURE, using=using)
    assert t.registers <= 32  # 1024 threads x 2 blocks per SM leave 32 registers a thread
    assert t.spill_stores > 0 and t.spill_loads > 0 and t.local_mem > r.local_mem


def test_the_default_assembler_is_whole_program_ptxas_and_it_is_part_of_the_code(pressure_ptx, monkeypatch):
    plain, _ = pressure_ptx
    monkeypatch.delenv("MNEME_ASSEMBLER", raising=False)
    assert ptxas.find_ptxas() and assembler() == "ptxas"  # this machine has a CUDA toolkit
    whole = link_cubin(plain, "sm_90", 3, kernel=PRESSURE)
    assert "Compiling entry function '_Z8pressurePKfPfii'" in whole.info_log
    reloc = link_cubin(plain, "sm_90", 3, kernel=PRESSURE, using="nvjitlink")
    assert "Function properties for '_Z8pressurePKfPfii'" in reloc.info_log
    # whole-program code keeps the 48-float array in registers; relocatable code leaves it in the frame
    assert whole.stack == 0 and reloc.stack >= 192 and whole.cubin != reloc.cubin
    monkeypatch.setenv("MNEME_ASSEMBLER", "nvjitlink")
    assert assembler() == "nvjitlink"
    monkeypatch.setenv("MNEME_ASSEMBLER", "ptxass")
    with pytest.raises(CompileError, match="MNEME_ASSEMBLER"):
        assembler()


@pytest.mark.parametrize("using", ASSEMBLERS)
def test_parallel_split_compile_gives_the_same_code(pressure_ptx, using):
    plain, _ = pressure_ptx
    serial = link_cubin(plain, "sm_90", 3, "serial", kernel=PRESSURE, using=using)
    parallel = link_cubin(plain, "sm_90", 3, "parallel", kernel=PRESSURE, threads=2, using=using)
    assert (parallel.registers, parallel.stack, parallel.size) == (serial.registers, serial.stack, serial.size)
    assert "-split-compile=2" in nvjitlink_options("sm_90", 3, "parallel", 2)
    assert not any(o.startswith("-split") for o in nvjitlink_options("sm_90", 3, "serial"))
    assert ptxas.ptxas_options("sm_90", 3, "parallel", 2)[-2:] == ["--split-compile", "2"]


def test_nvjitlink_recognizes_every_option_we_pass():
    # nvJitLink refuses unknown options at creation; a typo would show up here, not on the GPU machine
    from cuda.bindings import nvjitlink as nj

    for opt in range(4):
        for method in ("serial", "parallel"):
            options = nvjitlink_options("sm_90", opt, method, 2)
            nj.destroy(nj.create(len(options), options))
    with pytest.raises(nj.nvJitLinkError):
        nj.create(2, ["-arch=sm_90", "-no-such-option"])
    assert "-O1" not in nvjitlink_options("sm_90", 1, "serial")  # nvJitLink takes -O0/-O3 only


@pytest.mark.parametrize("using", ASSEMBLERS)
def test_codegen_levels_reach_ptxas(pressure_ptx, using):
    plain, _ = pressure_ptx
    o0 = link_cubin(plain, "sm_90", 0, kernel=PRESSURE, using=using)
    o3 = link_cubin(plain, "sm_90", 3, kernel=PRESSURE, using=using)
    assert o0.size != o3.size


def test_bad_input_is_a_compile_error_with_the_log():
    bad = ".version 8.8\n.target sm_90\n.address_size 64\nthis is not ptx\n"
    with pytest.raises(CompileError, match="nvJitLink rejected"):
        link_cubin(bad, using="nvjitlink")
    with pytest.raises(CompileError, match=r"ptxas \(.*\) rejected the PTX for sm_90(.|\n)*syntax error"):
        link_cubin(bad, using="ptxas")
    too_new = ".version 99.9\n.target sm_90\n.address_size 64\n.visible .entry k() { ret; }\n"
    with pytest.raises(CompileError, match="older than the PTX that LLVM emits(.|\n)*MNEME_ASSEMBLER=nvjitlink"):
        link_cubin(too_new, using="ptxas")
    with pytest.raises(CompileError, match="codegen_method"):
        link_cubin("", method="threads")
    with pytest.raises(CompileError, match="sm_90"):
        link_cubin("", arch="gfx90a")


def test_info_log_parsing_reads_every_field():
    log = (
        "ptxas info    : Function properties for _Z1kPf\n"
        "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "info    : 4 bytes gmem, 64 bytes cmem[3]\n"
        "info    : Function properties for '_Z1kPf':\n"
        "info    : used 40 registers, used 1 barriers, 16 stack, 1024 bytes smem, 360 bytes cmem[0], 4 bytes lmem\n"
    )
    assert parse_info_log(log) == {
        "_Z1kPf": {
            "stack_frame": 16, "spill_stores": 8, "spill_loads": 12, "registers": 40, "barriers": 1,
            "stack": 16, "shared_mem": 1024, "param_mem": 360, "local_mem": 20, "const_mem": 64,
        }
    }


def test_constant_memory_of_used_variables_is_reported(build):
    mod = optimize(link_modules([build("params.cu")], SAXPY), "default<O3>")
    r = link_cubin(emit_ptx(mod), kernel=SAXPY)
    assert r.const_mem == 64  # __constant__ float coeffs[16]
