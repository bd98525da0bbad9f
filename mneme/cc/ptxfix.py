"""A ptxas step for relocatable device code (-fgpu-rdc): kernels of other translation units declared as
kernels.

clang-22 declares a `__global__` function that a translation unit launches from device code (dynamic
parallelism) but does not define as `.extern .func` in its PTX, where ptxas/nvlink need `.extern .entry`:
the device link then fails with "Function '...' not declared __global__ in all source files"
(llvm-project issue #118212; cuda-samples cdpAdvancedQuicksort launches big_bitonicsort of another file).
clang does list those kernels: the PTX's `__clang_gpu_used_external` array holds the kernels (and host-used
variables) that the unit uses but does not define; device functions whose address is taken are not in it.
So the fix is exact: every `.extern .func NAME` without a return value whose NAME is in that array becomes
`.extern .entry NAME`.

clang runs this file through `--ptxas-path` (mneme.cc.cc.Driver.compile makes the wrapper): as a script,
`python ptxfix.py REAL_PTXAS ptxas-arguments...`. It imports nothing of mneme, so it starts fast.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import List, Sequence, Set, Tuple

_USED_EXTERNAL = re.compile(r"__clang_gpu_used_external\s*\[\s*\d*\s*\]\s*=\s*\{([^}]*)\}", re.S)
# `.extern .func NAME(` / `.extern .func NAME\n(` — no return value (`.func (.param ...) NAME` is not a kernel)
_EXTERN_FUNC = re.compile(r"^(\s*)\.extern\s+\.func\s+([A-Za-z_$%][\w$%]*)(?=\s*(\(|;|$))", re.M)


def used_external_kernels(ptx: str) -> Set[str]:
    """The names in the PTX's `__clang_gpu_used_external` initializers (`generic(NAME)` unwrapped)."""
    names: Set[str] = set()
    for m in _USED_EXTERNAL.finditer(ptx):
        for item in m.group(1).split(","):
            item = item.strip()
            inner = re.fullmatch(r"generic\((.*)\)", item)
            if inner:
                item = inner.group(1).strip()
            if item:
                names.add(item)
    return names


def fix_ptx(ptx: str) -> Tuple[str, List[str]]:
    """(fixed PTX, the names whose declarations became `.extern .entry`)."""
    kernels = used_external_kernels(ptx)
    if not kernels:
        return ptx, []
    fixed: List[str] = []

    def repl(m: "re.Match[str]") -> str:
        if m.group(2) not in kernels:
            return m.group(0)
        fixed.append(m.group(2))
        return f"{m.group(1)}.extern .entry {m.group(2)}"

    return _EXTERN_FUNC.sub(repl, ptx), fixed


def ptx_inputs(argv: Sequence[str]) -> List[int]:
    """Indexes of the PTX inputs among ptxas's arguments (clang passes one `.s` or `.ptx` file)."""
    takes_value = {"-o", "--output-file", "--gpu-name", "-arch", "-maxrregcount", "--maxrregcount", "-m"}
    out: List[int] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in takes_value:
            skip = True
            continue
        if not a.startswith("-") and a.endswith((".s", ".ptx")) and os.path.isfile(a):
            out.append(i)
    return out


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("ptxfix: usage: ptxfix.py REAL_PTXAS [ptxas arguments]", file=sys.stderr)
        return 2
    real, args = argv[0], list(argv[1:])
    written: List[str] = []
    for i in ptx_inputs(args):
        with open(args[i], encoding="utf-8", errors="surrogateescape") as fh:
            ptx = fh.read()
        new, fixed = fix_ptx(ptx)
        if fixed:
            path = args[i] + ".mneme-entry.s"
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as fh:
                fh.write(new)
            args[i] = path
            written.append(path)
            if os.environ.get("MNEME_CC_VERBOSE", "") not in ("", "0"):
                print(f"mneme ptxfix: {', '.join(fixed)}: declared .extern .entry (kernels of another "
                      "translation unit launched from device code)", file=sys.stderr)
    if not written:
        os.execv(real, [real] + args)
    try:
        return subprocess.run([real] + args).returncode
    finally:
        for path in written:
            os.remove(path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
