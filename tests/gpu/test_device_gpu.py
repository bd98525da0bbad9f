"""The replay GPU core on a real GPU: arena at the recorded address, prologue load, resets, verification
(host and GPU compare), variables with relocations, pinned host blobs, big dynamic shared memory, and
the failure modes (sticky errors and hung kernels, each in a process of its own).

The kernels are hand-written NVPTX IR compiled here through llvmlite -> PTX -> nvJitLink (mneme.ir).
"""

from __future__ import annotations

import array
import functools
import math
import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
VA = 0x153940000000          # the recorder's default VA base
ARENA_BYTES = 256 << 20
HOST_VA = 0x6F0000000000      # a fixed host address for pinned blobs (page-aligned, unused in a fresh process)

KERNELS_LL = r"""
target datalayout = "e-p6:32:32-i64:64-i128:128-i256:256-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"

@scale = addrspace(1) externally_initialized global float 0.0, align 4
@scale_ptr = addrspace(1) externally_initialized global ptr addrspace(1) null, align 8
@counter = addrspace(1) externally_initialized global i32 0, align 4
@dsmem = external addrspace(3) global [0 x i8], align 16

declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
declare i64 @llvm.nvvm.read.ptx.sreg.globaltimer()

define ptx_kernel void @saxpy(float %a, ptr addrspace(1) %x, ptr addrspace(1) %y, i32 %n) {
entry:
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %bid = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %bdim = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %t0 = mul i32 %bid, %bdim
  %i = add i32 %t0, %tid
  %in = icmp slt i32 %i, %n
  br i1 %in, label %body, label %exit
body:
  %idx = sext i32 %i to i64
  %px = getelementptr float, ptr addrspace(1) %x, i64 %idx
  %py = getelementptr float, ptr addrspace(1) %y, i64 %idx
  %vx = load float, ptr addrspace(1) %px, align 4
  %vy = load float, ptr addrspace(1) %py, align 4
  %m = fmul float %a, %vx
  %r = fadd float %m, %vy
  store float %r, ptr addrspace(1) %py, align 4
  br label %exit
exit:
  ret void
}

; y[i] = *scale_ptr * x[i]; thread 0 of every block adds 1 to counter
define ptx_kernel void @scaled(ptr addrspace(1) %x, ptr addrspace(1) %y, i32 %n) {
entry:
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %bid = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %bdim = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %count, label %work
count:
  %old = atomicrmw add ptr addrspace(1) @counter, i32 1 monotonic, align 4
  br label %work
work:
  %t0 = mul i32 %bid, %bdim
  %i = add i32 %t0, %tid
  %in = icmp slt i32 %i, %n
  br i1 %in, label %body, label %exit
body:
  %sp = load ptr addrspace(1), ptr addrspace(1) @scale_ptr, align 8
  %s = load float, ptr addrspace(1) %sp, align 4
  %idx = sext i32 %i to i64
  %px = getelementptr float, ptr addrspace(1) %x, i64 %idx
  %py = getelementptr float, ptr addrspace(1) %y, i64 %idx
  %vx = load float, ptr addrspace(1) %px, align 4
  %r = fmul float %s, %vx
  store float %r, ptr addrspace(1) %py, align 4
  br label %exit
exit:
  ret void
}

; every thread stores its id at the end of the dynamic shared memory, reads it back, writes id + 1
define ptx_kernel void @bigshared(ptr addrspace(1) %out, i32 %nbytes) {
entry:
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %bdim = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %back = sub i32 %bdim, %tid
  %back4 = shl i32 %back, 2
  %off = sub i32 %nbytes, %back4
  %off64 = zext i32 %off to i64
  %p = getelementptr i8, ptr addrspace(3) @dsmem, i64 %off64
  store volatile i32 %tid, ptr addrspace(3) %p, align 4
  %v = load volatile i32, ptr addrspace(3) %p, align 4
  %v1 = add i32 %v, 1
  %idx = zext i32 %tid to i64
  %po = getelementptr i32, ptr addrspace(1) %out, i64 %idx
  store i32 %v1, ptr addrspace(1) %po, align 4
  ret void
}

define ptx_kernel void @poke(ptr addrspace(1) %p) {
entry:
  store volatile i32 1, ptr addrspace(1) %p, align 4
  ret void
}

; spins until *flag != 0 or limit_ns passed (so a forgotten kernel still ends)
define ptx_kernel void @spin(ptr addrspace(1) %flag, i64 %limit_ns) {
entry:
  %t0 = call i64 @llvm.nvvm.read.ptx.sreg.globaltimer()
  br label %loop
loop:
  %v = load volatile i32, ptr addrspace(1) %flag, align 4
  %t = call i64 @llvm.nvvm.read.ptx.sreg.globaltimer()
  %dt = sub i64 %t, %t0
  %late = icmp ugt i64 %dt, %limit_ns
  %set = icmp ne i32 %v, 0
  %stop = or i1 %late, %set
  br i1 %stop, label %exit, label %loop
exit:
  ret void
}
"""


@functools.lru_cache(maxsize=None)
def cubin(arch: str = "sm_90") -> bytes:
    """The kernels above as a cubin for `arch` (llvmlite -> PTX -> nvJitLink)."""
    from mneme.ir.codegen import emit_ptx, link_cubin
    from mneme.ir.module import parse_module

    return link_cubin(emit_ptx(parse_module(KERNELS_LL.encode()), arch, 3), arch, 3).cubin


def f32(values) -> bytes:
    return array.array("f", values).tobytes()


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def run_script(body: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Runs `body` in a fresh interpreter that imports this file's helpers (a broken CUDA context
    must not outlive its test)."""
    prelude = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
               f"from test_device_gpu import *\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


# ---- fixtures -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def device():
    from mneme.device import Device

    return Device(0, timeout=60)


@pytest.fixture(scope="module")
def arena(device):
    from mneme.device import Arena

    a = Arena(device, VA, ARENA_BYTES)
    yield a
    a.close()


@pytest.fixture(scope="module")
def module(device):
    from mneme.device import DeviceModule

    with DeviceModule.from_cubin(cubin(device.arch)) as m:
        yield m


def write_snapshot(path, kind, blobs=(), variables=(), args=None, before=None):
    """blobs: (addr, bytes, space); variables: (name, addr, bytes, relocs); before: {addr: bytes} for
    epilogue diffs."""
    from mneme.snapshot import Snapshot, Writer

    with Writer(path, kind) as w:
        for addr, data, space in blobs:
            if kind == 2:
                w.blob_epilogue(addr, data, (before or {}).get(addr), space=space)
            else:
                w.blob(addr, data, space)
        for name, addr, data, relocs in variables:
            w.variable(name, addr, data, relocs=relocs)
        if args is not None:
            w.args(args)
    return Snapshot.read(path)


SAXPY_N = 1 << 20  # 4 MiB per array: the GPU compare path
X_ADDR, Y_ADDR = VA, VA + (8 << 20)


def saxpy_state(tmp_path, y_space=0, y_addr=Y_ADDR):
    """Prologue and applied epilogue of y = 2*x + y with integer values (exact in f32, FMA or not)."""
    x = f32(float(i % 1000) for i in range(SAXPY_N))
    y0 = f32(float(i % 7) for i in range(SAXPY_N))
    y1 = f32(2.0 * (i % 1000) + (i % 7) for i in range(SAXPY_N))
    args = [struct.pack("<f", 2.0), u64(X_ADDR), u64(y_addr), struct.pack("<i", SAXPY_N)]
    pro = write_snapshot(tmp_path / "pro.snap", 1, [(X_ADDR, x, 0), (y_addr, y0, y_space)], args=args)
    epi = write_snapshot(tmp_path / "epi.snap", 2, [(y_addr, y1, y_space)], before={y_addr: y0})
    epi.apply(pro)
    return pro, epi, y0, y1


# ---- device, arena ---------------------------------------------------------------------------

def test_device_properties(device):
    from mneme.device import get_device, get_device_arch, get_device_count, set_device

    info = device.info
    assert get_device_count() >= 1
    assert device.arch == get_device_arch() and device.arch.startswith("sm_")
    assert info.sm_count > 0 and info.l2_size > 0 and info.warp_size == 32
    assert info.max_shared_per_block_optin > 48 * 1024
    assert info.driver_version >= 12000
    assert info.uuid.startswith("GPU-") and len(info.uuid) == 40
    assert ":" in info.pci_bus_id and info.total_mem > 1 << 30
    assert info.virtual_memory_management and info.unified_addressing
    assert set_device(0) is device and get_device() is device and device.usable


def test_arena_is_granted_at_the_recorded_address(device, arena):
    from mneme.device import Arena, DeviceAllocation, read, write
    from mneme.errors import DeviceError

    assert arena.base == VA and arena.size >= ARENA_BYTES and arena.size % (2 << 20) == 0
    write(VA + 123, b"mneme")
    assert read(VA + 123, 5) == b"mneme"
    with pytest.raises(DeviceError, match="overlaps"):
        Arena(device, VA + (2 << 20), 2 << 20)
    with DeviceAllocation(64 << 20) as taken:
        start = -(-taken.addr // (2 << 20)) * (2 << 20)
        with pytest.raises(DeviceError, match=f"0x{start:x}"):
            Arena(device, start, 2 << 20)


# ---- prologue, launch, resets, verification ----------------------------------------------------------

def test_saxpy_verifies_resets_and_catches_a_planted_mismatch(tmp_path, device, arena, module):
    from mneme.device import BufferCheck, ReplayState, write

    pro, epi, y0, y1 = saxpy_state(tmp_path)
    fn = module.get_function("saxpy")
    grid, block = SAXPY_N // 256, 256
    with ReplayState(device, pro) as state:
        report = state.verify(pro)
        assert report.equal, str(report)
        fn.launch(grid, block, 0, pro.args)
        for gpu_min in (0, 1 << 62):  # every check on the GPU, then every check on the host
            report = state.verify(epi, gpu_min_bytes=gpu_min)
            assert report.equal, str(report)
            assert report.bytes_compared == 2 * SAXPY_N * 4

        copies, nbytes = state.plan_resets([(Y_ADDR, SAXPY_N * 4)])
        assert (copies, nbytes) == (1, SAXPY_N * 4)
        state.reset_written()
        assert state.verify(pro).equal

        times = fn.profile(grid, block, 0, pro.args, iterations=5, warmup=2, state=state)
        assert len(times) == 5 and all(t > 0 for t in times)
        assert state.verify(epi).equal  # every run started from the prologue
        flushed = fn.profile(grid, block, 0, pro.args, iterations=3, warmup=1, l2_flush=True, state=state)
        assert len(flushed) == 3 and all(t > 0 for t in flushed)

        planted = 12345
        for gpu_min in (0, 1 << 62):
            write(Y_ADDR + planted * 4, b"\xff\xff\xff\xff")
            report = state.verify(epi, gpu_min_bytes=gpu_min)
            assert not report.equal
            (bad,) = report.failures
            assert bad.check.key == Y_ADDR and bad.first_mismatch == planted * 4 and bad.mismatches == 4
            state.reset_all()
            assert state.verify(pro).equal
            fn.launch(grid, block, 0, pro.args)
            assert state.verify(epi).equal

        # tolerances: y[planted] off by 0.25 passes atol 0.5 and fails atol 0.1, on both paths
        value = struct.unpack_from("<f", y1, planted * 4)[0]
        write(Y_ADDR + planted * 4, struct.pack("<f", value + 0.25))
        for gpu_min in (0, 1 << 62):
            for atol, ok in ((0.5, True), (0.1, False)):
                plan = [BufferCheck("blob", X_ADDR, X_ADDR, 0, SAXPY_N * 4),
                        BufferCheck("blob", Y_ADDR, Y_ADDR, 0, SAXPY_N * 4, "f32", "element", atol, 0.0)]
                report = state.verify(epi, plan, gpu_min_bytes=gpu_min)
                assert report.equal is ok, str(report)
                y_result = report.results[1]
                assert math.isclose(y_result.max_abs_err, 0.25)
                assert y_result.mismatches == (0 if ok else 1)


def test_gpu_compare_agrees_with_mn_compare(device):
    from mneme.device import DeviceAllocation, compare_on_device, write
    from mneme.snapshot import compare

    n = 3 << 20  # f32 elements (12 MiB: several scratch chunks are not involved here, one launch)
    base = [math.sin(i) * 100 for i in range(n)]
    exp = array.array("f", base)
    act = array.array("f", base)
    for i in range(0, n, 99991):
        act[i] += 0.01 * (1 + i % 3)
    act[7] = float("nan")
    exp[11] = act[11] = float("nan")
    act[13] = float("inf")
    act[17] = -0.0 if exp[17] == 0 else act[17]
    cases = [("bytes", "element", -1, -1), ("f32", "element", -1, -1), ("f32", "element", 0.02, 0),
             ("f32", "element", 0, 1e-3), ("f32", "element", 0.001, 1e-4), ("f32", "l1", 1.0, 0),
             ("f32", "l2", 0, 1e-5), ("f32", "linf", 0.05, 0), ("i32", "element", 5, 0), ("u64", "l2", 0, 0.5),
             ("f16", "element", 0.1, 0), ("bf16", "linf", 0, 0.01)]
    with DeviceAllocation(n * 4) as e, DeviceAllocation(n * 4) as a:
        for finite in (False, True):
            if finite:  # norms of clean data: no NaN or inf mismatch
                act[7], act[13] = exp[7], exp[13]
            write(e.addr, exp.tobytes())
            write(a.addr, act.tobytes())
            for elem, norm, atol, rtol in cases:
                gpu = compare_on_device(e.addr, a.addr, n * 4, elem, norm, atol, rtol)
                host = compare(exp.tobytes(), act.tobytes(), elem, norm=norm, atol=atol, rtol=rtol)
                what = (finite, elem, norm, atol, rtol)
                assert gpu.equal == host.equal, what
                assert gpu.mismatches == host.mismatches, what
                assert gpu.first_mismatch == host.first_mismatch, what
                assert gpu.max_abs_err == host.max_abs_err, what
                assert gpu.max_rel_err == host.max_rel_err, what
                assert math.isclose(gpu.err_norm, host.err_norm, rel_tol=1e-9, abs_tol=1e-12), what
                assert math.isclose(gpu.ref_norm, host.ref_norm, rel_tol=1e-9, abs_tol=1e-12), what


def test_large_blob_is_loaded_and_verified_in_chunks(tmp_path, device, arena):
    """96 MiB: the staging halves and the compare scratch halves (32 MiB) both cycle several times."""
    from mneme.device import BufferCheck, ReplayState, read, write
    from mneme.snapshot import compare

    size = 96 << 20
    data = os.urandom(size)
    pro = write_snapshot(tmp_path / "big.snap", 1, [(VA, data, 0)])
    with ReplayState(device, pro) as state:
        assert read(VA + size - 4096, 4096) == data[-4096:]
        assert state.verify(pro, gpu_min_bytes=0).equal
        planted = [70 * (1 << 20) + 12, 90 * (1 << 20) + 3, size - 1]
        for off in planted:
            write(VA + off, bytes([data[off] ^ 0xFF]))
        report = state.verify(pro, gpu_min_bytes=0)
        (bad,) = report.failures
        assert (bad.mismatches, bad.first_mismatch) == (3, planted[0])
        actual = read(VA, size)
        plan = [BufferCheck("blob", VA, VA, 0, size, "f32", "l2", 0.0, 1e-3)]
        for gpu_min in (0, 1 << 62):
            r = state.verify(pro, plan, gpu_min_bytes=gpu_min).results[0]
            host = compare(data, actual, "f32", norm="l2", atol=0.0, rtol=1e-3)
            assert (r.equal, r.mismatches, r.first_mismatch) == (host.equal, host.mismatches, host.first_mismatch)
            assert r.max_abs_err == host.max_abs_err and r.max_rel_err == host.max_rel_err
        state.reset_all()
        assert state.verify(pro, gpu_min_bytes=0).equal

        # many small written ranges: merged into one copy across small gaps, one per range without merging
        ranges = [(VA + i * 64, 8) for i in range(1000)]
        for a, n in ranges:
            write(a, bytes(b ^ 0xFF for b in data[a - VA:a - VA + n]))
        assert not state.verify(pro, gpu_min_bytes=0).equal
        assert state.plan_resets(ranges, merge_gap=0) == (1000, 8000)
        assert state.plan_resets(ranges) == (1, 999 * 64 + 8)
        state.reset_written()
        assert state.verify(pro, gpu_min_bytes=0).equal


def test_variables_are_relocated_verified_and_reset(tmp_path, device, arena, module):
    from mneme.device import ReplayState, read

    n, block = 4096, 128
    blocks = n // block
    rec_scale, rec_ptr, rec_counter = 0x7F0000001000, 0x7F0000001008, 0x7F0000001010
    x = f32(float(i) for i in range(n))
    y0 = f32(0.0 for _ in range(n))
    variables = [("scale", rec_scale, struct.pack("<f", 3.0), ()),
                 ("scale_ptr", rec_ptr, u64(rec_scale), ((0, "scale", 0),)),
                 ("counter", rec_counter, struct.pack("<i", 5), ()),
                 ("ghost", 0x7F0000002000, b"\0" * 16, ())]
    args = [u64(X_ADDR), u64(Y_ADDR), struct.pack("<i", n)]
    pro = write_snapshot(tmp_path / "vpro.snap", 1, [(X_ADDR, x, 0), (Y_ADDR, y0, 0)], variables, args)
    after = [(name, addr, struct.pack("<i", 5 + blocks) if name == "counter" else data, rel)
             for name, addr, data, rel in variables]
    epi = write_snapshot(tmp_path / "vepi.snap", 2, [(Y_ADDR, f32(3.0 * i for i in range(n)), 0)], after,
                         before={Y_ADDR: y0})
    epi.apply(pro)
    from mneme.device import DeviceModule

    with DeviceModule.from_cubin(cubin(device.arch)) as m, ReplayState(device, pro) as state:
        assert m.load_variables(pro) == ["ghost"]
        scale_addr, scale_size = m.global_address("scale")
        ptr_addr, _ = m.global_address("scale_ptr")
        assert scale_size == 4 and scale_addr != rec_scale
        assert struct.unpack("<Q", read(ptr_addr, 8))[0] == scale_addr  # relocated
        fn = m.get_function("scaled")
        fn.launch(blocks, block, 0, pro.args)
        report = state.verify(epi, module=m)
        assert report.equal, str(report)
        assert any("ghost" in s for s in report.skipped)
        counter_addr, _ = m.global_address("counter")
        state.plan_resets([(Y_ADDR, n * 4), (rec_counter, 4)], module=m)
        fn.profile(blocks, block, 0, pro.args, iterations=4, warmup=1, state=state)
        assert struct.unpack("<i", read(counter_addr, 4))[0] == 5 + blocks
        assert state.verify(epi, module=m).equal
        state.reset_all(module=m)
        assert struct.unpack("<i", read(counter_addr, 4))[0] == 5
        assert struct.unpack("<Q", read(ptr_addr, 8))[0] == scale_addr


def test_pinned_host_blob_at_its_recorded_address(tmp_path, device, arena, module):
    from mneme.device import ReplayState, host_regions

    pro, epi, y0, y1 = saxpy_state(tmp_path, y_space=1, y_addr=HOST_VA)
    assert host_regions(pro.blobs) == [(HOST_VA, SAXPY_N * 4)]
    fn = module.get_function("saxpy")
    with ReplayState(device, pro) as state:
        assert [(r.addr, r.size) for r in state.regions] == [(HOST_VA, SAXPY_N * 4)]
        fn.launch(SAXPY_N // 256, 256, 0, pro.args)
        report = state.verify(epi)
        assert report.equal, str(report)
        state.reset_written([(HOST_VA, SAXPY_N * 4)])
        assert state.verify(pro).equal
        times = fn.profile(SAXPY_N // 256, 256, 0, pro.args, iterations=3, state=state)
        assert len(times) == 3 and state.verify(epi).equal


def test_dynamic_shared_memory_above_48k(device, arena, module):
    from mneme.device import read

    fn = module.get_function("bigshared")
    threads, shared = 256, 100 * 1024
    fn.launch(1, threads, shared, [u64(VA), struct.pack("<i", shared)])
    out = array.array("i", read(VA, threads * 4))
    assert list(out) == [t + 1 for t in range(threads)]
    occ = fn.occupancy(threads, shared)
    assert 0 < occ <= 1
    assert fn.active_blocks(threads, shared) <= device.info.max_shared_per_sm // shared
    assert fn.reg_usage > 0 and fn.local_mem == 0 and fn.attributes().max_threads_per_block >= threads


def test_invalid_launch_is_reported_and_not_sticky(device, arena, module):
    from mneme.device import CudaError, read, write

    fn = module.get_function("poke")
    with pytest.raises(CudaError) as e:
        fn.launch(1, 2048, 0, [u64(VA)])  # more threads than a block may have
    assert e.value.name == "CUDA_ERROR_INVALID_VALUE" and not e.value.sticky
    write(VA, b"\0\0\0\0")
    fn.launch(1, 1, 0, [u64(VA)])
    assert read(VA, 4) == struct.pack("<i", 1)


def test_arguments_are_checked_against_the_kernel_parameters(device, arena, module):
    from mneme.device.errors import lib
    from mneme.errors import DeviceError

    fn = module.get_function("saxpy")
    assert fn.params == [(0, 4), (8, 8), (16, 8), (24, 4)]
    good = [struct.pack("<f", 1.0), u64(VA), u64(VA), struct.pack("<i", 0)]
    with pytest.raises(DeviceError, match="takes 4 parameter"):
        fn.launch(1, 32, 0, good[:3])
    with pytest.raises(DeviceError, match="parameter 3 has 4 bytes, the argument 8"):
        fn.launch(1, 32, 0, good[:3] + [u64(0)])
    ffi, native = lib()
    params = ffi.new("void *[]", 3)
    dims = ffi.new("uint32_t[3]", [1, 1, 1])
    assert native.mnc_launch(fn._handle(), dims, dims, 0, params, 3) == native.MNC_E_INVALID  # the C guard
    fn.launch(1, 32, 0, good)


def test_timed_loop_measures_the_kernel_not_the_launch(device, arena, module):
    fn = module.get_function("poke")
    times = fn.profile(1, 1, 0, [u64(VA)], iterations=51, warmup=3)
    median = sorted(times)[25]
    # an event-timed launch on an idle GPU costs ~5 us (host latency included); the hold kernel hides it
    assert 0 < median < 4500, times


def test_unloading_a_module_invalidates_its_functions(device):
    from mneme.device import DeviceModule
    from mneme.errors import DeviceError

    m = DeviceModule.from_cubin(cubin(device.arch))
    fn = m.get_function("poke")
    with pytest.raises(DeviceError, match="CUDA_ERROR_NOT_FOUND"):
        m.get_function("no_such_kernel")
    m.unload()
    assert not fn.valid
    with pytest.raises(DeviceError, match="unloaded"):
        fn.launch(1, 1, 0, [u64(VA)])


# ---- failures that break the context, each in its own process ---------------------------------------------

def test_illegal_address_is_a_sticky_cuda_error():
    p = run_script("""
        from mneme.device import CudaError, Device, DeviceAllocation, DeviceModule
        d = Device(0, timeout=60)
        m = DeviceModule.from_cubin(cubin(d.arch))
        try:
            m.get_function("poke").launch(1, 1, 0, [u64(16)])
            print("NO ERROR")
        except CudaError as e:
            print("FIRST", e.name, e.sticky)
        try:
            DeviceAllocation(1024)
            print("SECOND ran")
        except CudaError as e:
            print("SECOND", e.name, e.sticky, "refused" in str(e))
    """)
    assert p.returncode == 0, p.stderr
    assert "FIRST CUDA_ERROR_ILLEGAL_ADDRESS True" in p.stdout, p.stdout + p.stderr
    assert "SECOND CUDA_ERROR_ILLEGAL_ADDRESS True True" in p.stdout, p.stdout + p.stderr


def test_hung_kernel_is_stopped_by_the_watchdog():
    p = run_script("""
        import os, time
        from mneme.device import Device, DeviceAllocation, DeviceModule, DeviceTimeout, fill
        d = Device(0, timeout=2.0)
        m = DeviceModule.from_cubin(cubin(d.arch))
        flag = DeviceAllocation(4)
        fill(flag.addr, 0, 4)
        t = time.monotonic()
        try:
            m.get_function("spin").launch(1, 1, 0, [u64(flag.addr), u64(30 * 10**9)])
            print("NO TIMEOUT")
        except DeviceTimeout as e:
            print("TIMEOUT", e.name, e.sticky, round(time.monotonic() - t, 1))
        try:
            m.get_function("poke")
            DeviceAllocation(16)
            print("AFTER ran")
        except DeviceTimeout as e:
            print("AFTER refused", e.name)
        sys.stdout.flush()
        os._exit(0)  # the kernel still spins; exiting tears the context down
    """, timeout=120)
    assert "TIMEOUT MNEME_TIMEOUT True" in p.stdout, p.stdout + p.stderr
    waited = float(p.stdout.split("TIMEOUT MNEME_TIMEOUT True")[1].split()[0])
    assert 2.0 <= waited < 6.0
    assert "AFTER refused MNEME_TIMEOUT" in p.stdout, p.stdout + p.stderr
