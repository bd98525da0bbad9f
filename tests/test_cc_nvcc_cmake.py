"""`mneme-nvcc` as the CUDA compiler of unmodified build files: a CMake CUDA project (tests/data/nvcc_cmake,
configured with -DCMAKE_CUDA_COMPILER=mneme-nvcc) and two programs of the public corpus (../shared/corpus:
one nvcc Makefile, one cuda-samples CMake project), built in a scratch copy with their own build files
and the corpus's build command, then read back with `mneme ir`."""

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mnemetest import ROOT

DATA = Path(__file__).parent / "data" / "nvcc_cmake"
CORPUS = Path(os.environ.get("MNEME_CORPUS", ROOT.parent / "shared" / "corpus"))

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")


@pytest.fixture
def nvcc_exe(tmp_path) -> Path:
    """An executable `mneme-nvcc` for this interpreter (what the console script is after pip install)."""
    exe = tmp_path / "bin" / "mneme-nvcc"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m mneme.cli nvcc "$@"\n')
    exe.chmod(0o755)
    return exe


def mneme_ir(binary: Path) -> str:
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "ir", str(binary)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout


def run(cmd, cwd, env=None, shell=False) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=env, shell=shell, capture_output=True, text=True)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p


def test_cmake_cuda_project(tmp_path, nvcc_exe):
    src = tmp_path / "src"
    shutil.copytree(DATA, src)
    build = tmp_path / "build"
    run(["cmake", "-S", src, "-B", build, f"-DCMAKE_CUDA_COMPILER={nvcc_exe}", "-DCMAKE_CUDA_ARCHITECTURES=80;90"],
        cwd=tmp_path)
    info = next(build.glob("CMakeFiles/*/CMakeCUDACompiler.cmake")).read_text()
    assert 'set(CMAKE_CUDA_COMPILER_ID "NVIDIA")' in info  # presents itself as nvcc (docs/CC.md says why)
    assert re.search(r'set\(CMAKE_CUDA_COMPILER_VERSION "\d+\.\d+\.\d+"\)', info)
    p = run(["cmake", "--build", build, "--", "VERBOSE=1"], cwd=tmp_path)
    assert "-dlink" in p.stdout and "--generate-code=arch=compute_90,code=[compute_90,sm_90]" in p.stdout
    assert "-rdc=true" in p.stdout
    app = build / "app"
    ir = mneme_ir(app)
    assert "saxpyScaled" in ir and "scale.cu" in ir and "saxpy.cu" in ir
    assert "ftz=true prec-div=false" in ir  # the app's --use_fast_math, recorded per module
    assert "libcudart" not in run(["ldd", app], cwd=tmp_path).stdout  # CMake's default: static runtime
    deps = list(build.glob("CMakeFiles/app.dir/saxpy.cu.o.d"))
    assert deps and "cuda_runtime.h" in deps[0].read_text()
    nm = run(["nm", app], cwd=tmp_path).stdout
    assert "__cudaRegisterFatBinary" in nm and "__start_llvm_offload_entries" in nm


def corpus_app(name: str) -> dict:
    if not (CORPUS / "apps.tsv").is_file():
        pytest.skip(f"the corpus is not at {CORPUS} (set MNEME_CORPUS)")
    with open(CORPUS / "apps.tsv", newline="") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            if row["name"] == name:
                return row
    raise AssertionError(f"{name} is not in {CORPUS / 'apps.tsv'}")


def build_corpus_app(name: str, tmp_path: Path, nvcc_exe: Path, **env_extra: str) -> Path:
    """Copy the program (and the shared headers it includes) to a scratch dir and run its build command."""
    row = corpus_app(name)
    top = row["path"].split("/")[0]
    shutil.copytree(CORPUS / top, tmp_path / top, ignore=shutil.ignore_patterns("build", "*.o"))
    env = dict(os.environ, NVCC=str(nvcc_exe), CUDA_ARCH="90", **env_extra)
    run(row["build"], cwd=tmp_path / row["path"], env=env, shell=True)
    return tmp_path / row["path"] / row["binary"]


def test_corpus_makefile_with_nvcc_flags(tmp_path, nvcc_exe):
    """simpleSeparateCompilation: -ccbin g++ -m64 -dc --threads 0 --std=c++11 -gencode ..., nvcc -lib, final
    link by nvcc (device link against the device-code archive)."""
    binary = build_corpus_app("simpleSeparateCompilation", tmp_path, nvcc_exe)
    ir = mneme_ir(binary)
    assert "transformVector" in ir and "simpleDeviceLibrary.cu" in ir


def test_corpus_cmake_project(tmp_path, nvcc_exe):
    """inlinePTX: cuda-samples CMakeLists, nine architectures, separable compilation, g++ final link."""
    binary = build_corpus_app("inlinePTX", tmp_path, nvcc_exe)
    ir = mneme_ir(binary)
    assert "sequence_gpu" in ir
    cache = (binary.parent / "CMakeCache.txt").read_text()
    assert f"CMAKE_CUDA_COMPILER:FILEPATH={nvcc_exe}" in cache or str(nvcc_exe) in cache


def test_corpus_dynamic_parallelism_across_files(tmp_path, nvcc_exe):
    """cdpAdvancedQuicksort: a kernel of cdpAdvancedQuicksort.cu launches big_bitonicsort of cdpBitonicSort.cu
    from device code; clang declares it `.extern .func`, nvlink refused that until mneme/cc/ptxfix.py
    declared it `.extern .entry`. Its own CMakeLists, unmodified (one architecture of its nine, for time:
    `bash scripts/corpus.sh build --apps cdpAdvancedQuicksort` builds all nine)."""
    binary = build_corpus_app("cdpAdvancedQuicksort", tmp_path, nvcc_exe, MNEME_NVCC_ARCH="sm_90")
    ir = mneme_ir(binary)
    assert "_Z10qsort_warpPjS_jjP17qsortAtomicData_tP14qsortRingbuf_tjj" in ir
    assert "_Z15big_bitonicsortPjS_S_jj" in ir and "cdpBitonicSort.cu" in ir


def test_corpus_device_new_delete_and_virtuals(tmp_path, nvcc_exe):
    """newdelete: device-side new/delete of objects with virtual functions (__cxa_pure_virtual: nvcc_compat.h)."""
    binary = build_corpus_app("newdelete", tmp_path, nvcc_exe, MNEME_NVCC_ARCH="sm_90")
    ir = mneme_ir(binary)
    for kernel in ("vectorCreate", "containerFill", "containerConsume", "containerDelete", "placementNew"):
        assert kernel in ir
