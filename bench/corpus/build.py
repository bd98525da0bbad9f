"""The CPU stages: `build` (each program copied to a scratch folder and built with its own build file,
only the compiler and the architecture set; the binary stripped and kept under .corpus/bin) and `pack`
(a subset of the built binaries with a manifest, for one device call: .corpus/pack, at most --max-mib)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from bench.corpus import stage
from bench.corpus.apps import App, ROOT

STATE = ROOT / ".corpus"
BIN = STATE / "bin"
PACK = STATE / "pack"
DEFAULT_ARCH = "90"
#: the GPU call carries the wheels (.bundle, about 32 MiB) too; 64 MiB in all
DEFAULT_MAX_MIB = 28.0
BUILD_TIMEOUT_S = 1200.0

_ERROR = re.compile(r"(\berror\b|\bfatal\b|undefined reference|cannot find -l|No such file or directory|"
                    r"not found|unsupported)", re.I)
_NOISE = re.compile(r"^(g?make(\[\d+\])?: \*\*\*|make: \*\*\*|\s*$|-- |ninja: build stopped|"
                    r"collect2: error: ld returned|Error: [a-z]+ failed with error|"
                    r"CMake Error: The source directory)", re.I)


def first_error(output: str, limit: int = 240) -> str:
    """The first line of a failed build's output that states a real error (not make's or CMake's own
    summary lines); for "CMake Error at FILE:" the line after it too. '' when nothing looks like one."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if _NOISE.search(line) or not _ERROR.search(line):
            continue
        text = line.strip()
        if text.startswith("CMake Error at") and i + 1 < len(lines):
            nxt = next((x.strip() for x in lines[i + 1:i + 4] if x.strip()), "")
            text = f"{text} {nxt}"
        return text[:limit]
    for line in reversed(lines):
        if line.strip() and not _NOISE.search(line):
            return line.strip()[:limit]
    return ""


def has_libcuda() -> bool:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return "libcuda.so " in out or any(Path(d, "libcuda.so").exists() for d in
                                       os.environ.get("LIBRARY_PATH", "").split(":") if d)


def libcuda_stub(where: Path) -> Path:
    """A stub libcuda.so for linking `-lcuda` on a machine without the driver (corpus README)."""
    where.mkdir(parents=True, exist_ok=True)
    so = where / "libcuda.so"
    if not so.exists():
        subprocess.run(["gcc", "-shared", "-fPIC", "-x", "c", "-", "-Wl,-soname,libcuda.so.1", "-o", str(so)],
                       input="int mneme_corpus_libcuda_stub;\n", text=True, check=True, capture_output=True)
    return where


def build_env(scratch: Path, arch: str = DEFAULT_ARCH) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NVCC", "CUDA_ARCH", "CUDACXX", "MAKEFLAGS")}
    # a build file that fixes its own architectures (the cuda-samples CMakeLists: 75 ... 120) still gets
    # its IR for the GPU the campaign runs on: CUB's kernels differ per architecture
    env.setdefault("MNEME_IR_ARCH", f"sm_{arch.removeprefix('sm_')}")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    if not has_libcuda():
        stub = libcuda_stub(scratch / "libcuda-stub")
        env["LIBRARY_PATH"] = f"{stub}:{env['LIBRARY_PATH']}" if env.get("LIBRARY_PATH") else str(stub)
    return env


def cudart_linkage(binary: Path) -> str:
    """'shared' when the binary needs libcudart.so, else 'static' (nvcc's and CMake's default)."""
    try:
        out = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return "shared" if re.search(r"NEEDED.*\[libcudart\.so", out) else "static"


def ir_kernels(binary: Path) -> Dict[str, Any]:
    """The device IR embedded in the binary (`mneme ir`): modules and the kernels they define."""
    try:
        from mneme.cc.ircli import list_modules
        mods = list_modules(binary)
    except Exception as e:  # noqa: BLE001 - no IR is a result, not a failure of the stage
        return {"ir_modules": 0, "ir_kernels": [], "ir_error": str(e)[:300]}
    kernels = sorted({k["name"] for m in mods for k in m["kernels"]})
    return {"ir_modules": len(mods), "ir_kernels": kernels}


def strip_copy(binary: Path, dest: Path) -> Dict[str, Any]:
    """dest = binary stripped of symbols and debug info; the embedded IR must survive (else unstripped)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, dest)
    r = subprocess.run(["strip", "--strip-unneeded", str(dest)], capture_output=True, text=True)
    info: Dict[str, Any] = {"binary_bytes": binary.stat().st_size, "stripped": r.returncode == 0}
    if r.returncode != 0:
        shutil.copy2(binary, dest)
        info["strip_error"] = r.stderr.strip()[:200]
    info["stripped_bytes"] = dest.stat().st_size
    return info


def compiler_version(nvcc: str) -> str:
    """`$NVCC --version`, its lines joined (nvcc's first names the driver, its last the build)."""
    p = stage.run([nvcc, "--version"], timeout=60)
    lines = [x.strip() for x in p.output.splitlines() if x.strip()]
    return " / ".join(lines)[:400] if lines else f"({nvcc} --version failed)"


def build_app(app: App, budget: stage.Budget, corpus: Path, nvcc: str, arch: str, scratch: Path,
              bin_dir: Path = BIN, timeout: float = BUILD_TIMEOUT_S, keep: bool = False) -> Dict[str, Any]:
    work = scratch / app.name
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(corpus, work, symlinks=True)
    cwd = work / app.path
    limit = budget.cap(timeout)
    p = stage.run([app.build_script(nvcc, arch)], timeout=limit, cwd=cwd, env=build_env(scratch, arch), shell=True)
    if p.timed_out and limit < timeout:
        return {"budget_cut": True}
    binary = cwd / app.binary
    row: Dict[str, Any] = {"built_unmodified": bool(p.ok and binary.is_file()), "build_s": round(p.seconds, 1),
                           "build_rc": p.returncode, "build_error": None}
    if not row["built_unmodified"]:
        row["build_error"] = (f"timed out after {p.seconds:.0f} s" if p.timed_out else
                              first_error(p.output) or f"exit {p.returncode}, no {app.binary}")
        row["build_log"] = stage.tail(p.output, 2000)
    else:
        row.update(ir_kernels(binary))
        row["cudart"] = cudart_linkage(binary)
        row.update(strip_copy(binary, bin_dir / app.name / Path(app.binary).name))
        after = ir_kernels(bin_dir / app.name / Path(app.binary).name)
        if after["ir_kernels"] != row["ir_kernels"]:
            shutil.copy2(binary, bin_dir / app.name / Path(app.binary).name)
            row["stripped"], row["strip_error"] = False, "strip lost the embedded IR; kept unstripped"
            row["stripped_bytes"] = binary.stat().st_size
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return row


def build_stage(apps: Sequence[App], budget: stage.Budget, corpus: Path, nvcc: str, arch: str = DEFAULT_ARCH,
                scratch: Optional[Path] = None, bin_dir: Path = BIN, keep: bool = False,
                argv: Optional[Sequence[str]] = None, save_path: Optional[Path] = None) -> Dict[str, Any]:
    """The build stage; with save_path the result so far is written there after every app."""
    own = scratch is None
    scratch = Path(scratch or tempfile.mkdtemp(prefix="mneme-corpus-build-"))
    extra = {"compiler": nvcc, "compiler_version": compiler_version(nvcc), "arch": arch, "corpus": str(corpus)}
    try:
        result = stage.run_stage("build", apps, lambda a, b: build_app(a, b, corpus, nvcc, arch, scratch, bin_dir,
                                                                         keep=keep), budget, argv=argv,
                                 save=(lambda r: stage.save({**r, **extra}, save_path)) if save_path else None)
    finally:
        if own and not keep:
            shutil.rmtree(scratch, ignore_errors=True)
    return {**result, **extra}


# ---- the bundle for the GPU machine ---------------------------------------------------------------

def built_apps(build_results: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """name -> the newest build row of each app that built (later results win, by their date: result files
    are named by their apps, and `build-a+b-2.json` sorts before `build-a+b.json`)."""
    rows: Dict[str, Dict[str, Any]] = {}
    for res in sorted(build_results, key=lambda r: str(r.get("date", ""))):
        for name, row in res["apps"].items():
            rows[name] = {**row, "_compiler": res.get("compiler"), "_arch": res.get("arch"), "_commit": res.get("commit")}
    return {n: r for n, r in rows.items() if r.get("built_unmodified")}


def plan_groups(sizes: Dict[str, int], max_bytes: float, max_apps: int = 0) -> List[List[str]]:
    """Apps grouped (in the given order, first fit) so that each group's binaries fit `max_bytes` and a
    group holds at most `max_apps` apps (0: no limit); an app bigger than the limit is a group alone."""
    groups: List[List[str]] = []
    totals: List[int] = []
    for name, size in sizes.items():
        for i, t in enumerate(totals):
            if t + size <= max_bytes and (not max_apps or len(groups[i]) < max_apps):
                groups[i].append(name)
                totals[i] += size
                break
        else:
            groups.append([name])
            totals.append(size)
    return groups


def pack(apps: Sequence[App], built: Dict[str, Dict[str, Any]], bin_dir: Path = BIN, out: Path = PACK,
         max_mib: float = DEFAULT_MAX_MIB) -> Dict[str, Any]:
    """out/manifest.json + out/bin/<app>/<binary> for the apps given that built; refuses over max_mib."""
    chosen = [a for a in apps if a.name in built]
    skipped = [a.name for a in apps if a.name not in built]
    files = {a.name: bin_dir / a.name / Path(a.binary).name for a in chosen}
    missing = [n for n, f in files.items() if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"no built binary for {', '.join(missing)} under {bin_dir}: run the build stage first")
    total = sum(f.stat().st_size for f in files.values())
    if total > max_mib * 2 ** 20:
        sizes = {n: f.stat().st_size for n, f in files.items()}
        groups = plan_groups(sizes, max_mib * 2 ** 20)
        raise ValueError(f"the binaries of {len(chosen)} apps hold {total / 2 ** 20:.1f} MiB, over {max_mib} MiB: "
                         "pack fewer apps per call, e.g. " + "; ".join("--apps " + ",".join(g) for g in groups))
    shutil.rmtree(out, ignore_errors=True)
    (out / "bin").mkdir(parents=True)
    entries = []
    for a in chosen:
        dest = out / "bin" / a.name / files[a.name].name
        dest.parent.mkdir(parents=True)
        shutil.copy2(files[a.name], dest)
        b = built[a.name]
        entries.append({**a.to_dict(), "exe": str(dest.relative_to(out)), "cudart": b.get("cudart"),
                        "ir_kernels": b.get("ir_kernels", []), "compiler": b.get("_compiler"), "arch": b.get("_arch")})
    manifest = {"commit": stage.commit(), "date": stage.now_iso(), "bytes": total, "apps": entries,
                "not_built": skipped}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_manifest(pack_dir: Path = PACK) -> Dict[str, Any]:
    path = Path(pack_dir) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no corpus pack; build and pack on the development machine "
                                "(bash scripts/corpus.sh build; bash scripts/corpus.sh pack --apps ...) and carry "
                                f"{Path(pack_dir).name} to the GPU machine")
    return json.loads(path.read_text())
