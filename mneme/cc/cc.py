"""`mneme cc`: a drop-in CXX over clang++-22 in CUDA mode that embeds each translation unit's device
LLVM bitcode in its object file.

Per CUDA source it runs two compiles side by side: the ordinary one (host + device code, the user's
flags) and a device-only one that writes pre-optimization bitcode, which is then placed in the
object's `.mneme_ir` section (see mneme.cc.embedded for the format). Links use the shared libcudart
so that the recorder can interpose on it. `-v` or MNEME_CC_VERBOSE=1 prints every command run.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from mneme.cc import cmdline
from mneme.cc.cmdline import Invocation, Source
from mneme.cc.embedded import SECTION, archive_rdc_sections, pack_entry
from mneme.cc.toolchain import DEFAULT_ARCH, Toolchain, find_clang, find_ld
from mneme.errors import MnemeError

PROG = "mneme cc"


class BuildError(MnemeError):
    """A compile, embed or link step failed; the message names the file."""

    def __init__(self, message: str, returncode: int = 1):
        super().__init__(message)
        self.returncode = returncode


def _arch_number(arch: str) -> int:
    digits = "".join(c for c in arch.split("_")[-1] if c.isdigit())
    return int(digits) if digits else -1


def ir_arch(archs: Sequence[str], wanted: Optional[str] = None) -> str:
    """The one architecture of `archs` the embedded IR is compiled for: the first, unless `wanted`
    (MNEME_IR_ARCH: `sm_90` or `90`, the GPU replay will run on) names one of them or lies above some;
    then that one, or the highest below it, as the CUDA runtime picks a cubin for that GPU. Code that
    depends on __CUDA_ARCH__ (CUB's and Thrust's tuning policies: block sizes, __launch_bounds__) differs
    between the architectures, and replay runs what the IR says."""
    if not wanted:
        return archs[0]
    want = _arch_number(wanted)
    below = [a for a in archs if 0 <= _arch_number(a) <= want]
    return max(below, key=_arch_number) if below else archs[0]


class Driver:
    """Runs one `mneme cc` invocation: passes through, compiles (and embeds), or compiles and links."""

    def __init__(self, inv: Invocation, tc: Toolchain, verbose: bool):
        self.inv = inv
        self.tc = tc
        self.verbose = verbose
        self.archs = inv.archs or [os.environ.get("MNEME_CUDA_ARCH", DEFAULT_ARCH)]
        #: the architecture the embedded IR is compiled for (MNEME_IR_ARCH picks it from a multi-arch build)
        self.ir_arch = ir_arch(self.archs, os.environ.get("MNEME_IR_ARCH"))
        self.env = tc.env()
        #: the device-code settings of this build, stored in the embedded IR's metadata ("build")
        self.build = {**build_settings(inv), "arch": self.ir_arch, "archs": list(self.archs)}

    # ---- running commands ------------------------------------------------------------------------
    def _show(self, cmd: Sequence[str]) -> None:
        if self.verbose:
            print(f"{PROG}: {shlex.join(cmd)}", file=sys.stderr, flush=True)

    def run(self, cmd: Sequence[str], what: str) -> None:
        self._show(cmd)
        rc = subprocess.run(list(cmd), env=self.env).returncode
        if rc != 0:
            raise BuildError(f"{what} failed (exit {rc})", rc)

    # ---- flags -----------------------------------------------------------------------------------
    def _source_cmd(self, src: Source) -> List[str]:
        """clang command prefix for `src`, before the user's flags."""
        if src.lang == "cuda":
            return [self.tc.clang] + self.tc.cuda_flags(self.archs)
        if src.lang == "c":
            return [self.tc.clang_c] + self.tc.host_flags()
        if src.lang == "asm":
            return [self.tc.clang_c]
        return [self.tc.clang] + self.tc.host_flags()

    def _lang(self, src: Source) -> List[str]:
        return {"cuda": [], "c++": ["-x", "c++"], "c": ["-x", "c"], "asm": []}.get(src.lang, [])

    def _user_flags(self) -> List[str]:
        return self.inv.flags(("flag", "ir", "dep"))

    # ---- steps -----------------------------------------------------------------------------------
    def passthrough(self) -> None:
        """-E, -M, -S, -emit-llvm, --cuda-device-only ...: clang with our flags, nothing embedded."""
        out = ["-o", self.inv.output] if self.inv.output else []
        for src in self.inv.sources:
            cmd = self._source_cmd(src) + self._user_flags() + self._lang(src) + [src.path] + out
            self.run(cmd, f"{src.path}: clang")

    def _cuid(self, src: Source) -> List[str]:
        """One compilation-unit id for both compiles of a CUDA source. clang derives the suffix of
        externalized static device symbols (`_ZL6hiddenPi__intern__<hash>`, RDC) from it and by
        default hashes the command line, which differs between the two compiles: the embedded IR would
        then name those symbols differently from the binary. Deterministic, like clang's own."""
        if any(a.startswith(("-cuid=", "-fuse-cuid=")) for a in self.inv.flags()):
            return []
        key = "\0".join([os.path.abspath(src.path)] + self.inv.flags(("flag", "ir")))
        return [f"-cuid={hashlib.sha256(key.encode()).hexdigest()[:16]}"]

    def compile(self, src: Source, obj: str, extra: Sequence[str] = ()) -> None:
        if not os.path.exists(src.path):
            raise BuildError(f"{src.path}: no such source file")
        cuid = self._cuid(src) if src.lang == "cuda" else []
        cmd = self._source_cmd(src) + self._user_flags() + list(extra) + cuid + self._lang(src)
        cmd += ["-c", src.path, "-o", obj]
        if src.lang != "cuda":
            self.run(cmd, f"{src.path}: compile")
            return
        with tempfile.TemporaryDirectory(prefix="mneme-cc-") as tmp:
            if self.inv.is_rdc:
                cmd.append(self.ptxas_wrapper(tmp))  # after the user's --ptxas-path, which it runs
            bc = os.path.join(tmp, "device.bc")
            ir_cmd = [self.tc.clang] + self.tc.ir_flags(self.ir_arch, self.archs) + self.inv.ir_flags() + cuid
            ir_cmd += [src.path, "-o", bc]
            self._show(ir_cmd)
            ir_proc = subprocess.Popen(ir_cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            try:
                self.run(cmd, f"{src.path}: compile")
            finally:
                ir_out = ir_proc.communicate()[0].decode(errors="replace")
            if ir_proc.returncode != 0:
                sys.stderr.write(ir_out)
                _remove(obj)
                raise BuildError(
                    f"{src.path}: device bitcode compile failed (exit {ir_proc.returncode}); "
                    f"command: {shlex.join(ir_cmd)}"
                )
            try:
                self.embed(src, Path(bc).read_bytes(), obj, tmp)
            except BaseException:
                _remove(obj)
                raise

    def ptxas_wrapper(self, tmp: str) -> str:
        """`--ptxas-path=` of a script in `tmp` that runs mneme.cc.ptxfix before the real ptxas (the user's
        --ptxas-path, else the CUDA root's): with -fgpu-rdc, kernels of other units that this unit launches
        from device code are declared `.extern .entry` (clang declares them as functions; see ptxfix)."""
        real = next((a.split("=", 1)[1] for a in reversed(self.inv.flags()) if a.startswith("--ptxas-path=")),
                    str(self.tc.cuda / "bin" / "ptxas"))
        script = os.path.join(tmp, "ptxas")
        fix = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ptxfix.py")
        verbose = "MNEME_CC_VERBOSE=1 " if self.verbose else ""
        Path(script).write_text(f"#!/bin/sh\n{verbose}exec {shlex.quote(sys.executable)} {shlex.quote(fix)} "
                                f"{shlex.quote(real)} \"$@\"\n")
        os.chmod(script, 0o755)
        return f"--ptxas-path={script}"

    def embed(self, src: Source, bitcode: bytes, obj: str, tmp: str) -> None:
        """Merge a `.mneme_ir` entry into `obj` (relocatable link of obj + a one-section object)."""
        with open(obj, "rb") as fh:
            if fh.read(4) != b"\x7fELF":
                raise BuildError(f"{obj}: not an ELF object (LTO bitcode objects cannot carry embedded IR: drop -flto)")
        meta = {
            "name": src.path,
            "source": os.path.abspath(src.path),
            "arch": self.ir_arch,
            "rdc": self.inv.is_rdc,
            "cwd": os.getcwd(),
            "flags": self.inv.ir_flags(),
            "build": self.build,
        }
        ir_obj = self.section_object(pack_entry(bitcode, meta), tmp, src.path)
        merged = obj + ".mneme-tmp"
        try:
            self.run([find_ld(), "-r", obj, ir_obj, "-o", merged], f"{obj}: embedding device bitcode")
            os.replace(merged, obj)
        finally:
            _remove(merged)

    def section_object(self, contents: bytes, tmp: str, label: str) -> str:
        """An object file whose only content is a `.mneme_ir` section holding `contents`."""
        fd, blob = tempfile.mkstemp(suffix=".bin", dir=tmp)
        with os.fdopen(fd, "wb") as fh:
            fh.write(contents)
        asm = blob[: -len(".bin")] + ".s"
        quoted = blob.replace("\\", "\\\\").replace('"', '\\"')
        # "aR": allocated and SHF_GNU_RETAIN, so -Wl,--gc-sections keeps the unreferenced section.
        Path(asm).write_text(
            f'\t.section {SECTION},"aR",@progbits\n\t.p2align 3\n\t.incbin "{quoted}"\n'
            '\t.section .note.GNU-stack,"",@progbits\n'
        )
        obj = blob[: -len(".bin")] + ".o"
        self.run([self.tc.clang_c, "-c", "-x", "assembler", asm, "-o", obj], f"{label}: assembling its IR section")
        return obj

    def archive_ir(self, args: Sequence[str], tmp: str) -> List[str]:
        """An extra link input carrying the IR of RDC members of the static archives being linked
        (see embedded.archive_rdc_sections); [] when there are none."""
        sections: List[bytes] = []
        for archive in _static_archives(args):
            sections += archive_rdc_sections(archive)
        return [self.section_object(b"".join(sections), tmp, "archive device IR")] if sections else []

    def compile_all(self) -> None:
        for src in self.inv.sources:
            self.compile(src, self.inv.output or cmdline.default_object(src.path))

    def link(self) -> None:
        out = self.inv.output or "a.out"
        extra: List[str] = []
        if self.inv.wants_deps and not self.inv.has("-MF"):
            extra = ["-MF", str(Path(out).with_suffix(".d")) if Path(out).suffix else out + ".d", "-MT", out]
        with tempfile.TemporaryDirectory(prefix="mneme-cc-") as tmp:
            args: List[str] = []
            sources = iter(self.inv.sources)
            for n, (kind, group) in enumerate(self.inv.items):
                if kind == "input":
                    src = next(sources)
                    obj = os.path.join(tmp, f"{n}-{Path(src.path).stem}.o")
                    self.compile(src, obj, extra)
                    args.append(obj)
                elif kind != "dep":  # objects, libraries, flags; clang ignores the compile-only ones
                    args += ["-lcudart" if a == "-lcudart_static" else a for a in group]
            if self.inv.mode == "relocatable":
                cmd = [self.tc.clang] + args + ["-o", out]
            else:
                cmd = [self.tc.clang] + args + self.archive_ir(args, tmp) + self.tc.link_flags() + ["-o", out]
                devrt = self.tc.cuda / "lib64" / "libcudadevrt.a"
                if self.inv.is_rdc and devrt.exists():  # as nvcc: the device runtime (dynamic parallelism)
                    cmd[-2:-2] = ["-Xoffload-linker", f"-L{devrt.parent}", "-Xoffload-linker", "-lcudadevrt"]
            self.run(cmd, f"linking {out}")


#: clang's ptxas -O for the device -O level (clang/lib/Driver/ToolChains/Cuda.cpp): -Os/-Oz and unknown
#: levels give 2, -Ofast/-O4 3, no -O at all 0 (ptxas's own default would be 3)
_CLANG_PTXAS_OPT = {"0": 0, "1": 1, "2": 2, "3": 3, "4": 3, "fast": 3}


def _device_opt(flags: Sequence[str]) -> str:
    """The device side's -O level: the last -O that is not host-only (-Xarch_host -O0 is not the device's)."""
    level = None
    for prev, a in zip([""] + list(flags), flags):
        if a.startswith("-O") and prev != "-Xarch_host":
            level = a[2:] or "1"
    return "0" if level is None else level


def _mllvm(flags: Sequence[str], name: str) -> Optional[str]:
    """The value of `-mllvm -<name>=V` (the last one), or None."""
    hit = None
    for prev, a in zip([""] + list(flags), flags):
        if prev == "-mllvm" and a.startswith(f"-{name}="):
            hit = a.split("=", 1)[1]
    return hit


def build_settings(inv: Invocation) -> dict:
    """How `mneme cc` was asked to build the device code: the -O level, the floating-point and ptxas flags
    (embedded.BUILD_VERSION; the replay baseline compiles as the app was built: mneme.ir.appbuild). What the
    IR itself carries (denormal and fast-math attributes, contract flags) is read from the IR at replay;
    this records what only code generation sees: ptxas options, division and square-root precision."""
    from mneme.cc.embedded import BUILD_VERSION

    flags = inv.flags()
    opt = _device_opt(flags)
    fp = [a for a in flags if a.startswith(("-ffast-math", "-fno-fast-math", "-ffp-contract", "-fgpu-", "-fno-gpu-",
                                              "-fcuda-", "-fno-cuda-", "-fdenormal"))]
    ptxas = [b for a, b in zip(flags, flags[1:]) if a == "-Xcuda-ptxas"]
    fast = "-ffast-math" in fp and "-fno-fast-math" not in fp[fp.index("-ffast-math"):]
    div = _mllvm(flags, "nvptx-prec-divf32")
    sqrt = _mllvm(flags, "nvptx-prec-sqrtf32")
    reflect = _mllvm(flags, "nvvm-reflect-add") or ""
    prec_sqrt = sqrt not in (None, "0") or reflect.replace(" ", "") == "__CUDA_PREC_SQRT=1"
    return {"version": BUILD_VERSION, "compiler": "cc", "opt_level": opt, "host_opt_level": opt, "fp_flags": fp,
            "ptxas": ptxas, "ptxas_opt": 0 if opt == "0" else _CLANG_PTXAS_OPT.get(opt, 2),
            "ftz": "-fgpu-flush-denormals-to-zero" in fp or "-fcuda-flush-denormals-to-zero" in fp,
            "fast_math": fast, "prec_div": (div != "0") if div is not None else not fast,
            # clang-22 lowers sqrtf to sqrt.approx unless told otherwise (TOOLCHAIN.md)
            "prec_sqrt": prec_sqrt,
            "fmad": "-ffp-contract=off" not in fp, "maxrregcount": None, "rdc": inv.is_rdc,
            "relocatable": inv.is_rdc, "dlto": "-foffload-lto" in flags or "-fgpu-rdc-lto" in flags,
            "arch": inv.archs[0] if inv.archs else None, "archs": list(inv.archs)}


def _static_archives(args: Sequence[str]) -> List[str]:
    """Static archives a link command line names, as paths or as -l found in -L/LIBRARY_PATH
    directories (where the linker would take lib<name>.so first, the archive is not used)."""
    dirs = [a[2:] for a in args if a.startswith("-L") and len(a) > 2]
    dirs += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-L"]
    dirs += [d for d in os.environ.get("LIBRARY_PATH", "").split(os.pathsep) if d]
    found: List[str] = []
    for i, a in enumerate(args):
        if a.endswith(".a") and not a.startswith("-") and os.path.isfile(a):
            found.append(a)
            continue
        if a.startswith("-l") and len(a) > 2:
            name = a[2:]
        elif a == "-l" and i + 1 < len(args):
            name = args[i + 1]
        else:
            continue
        candidates = [name[1:]] if name.startswith(":") else [f"lib{name}.so", f"lib{name}.a"]
        for d in dirs:
            hit = next((os.path.join(d, c) for c in candidates if os.path.isfile(os.path.join(d, c))), None)
            if hit:
                if hit.endswith(".a"):
                    found.append(hit)
                break
    return found


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


HELP = """usage: mneme cc [clang options] FILES...   (also installed as mneme-cc, for CMake)

A drop-in C++/CUDA compiler for Make and CMake: clang++-22 in CUDA mode, plus what mneme adds:
  * each CUDA translation unit's device LLVM bitcode embedded in its object (`mneme ir` lists it), so
    `mneme record` finds the IR of every kernel the app launches
  * nvcc's conveniences: -x cuda for .cu, --cuda-gpu-arch=sm_90 by default (MNEME_CUDA_ARCH), CCCL and
    CUDA includes, nvcc builtins clang lacks, -arch=sm_NN / --gpu-architecture spellings
  * links against the shared libcudart (the recorder interposes on it) and device-links -fgpu-rdc code
  * -v or MNEME_CC_VERBOSE=1 prints every command it runs; #include <mneme/tolerance.h> works everywhere

example: mneme cc -O2 -o app app.cu && mneme ir ./app       (more: docs/CC.md)

clang's own options follow.
"""


def run_reporting(prog: str, body: Callable[[], int]) -> int:
    """Runs a compiler driver's `body`; errors become one `<prog>: error: ...` line and an exit code
    (the failing step's, 2 for a configuration error, 130 when interrupted)."""
    try:
        return body()
    except BuildError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.returncode or 1
    except MnemeError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--help", "-help", "-h"):
        print(HELP, flush=True)
        try:
            return subprocess.run([find_clang(), "--help"]).returncode
        except MnemeError as e:
            print(f"{PROG}: clang's help unavailable: {e}", file=sys.stderr)
            return 0

    def body() -> int:
        inv = cmdline.parse(argv)
        verbose = inv.verbose or os.environ.get("MNEME_CC_VERBOSE", "") not in ("", "0")
        if inv.mode == "info":  # --version, -print-*, -dumpmachine: clang answers
            return subprocess.run([find_clang()] + argv).returncode
        driver = Driver(inv, Toolchain.locate(inv.cuda_path), verbose)
        if inv.mode in ("preprocess", "asm"):
            driver.passthrough()
        elif inv.mode == "compile":
            driver.compile_all()
        else:
            driver.link()
        return 0

    return run_reporting(PROG, body)


def console_main() -> None:
    """Entry point of the `mneme-cc` console script (CMake wants CXX to be a single executable)."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
