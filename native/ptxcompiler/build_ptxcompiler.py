"""Link NVIDIA's static PTX compiler (libnvptxcompiler_static.a) into mneme/lib/libmneme_ptxc.so, so that
mneme.ir.ptxcompiler assembles PTX in-process instead of starting a ptxas process per configuration.

    python native/ptxcompiler/build_ptxcompiler.py [--verbose]

There is no C source: the archive is linked whole into a shared object that exports only its nvPTXCompiler*
API (exports.map), and Python calls it through ctypes. The archive is looked for where mneme looks for ptxas
(mneme.ir.ptxas.cuda_roots(): lib64/ of $CUDA_HOME, $CUDA_PATH, $CUDA_ROOT, /usr/local/cuda), then in the pip
package nvidia-nvptxcompiler. Its version goes into libmneme_ptxc.json beside the library: the ptxas of the same
CUDA root, or the pip package's; mneme uses the library only while that version equals the ptxas it would
run, so the machine code is what ptxas makes. Without an archive nothing is built (ptxas runs as a process)
and the exit status is 0: the library is an optimization, not a requirement.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = ROOT / "mneme" / "lib"
LIB = "libmneme_ptxc.so"
ARCHIVE = "libnvptxcompiler_static.a"


def find_archive() -> Optional[Tuple[Path, str]]:
    """(archive, its version) or None."""
    sys.path.insert(0, str(ROOT))
    from mneme.ir.ptxas import cuda_roots, ptxas_version

    for root in cuda_roots():
        for lib in ("lib64", "lib", "targets/x86_64-linux/lib"):
            path = Path(root) / lib / ARCHIVE
            exe = Path(root) / "bin" / "ptxas"
            if path.is_file() and exe.is_file():
                return path, ptxas_version(str(exe))
    try:
        from importlib import metadata

        dist = metadata.distribution("nvidia-nvptxcompiler")
    except Exception:  # noqa: BLE001 - not installed
        return None
    for f in dist.files or []:
        if f.name == ARCHIVE:
            return Path(dist.locate_file(f)).resolve(), dist.version
    return None


def build(verbose: bool = False) -> Optional[Path]:
    found = find_archive()
    lib, meta = OUT / LIB, OUT / "libmneme_ptxc.json"
    if found is None:
        for p in (lib, meta):
            p.unlink(missing_ok=True)  # a stale library of another toolkit must not stay
        print(f"build_ptxcompiler: no {ARCHIVE} found (CUDA roots' lib64/, pip nvidia-nvptxcompiler): "
              "PTX is assembled by the ptxas process")
        return None
    archive, version = found
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_suffix(".tmp")
    cc = shlex.split(os.environ.get("CC") or "cc")
    cmd = [*cc, "-shared", "-o", str(tmp), f"-Wl,--version-script={HERE / 'exports.map'}",
           "-Wl,--whole-archive", str(archive), "-Wl,--no-whole-archive", "-lpthread", "-lm", "-ldl", "-lrt"]
    if verbose:
        print(" ".join(shlex.quote(c) for c in cmd))
    subprocess.run(cmd, check=True)
    os.replace(tmp, lib)
    meta.write_text(json.dumps({"archive": str(archive), "version": version}, indent=1) + "\n")
    print(f"build_ptxcompiler: {lib} from {archive} (PTX compiler {version})")
    return lib


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    try:
        build(args.verbose)
    except subprocess.CalledProcessError as e:
        print(f"build_ptxcompiler: linking failed ({e}); PTX is assembled by the ptxas process", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
