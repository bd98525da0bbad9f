"""mneme/tolerance.h: compiles as C and C++, agrees with the snapshot format's numbering, does nothing
without the recorder and reaches `mneme_recorder_annotate` when a recorder is preloaded."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "native" / "include"
SNAPSHOT_H = ROOT / "native" / "snapshot.h"
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"

CC = shutil.which("gcc") or shutil.which("clang-22")
CXX = shutil.which("g++") or shutil.which("clang++-22")
pytestmark = pytest.mark.skipif(not (CC and CXX), reason="needs a C and a C++ compiler")

# A stand-in for the recorder's export, with the contract's exact signature: it prints every call.
FAKE_RECORDER = r"""
#include <stdio.h>
#include <stddef.h>
int mneme_recorder_annotate(const void *p, size_t bytes, int elem, int mode, int norm, double tol, const char *tag) {
  printf("annotate %p %zu %d %d %d %g %s\n", p, bytes, elem, mode, norm, tol, tag ? tag : "-");
  return 0;
}
"""

C_USER = r"""
#include <mneme/tolerance.h>
#include <stdio.h>
int main(void) {
  printf("recording %d\n", mneme_recording());
  int r = mneme_annotate((const void *)0x1000, 64, MNEME_ELEM_F64, MNEME_TOL_REL, MNEME_NORM_L2, 1e-6, "out");
  r += mneme_annotate_abs((const void *)0x2000, 8, MNEME_ELEM_I32, 2);
  printf("status %d\n", r);
  return 0;
}
"""

CXX_USER = r"""
#include <cuda_fp16.h>
#include <mneme/tolerance.h>
#include <cstdio>
int main() {
  std::printf("recording %d\n", (int)mneme::recording());
  mneme::annotate((const float *)0x1000, 4, mneme::relative(1e-5), "sum");
  mneme::annotate((const long long *)0x2000, 2, mneme::absolute(0, mneme::NORM_LINF));
  mneme::annotate((const unsigned short *)0x3000, 3, mneme::absolute(1, mneme::NORM_L1));
  mneme::annotate((const __half *)0x4000, 5, mneme::relative(1e-2));
  mneme::annotate((const char *)0x5000, 1, mneme::absolute(0));
  mneme::annotate_bytes((const void *)0x6000, 16, mneme::absolute(0), "raw");
  return 0;
}
"""


def build(tmp: Path, compiler: str, name: str, source: str, *flags: str) -> Path:
    src = tmp / name
    src.write_text(source)
    out = tmp / src.stem
    subprocess.run([compiler, *flags, f"-I{INCLUDE}", str(src), "-o", str(out), "-ldl"], check=True,
                   capture_output=True, text=True)
    return out


@pytest.fixture(scope="module")
def recorder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("recorder")
    (d / "rec.c").write_text(FAKE_RECORDER)
    subprocess.run([CC, "-shared", "-fPIC", str(d / "rec.c"), "-o", str(d / "librec.so")], check=True)
    return d / "librec.so"


def run(exe: Path, preload: Path = None) -> str:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = str(preload)
    return subprocess.run([str(exe)], env=env, capture_output=True, text=True, check=True).stdout


def test_c_without_and_with_the_recorder(tmp_path, recorder):
    exe = build(tmp_path, CC, "user.c", C_USER, "-std=c99", "-Wall", "-Wextra", "-Werror")
    assert run(exe) == "recording 0\nstatus 0\n"
    assert run(exe, recorder).splitlines() == [
        "recording 1",
        "annotate 0x1000 64 2 1 2 1e-06 out",
        "annotate 0x2000 8 7 0 0 2 -",
        "status 0",
    ]


def test_cpp_deduces_element_types(tmp_path, recorder):
    exe = build(tmp_path, CXX, "user.cpp", CXX_USER, "-std=c++11", "-Wall", "-Wextra", "-Werror", f"-I{CUDA_INCLUDE}")
    assert run(exe) == "recording 0\n"
    assert run(exe, recorder).splitlines()[1:] == [
        "annotate 0x1000 16 1 1 0 1e-05 sum",  # float: F32, relative, per element
        "annotate 0x2000 16 8 0 3 0 -",  # long long: I64, Linf
        "annotate 0x3000 6 10 0 1 1 -",  # unsigned short: U16, L1
        "annotate 0x4000 10 3 1 0 0.01 -",  # __half: F16
        "annotate 0x5000 1 5 0 0 0 -",  # char: I8 (signed on x86-64)
        "annotate 0x6000 16 0 0 0 0 raw",  # bytes
    ]


@pytest.mark.parametrize("order", [("snapshot", "tolerance"), ("tolerance", "snapshot", "tolerance")])
def test_numbering_agrees_with_the_snapshot_format(tmp_path, order):
    includes = {"snapshot": f'#include "{SNAPSHOT_H}"', "tolerance": "#include <mneme/tolerance.h>"}
    src = "\n".join(includes[h] for h in order) + "\nint main(void) { return MNEME_ELEM_BF16 - MN_ELEM_BF16; }\n"
    exe = build(tmp_path, CC, "both.c", src, "-std=c11", "-Wall", "-Werror")
    assert subprocess.run([str(exe)]).returncode == 0


def test_numbering_mismatch_fails_to_compile(tmp_path):
    bad = tmp_path / "snapshot.h"
    bad.write_text(SNAPSHOT_H.read_text().replace("MN_NORM_L2 = 2", "MN_NORM_L2 = 5"))
    src = f'#include "{bad}"\n#include <mneme/tolerance.h>\nint main(void) {{ return 0; }}\n'
    (tmp_path / "both.c").write_text(src)
    p = subprocess.run([CC, f"-I{INCLUDE}", str(tmp_path / "both.c"), "-o", str(tmp_path / "both")],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "norms differ from snapshot.h" in p.stderr
