"""`make -C examples` builds every example app through `mneme cc`, and `mneme ir` finds exactly each
app's kernels (also in a shared library and across RDC translation units)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mneme.cc.embedded import read_embedded, shared_library_deps
from mneme.cc.ircli import list_modules
from mneme.ir.module import parse_module

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: demangled kernels per app (the shared library's included for shlib)
EXPECTED = {
    "vecadd": ["vecAdd(float const*, float const*, float*, int)"],
    "stencil2d": ["stencil2d(float const*, float*, int, int)"],
    "matmul": [
        "matmulStatic(float const*, float const*, float*, int)",
        "matmulDynamic(float const*, float const*, float*, int, int)",
        "matmulPanel(float const*, float const*, float*, int)",
    ],
    "reduce": ["reduceSum(float const*, float*, int)"],
    "rdc": ["rdcApply(float const*, float*, int)"],
    "structarg": ["structArg(Params, float const* const*, int, float*)"],
    "manylaunch": ["scaleAdd(float*, float const*, float, int)"],
    "ptrglobal": ["ptrGlobal(int const*, float*, int)"],
    "pinned": ["readPinned(float const*, float const*, float*, int)", "scaleMapped(float*, float, int)"],
    "graph": ["graphStep(float*, float, int)"],
    "graphupdate": ["graphScale(float*, float, int)", "graphShift(float*, float const*, float, int)"],
    "graphmem": ["graphFill(float*, float, int)", "graphAccum(float*, float const*, int)"],
    "driverapi": ["driverScale(float*, float, int)"],
    "texture": [
        "textureRead(unsigned long long, float*, int)",
        "pitchRead(unsigned long long, float*, int, int)",
        "arrayRead(unsigned long long, float*, int, int)",
        "volumeRead(unsigned long long, float*, int, int, int)",
        "surfaceWrite(unsigned long long, unsigned long long, int, int)",
        "globalRead(float*, int)",
        "mipRead(unsigned long long, float*, int, int, float)",
    ],
    "managed": ["managedUpdate(float*, float, int)", "managedRows(float* const*, float const*, int, int)"],
    "zerocopy": ["zeroCopyRead(float const*, float*, float, int)", "zeroCopyWrite(float const*, float*, int)"],
    "streamalloc": [
        "poolAxpy(float*, float const*, float, int)",
        "pitchScale(float*, unsigned long, int, int, float)",
        "volumeAdd(cudaPitchedPtr, int, int, int, float const*, unsigned long)",
    ],
    "launchex": ["exScale(float const*, float*, int, float)"],
    "cooperative": ["coopSum(float const*, float*, float*, int)"],
    "shlib": ["shlibOffset(float*, float, int)", "shlibScale(float*, float, int)"],
    "consttable": ["tableMap(float const*, float*, int)"],
    "devcounter": ["countAbove(float const*, float*, int, float)"],
    "atomicsum": ["jacobiStep(float const*, float const*, float*, float*, int)"],
    "workqueue": ["queueSquare(float const*, float*, int*, unsigned int*, int)"],
    "halo": ["void haloSmooth<16>(float const*, float*, int, int)"],
    "devfnptr": ["applyFn(float*, float (*)(float), int)", "applyTable(float*, int, int)", "applyVirtual(float*, int)"],
    "devheap": ["heapFill(float**, float const*, int)", "heapSum(float* const*, float*, int)",
                "heapFree(float**)"],
    "dynpar": ["scaleRow(float*, float const*, int, float, int)",
               "launchRows(float*, float const*, int, int, float, int, unsigned int*)"],
    # the RDC example built by `mneme nvcc` (nvcc's -dc, device link and g++ link)
    "nvcc_rdc": ["rdcApply(float const*, float*, int)"],
    "nvcc_rdc_shared": ["rdcApply(float const*, float*, int)"],
    # build settings the replay baseline reproduces (tests/test_baseline.py): nvcc -rdc=true, --use_fast_math, defaults
    "nvcc_matmul_rdc": ["matmulTile32(float const*, float const*, float*, int)"],
    "nvcc_fastmath": ["fastMath(float const*, float*, int, int)"],
    "nvcc_precmath": ["fastMath(float const*, float*, int, int)"],
}
#: built by `mneme nvcc` with nvcc's default runtime linkage (static)
STATIC_CUDART = {"nvcc_rdc", "nvcc_matmul_rdc", "nvcc_fastmath", "nvcc_precmath"}


def make(out: Path, *targets: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CXXFLAGS", "MAKEFLAGS")}
    return subprocess.run(
        ["make", "-C", str(EXAMPLES), "-j2", f"MNEME={sys.executable} -m mneme.cli", f"BIN={out}/bin",
         f"OBJ={out}/obj", *targets],
        env=env, capture_output=True, text=True,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("examples")
    p = make(out)
    assert p.returncode == 0, p.stdout + p.stderr
    return out / "bin"


#: examples/Makefile's STATIC: the same apps linked with the static CUDA runtime, as <name>_static
STATIC = ["vecadd", "ptrglobal", "pinned", "manylaunch", "launchex"]


def test_every_app_is_built(built):
    expected = [*EXPECTED, "libmnemeshlib.so", *(f"{n}_static" for n in STATIC)]
    assert sorted(p.name for p in built.iterdir()) == sorted(expected)


@pytest.mark.parametrize("app", STATIC)
def test_static_runtime_builds_carry_the_ir_and_no_libcudart(built, app):
    modules = list_modules(built / f"{app}_static", ld_library_path="")
    assert sorted(k["demangled"] for m in modules for k in m["kernels"]) == sorted(EXPECTED[app])
    names = [p.name for p in shared_library_deps(built / f"{app}_static", ld_library_path="")]
    assert not [n for n in names if n.startswith("libcudart")], names


@pytest.mark.parametrize("app", sorted(EXPECTED))
def test_ir_lists_exactly_the_kernels(built, app):
    modules = list_modules(built / app, ld_library_path="")
    kernels = [k["demangled"] for m in modules for k in m["kernels"]]
    assert sorted(kernels) == sorted(EXPECTED[app])
    assert all(m["arch"] == "sm_90" for m in modules)
    mangled = {k["name"] for m in modules for k in m["kernels"]}
    assert all(name.startswith("_Z") for name in mangled)


@pytest.mark.parametrize("app", sorted(EXPECTED))
def test_links_the_shared_cudart(built, app):
    names = [p.name for p in shared_library_deps(built / app, ld_library_path="")]
    if app in STATIC_CUDART:
        assert not any(n.startswith("libcudart") for n in names), names
    else:
        assert "libcudart.so.13" in names, names


def test_bitcode_is_pre_optimization_and_named(built):
    (mod,) = read_embedded(built / "vecadd")
    text = str(parse_module(mod.bitcode))
    kernel = text[text.index("@_Z6vecAddPKfS0_Pfi(") :].split("\n}\n")[0]
    assert "optnone" not in text
    assert "alloca" in kernel and "%a.addr" in kernel  # front-end IR: locals not yet promoted, names kept
    assert "!tbaa" in kernel  # an optimizing build's front end, not -O0
    assert '"target-cpu"="sm_90"' in text
    assert mod.source == str(EXAMPLES / "vecadd.cu")


def test_variables_are_in_the_modules(built):
    (stencil,) = read_embedded(built / "stencil2d")
    text = str(parse_module(stencil.bitcode))
    assert re.search(r"@c_weights = .*addrspace\(4\)", text)
    assert re.search(r"@g_boundary = .*addrspace\(1\)", text)
    assert re.search(r"define .*@_Z9neighbourPKfiiii\(", text)  # the __device__ helper, not inlined yet
    (ptr,) = read_embedded(built / "ptrglobal")
    text = str(parse_module(ptr.bitcode))
    assert re.search(r"@g_ptr = .*global ptr addrspacecast \(ptr addrspace\(1\) @g_value to ptr\)", text)
    assert re.search(r"@g_cursor = .*getelementptr", text)


def test_rdc_translation_units_and_device_link(built):
    mods = read_embedded(built / "rdc")
    assert [Path(m.name).name for m in mods] == ["rdc_main.cu", "rdc_lib.cu"]
    assert all(m.meta["rdc"] for m in mods)
    main, lib = (str(parse_module(m.bitcode)) for m in mods)
    assert re.search(r"declare .*@_Z13rdc_transformf\(", main)
    assert re.search(r"define .*@_Z13rdc_transformf\(", lib) and "@rdc_gain" in lib
    # The device code was really linked: the fatbin holds the function from the other unit.
    from elftools.elf.elffile import ELFFile

    with open(built / "rdc", "rb") as fh:
        fatbin = ELFFile(fh).get_section_by_name(".nv_fatbin").data()
    assert b"_Z13rdc_transformf" in fatbin and b"_Z8rdcApplyPKfPfi" in fatbin


def test_shared_library_ir_is_found_through_rpath(built):
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "ir", str(built / "shlib")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert re.search(r"^.*/libmnemeshlib\.so$", p.stdout, re.M)
    assert "_Z10shlibScalePffi  shlibScale(float*, float, int)" in p.stdout
    assert "_Z11shlibOffsetPffi  shlibOffset(float*, float, int)" in p.stdout


def test_make_is_incremental_and_cleans(built):
    out = built.parent
    again = make(out)
    assert again.returncode == 0 and "mneme.cli cc" not in again.stdout, again.stdout
    clean = make(out, "clean")
    assert clean.returncode == 0
    assert not (out / "bin").exists() and not (out / "obj").exists()
    rebuilt = make(out, f"{out}/bin/vecadd")
    assert rebuilt.returncode == 0 and (out / "bin" / "vecadd").exists()
