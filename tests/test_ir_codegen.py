"""PTX from llvmlite and cubins with resource usage from nvJitLink (CUDA 13.0), no GPU involved."""

import pytest
from irutil import bc_dir, build  # noqa: F401  (fixtures)

from mneme.errors import CompileError
from mneme.ir import emit_ptx, link_cubin, link_modules, optimize, parse_info_log, set_launch_bounds
from mneme.ir.codegen import nvjitlink_options

PRESSURE = "_Z8pressurePKfPfii"
SAXPY = "_Z5saxpyfPKfPfii"


@pytest.fixture(scope="module")
def pressure_ptx(build):
    mod = link_modules([build("spill.cu")], PRESSURE)
    plain = emit_ptx(optimize(mod.clone(), "default<O3>"))
    tight = emit_ptx(optimize(set_launch_bounds(mod, PRESSURE, 1024, 2), "default<O3>"))
    return plain, tight


def test_ptx_header_matches_the_ir_and_the_arch(build):
    mod = optimize(link_modules([build("vecadd.cu")], "_Z6vecAddPKfS0_Pfi"), "default<O3>")
    for opt in range(4):
        ptx = emit_ptx(mod.clone(), "sm_90", opt)
        assert ".version 8.8" in ptx and ".target sm_90" in ptx and ".visible .entry _Z6vecAddPKfS0_Pfi(" in ptx
    assert ".version 8.6" in emit_ptx(mod.clone(), "sm_90", 3, ptx=86)


def test_local_memory_registers_and_spills_come_from_the_link(pressure_ptx):
    plain, tight = pressure_ptx
    assert ".local .align 4 .b8 \t__local_depot0" in plain
    r = link_cubin(plain, "sm_90", 3, kernel=PRESSURE)
    assert r.cubin[:4] == b"\x7fELF" and r.size == len(r.cubin) > 0
    assert r.local_mem >= 192 and r.stack >= 192  # the 48-float private array lives in the frame
    assert r.registers > 32 and r.param_mem > 0
    assert "Function properties for '_Z8pressurePKfPfii'" in r.info_log
    t = link_cubin(tight, "sm_90", 3, kernel=PRESSURE)
    assert t.registers <= 32  # 1024 threads x 2 blocks per SM leave 32 registers a thread
    assert t.spill_stores > 0 and t.spill_loads > 0 and t.local_mem > r.local_mem


def test_parallel_split_compile_gives_the_same_code(pressure_ptx):
    plain, _ = pressure_ptx
    serial = link_cubin(plain, "sm_90", 3, "serial", kernel=PRESSURE)
    parallel = link_cubin(plain, "sm_90", 3, "parallel", kernel=PRESSURE, threads=2)
    assert (parallel.registers, parallel.stack, parallel.size) == (serial.registers, serial.stack, serial.size)
    assert "-split-compile=2" in nvjitlink_options("sm_90", 3, "parallel", 2)
    assert not any(o.startswith("-split") for o in nvjitlink_options("sm_90", 3, "serial"))


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


def test_codegen_levels_reach_ptxas(pressure_ptx):
    plain, _ = pressure_ptx
    o0 = link_cubin(plain, "sm_90", 0, kernel=PRESSURE)
    o3 = link_cubin(plain, "sm_90", 3, kernel=PRESSURE)
    assert o0.size != o3.size


def test_bad_input_is_a_compile_error_with_the_log():
    with pytest.raises(CompileError, match="nvJitLink rejected"):
        link_cubin(".version 8.8\n.target sm_90\n.address_size 64\nthis is not ptx\n")
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
