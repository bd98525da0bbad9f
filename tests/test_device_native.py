"""The replay GPU core without a GPU: import and the clear error where no driver exists, the status ->
exception mapping, the pure C helpers (parameter array, range coalescing, copy merging), the Python
planning helpers, and that the C core and the shipped compare PTX are built from the sources as they are."""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "native" / "core"
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"


def native():
    from mneme.device.errors import lib

    return lib()


def run_py(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env}, timeout=120)


# ---- no driver ---------------------------------------------------------------------------------------

def test_import_needs_no_driver_and_first_use_names_the_missing_driver():
    p = run_py(
        "import mneme, mneme._native, mneme.device as d\n"
        "from mneme.errors import DeviceError\n"
        "for call in (d.get_device_count, lambda: d.Device(0), d.get_device_arch,\n"
        "             lambda: d.DeviceModule.from_cubin(b'x'), lambda: d.Arena(None, 0x153940000000, 1 << 20)):\n"
        "    try:\n"
        "        call(); print('NO ERROR')\n"
        "    except DeviceError as e:\n"
        "        print(type(e).__name__, '|', e)\n",
        MNEME_LIBCUDA="/nonexistent/libcuda.so.1")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 5, p.stdout
    for line in lines:
        assert line.startswith("DeviceError | no NVIDIA driver: /nonexistent/libcuda.so.1 not found"), line


def test_context_limits_need_a_driver_and_say_so():
    """mnc_ctx_limit (Device.set_limits: the recorded heap size and device-runtime limits) refuses cleanly."""
    p = run_py("import mneme.device.errors as e\nffi, lib = e.lib()\nnow = ffi.new('uint64_t *')\n"
               "print(lib.mnc_ctx_limit(2, 1 << 26, now), '|', ffi.string(lib.mnc_error()).decode())\n"
               "print(lib.mnc_ctx_limit(2, 1 << 26, ffi.NULL))",
               MNEME_LIBCUDA="/nonexistent/libcuda.so.1")
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.splitlines()
    assert first.startswith(f"{native()[1].MNC_E_NO_DRIVER} | no NVIDIA driver"), first
    assert int(second) == native()[1].MNC_E_INVALID


def test_device_package_imports_only_its_layer():
    p = run_py("import sys, mneme.device\n"
               "print(' '.join(sorted(m for m in sys.modules if m.startswith('mneme'))))")
    assert p.returncode == 0, p.stderr
    loaded = set(p.stdout.split())
    assert {"mneme.device", "mneme.snapshot", "mneme.config", "mneme.errors"} <= loaded
    assert not [m for m in loaded if m.split(".")[1:2] in (["record"], ["replay"], ["ir"], ["tune"], ["track"])]


# ---- statuses and errors -------------------------------------------------------------------------------

def test_status_names_and_stickiness():
    ffi, lib = native()
    name = lambda s: ffi.string(lib.mnc_status_name(s)).decode()  # noqa: E731
    assert name(lib.MNC_E_TIMEOUT) == "MNEME_TIMEOUT"
    assert name(lib.MNC_E_NO_DRIVER) == "MNEME_NO_DRIVER"
    assert name(700) in ("CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_700")  # the driver names it where loaded
    for sticky in (700, 702, 710, 714, 715, 716, 717, 718, 719, lib.MNC_E_TIMEOUT):
        assert lib.mnc_is_sticky(sticky) == 1, sticky
    for benign in (0, 1, 2, 200, 500, 600, 701, lib.MNC_E_INVALID, lib.MNC_E_NOT_GRANTED):
        assert lib.mnc_is_sticky(benign) == 0, benign


def test_check_raises_the_matching_error():
    from mneme.device import AddressNotGranted, CudaError, DeviceTimeout
    from mneme.device.errors import check
    from mneme.errors import DeviceError

    check(0)
    with pytest.raises(DeviceTimeout) as e:
        check(-3)
    assert e.value.sticky and e.value.name == "MNEME_TIMEOUT" and isinstance(e.value, CudaError)
    with pytest.raises(CudaError) as e:
        check(716)
    assert e.value.sticky and e.value.code == 716
    with pytest.raises(CudaError) as e:
        check(1)
    assert not e.value.sticky and e.value.code == 1
    with pytest.raises(AddressNotGranted):
        check(-4)
    with pytest.raises(DeviceError) as e:
        check(-5)
    assert type(e.value) is DeviceError


# ---- pure C helpers ------------------------------------------------------------------------------------

def test_kernel_args_point_at_each_parameter():
    from mneme.device import KernelArgs

    ffi, _ = native()
    values = [struct.pack("<f", 2.5), struct.pack("<Q", 0x153940000000), struct.pack("<i", -7), b"\x01",
              struct.pack("<d", 1.25)]
    args = KernelArgs.from_values(values)
    assert args.offsets == (0, 8, 16, 20, 24) and len(args) == 5
    for i, v in enumerate(values):
        assert bytes(ffi.buffer(ffi.cast("uint8_t *", args.params[i]), len(v))) == v


def test_kernel_args_from_a_recorded_snapshot(tmp_path):
    from mneme.device import KernelArgs
    from mneme.snapshot import Snapshot, Writer

    ffi, _ = native()
    with Writer(tmp_path / "p.snap", 1) as w:
        w.args(raw=b"\xaa" * 4 + b"\0" * 4 + struct.pack("<Q", 42), offsets=[0, 8], sizes=[4, 8])
    with Snapshot.read(tmp_path / "p.snap") as s:
        args = KernelArgs.of(s.args)
    assert args.offsets == (0, 8)
    assert bytes(ffi.buffer(ffi.cast("uint8_t *", args.params[1]), 8)) == struct.pack("<Q", 42)
    assert KernelArgs.of(None).params is not None and len(KernelArgs.of(None)) == 0


def test_kernel_args_refuse_parameters_past_the_buffer():
    from mneme.device import KernelArgs
    from mneme.errors import DeviceError

    with pytest.raises(DeviceError, match="parameter 1 .offset 4, 8 bytes. ends past the buffer's 8 bytes"):
        KernelArgs(b"\0" * 8, [0, 4], [4, 8])


def test_coalesce_ranges():
    ffi, lib = native()

    def coalesce(ranges, gap):
        arr = ffi.new("mn_range[]", ranges)
        n = lib.mnc_coalesce_ranges(arr, len(ranges), gap)
        return [(arr[i].offset, arr[i].length) for i in range(n)]

    ranges = [(100, 10), (0, 10), (10, 5), (50, 0), (108, 4), (200, 1), (30, 4)]
    assert coalesce(ranges, 0) == [(0, 15), (30, 4), (100, 12), (200, 1)]
    assert coalesce(ranges, 15) == [(0, 15), (30, 4), (100, 12), (200, 1)]  # the gap 15..30 is not below 15
    assert coalesce(ranges, 16) == [(0, 34), (100, 12), (200, 1)]
    assert coalesce(ranges, 1000) == [(0, 201)]
    assert coalesce([], 0) == []


def test_merge_copies_only_where_source_and_destination_line_up():
    ffi, lib = native()
    D2D, HOST = 0, 1

    def merge(copies, gap):
        arr = ffi.new("mnc_copy[]", [dict(dst=d, src=s, length=n, kind=k) for d, s, n, k in copies])
        n = lib.mnc_merge_copies(arr, len(copies), gap)
        return [(arr[i].dst, arr[i].src, arr[i].length, arr[i].kind) for i in range(n)]

    same_shift = [(1000, 5000, 8, D2D), (1100, 5100, 8, D2D)]
    assert merge(same_shift, 4096) == [(1000, 5000, 108, D2D)]
    assert merge(same_shift, 92) == same_shift  # gap of 92 bytes is not below 92
    assert merge(same_shift, 93) == [(1000, 5000, 108, D2D)]
    other_shift = [(1000, 5000, 8, D2D), (1100, 9100, 8, D2D)]
    assert merge(other_shift, 4096) == other_shift
    overlapping = [(1004, 5004, 8, D2D), (1000, 5000, 8, D2D)]
    assert merge(overlapping, 0) == [(1000, 5000, 12, D2D)]
    host = [(1000, 5000, 8, HOST), (1008, 5008, 8, HOST), (1100, 5100, 8, HOST)]
    assert merge(host, 4096) == [(1000, 5000, 16, HOST), (1100, 5100, 8, HOST)]
    kinds = [(1000, 5000, 8, HOST), (1008, 5008, 8, D2D)]
    assert merge(kinds, 4096) == [(1008, 5008, 8, D2D), (1000, 5000, 8, HOST)]


def test_copies_of_two_objects_never_merge_even_where_they_line_up():
    # devcounter on the H200: the driver places g_count and g_launches 256 bytes apart (each its own
    # allocation), the variables' device-side copies are 256 bytes apart too; one merged copy over both was
    # refused with CUDA_ERROR_INVALID_VALUE ("reset of written bytes")
    ffi, lib = native()
    D2D = 0
    g_count, g_launches = 0x7F0000000000, 0x7F0000000100
    shadow = 0x7E0000000000
    copies = [dict(dst=g_launches, src=shadow + 256, length=1, kind=D2D, obj=5),
              dict(dst=g_count, src=shadow, length=3, kind=D2D, obj=4),
              dict(dst=g_count + 4, src=shadow + 4, length=2, kind=D2D, obj=4)]
    arr = ffi.new("mnc_copy[]", copies)
    n = lib.mnc_merge_copies(arr, len(copies), 4096)
    assert [(arr[i].dst, arr[i].src, arr[i].length, arr[i].obj) for i in range(n)] == [
        (g_count, shadow, 6, 4), (g_launches, shadow + 256, 1, 5)]  # within one variable they still merge


def test_copy_inside_checks_both_ends_against_the_object():
    ffi, lib = native()
    c = ffi.new("mnc_copy *", dict(dst=1000, src=5000, length=8))
    assert lib.mnc_copy_inside(c, 1000, 5000, 8) == 1
    assert lib.mnc_copy_inside(c, 992, 4992, 16) == 1
    assert lib.mnc_copy_inside(c, 1000, 5000, 7) == 0  # past the object's end
    assert lib.mnc_copy_inside(c, 1001, 5000, 100) == 0  # starts before it
    assert lib.mnc_copy_inside(c, 1000, 5004, 100) == 0  # source outside its copy
    big = ffi.new("mnc_copy *", dict(dst=2**64 - 8, src=0, length=16))
    assert lib.mnc_copy_inside(big, 2**64 - 8, 0, 8) == 0  # no wrap-around


# ---- Python planning helpers -------------------------------------------------------------------------------

class _B:
    def __init__(self, addr, size, space):
        self.addr, self.size, self.space = addr, size, space


def test_host_regions_cover_pinned_blobs_by_whole_pages():
    from mneme.device import host_regions

    blobs = [_B(0x7000001010, 100, 1), _B(0x7000002000, 4096, 1), _B(0x153940000000, 64, 0),
             _B(0x7000009000, 1, 1), _B(0x700000A000, 0, 1)]
    assert host_regions(blobs, page=4096) == [(0x7000001000, 0x2000), (0x7000009000, 0x2000)]
    assert host_regions([_B(0x153940000000, 64, 0)], page=4096) == []


def test_managed_spans_cover_managed_blobs_by_whole_granules_and_nothing_else():
    from mneme.device import managed_spans

    g = 2 << 20
    # two cudaMallocManaged ranges packed into one 2 MiB granule, one straddling a granule boundary, one far away
    blobs = [_B(0x7F0000000200, 4096, 2), _B(0x7F0000000000, 512, 2), _B(0x7F00001FF000, 8192, 2),
             _B(0x7F0010000000, 1, 2), _B(0x153940000000, 64, 0), _B(0x7000001000, 4096, 1)]
    assert managed_spans(blobs, g) == [(0x7F0000000000, 2 * g), (0x7F0010000000, g)]
    assert managed_spans([_B(0x153940000000, 64, 0), _B(0x7000001000, 64, 1)], g) == []


def test_exact_plan_covers_every_blob_and_variable(tmp_path):
    from mneme.device import exact_plan
    from mneme.snapshot import Snapshot, Writer

    with Writer(tmp_path / "p.snap", 1) as w:
        w.blob(0x153940000000, b"a" * 64)
        w.blob(0x6F0000000000, b"b" * 16, 1)
        w.variable("g", 0x7F0000000000, b"c" * 8)
    with Snapshot.read(tmp_path / "p.snap") as s:
        plan = exact_plan(s)
    assert [(c.kind, c.key, c.base, c.offset, c.length, c.elem) for c in plan] == [
        ("blob", 0x153940000000, 0x153940000000, 0, 64, "bytes"),
        ("blob", 0x6F0000000000, 0x6F0000000000, 0, 16, "bytes"),
        ("variable", "g", 0x7F0000000000, 0, 8, "bytes")]


# ---- the GPU test kernels and the native sources -------------------------------------------------------------

def test_gpu_test_kernels_compile_to_a_cubin():
    spec = importlib.util.spec_from_file_location("device_gpu_kernels", ROOT / "tests/gpu/test_device_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from mneme.ir.codegen import parse_info_log  # noqa: F401  (the same path the GPU tests take)

    blob = mod.cubin("sm_90")
    assert blob[:4] == b"\x7fELF"
    for kernel in (b"saxpy", b"scaled", b"bigshared", b"poke", b"spin", b"scale_ptr", b"counter"):
        assert kernel in blob


@pytest.mark.skipif(not (CUDA_INCLUDE / "cuda.h").exists(), reason="needs CUDA headers (cuda.h)")
def test_native_core_compiles_without_warnings(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    for src in sorted(CORE.glob("*.c")):
        p = subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", f"-I{CUDA_INCLUDE}",
                            "-c", str(src), "-o", str(tmp_path / (src.stem + ".o"))], capture_output=True, text=True)
        assert p.returncode == 0, f"{src.name}:\n{p.stderr}"


@pytest.mark.skipif(shutil.which("clang++-22") is None, reason="needs clang++-22")
def test_shipped_compare_ptx_is_built_from_compare_cu(tmp_path):
    shipped = (ROOT / "mneme" / "data" / "compare.ptx").read_text()
    work = tmp_path / "root"
    (work / "native" / "core").mkdir(parents=True)
    for f in ("compare.cu", "build_ptx.sh"):
        shutil.copy(CORE / f, work / "native" / "core" / f)
    p = subprocess.run(["bash", str(work / "native" / "core" / "build_ptx.sh")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert (work / "mneme" / "data" / "compare.ptx").read_text() == shipped, (
        "mneme/data/compare.ptx is stale: run `make ptx` after editing native/core/compare.cu")
    for entry in ("mn_cmp_bytes", "mn_cmp_values", "mn_hold"):
        assert f".entry {entry}(" in shipped
