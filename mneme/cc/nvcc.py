"""`mneme nvcc` / `mneme-nvcc`: nvcc's command line, built through clang-22 with the device IR embedded.

The pipeline is nvcc's: `.cu` files are compiled by clang-22 in CUDA mode (host and device, with the
device bitcode embedded as `mneme cc` does: mneme.cc.cc.Driver), `.c`/`.cpp` files by the host compiler
(`-ccbin`, default gcc/g++), relocatable device code is device-linked into one object (`-dlink`, done
for the link phase too), and the executable is linked by the host compiler with the CUDA runtime that
`-cudart` names (static by default, as nvcc). Flag translation: mneme.cc.nvcctrans; option syntax:
mneme.cc.nvccflags. `-v` prints nvcc's `#$` lines (CMake reads them) and every command run.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence

from mneme.cc import cmdline
from mneme.cc.cc import BuildError, Driver, _static_archives, run_reporting
from mneme.cc.nvccflags import Input, NvccCommand, parse
from mneme.cc.nvcctrans import Translation, cuda_version_banner
from mneme.cc.toolchain import Toolchain
from mneme.errors import ConfigurationError

PROG = "mneme nvcc"


class NvccDriver:
    def __init__(self, cmd: NvccCommand, tc: Toolchain):
        self.cmd = cmd
        self.tc = tc
        self.tr = Translation(cmd, tc)
        self.env = tc.env()
        self.verbose = cmd.verbose or os.environ.get("MNEME_CC_VERBOSE", "") not in ("", "0")

    # ---- running -----------------------------------------------------------------------------------
    def show(self, argv: Sequence[str]) -> None:
        if self.verbose:
            print("#$ " + shlex.join(argv), file=sys.stderr, flush=True)

    def run(self, argv: Sequence[str], what: str) -> None:
        self.show(argv)
        if self.cmd.dryrun:
            return
        rc = subprocess.run(list(argv), env=self.env).returncode
        if rc != 0:
            raise BuildError(f"{what} failed (exit {rc})", rc)

    def banner(self) -> None:
        """nvcc's `-v` preamble: CMake reads TOP, NVVMIR_LIBRARY_DIR, PATH, INCLUDES, LIBRARIES."""
        if not self.verbose:
            return
        t = self.tr
        lines = [
            "_MNEME_=mneme nvcc (clang-22 with device IR embedded)",
            f"TOP={self.tc.cuda}",
            f"NVVMIR_LIBRARY_DIR={self.tc.cuda / 'nvvm' / 'libdevice'}",
            f"PATH={self.env.get('PATH', '')}",
            f"INCLUDES={shlex.join(t.includes())}",
            f"SYSTEM_INCLUDES={shlex.join(t.system_includes())}",
            f"LIBRARIES={shlex.join(t.library_dirs())}",
            "CUDA_ARCHS=" + " ".join(f"-arch compute_{a[3:]}" for a in t.archs),
        ]
        for line in lines:
            print("#$ " + line, file=sys.stderr)

    # ---- compiling ---------------------------------------------------------------------------------
    def object_name(self, src: Input, suffix: str = ".o") -> str:
        if self.cmd.output and self.cmd.phase in ("compile", "dc", "dw", "ptx", "cubin", "fatbin"):
            return self.cmd.output
        name = Path(src.path).with_suffix(suffix).name
        return os.path.join(self.cmd.output_dir, name) if self.cmd.output_dir else name

    def compile_one(self, src: Input, obj: str) -> None:
        if not os.path.exists(src.path):
            raise BuildError(f"{src.path}: no such source file")
        if src.lang == "cuda":
            self.tr.check_openmp_source(src)
            args = self.tr.cuda_args() + ["-c", src.path, "-o", obj]
            inv = cmdline.parse(args)
            drv = Driver(inv, self.tc, self.verbose)
            drv.build = {**self.cmd.device_settings(), "arch": drv.ir_arch, "archs": list(drv.archs)}
            drv._show = self.show  # nvcc's "#$ " style
            if self.cmd.dryrun:
                self.show([self.tc.clang] + args)
                return
            drv.compile(inv.sources[0], obj)
        else:
            self.run(self.tr.host_compile_args(src) + ["-c", src.path, "-o", obj], f"{src.path}: host compile")

    def compile_phase(self) -> None:
        sources = [s for s in self.cmd.inputs if s.lang != "obj"]
        if self.cmd.output and len(sources) > 1:
            raise ConfigurationError(f"-o {self.cmd.output} with -c and {len(sources)} sources: compile one at a time")
        for src in sources:
            self.compile_one(src, self.object_name(src))

    def device_phase(self, kind: str) -> None:
        """-ptx / -cubin: device code of each CUDA source for the first architecture."""
        suffix = {"ptx": ".ptx", "cubin": ".cubin"}[kind]
        for src in self.cmd.inputs:
            if src.lang != "cuda":
                raise ConfigurationError(f"-{kind} {src.path}: only .cu sources have device code")
            out = self.object_name(src, suffix)
            argv = self.tc_cmd(self.tr.archs[:1]) + ["--cuda-device-only", "-S" if kind == "ptx" else "-c"]
            self.run(argv + [src.path, "-o", out], f"{src.path}: -{kind}")

    def fatbin_phase(self) -> None:
        """-fatbin: a cubin and the PTX of every architecture, packed by CUDA's fatbinary."""
        fatbinary = self.tc.cuda / "bin" / "fatbinary"
        if not fatbinary.exists():
            raise ConfigurationError(f"-fatbin needs {fatbinary} (CUDA's fatbinary), which this CUDA root lacks")
        for src in self.cmd.inputs:
            if src.lang != "cuda":
                raise ConfigurationError(f"-fatbin {src.path}: only .cu sources have device code")
            with tempfile.TemporaryDirectory(prefix="mneme-nvcc-") as tmp:
                images = []
                for arch in self.tr.archs:
                    base = self.tc_cmd([arch]) + ["--cuda-device-only", src.path]
                    cubin, ptx = os.path.join(tmp, f"{arch}.cubin"), os.path.join(tmp, f"{arch}.ptx")
                    self.run(base + ["-c", "-o", cubin], f"{src.path}: {arch} cubin")
                    self.run(base + ["-S", "-o", ptx], f"{src.path}: {arch} PTX")
                    sm = arch[3:]
                    images += [f"--image3=kind=elf,sm={sm},file={cubin}", f"--image3=kind=ptx,sm={sm},file={ptx}"]
                self.run([str(fatbinary), f"--create={self.object_name(src, '.fatbin')}", "-64"] + images,
                         f"{src.path}: fatbinary")

    def tc_cmd(self, archs) -> List[str]:
        return [self.tc.clang] + self.tc.cuda_flags(archs) + self.tr.cuda_args(archs=archs)

    def preprocess_phase(self) -> None:
        out = ["-o", self.cmd.output] if self.cmd.output else []
        flag = {"E": "-E", "M": "-M", "MM": "-MM"}[self.cmd.phase]
        for src in self.cmd.inputs:
            if src.lang == "cuda":
                argv = [self.tc.clang] + self.tc.cuda_flags(self.tr.archs) + self.tr.cuda_args() + ["--cuda-host-only"]
            else:
                argv = self.tr.host_compile_args(src)
            self.run(argv + [flag] + self.cmd.deps + [src.path] + out, f"{src.path}: preprocess")

    def objects(self, tmp: str) -> List[str]:
        """Every input as an object or library, sources compiled into `tmp`, in command-line order."""
        out = []
        for n, src in enumerate(self.cmd.inputs):
            if src.lang == "obj":
                if not os.path.exists(src.path) and not self.cmd.dryrun:
                    raise BuildError(f"{src.path}: no such file")
                out.append(src.path)
            else:
                obj = os.path.join(tmp, f"{n}-{Path(src.path).stem}.o")
                self.compile_one(src, obj)
                out.append(obj)
        return out

    # ---- device link, archives, link ----------------------------------------------------------------
    def device_link(self, objs: Sequence[str], out: str, tmp: str) -> bool:
        """Device-link the relocatable device code of `objs` (objects and archives) into `out`, an
        object holding the linked GPU code and its registration, to be linked beside `objs` by the host
        linker (what `nvcc -dlink` makes). False, and an empty object, when no input has RDC code."""
        from mneme.cc.dlink import device_link

        return device_link(self, objs, out, tmp)

    def lib_phase(self) -> None:
        out = self.cmd.output or "a.a"
        with tempfile.TemporaryDirectory(prefix="mneme-nvcc-") as tmp:
            objs = self.objects(tmp)
            if os.path.exists(out) and not self.cmd.dryrun:
                os.remove(out)
            self.run(["ar", "rcs"] + self.cmd.archive + [out] + objs, f"archiving {out}")

    def dlink_phase(self) -> None:
        out = self.cmd.output or "a_dlink.o"
        with tempfile.TemporaryDirectory(prefix="mneme-nvcc-") as tmp:
            self.device_link(self.objects(tmp), out, tmp)

    def link_phase(self) -> None:
        out = self.cmd.output or "a.out"
        with tempfile.TemporaryDirectory(prefix="mneme-nvcc-") as tmp:
            objs = self.objects(tmp)
            dl = os.path.join(tmp, f"{Path(out).name}_dlink.o")
            # archives named with -l take part in the device link too (their members' device code)
            libs = [a for a in _static_archives(self.tr.link_args(objs)) if a not in objs]
            extra = [dl] if self.device_link(objs + libs, dl, tmp) else []
            argv = self.tr.host_linker() + self.tr.host_link_flags() + ["-Wl,--start-group"] + extra + objs
            argv += self.tr.link_args([]) + self.tr.runtime_libs() + ["-Wl,--end-group", "-o", out]
            self.run(argv, f"linking {out}")

    def main(self) -> None:
        self.banner()
        for note in self.tr.notes():
            if self.verbose:
                print(f"{PROG}: {note}", file=sys.stderr)
        phase = self.cmd.phase
        if not self.cmd.inputs:
            raise ConfigurationError("no input files")
        if phase in ("compile", "dc", "dw"):
            self.compile_phase()
        elif phase in ("ptx", "cubin"):
            self.device_phase(phase)
        elif phase == "fatbin":
            self.fatbin_phase()
        elif phase in ("E", "M", "MM"):
            self.preprocess_phase()
        elif phase == "lib":
            self.lib_phase()
        elif phase == "dlink":
            self.dlink_phase()
        else:
            self.link_phase()


HELP = """usage: {prog} [nvcc options] files...

Build CUDA code from nvcc's command line with clang-22, embedding each translation unit's device LLVM
bitcode in the binary (what `mneme record` and `mneme replay` need); a drop-in for NVCC= in Makefiles
and -DCMAKE_CUDA_COMPILER=mneme-nvcc in CMake projects.

example:
  {prog} -O3 -arch=sm_90 --use_fast_math -o app app.cu && mneme ir ./app

What mneme adds or decides (docs/CC.md):
  the device IR           embedded before LLVM optimization (section .mneme_ir), listed by `mneme ir`
  build settings          -O, fast-math/ftz/prec-*/fmad, -maxrregcount, -Xptxas are stored with the IR
  __NVCC__, __CUDACC_VER_MAJOR__/_MINOR__
                          defined for user code as nvcc does, without breaking CUDA's own headers
  unsupported targets     sm_60 and older: one line naming the supported ones and the override
  flags it cannot honour  a clear error naming the flag; nothing is silently ignored

nvcc's options it takes (nvcc's documentation is the reference):
  -arch/-code/-gencode/--generate-code (compute_NN, sm_NN, lists, native, all), -c -o -E -M -MD -MMD -MT -MF,
  -ptx -cubin -fatbin -lib -shared, -rdc/-dc/-dlink/-dw, -cudart static|shared|none, -x cu, -std, -O,
  -g -G -lineinfo, --use_fast_math --ftz --prec-div --prec-sqrt --fmad, -maxrregcount,
  -Xcompiler/--compiler-options, -Xptxas/--ptxas-options, -Xlinker/--linker-options, -Xnvlink, -ccbin, -m64,
  --extended-lambda --expt-*, --default-stream, -t/--threads, -Werror, --diag-suppress, -Xcudafe,
  --resource-usage, -keep, @file/--options-file, --version
"""


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        cmd = parse(argv)
        if cmd.phase == "version":
            print(cuda_version_banner(Toolchain.locate()))
        elif cmd.phase == "help":
            print(HELP.format(prog=PROG))
        else:
            NvccDriver(cmd, Toolchain.locate()).main()
        return 0

    return run_reporting(PROG, body)


def console_main() -> None:
    """Entry point of the `mneme-nvcc` console script (for NVCC= and CMAKE_CUDA_COMPILER=)."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
