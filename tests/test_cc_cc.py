"""`mneme cc` as a drop-in compiler: Make and CMake projects, shared libraries, --gc-sections and strip,
static RDC archives, mixed C/C++/CUDA, the nvcc builtins it supplies, verbose output and errors."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mneme.cc.embedded import SECTION, collect_embedded, read_embedded
from mneme.ir.module import module_kernels, parse_module

CC = [sys.executable, "-m", "mneme.cli", "cc"]

KERNEL = """
#include "util.h"
__global__ void scaleKernel(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = twice(x[i]);
}
void launch_scale(float *x, int n) { scaleKernel<<<(n + 255) / 256, 256>>>(x, n); }
"""
UTIL = "__device__ inline float twice(float v) { return 2.0f * v; }\n"
MAIN_CPP = """
#include <cstdio>
#include <cuda_runtime.h>
void launch_scale(float *x, int n);
int main(int argc, char **) { if (argc > 5) launch_scale(nullptr, 0); std::printf("ok\\n"); return 0; }
"""


def cc(*args, cwd=None, env=None, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([*CC, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"mneme cc {' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def kernels(path) -> list:
    return [k for m in collect_embedded(path, ld_library_path="") for k in module_kernels(parse_module(m.bitcode))]


def write(d: Path, **files) -> None:
    for name, text in files.items():
        (d / name.replace("_DOT_", ".")).write_text(text)


def test_make_project(tmp_path):
    write(tmp_path, kern_DOT_cu=KERNEL, util_DOT_h=UTIL, main_DOT_cpp=MAIN_CPP)
    (tmp_path / "Makefile").write_text(
        "CXXFLAGS = -O2 -MMD -MP\n"
        "app: kern.o main.o\n\t$(CXX) -o $@ $^\n"
        "%.o: %.cu\n\t$(CXX) $(CXXFLAGS) -c -o $@ $<\n"
        "-include kern.d main.d\n"
    )
    cxx = " ".join(CC)
    first = subprocess.run(["make", f"CXX={cxx}"], cwd=tmp_path, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    assert kernels(tmp_path / "app") == ["_Z11scaleKernelPfi"]
    assert subprocess.run([tmp_path / "app"], capture_output=True, text=True).stdout == "ok\n"
    deps = (tmp_path / "kern.d").read_text()
    assert deps.startswith("kern.o:") and "util.h" in deps
    # Editing the header rebuilds the CUDA object only, and the new IR reaches the binary.
    (tmp_path / "util.h").write_text(UTIL.replace("2.0f", "3.0f"))
    second = subprocess.run(["make", f"CXX={cxx}"], cwd=tmp_path, capture_output=True, text=True)
    assert second.returncode == 0
    assert "kern.cu" in second.stdout and "main.cpp" not in second.stdout
    (mod,) = read_embedded(tmp_path / "app")
    assert "3.000000e+00" in str(parse_module(mod.bitcode))


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_project(tmp_path):
    console = Path(sys.executable).parent / "mneme"
    if not console.exists():
        pytest.skip("the `mneme` console script is not installed next to this Python")
    write(tmp_path, kern_DOT_cu=KERNEL, util_DOT_h=UTIL, main_DOT_cpp=MAIN_CPP)
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(demo LANGUAGES CXX)\n"
        "set_source_files_properties(kern.cu PROPERTIES LANGUAGE CXX)\n"
        "add_executable(app kern.cu main.cpp)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CXXFLAGS")}
    env["CXX"] = f"{console} cc"
    cfg = subprocess.run(["cmake", "-S", ".", "-B", "build", "-G", "Unix Makefiles"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    assert re.search(r"The CXX compiler identification is Clang 22", cfg.stdout)
    build = subprocess.run(["cmake", "--build", "build"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    assert kernels(tmp_path / "build" / "app") == ["_Z11scaleKernelPfi"]


def test_gc_sections_strip_and_verbose(tmp_path):
    write(tmp_path, kern_DOT_cu=KERNEL, util_DOT_h=UTIL, main_DOT_cpp=MAIN_CPP)
    env = dict(os.environ, MNEME_CC_VERBOSE="1")
    p = cc("-O2", "-ffunction-sections", "-fdata-sections", "kern.cu", "main.cpp", "-Wl,--gc-sections", "-o", "app",
           cwd=tmp_path, env=env)
    shown = [line for line in p.stderr.splitlines() if line.startswith("mneme cc: ")]
    assert any("--cuda-device-only" in s and "-disable-llvm-optzns" in s and "kern.cu" in s for s in shown)
    assert any(re.search(r"\bld -r\b", s) for s in shown)
    assert any("--offload-link" in s and "-lcudart" in s and "-Wl,--gc-sections" in s for s in shown)
    assert not any("main.cpp" in s and "--cuda-device-only" in s for s in shown)  # host C++: no bitcode
    assert kernels(tmp_path / "app") == ["_Z11scaleKernelPfi"]
    subprocess.run(["strip", "app", "-o", "app.stripped"], cwd=tmp_path, check=True)
    assert kernels(tmp_path / "app.stripped") == ["_Z11scaleKernelPfi"]


def test_shared_library_used_by_a_binary(tmp_path):
    (tmp_path / "lib").mkdir()
    write(tmp_path, lib_DOT_cu="""
__global__ void libKernel(int *p) { *p = 7; }
void lib_launch(int *p) { libKernel<<<1, 1>>>(p); }
""", app_DOT_cu="""
void lib_launch(int *p);
__global__ void appKernel(int *p) { *p = 1; }
int main(int argc, char **) { if (argc > 5) { lib_launch(nullptr); appKernel<<<1, 1>>>(nullptr); } return 0; }
""")
    cc("-fPIC", "-shared", "lib.cu", "-o", "lib/libk.so", cwd=tmp_path)
    cc("app.cu", "-Llib", "-lk", "-Wl,-rpath,$ORIGIN/lib", "-o", "app", cwd=tmp_path)
    mods = collect_embedded(tmp_path / "app", ld_library_path="")
    assert [(m.name, m.elf_path.name) for m in mods] == [("app.cu", "app"), ("lib.cu", "libk.so")]
    assert kernels(tmp_path / "lib" / "libk.so") == ["_Z9libKernelPi"]
    assert subprocess.run([tmp_path / "app"]).returncode == 0  # loads libk.so and libcudart.so; no GPU call


def test_static_archive_of_relocatable_device_code(tmp_path):
    write(tmp_path, use_DOT_cu="""
extern __device__ float scale(float);
__global__ void useScale(float *p) { p[threadIdx.x] = scale(p[threadIdx.x]); }
int main() { return 0; }
""", dev_DOT_cu="__device__ float factor = 2.0f;\n__device__ float scale(float x) { return x * factor; }\n")
    cc("-fgpu-rdc", "-c", "use.cu", "dev.cu", cwd=tmp_path)
    subprocess.run(["ar", "rcs", "libdev.a", "dev.o"], cwd=tmp_path, check=True)
    cc("use.o", "-L.", "-ldev", "-o", "app", cwd=tmp_path)
    # The host linker never pulls dev.o (no host symbol of it is used), yet its IR is in the binary.
    assert [m.name for m in read_embedded(tmp_path / "app")] == ["use.cu", "dev.cu"]
    assert "dev.cu" not in [m.name for m in read_embedded(tmp_path / "use.o")]


def test_mixed_c_cpp_and_cuda(tmp_path):
    write(tmp_path, main_DOT_cu="""
#include <cstdio>
int host_helper(float *p);
__global__ void mixedKernel(int *x) { *x = 2; }
int main() { std::printf("%d\\n", host_helper(nullptr)); return 0; }
""", host_DOT_cpp="""
#include <cuda_runtime.h>
#include <mneme/tolerance.h>
extern "C" int cfun(int);
int host_helper(float *p) { return mneme::annotate(p, 4, mneme::relative(1e-3)) + cfun(41); }
""", cfun_DOT_c="""
#include <stdlib.h>
int cfun(int new) { int *p = malloc(sizeof *p); free(p); return new + 1; }  /* `new`: C, not C++ */
""")
    cc("main.cu", "host.cpp", "cfun.c", "-o", "app", cwd=tmp_path)
    assert subprocess.run([tmp_path / "app"], capture_output=True, text=True).stdout == "42\n"
    assert [m.name for m in read_embedded(tmp_path / "app")] == ["main.cu"]


def test_nvcc_builtins(tmp_path):
    write(tmp_path, b_DOT_cu="""
struct Pair { double a, b; };
__global__ void builtins(float *p, float4 *v, Pair *s, int *q) {
  __stcs(p, 1.0f);
  __stcg(v, make_float4(1, 2, 3, 4));
  __stwb(s, Pair{1, 2});
  float f = __ldca(p) + __ldlu(v).y + (float)__ldca(s).b;
  int old = __nv_atomic_load_n(q, __NV_ATOMIC_ACQUIRE, __NV_THREAD_SCOPE_DEVICE);
  __nv_atomic_store_n(q, old + 1, __NV_ATOMIC_RELEASE, __NV_THREAD_SCOPE_BLOCK);
  int expected = 3;
  __nv_atomic_compare_exchange_n(q, &expected, 4, false, __NV_ATOMIC_ACQ_REL, __NV_ATOMIC_RELAXED,
                                 __NV_THREAD_SCOPE_SYSTEM);
  __nv_atomic_thread_fence(__NV_ATOMIC_SEQ_CST, __NV_THREAD_SCOPE_DEVICE);
  p[1] = f + __nv_atomic_fetch_add(q, 2, __NV_ATOMIC_RELAXED);
}
""")
    ptx = cc("--cuda-device-only", "-O2", "-S", "b.cu", "-o", "-", cwd=tmp_path).stdout
    for insn in ("st.global.cs.b32", "st.global.cg.v2.b64", "st.global.wb.v2.b64", "ld.global.ca.b32",
                 "ld.global.lu.v2.b64", "ld.acquire", "st.release", "atom.acq_rel", "fence.sc"):
        assert insn in ptx, insn
    cc("-std=c++11", "-Wall", "-Wextra", "-Werror", "-c", "b.cu", "-o", "b.o", cwd=tmp_path)
    assert kernels(tmp_path / "b.o") == ["_Z8builtinsPfP6float4P4PairPi"]


def test_dependency_only_and_preprocess_pass_through(tmp_path):
    write(tmp_path, kern_DOT_cu=KERNEL, util_DOT_h=UTIL)
    deps = cc("-MM", "kern.cu", cwd=tmp_path).stdout
    assert deps.startswith("kern.o: kern.cu") and "util.h" in deps
    assert not (tmp_path / "kern.o").exists()
    pre = cc("-E", "--cuda-host-only", "kern.cu", cwd=tmp_path).stdout
    assert "scaleKernel" in pre and "twice" in pre


def test_errors_name_the_file(tmp_path):
    (tmp_path / "bad.cu").write_text("__global__ void broken( {}\n")
    missing = cc("-c", "nope.cu", cwd=tmp_path, check=False)
    assert missing.returncode == 1 and "mneme cc: error: nope.cu: no such source file" in missing.stderr
    syntax = cc("-c", "bad.cu", cwd=tmp_path, check=False)
    assert syntax.returncode == 1
    assert "bad.cu:1:" in syntax.stderr and "mneme cc: error: bad.cu: compile failed" in syntax.stderr
    assert not (tmp_path / "bad.o").exists()
    arch = cc("-arch=volta", "-c", "bad.cu", cwd=tmp_path, check=False)
    assert arch.returncode == 2 and "-arch=volta: 'volta' is not a GPU architecture" in arch.stderr
    env = dict(os.environ, CUDA_HOME=str(tmp_path / "nocuda"))
    nocuda = cc("-c", "bad.cu", cwd=tmp_path, env=env, check=False)
    assert nocuda.returncode == 2 and f"CUDA_HOME {tmp_path / 'nocuda'} has no include/cuda_runtime.h" in nocuda.stderr
    env = dict(os.environ, MNEME_CLANG=str(tmp_path / "clang-missing"))
    noclang = cc("-c", "bad.cu", cwd=tmp_path, env=env, check=False)
    assert noclang.returncode == 2 and "MNEME_CLANG=" in noclang.stderr


def test_static_kernels_keep_their_binary_names_under_rdc(tmp_path):
    # clang renames internal kernels for RDC with a per-translation-unit id; the embedded IR must use the
    # same name as the binary registers, or the recorder could not match the launch to its IR.
    write(tmp_path, st_DOT_cu="""
static __device__ int s_counter;
static __global__ void hidden(int *p) { *p = s_counter++; }
void launch(int *p) { hidden<<<1, 1>>>(p); }
""")
    cc("-fgpu-rdc", "-c", "st.cu", "-o", "st.o", cwd=tmp_path)
    (name,) = kernels(tmp_path / "st.o")
    assert name.startswith("_ZL6hiddenPi__intern__")
    from elftools.elf.elffile import ELFFile

    with open(tmp_path / "st.o", "rb") as fh:  # every section but the embedded IR itself
        sections = [s for s in ELFFile(fh).iter_sections() if s.name != SECTION and s["sh_type"] != "SHT_NOBITS"]
        rest = b"".join(s.data() for s in sections)
    assert name.encode() + b"\0" in rest  # the host side registers this very name
