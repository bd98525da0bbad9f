"""Device link (`nvcc -dlink`) of objects compiled by clang-22 with -fgpu-rdc.

clang's objects carry their device code in a `.llvm.offloading` section and one entry per kernel and
device variable in `llvm_offload_entries`. nvcc's model is a separate device-link object that the host
linker links beside the objects; clang's is one linker-wrapper run at the final link. This module
makes nvcc's object from clang's pieces:

1. copy only the `.llvm.offloading` sections of the inputs (objects and archive members) into
   device-only objects, so that no host code is linked twice;
2. `clang++ --offload-link -r` on them: clang-linker-wrapper links the device code (nvlink), makes the
   fatbinary and the registration code (`__cudaRegisterFatBinary`, one `__cudaRegisterFunction` per
   entry between `__start_llvm_offload_entries` and `__stop_...`);
3. for a relocatable link the wrapper renames those two symbols to a private section of its own (its
   entries are none here); they are renamed back, so the registration walks the entries of every host
   object of the final link, which the host linker gathers into one `llvm_offload_entries` section.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence

from mneme.cc import cmdline
from mneme.cc.cc import BuildError, Driver
from mneme.cc.embedded import archive_members, archive_rdc_sections
from mneme.cc.toolchain import find_ld
from mneme.errors import ConfigurationError

OFFLOAD_SECTION = ".llvm.offloading"


def _llvm_tool(clang: str, name: str) -> str:
    real = os.path.realpath(clang)
    cand = os.path.join(os.path.dirname(real), name)
    if os.path.exists(cand):
        return cand
    raise ConfigurationError(f"{name} not found next to {real}: install the full clang-22 / llvm-22 package")


def _has_offloading(data: bytes) -> bool:
    return data.startswith(b"\x7fELF") and OFFLOAD_SECTION.encode() in data


def device_inputs(objs: Sequence[str], tmp: str) -> List[str]:
    """The objects (archive members extracted to `tmp`) among `objs` that carry device code."""
    found: List[str] = []
    for n, path in enumerate(objs):
        if path.endswith(".a") and os.path.isfile(path):
            for m, (name, body) in enumerate(archive_members(path)):
                if _has_offloading(body):
                    out = os.path.join(tmp, f"ar{n}-{m}-{Path(name).name}")
                    Path(out).write_bytes(body)
                    found.append(out)
        elif os.path.isfile(path) and not path.endswith(".so") and ".so." not in path:
            with open(path, "rb") as fh:
                data = fh.read()
            if _has_offloading(data):
                found.append(path)
    return found


def device_link(driver, objs: Sequence[str], out: str, tmp: str) -> bool:
    """Write the device-link object of `objs` to `out`; False (and an empty object) without RDC code.

    The object also carries the embedded IR of the RDC members of the archives among `objs`: the host
    linker takes a member only for a host symbol, but its device code may be linked for a device
    function alone (mneme.cc.embedded.archive_rdc_sections); the device-link object is always linked."""
    tc = driver.tc
    inputs = device_inputs(objs, tmp)
    if not inputs:
        asm = os.path.join(tmp, "empty_dlink.s")
        Path(asm).write_text('\t.section .note.GNU-stack,"",@progbits\n')
        driver.run([tc.clang_c, "-c", "-x", "assembler", asm, "-o", out], f"{out}: device link (no device code)")
        return False
    ir_sections = b"".join(sec for a in objs if a.endswith(".a") and os.path.isfile(a) for sec in archive_rdc_sections(a))
    objcopy = _llvm_tool(tc.clang, "llvm-objcopy")
    dev = []
    for n, obj in enumerate(inputs):
        d = os.path.join(tmp, f"dev{n}-{Path(obj).name}")
        driver.run([objcopy, "--only-section", OFFLOAD_SECTION, "--only-section", ".note.GNU-stack", obj, d],
                   f"{obj}: extracting device code")
        dev.append(d)
    raw = out + ".mneme-tmp"
    nvlink = [a for x in driver.cmd.nvlink for a in ("-Xoffload-linker", x)]
    devrt = tc.cuda / "lib64" / "libcudadevrt.a"
    if driver.cmd.cudadevrt == "static" and devrt.exists():  # nvcc's default: device runtime (dynamic parallelism)
        nvlink += ["-Xoffload-linker", f"-L{devrt.parent}", "-Xoffload-linker", "-lcudadevrt"]
    arch = [f"--cuda-gpu-arch={a}" for a in driver.tr.archs]
    # -O: the optimization of -dlto bitcode at the device link (nvcc's device default, -O3)
    opt = "-O0" if driver.cmd.device_debug or driver.cmd.dopt is False else "-O3"
    argv = [tc.clang, "--offload-link", "-r", opt, f"--cuda-path={tc.cuda}", "-Wno-unused-command-line-argument"]
    argv += arch + nvlink + dev + ["-o", raw]
    driver.show(argv)
    if not driver.cmd.dryrun:
        p = subprocess.run(argv, env=driver.env, capture_output=True, text=True)
        sys.stderr.write(p.stdout + p.stderr)
        if p.returncode != 0:
            hint = ""
            if "not declared __global__ in all source files" in p.stdout + p.stderr:
                hint = (": a kernel launches a __global__ function of another translation unit (dynamic "
                        "parallelism across files) that its object declares as a device function: compile "
                        "its objects with mneme nvcc -rdc=true (mneme/cc/ptxfix.py declares such kernels), "
                        "or build with -dlto (MNEME_NVCC_DLTO=1) so that the device link sees one module")
            raise BuildError(f"{out}: device link failed (exit {p.returncode}){hint}", p.returncode)
    if driver.cmd.dryrun:
        return True
    try:
        syms = subprocess.run([_llvm_tool(tc.clang, "llvm-nm"), raw], capture_output=True, text=True).stdout
        suffixes = sorted(set(re.findall(r"__start_llvm_offload_entries(_[0-9a-f]+)\b", syms)))
        redefine = []
        for s in suffixes:
            for edge in ("start", "stop"):
                redefine += ["--redefine-sym", f"__{edge}_llvm_offload_entries{s}=__{edge}_llvm_offload_entries"]
        if ir_sections:
            fixed = raw + ".entries"
            driver.run([objcopy] + redefine + [raw, fixed], f"{out}: device link (entry symbols)")
            ir_obj = Driver(cmdline.parse(["-o", out]), tc, False).section_object(ir_sections, tmp, "archive device IR")
            driver.run([find_ld(), "-r", fixed, ir_obj, "-o", out], f"{out}: device link (archive device IR)")
        else:
            driver.run([objcopy] + redefine + [raw, out], f"{out}: device link (entry symbols)")
    finally:
        for leftover in (raw, raw + ".entries"):
            if os.path.exists(leftover):
                os.remove(leftover)
    return True
