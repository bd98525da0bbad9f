"""`mneme replay --sass-diff`: is the replay's machine code the app's? (issue 16: the baseline is the app's code)

The app's SASS for the kernel comes from `cuobjdump -sass` on the binary (or shared library) that holds it, the
replay's from the cubin it compiled; both are reduced to their instruction mix (opcode with modifiers:
`LDS.128`, `FFMA`, `@P0 BRA` counts as `BRA`) and register count (`cuobjdump -res-usage`). A difference in
the mix says the replay does not run the app's code (e.g. vector shared loads where the app, built with
-fgpu-rdc, has scalar ones), whatever the timing says.

cuobjdump is looked for as MNEME_CUOBJDUMP, in the CUDA roots' bin/, in the pip packages nvidia-cuda-cuobjdump
and nvidia-cuda-nvdisasm (the dev extra; cuobjdump -sass runs nvdisasm), then on PATH.
"""

from __future__ import annotations

import collections
import functools
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from mneme.errors import ConfigurationError, MnemeError
from mneme.tmpfiles import pid_dir

_CODE_FOR = re.compile(r"^\s*code for (sm_\w+)")
_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_INSTR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_RES_FUNC = re.compile(r"^\s*Function (\S+?):\s*$")
_REG = re.compile(r"\bREG:(\d+)")


@functools.lru_cache(maxsize=None)
def find_cuobjdump() -> Optional[str]:
    explicit = os.environ.get("MNEME_CUOBJDUMP", "").strip()
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    from mneme.ir.ptxas import cuda_roots

    for root in cuda_roots():  # $CUDA_HOME, $CUDA_PATH, $CUDA_ROOT, /usr/local/cuda: where ptxas is looked for
        if os.access(Path(root) / "bin" / "cuobjdump", os.X_OK):
            return str(Path(root) / "bin" / "cuobjdump")
    for site in sys.path:  # nvidia-cuda-cuobjdump installs nvidia/<pkg>/bin/cuobjdump
        for hit in glob.glob(os.path.join(site, "nvidia", "*", "bin", "cuobjdump")):
            if os.access(hit, os.X_OK):
                return hit
    return shutil.which("cuobjdump")


def _cuobjdump(args: List[str]) -> str:
    exe = find_cuobjdump()
    if exe is None:
        raise ConfigurationError("--sass-diff needs cuobjdump: install the CUDA toolkit (set CUDA_HOME) or "
                                 "`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`, or point MNEME_CUOBJDUMP at it")
    env = dict(os.environ)
    here = Path(exe).parent
    if (here / "nvdisasm").is_file():  # cuobjdump -sass runs nvdisasm: the pip packages put both in one bin/
        env["PATH"] = f"{here}{os.pathsep}{env.get('PATH', '')}"
    try:
        p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=300, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        raise MnemeError(f"could not run {exe}: {e}") from None
    if p.returncode != 0:
        raise MnemeError(f"{exe} {' '.join(args)} failed (exit {p.returncode}): {p.stderr.strip()[:500]}")
    return p.stdout


def opcode(instr: str) -> str:
    """`LDS.128` of `@!P0 LDS.128 R4, [R2] `: the opcode with its modifiers, without the predicate."""
    words = instr.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def parse_sass(text: str) -> Dict[str, Dict[str, List[str]]]:
    """{arch: {function: [instruction text]}} of `cuobjdump -sass` output."""
    out: Dict[str, Dict[str, List[str]]] = {}
    arch, fn = "", None
    for line in text.splitlines():
        m = _CODE_FOR.match(line)
        if m:
            arch, fn = m.group(1), None
            continue
        m = _FUNCTION.match(line)
        if m:
            fn = m.group(1)
            out.setdefault(arch, {})[fn] = []
            continue
        m = _INSTR.match(line)
        if m and fn is not None:
            out[arch][fn].append(m.group(1))
    return out


def parse_registers(text: str) -> Dict[str, int]:
    """{function: registers} of `cuobjdump -res-usage` output."""
    regs: Dict[str, int] = {}
    fn = None
    for line in text.splitlines():
        m = _RES_FUNC.match(line)
        if m:
            fn = m.group(1)
            continue
        r = _REG.search(line)
        if r and fn:
            regs.setdefault(fn, int(r.group(1)))
    return regs


def kernel_sass(path: str, kernel: str, arch: str) -> Optional[Dict[str, Any]]:
    """{instructions, registers} of `kernel` for `arch` in an ELF file or cubin; None if it has none."""
    sass = parse_sass(_cuobjdump(["-sass", str(path)]))
    code = (sass.get(arch) or {}).get(kernel)
    if code is None:  # one architecture only (a cubin): its code whatever it is labelled
        code = next((fns[kernel] for fns in sass.values() if kernel in fns), None)
    if code is None:
        return None
    regs = parse_registers(_cuobjdump(["-res-usage", str(path)])).get(kernel)
    return {"instructions": code, "registers": regs}


def mix(instructions: List[str]) -> collections.Counter:
    return collections.Counter(opcode(i) for i in instructions if opcode(i) != "NOP")


def compare(app: Dict[str, Any], replay: Dict[str, Any]) -> Dict[str, Any]:
    """The difference of two kernels' SASS: mix (per opcode where the counts differ), registers, identity."""
    a, r = mix(app["instructions"]), mix(replay["instructions"])
    differs = {op: {"app": a.get(op, 0), "replay": r.get(op, 0)} for op in sorted(set(a) | set(r))
               if a.get(op, 0) != r.get(op, 0)}
    norm = lambda ins: [" ".join(i.split()) for i in ins if opcode(i) != "NOP"]  # noqa: E731
    return {
        "same_code": norm(app["instructions"]) == norm(replay["instructions"]),
        "same_mix": not differs,
        "instructions": {"app": sum(a.values()), "replay": sum(r.values())},
        "registers": {"app": app.get("registers"), "replay": replay.get("registers")},
        "mix_differs": differs,
    }


def app_binaries(pipe) -> List[str]:
    """Where the app's code may be: the executables the record's runs name, then their shared libraries with IR."""
    from mneme.cc.embedded import libraries_with_ir

    out: List[str] = []
    for run in (pipe.record.provenance or {}).get("runs", []):
        exe = run.get("exe")
        if exe and os.path.isfile(exe) and exe not in out:
            out.append(exe)
            try:
                out += [str(p) for p in libraries_with_ir(exe) if str(p) not in out]
            except MnemeError:
                pass
    return out


def compare_replay(pipe, compiled, binary: Optional[str] = None) -> Dict[str, Any]:
    """`mneme replay --sass-diff`: the app's SASS of the pipeline's kernel against `compiled`'s cubin."""
    kernel, arch = pipe.kernel_name, pipe.arch
    candidates = [binary] if binary else app_binaries(pipe)
    if not candidates:
        raise ConfigurationError(f"{pipe.record_db}: the record names no app binary that exists here; pass "
                                 "--sass-diff APP_BINARY")
    app, where = None, None
    for path in candidates:
        if not os.path.isfile(path):
            raise ConfigurationError(f"--sass-diff {path}: no such file")
        app = kernel_sass(path, kernel, arch)
        if app is not None:
            where = path
            break
    with pid_dir("sassdiff") as tmp:
        cubin = Path(tmp) / "replay.cubin"
        cubin.write_bytes(compiled.cubin.cubin)
        replay = kernel_sass(str(cubin), kernel, arch)
    if replay is None:
        raise MnemeError(f"cuobjdump found no SASS of {kernel} in the replay's cubin")
    if replay.get("registers") is None:
        replay["registers"] = compiled.cubin.registers
    doc: Dict[str, Any] = {"kernel": kernel, "arch": arch, "app_binary": where, "searched": candidates,
                           "baseline": pipe.baseline.kind}
    if app is None:
        doc.update(found=False, why=f"no {arch} SASS of {kernel} in {', '.join(candidates)} (the app may carry "
                                    "only PTX for it, JIT-compiled by the driver)")
        return doc
    doc.update(found=True, **compare(app, replay))
    return doc


def render(doc: Dict[str, Any], limit: int = 12) -> str:
    """A few lines for the terminal."""
    if not doc.get("found"):
        return f"sass-diff  {doc.get('why')}"
    n, regs = doc["instructions"], doc["registers"]
    verdict = "identical code" if doc["same_code"] else ("same instruction mix" if doc["same_mix"] else "DIFFERENT")
    lines = [f"sass-diff  {verdict}: app {n['app']} instructions, {regs['app']} registers ({doc['app_binary']}); "
             f"replay {n['replay']} instructions, {regs['replay']} registers"]
    rows = sorted(doc["mix_differs"].items(), key=lambda kv: -abs(kv[1]["app"] - kv[1]["replay"]))
    for op, c in rows[:limit]:
        lines.append(f"           {op:<24} app {c['app']:>5}  replay {c['replay']:>5}")
    if len(rows) > limit:
        lines.append(f"           ... {len(rows) - limit} more opcodes differ")
    return "\n".join(lines)
