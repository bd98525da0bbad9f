"""`mneme nvcc` builds with real clang-22: the command lines it runs, the device code they make (PTX read
back), nvcc's identity for user code, separate compilation with -dc/-dlink/-lib, dependency files,
OpenMP host code, errors without crash files, and the IR that `mneme ir` lists."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mneme.cc.embedded import build_settings, read_embedded
from mneme.ir.module import module_kernels, parse_module

NVCC = [sys.executable, "-m", "mneme.cli", "nvcc"]

KERNEL = r"""
__global__ void mathKernel(float *a, const float *b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = sqrtf(a[i]) / b[i] + a[i] * b[i];
}
void launch(float *a, const float *b, int n) { mathKernel<<<(n + 127) / 128, 128>>>(a, b, n); }
"""


def nvcc(*args, cwd, env=None, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([*NVCC, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"mneme nvcc {' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def float_ops(ptx: str) -> set:
    return set(re.findall(r"\b((?:div|sqrt|add|mul|fma)\.[a-z0-9.]*f32)\b", ptx))


def test_fast_math_changes_device_code_only(tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL)
    nvcc("-arch=sm_90", "-ptx", "k.cu", "-o", "plain.ptx", cwd=tmp_path)
    nvcc("-arch=sm_90", "-ptx", "-use_fast_math", "k.cu", "-o", "fast.ptx", cwd=tmp_path)
    plain = float_ops((tmp_path / "plain.ptx").read_text())
    fast = float_ops((tmp_path / "fast.ptx").read_text())
    # nvcc's defaults: IEEE division and square root (clang alone would approximate sqrtf), no ftz
    assert "div.rn.f32" in plain and "sqrt.rn.f32" in plain
    assert not any(".ftz" in op or "approx" in op for op in plain)
    # --use_fast_math: approximate division and square root, denormals flushed
    assert "div.approx.ftz.f32" in fast and "sqrt.approx.ftz.f32" in fast
    assert not any(op in fast for op in ("div.rn.f32", "sqrt.rn.f32"))
    nvcc("-arch=sm_90", "-ptx", "--ftz=true", "k.cu", "-o", "ftz.ptx", cwd=tmp_path)
    ftz = float_ops((tmp_path / "ftz.ptx").read_text())
    assert "div.rn.ftz.f32" in ftz and "sqrt.rn.ftz.f32" in ftz


def test_compile_commands_and_settings_read_back(tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL)
    p = nvcc("-v", "-c", "k.cu", "-o", "k.o", "-O2", "--use_fast_math", "-maxrregcount=32", "-Xptxas", "-v",
             "-Xcompiler", "-fPIC,-Wall", "-lineinfo", "-gencode", "arch=compute_80,code=sm_80",
             "--generate-code=arch=compute_90,code=[compute_90,sm_90]", cwd=tmp_path)
    lines = [line[3:] for line in p.stderr.splitlines() if line.startswith("#$ ")]
    compile_line = next(line for line in lines if " -c " in line and "-emit-llvm" not in line and "clang" in line)
    for flag in ("--cuda-gpu-arch=sm_80", "--cuda-gpu-arch=sm_90", "-Xcuda-ptxas --maxrregcount=32",
                 "-Xcuda-ptxas -v", "-Xarch_host -O2", "-Xarch_host -fPIC", "-Xarch_host -Wall",
                 "-Xarch_device -O3", "-fgpu-flush-denormals-to-zero", "-nvptx-prec-divf32=0",
                 "-fgpu-approx-transcendentals", "-Xarch_device -gline-directives-only", "-fno-crash-diagnostics"):
        assert flag in compile_line, flag
    assert "ptxas info" in p.stderr and "Used" in p.stderr  # -Xptxas -v reached ptxas
    assert any("TOP=" in line for line in lines) and any(line.startswith("LIBRARIES=") for line in lines)
    (mod,) = read_embedded(tmp_path / "k.o")
    s = build_settings(mod)
    assert s["compiler"] == "nvcc" and s["ftz"] and not s["prec_div"] and not s["prec_sqrt"]
    assert s["maxrregcount"] == 32 and "-v" in s["ptxas"] and s["host_opt_level"] == "2"
    assert module_kernels(parse_module(mod.bitcode)) == ["_Z10mathKernelPfPKfi"]


NVCC_GUARDED = r"""
#include <cstdio>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <cuda/std/type_traits>
#ifdef __NVCC__
#define HD __host__ __device__
#else
#define HD
#endif
#if !defined(__CUDACC_VER_MAJOR__) || __CUDACC_VER_MAJOR__ < 12
#error "__CUDACC_VER_MAJOR__ missing"
#endif
struct Twice { HD float operator()(float v) const { return 2 * v; } };
__global__ void apply(float *x) { x[threadIdx.x] = Twice()(x[threadIdx.x]); }
int main() {
  std::printf("nvcc=%d major=%d minor=%d host=%g\n", __NVCC__, __CUDACC_VER_MAJOR__, __CUDACC_VER_MINOR__,
              Twice()(1.5f));
  apply<<<1, 1>>>(nullptr);
  return 0;
}
"""


def test_code_testing_nvcc_macros_builds_and_runs_its_host_side(tmp_path):
    (tmp_path / "g.cu").write_text(NVCC_GUARDED)
    nvcc("-arch=sm_90", "-std=c++17", "g.cu", "-o", "g", "-cudart", "shared", cwd=tmp_path)
    out = subprocess.run([tmp_path / "g"], capture_output=True, text=True).stdout  # no GPU: the launch fails
    m = re.search(r"nvcc=1 major=(\d+) minor=(\d+) host=3", out)
    assert m, out
    cuda_h = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include" / "cuda.h"
    version = int(re.search(r"#define\s+CUDA_VERSION\s+(\d+)", cuda_h.read_text()).group(1))
    assert (int(m.group(1)), int(m.group(2))) == (version // 1000, version % 1000 // 10)


CALLER = r"""
extern __device__ float scale(float);
__global__ void useScale(float *x) { x[threadIdx.x] = scale(x[threadIdx.x]); }
void run(float *x) { useScale<<<1, 32>>>(x); }
"""
CALLEE = "__device__ float scale(float v) { return 3 * v; }\n__global__ void other(float *x) { x[0] = 1; }\n"
MAIN = "void run(float *);\nint main(int argc, char **) { if (argc > 3) run(nullptr); return 0; }\n"


def test_separate_compilation_dlink_lib_and_host_link(tmp_path):
    (tmp_path / "caller.cu").write_text(CALLER)
    (tmp_path / "callee.cu").write_text(CALLEE)
    (tmp_path / "main.cpp").write_text(MAIN)
    a = ["-arch=sm_90"]
    nvcc(*a, "-dc", "caller.cu", "-o", "caller.o", cwd=tmp_path)
    nvcc(*a, "-rdc=true", "-c", "callee.cu", "-o", "callee.o", cwd=tmp_path)
    nvcc(*a, "-lib", "callee.o", "-o", "libcallee.a", cwd=tmp_path)
    nvcc("-c", "main.cpp", "-o", "main.o", cwd=tmp_path)  # host compiler (g++)
    # CMake's way: device link to an object, host link by g++ with the static runtime
    nvcc(*a, "-dlink", "caller.o", "libcallee.a", "-o", "dlink.o", cwd=tmp_path)
    cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    subprocess.run(["g++", "main.o", "caller.o", "dlink.o", "libcallee.a", f"-L{cuda}/lib64", "-lcudart_static",
                    "-ldl", "-lpthread", "-lrt", "-o", "app_gxx"], cwd=tmp_path, check=True)
    nm = subprocess.run(["nm", tmp_path / "app_gxx"], capture_output=True, text=True).stdout
    assert "__cudaRegisterFatBinary" in nm and re.search(r" D __start_llvm_offload_entries\n", nm)
    # nvcc's way: one link command
    nvcc(*a, "main.o", "caller.o", "-L.", "-lcallee", "-o", "app", cwd=tmp_path)
    ldd = subprocess.run(["ldd", tmp_path / "app"], capture_output=True, text=True).stdout
    assert "libcudart" not in ldd  # static runtime, as nvcc
    ir = subprocess.run([sys.executable, "-m", "mneme.cli", "ir", "app"], cwd=tmp_path, capture_output=True,
                        text=True, check=True).stdout
    assert "_Z8useScalePf" in ir and "caller.cu" in ir
    nvcc(*a, "main.o", "caller.o", "libcallee.a", "-cudart=shared", "-o", "app_shared", cwd=tmp_path)
    assert "libcudart.so" in subprocess.run(["ldd", tmp_path / "app_shared"], capture_output=True, text=True).stdout


def test_dependency_files(tmp_path):
    (tmp_path / "util.h").write_text("__device__ inline float one() { return 1; }\n")
    (tmp_path / "d.cu").write_text('#include "util.h"\n__global__ void d(float *x) { x[0] = one(); }\n')
    nvcc("-arch=sm_90", "-MD", "-MT", "obj/d.o", "-MF", "d.dep", "-c", "d.cu", "-o", "d.o", cwd=tmp_path)
    dep = (tmp_path / "d.dep").read_text()
    assert dep.startswith("obj/d.o:") and "util.h" in dep
    out = nvcc("-arch=sm_90", "-M", "d.cu", cwd=tmp_path).stdout
    assert "d.o:" in out and "util.h" in out


def test_openmp_host_code_links_gccs_libgomp(tmp_path):
    (tmp_path / "omp.cpp").write_text(
        "#include <omp.h>\n#include <cstdio>\nint main() { int n = 0;\n#pragma omp parallel reduction(+:n)\n"
        "n += 1;\nstd::printf(\"%d\\n\", n); return 0; }\n"
    )
    (tmp_path / "k.cu").write_text(KERNEL)
    nvcc("-arch=sm_90", "-Xcompiler", "-fopenmp", "omp.cpp", "k.cu", "-o", "omp", cwd=tmp_path)
    assert "libgomp" in subprocess.run(["ldd", tmp_path / "omp"], capture_output=True, text=True).stdout
    run = subprocess.run([tmp_path / "omp"], env=dict(os.environ, OMP_NUM_THREADS="3"), capture_output=True, text=True)
    assert run.stdout.strip() == "3"


def test_failures_name_the_flag_and_leave_no_crash_files(tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    old = nvcc("-arch=sm_60", "-c", "k.cu", cwd=tmp_path, env=env, check=False)
    assert old.returncode != 0
    err = [line for line in old.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "sm_60" in err[0] and "-arch=sm_90" in err[0], old.stderr
    bad = nvcc("-arch=sm_90", "-Xptxas", "--no-such-ptxas-flag", "-c", "k.cu", cwd=tmp_path, env=env, check=False)
    assert bad.returncode != 0 and "k.cu" in bad.stderr
    assert "PLEASE submit a bug report" not in bad.stderr and "Preprocessed source" not in bad.stderr
    assert list(tmp.iterdir()) == []
    unknown = nvcc("--no-such-nvcc-option", "k.cu", cwd=tmp_path, check=False)
    assert unknown.returncode == 2 and "--no-such-nvcc-option" in unknown.stderr


def test_version_is_what_cmake_looks_for(tmp_path):
    out = nvcc("--version", cwd=tmp_path).stdout
    assert "nvcc: NVIDIA (R) Cuda compiler driver" in out and re.search(r"V\d+\.\d+\.\d+", out) and "mneme" in out


def test_openmp_pragmas_in_cuda_source_need_libomp(tmp_path):
    from mneme.cc.nvcctrans import Translation

    if Translation.libomp():
        pytest.skip("LLVM's libomp is installed: clang compiles the pragmas against it")
    (tmp_path / "p.cu").write_text("void f(int *x) {\n#pragma omp parallel for\nfor (int i = 0; i < 4; ++i) x[i] = i; }\n")
    p = nvcc("-arch=sm_90", "-Xcompiler", "-fopenmp", "-c", "p.cu", cwd=tmp_path, check=False)
    assert p.returncode == 2 and "p.cu" in p.stderr and "libomp" in p.stderr and ".cpp" in p.stderr


def test_cubin_and_fatbin(tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL)
    nvcc("-cubin", "-arch=sm_90", "k.cu", cwd=tmp_path)
    assert (tmp_path / "k.cubin").read_bytes()[:4] == b"\x7fELF"
    nvcc("-fatbin", "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90", "k.cu",
         "-o", "k.fatbin", cwd=tmp_path)
    data = (tmp_path / "k.fatbin").read_bytes()
    assert data[:4] == bytes.fromhex("50ed55ba")  # fatbinary's magic
    assert data.count(b"\x7fELF") == 2  # one cubin per architecture (and their PTX)


PARENT = "__global__ void child(int *x);\n__global__ void parent(int *x) { child<<<1, 1>>>(x); }\n"
CHILD = "__global__ void child(int *x) { x[threadIdx.x] = 1; }\nint main() { return 0; }\n"


def test_dynamic_parallelism_across_files_device_links(tmp_path):
    """clang declares child as `.extern .func` in parent's PTX; ptxfix makes it `.extern .entry` (nvlink
    refuses the objects otherwise); -dlto links one module and needs no fix."""
    (tmp_path / "parent.cu").write_text(PARENT)
    (tmp_path / "child.cu").write_text(CHILD)
    for src in ("parent", "child"):
        nvcc("-arch=sm_90", "-dc", f"{src}.cu", "-o", f"{src}.o", cwd=tmp_path)
    nvcc("-arch=sm_90", "parent.o", "child.o", "-o", "app", cwd=tmp_path)
    ir = subprocess.run([sys.executable, "-m", "mneme.cli", "ir", "app"], cwd=tmp_path, capture_output=True,
                        text=True, check=True).stdout
    assert "_Z6parentPi" in ir and "_Z5childPi" in ir
    p = nvcc("-v", "-arch=sm_90", "-dc", "parent.cu", "-o", "parent.o", cwd=tmp_path)
    assert "_Z5childPi: declared .extern .entry" in p.stderr
    for src in ("parent", "child"):  # device code as bitcode, linked as one module (libcudadevrt included)
        nvcc("-arch=sm_90", "-dc", "-dlto", f"{src}.cu", "-o", f"{src}.o", cwd=tmp_path)
    nvcc("-arch=sm_90", "parent.o", "child.o", "-o", "app2", cwd=tmp_path)
    assert (tmp_path / "app2").exists()


def test_ptxfix_rewrites_only_kernels_clang_lists():
    """A device function whose address is taken stays `.extern .func`; a function with a return value
    is never a kernel; `generic(...)` entries are unwrapped."""
    from mneme.cc.ptxfix import fix_ptx

    ptx = (".extern .func _Z5childPi\n(\n\t.param .b64 _Z5childPi_param_0\n)\n;\n"
           ".extern .func _Z4devfPi\n(\n\t.param .b64 _Z4devfPi_param_0\n)\n;\n"
           ".extern .func  (.param .b64 func_retval0) __cudaCDP2GetParameterBuffer\n(\n)\n;\n"
           ".extern .func _Z2k2v()\n;\n"
           ".visible .global .align 8 .u64 fp = _Z4devfPi;\n"
           ".global .align 8 .u64 __clang_gpu_used_external[2] = {_Z5childPi, generic(_Z2k2v)};\n")
    new, fixed = fix_ptx(ptx)
    assert fixed == ["_Z5childPi", "_Z2k2v"]
    assert ".extern .entry _Z5childPi\n(" in new and ".extern .entry _Z2k2v()" in new
    assert ".extern .func _Z4devfPi" in new and "__cudaCDP2GetParameterBuffer" in new
    assert fix_ptx(ptx.replace("__clang_gpu_used_external", "other"))[1] == []


VIRTUAL_A = ("#include <new>\nstruct B { __device__ virtual int f() = 0; __device__ virtual ~B() {} };\n"
             "struct D : B { __device__ int f() override { return 3; } };\n"
             "__global__ void k(int *o) { B *b = new D(); o[0] = b->f(); delete b; }\nint main() { return 0; }\n")
VIRTUAL_B = ("struct B2 { __device__ virtual int g() = 0; };\nstruct D2 : B2 { __device__ int g() override { return 4; } };\n"
             "__global__ void k2(int *o) { D2 d; B2 *b = &d; o[0] = b->g(); }\n")


def test_device_virtual_functions_in_several_files_device_link(tmp_path):
    """Pure virtual functions name __cxa_pure_virtual, which nvcc's device runtime defines: nvcc_compat.h
    gives every translation unit a weak one."""
    (tmp_path / "a.cu").write_text(VIRTUAL_A)
    (tmp_path / "b.cu").write_text(VIRTUAL_B)
    for src in ("a", "b"):
        nvcc("-arch=sm_90", "-dc", f"{src}.cu", "-o", f"{src}.o", cwd=tmp_path)
    nvcc("-arch=sm_90", "a.o", "b.o", "-o", "app", cwd=tmp_path)
    assert (tmp_path / "app").exists()


CUB_PROGRAM = r"""
#include <cub/device/device_reduce.cuh>

template <int N>
__global__ void scale(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= N;
}

void run(float *x, float *sum, void *tmp, size_t bytes, int n) {
  scale<2><<<(n + 255) / 256, 256>>>(x, n);
  cub::DeviceReduce::Sum(tmp, bytes, x, sum, n);
}
"""


def fatbin_kernels(obj: Path) -> set:
    """Kernel names of every cubin in the object's .nv_fatbin (a kernel has a .nv.info.<name> section)."""
    import io

    from elftools.elf.elffile import ELFFile

    with open(obj, "rb") as fh:
        data = ELFFile(fh).get_section_by_name(".nv_fatbin").data()
    names, cubins = set(), 0
    for m in re.finditer(rb"\x7fELF", data):
        cubin = ELFFile(io.BytesIO(data[m.start():]))
        names |= {s.name[len(".nv.info."):] for s in cubin.iter_sections() if s.name.startswith(".nv.info.")}
        cubins += 1
    assert cubins == 2, f"one cubin per architecture, found {cubins}"
    return names


@pytest.mark.slow
def test_cub_kernels_in_the_ir_are_named_as_in_the_device_code_for_several_archs(tmp_path):
    """CCCL names its namespace after __CUDA_ARCH_LIST__ (cub::CUB_300001_SM_800_900); the IR compile,
    for the first architecture only, once defined it as 800 and no recorded CUB/Thrust kernel had IR
    (the corpus's radixSortThrust)."""
    (tmp_path / "cubsum.cu").write_text(CUB_PROGRAM)
    nvcc("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90", "-c", "cubsum.cu",
         "-o", "cubsum.o", cwd=tmp_path)
    ir = {k for m in read_embedded(tmp_path / "cubsum.o") for k in module_kernels(parse_module(m.bitcode))}
    assert any("CUB_300001_SM_800_900" in k for k in ir), sorted(ir)
    assert "_Z5scaleILi2EEvPfi" in ir
    assert ir == fatbin_kernels(tmp_path / "cubsum.o")


def test_cuda_arch_list_is_clangs(tmp_path):
    """The IR compile defines __CUDA_ARCH_LIST__ as clang does for the build's own compile."""
    from mneme.cc.toolchain import Toolchain, cuda_arch_list

    assert cuda_arch_list(["sm_90", "sm_75", "sm_100a", "sm_90"]) == "750,900,1000"
    tc = Toolchain.locate()
    (tmp_path / "a.cu").write_text("int x = __CUDA_ARCH_LIST__;\n")
    archs = ["sm_90", "sm_75", "sm_100a"]
    cmd = [tc.clang] + tc.cuda_flags(archs) + ["--cuda-host-only", "-E", "-dM", str(tmp_path / "a.cu")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert f"#define __CUDA_ARCH_LIST__ {cuda_arch_list(archs)}" in p.stdout.splitlines()
    ir = subprocess.run([tc.clang] + tc.ir_flags("sm_75", archs) + ["-E", "-dM", str(tmp_path / "a.cu"), "-o", "-"],
                        capture_output=True, text=True)
    assert ir.returncode == 0, ir.stderr
    lines = ir.stdout.splitlines()
    assert f"#define __CUDA_ARCH_LIST__ {cuda_arch_list(archs)}" in lines and "#define __CUDA_ARCH__ 750" in lines


def test_ir_arch_picks_the_replay_gpus_architecture_from_a_multi_arch_build(tmp_path):
    """The IR is compiled for one architecture. A build for 75 ... 120 (the cuda-samples CMakeLists) once
    embedded sm_75's: CUB's Onesweep kernel there has __launch_bounds__(256), while the app on the H200 ran
    sm_90's, launched with 384 threads, and the replay of the sm_75 IR was refused (invalid argument).
    MNEME_IR_ARCH names the GPU; the IR is for that architecture, or the highest of the build below it."""
    from mneme.cc.cc import ir_arch

    assert ir_arch(["sm_75", "sm_80", "sm_90", "sm_100"]) == "sm_75"
    assert ir_arch(["sm_75", "sm_80", "sm_90", "sm_100"], "sm_90") == "sm_90"
    assert ir_arch(["sm_75", "sm_80", "sm_100"], "90") == "sm_80"  # as the runtime picks a cubin
    assert ir_arch(["sm_90a", "sm_75"], "sm_90") == "sm_90a"
    assert ir_arch(["sm_100"], "sm_90") == "sm_100"  # nothing below: the build's first
    (tmp_path / "arch.cu").write_text("__global__ void which(int *o) {\n#ifdef __CUDA_ARCH__\n  *o = __CUDA_ARCH__;\n"
                                      "#endif\n}\n")
    flags = ["-gencode", "arch=compute_75,code=sm_75", "-gencode", "arch=compute_90,code=sm_90", "-c", "arch.cu"]
    nvcc(*flags, "-o", "first.o", cwd=tmp_path)
    nvcc(*flags, "-o", "h200.o", cwd=tmp_path, env=dict(os.environ, MNEME_IR_ARCH="sm_90"))
    for obj, arch, value in (("first.o", "sm_75", 750), ("h200.o", "sm_90", 900)):
        (m,) = read_embedded(tmp_path / obj)
        text = str(parse_module(m.bitcode))
        assert m.arch == arch and m.meta["build"]["arch"] == arch and m.meta["build"]["archs"] == ["sm_75", "sm_90"]
        assert f"store i32 {value}" in text and f'"target-cpu"="{arch}"' in text, text[-1500:]
