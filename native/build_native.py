"""Build the cffi API-mode extension `mneme._native` in place (the shared object lands in mneme/).

    python native/build_native.py [--direct] [--verbose]

Sources: native/snapshot.c and every native/core/*.c. Declarations: native/snapshot.cdef, then every
native/core/*.cdef. The generated C file includes native/snapshot.h and every native/core/*.h, so each
cdef'd function must be declared by one of those headers. Include directories: native/ and
$CUDA_HOME/include (default /usr/local/cuda/include) for cuda.h; the replay core dlopens libcuda at
run time, so the extension links only -ldl and -lm and imports on a machine without a GPU driver.

The build goes through cffi's own `ffibuilder.compile`, which needs setuptools on Python >= 3.12. Where
setuptools is missing (a bare GPU machine), or with --direct, the generated C file is compiled with
the C compiler directly, using the flags of this Python's sysconfig. Neither path uses pip or a network.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import cffi

NATIVE = Path(__file__).resolve().parent
ROOT = NATIVE.parent
MODULE = "mneme._native"
BUILD_DIR = ROOT / "build" / "native"
OPT = "-O2"


def cuda_include() -> Path:
    return Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"


def sources() -> list[Path]:
    return [NATIVE / "snapshot.c", *sorted((NATIVE / "core").glob("*.c"))]


def cdef_files() -> list[Path]:
    return [NATIVE / "snapshot.cdef", *sorted((NATIVE / "core").glob("*.cdef"))]


def headers() -> list[str]:
    return ["snapshot.h", *(f"core/{p.name}" for p in sorted((NATIVE / "core").glob("*.h")))]


def make_builder() -> cffi.FFI:
    ffi = cffi.FFI()
    for path in cdef_files():
        ffi.cdef(path.read_text(), override=False)
    ffi.set_source(
        MODULE,
        "".join(f'#include "{h}"\n' for h in headers()),
        sources=[str(p) for p in sources()],
        include_dirs=[str(NATIVE), str(cuda_include())],
        libraries=["dl", "m"],
        extra_compile_args=[OPT],
    )
    return ffi


def target() -> Path:
    return ROOT / "mneme" / ("_native" + sysconfig.get_config_var("EXT_SUFFIX"))


def have_setuptools() -> bool:
    try:
        import setuptools  # noqa: F401
    except ImportError:
        return False
    return True


def compile_with_cffi(ffi: cffi.FFI, verbose: bool) -> Path:
    return Path(ffi.compile(tmpdir=str(BUILD_DIR), verbose=verbose))


def compile_direct(ffi: cffi.FFI, verbose: bool) -> Path:
    c_file = BUILD_DIR / "_native.c"
    ffi.emit_c_code(str(c_file))
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    out = BUILD_DIR / ("_native" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = [
        *cc[:1], "-shared", "-fPIC", OPT,
        f"-I{sysconfig.get_paths()['include']}", f"-I{NATIVE}", f"-I{cuda_include()}",
        "-o", str(out), str(c_file), *(str(p) for p in sources()), "-ldl", "-lm",
    ]
    if verbose:
        print(" ".join(shlex.quote(c) for c in cmd))
    subprocess.run(cmd, check=True)
    return out


def build(direct: bool = False, verbose: bool = False) -> Path:
    """Build the extension and copy it into mneme/; returns its path."""
    if not (cuda_include() / "cuda.h").exists() and any((NATIVE / "core").glob("*.c")):
        sys.exit(f"build_native: {cuda_include()}/cuda.h not found; set CUDA_HOME to the CUDA toolkit root")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    ffi = make_builder()
    built = compile_direct(ffi, verbose) if direct or not have_setuptools() else compile_with_cffi(ffi, verbose)
    dest = target()
    tmp = dest.with_suffix(".tmp")
    shutil.copyfile(built, tmp)
    os.replace(tmp, dest)  # atomic: a running process keeps its mapping of the old file
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--direct", action="store_true", help="compile with the C compiler, not through setuptools")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    try:
        dest = build(args.direct, args.verbose)
    except (subprocess.CalledProcessError, cffi.VerificationError) as e:
        print(f"build_native: compiling {MODULE} failed: {e}", file=sys.stderr)
        return 1
    print(f"built {dest.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
