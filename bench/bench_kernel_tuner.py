"""Side by side with Kernel Tuner: the same block-shape space searched by brute force on the same GPU in one
run, by Kernel Tuner and by `mneme tune`; configurations per second and the best time each finds.

Kernels: vecAdd (examples/vecadd.cu, 2^24 elements) and the 5-point 2-D stencil (examples/stencil2d.cu,
4096 x 4096, one step). Spaces (bench/block_spaces.py, one definition read by both tools): vecAdd block.x in
every multiple of 32 up to 1024 (32 configurations); the stencil every power-of-two (bx, by) with
32 <= bx*by <= 1024 (51). The grid always covers the work: ceil(problem / block) per dimension. Before
tuning, the script checks that mneme's configurations for the recording are exactly Kernel Tuner's (blocks and
grids); the `same set` column says whether each tool then ran exactly that set.

Kernel Tuner (pip kernel-tuner; cupy backend, or cuda-python's NVRTC backend where cupy is missing) tunes the
device code cut from the example source between its includes and main(), unchanged, with
`strategy="brute_force"` and its defaults otherwise: NVRTC compiles the source once per configuration (it
defines block_size_x... in it), CUDA events time each launch, `time` is the mean of the iterations, the first
configuration is run once more as a warm-up, all in one process. A second Kernel Tuner row adds `answer=` (every
configuration's output checked against a NumPy reference), the like of mneme's verification. mneme records the
example app at that size (`mneme record`, not timed here), then runs `mneme tune --space-module
bench.kt_space:BlockSpace --sampler exhaustive` with its defaults (every configuration verified against the
recorded epilogue, compile jobs = CPU count, median of the timed iterations after 2 warm-ups, written bytes
restored before each run) but tracking off. Both time the same number of iterations per configuration
(--iterations, default 10). mneme compiles the recorded LLVM IR (clang-22 -O3 front end) with LLVM's NVPTX back
end and ptxas (whole program), and a launch-only change reuses one cubin. Each tool runs in a fresh process with cold caches
(CuPy's kernel cache in an empty folder, mneme's cubin cache in its new results folder); for each kernel mneme
runs first.

Main table: `compiles` is what each tool reports compiling; `wall s` is the tool's whole process (start,
imports, device setup, compiles, warm-up, every configuration, results; Kernel Tuner's process also makes its
host data) and configs/s = configurations / wall s; `search s` is Kernel Tuner's tune_kernel() call (device
setup, search space, warm-up, configurations) and, for mneme, its baseline's start to its last trial's end
(its worker processes are up by then); `best us (own)` is each tool's own figure for its best configuration
(Kernel Tuner: mean, mneme: median). The best blocks of all rows are then re-measured alike, each method in a
process of its own, in rounds alternating between the blocks: `cupy events` (the kernel compiled by NVRTC as
Kernel Tuner does, CUDA events around single launches, median) and `mneme replay` (the recorded kernel replayed,
verified and timed by mneme, median). The last table compares the tools' own medians configuration by
configuration (mneme / Kernel Tuner) with the rank correlation of their two orders.

The ratio line gives, per kernel, mneme / Kernel Tuner in configurations per second, and the re-measured time
of mneme's best block / Kernel Tuner's best block (cupy events where they ran), each with which tool is ahead
(within 2 %: even).

Usage: python bench/bench_kernel_tuner.py [--quick] [--only vecadd,stencil2d] [--iterations N] [--kt-lang auto]
       [--no-kt-answer] [--compile-jobs N] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import numbers
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
import benchlib  # noqa: E402
from bench import block_spaces as bs  # noqa: E402

NAME = "kernel_tuner"
LINE = "BENCH "
BIN = benchlib.ROOT / "examples" / "bin"
SPACE_MODULE = "bench.kt_space:BlockSpace"
#: absolute tolerance of Kernel Tuner's answer check (float32 sums of values in [0, 1); FMA contraction differs)
ATOL = 1e-5
#: the stencil's constants, as examples/stencil2d.cu sets them
STENCIL_WEIGHTS = (0.5, 0.125, 0.125, 0.125, 0.125)
STENCIL_BOUNDARY = 1.0
#: within this relative difference two figures count as even in the ratio line
EVEN = 0.02
#: the common re-measurements of the best blocks: worker, row key, name; the ratio line prefers the first
COMMON_METHODS = (("cupy", "best_cupy_us", "cupy events"), ("replay", "best_replay_us", "mneme replay"))
COMMON = tuple((key, method) for _, key, method in COMMON_METHODS)

MNEME = "mneme"
KT = "Kernel Tuner"
KT_ANSWER = "Kernel Tuner + answer"
#: where Kernel Tuner says each configuration's time went (its <name>_time fields, ms)
KT_TIMES = ("compile", "verification", "benchmark", "framework", "strategy")


@dataclass(frozen=True)
class Kernel:
    """One kernel of the comparison: where its source and app are, the size it is timed at, its spaces."""

    example: str  # examples/<example>.cu and examples/bin/<example>
    function: str  # the __global__ function
    problem: Tuple[int, ...]  # Kernel Tuner's problem_size; the app is recorded at the same size
    app_args: Tuple[str, ...]
    space: str
    quick_space: str


KERNELS: Dict[str, Kernel] = {
    "vecadd": Kernel("vecadd", "vecAdd", (1 << 24,), (str(1 << 24),), "vecadd", "vecadd-quick"),
    "stencil2d": Kernel("stencil2d", "stencil2d", (4096, 4096), ("4096", "4096", "1"), "stencil2d", "stencil2d-quick"),
}

MAIN_COLUMNS = [
    ["kernel", "kernel"], ["tool", "tool"], ["backend", "how"], ["configs", "configs", "d"], ["ok", "ok", "d"],
    ["same_space", "same set"], ["compiles", "compiles", "d"], ["wall_s", "wall s", ".2f"],
    ["per_s", "configs/s", ".2f"], ["search_s", "search s", ".2f"], ["best_block", "best block"],
    ["best_own_us", "best us (own)", ".2f"], ["best_cupy_us", "best us (cupy events)", ".2f"],
    ["best_replay_us", "best us (mneme replay)", ".2f"],
]
COMMON_COLUMNS = [
    ["kernel", "kernel"], ["method", "method"], ["block", "block"], ["picked_by", "best of"], ["us", "median us", ".2f"],
    ["min_us", "min us", ".2f"], ["n", "launches", "d"],
]
PER_CONFIG_COLUMNS = [
    ["kernel", "kernel"], ["both", "configs timed by both", "d"], ["ratio_median", "mneme / KT, median", ".3f"],
    ["ratio_min", "min", ".3f"], ["ratio_max", "max", ".3f"], ["spearman", "rank correlation", ".3f"],
    ["mneme_best", "mneme's best"], ["kt_best", "Kernel Tuner's best"],
]


# ---- the kernels as Kernel Tuner sees them (no GPU) --------------------------------------------------

def kernel_source(example: str, root: Path = benchlib.ROOT) -> str:
    """The example's device code exactly as written: everything between its includes and main()."""
    path = root / "examples" / f"{example}.cu"
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    last_include = max((i for i, ln in enumerate(lines) if ln.lstrip().startswith("#include")), default=-1)
    body = "".join(lines[last_include + 1:])
    cut = body.find("int main(")
    if cut < 0:
        raise ValueError(f"{path}: no main() to cut the device code from")
    return body[:cut].rstrip() + "\n"


def host_arguments(kernel: str, problem: Sequence[int], seed: int = 0):
    """(arguments, constant-memory arguments, answer) for Kernel Tuner, NumPy on the host."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if kernel == "vecadd":
        (n,) = problem
        a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
        return [a, b, np.zeros_like(a), np.int32(n)], None, [None, None, a + b, None]
    if kernel == "stencil2d":
        nx, ny = problem
        src = rng.random((ny, nx), dtype=np.float32)
        weights = np.asarray(STENCIL_WEIGHTS, dtype=np.float32)
        cmem = {"c_weights": weights, "g_boundary": np.asarray([STENCIL_BOUNDARY], dtype=np.float32)}
        ref = stencil_reference(src, weights, STENCIL_BOUNDARY).ravel()
        return [src.ravel(), np.zeros(nx * ny, dtype=np.float32), np.int32(nx), np.int32(ny)], cmem, \
            [None, ref, None, None]
    raise KeyError(f"unknown kernel {kernel!r}; choose from {', '.join(KERNELS)}")


def stencil_reference(src, weights, boundary: float):
    """examples/stencil2d.cu's step on the host, in float32 and in the kernel's order of additions."""
    import numpy as np

    w = np.asarray(weights, dtype=np.float32)
    p = np.pad(src.astype(np.float32), 1, constant_values=np.float32(boundary))
    centre, west, east = p[1:-1, 1:-1], p[1:-1, :-2], p[1:-1, 2:]
    south, north = p[:-2, 1:-1], p[2:, 1:-1]
    v = w[0] * centre
    for wk, nb in zip(w[1:], (west, east, south, north)):
        v = v + wk * nb
    return v.astype(np.float32)


def resolve_lang(lang: str) -> str:
    """Kernel Tuner's backend: cupy where it imports, else cuda-python's NVRTC backend ('nvcuda')."""
    if lang != "auto":
        return lang
    try:
        import cupy  # noqa: F401
        return "cupy"
    except ImportError:
        return "nvcuda"


# ---- the workers (each in a process of its own, on the GPU) -----------------------------------------

def _whole_device_uuid() -> None:
    """CuPy hands the device UUID over as a C string, cut at its first zero byte, and Kernel Tuner 1.5's CuPy
    backend then fails in uuid.UUID(bytes=...) ('bytes is not a 16-char string') on a GPU whose UUID holds a
    zero byte (seen on some H200s, not others). Pad it back to 16 bytes (the cut-off bytes were zeros)."""
    try:
        import cupy as cp
    except ImportError:
        return
    runtime = cp.cuda.runtime
    original = runtime.getDeviceProperties

    def properties(device):
        props = original(device)
        raw = props.get("uuid")
        if isinstance(raw, bytes) and len(raw) < 16:
            props = dict(props, uuid=raw.ljust(16, b"\0"))
        return props

    runtime.getDeviceProperties = properties


def kt_worker(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Kernel Tuner's brute-force search of one space."""
    t0 = time.perf_counter()
    import kernel_tuner

    _whole_device_uuid()

    imported = time.perf_counter() - t0
    k = KERNELS[spec["kernel"]]
    space = bs.space_def(spec["space"])
    lang = resolve_lang(spec.get("lang", "auto"))
    args, cmem, answer = host_arguments(spec["kernel"], k.problem, spec.get("seed", 0))
    t1 = time.perf_counter()
    results, env = kernel_tuner.tune_kernel(
        k.function, kernel_source(k.example), k.problem, args, space.tune_params,
        restrictions=list(space.restrictions) or None, answer=answer if spec.get("answer") else None, atol=ATOL,
        lang=lang, iterations=spec["iterations"], strategy="brute_force", cmem_args=cmem, quiet=True,
    )
    tuned = time.perf_counter() - t1
    return {"lang": lang, "version": getattr(kernel_tuner, "__version__", "?"), "import_s": imported,
            "search_s": tuned, "device": env.get("device_name"), "configs": [kt_config(r) for r in results]}


def kt_config(r: Dict[str, Any]) -> Dict[str, Any]:
    """One Kernel Tuner result as plain JSON: block, own time (mean), its iterations, the time it took."""
    block = list(bs.block_of(r))
    err = r.get("__error__")  # Kernel Tuner's ErrorConfig classes name the failure (as empty strings)
    if err is not None or not isinstance(r.get("time"), numbers.Real):
        return {"block": block, "error": type(err).__name__ if err is not None else f"no time: {r.get('time')!r}"}
    spent = {f"{k}_ms": float(r.get(f"{k}_time") or 0.0) for k in KT_TIMES}
    return {"block": block, "us": float(r["time"]) * 1e3, "times_us": [float(t) * 1e3 for t in r.get("times") or []], **spent}


def cupy_worker(spec: Dict[str, Any]) -> Dict[str, Any]:
    """The best blocks timed alike: the NVRTC-compiled kernel, CUDA events around each launch, rounds alternating."""
    import cupy as cp
    import numpy as np

    k = KERNELS[spec["kernel"]]
    mod = cp.RawModule(code=kernel_source(k.example), options=("--std=c++11",), name_expressions=[k.function])
    fn = mod.get_function(k.function)
    args, cmem, _ = host_arguments(spec["kernel"], k.problem, spec.get("seed", 0))
    for name, value in (cmem or {}).items():
        cp.ndarray(value.shape, value.dtype, mod.get_global(name))[:] = cp.asarray(value)
    gpu = tuple(cp.asarray(a) if isinstance(a, np.ndarray) else a for a in args)
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def once(block) -> float:
        start.record()
        fn(bs.grid_for(k.problem, block), tuple(block), gpu)
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) * 1e3

    blocks = [tuple(b) for b in spec["blocks"]]
    times: Dict[Tuple[int, ...], List[float]] = {b: [] for b in blocks}
    for b in blocks:
        for _ in range(spec["warmup"]):
            once(b)
    for r in range(spec["rounds"]):
        for b in (blocks if r % 2 == 0 else blocks[::-1]):
            times[b] += [once(b) for _ in range(spec["per_round"])]
    return {"blocks": [{"block": list(b), "us": benchlib.median(t), "min_us": min(t), "n": len(t)} for b, t in times.items()]}


def replay_worker(spec: Dict[str, Any]) -> Dict[str, Any]:
    """The best blocks replayed by mneme from the recording: verified, timed, rounds alternating."""
    from bench.kt_space import BlockSpace
    from mneme.config import MeasurementSettings
    from mneme.replay.pipeline import ReplayPipeline
    from mneme.tune.space import SpaceContext

    settings = MeasurementSettings(iterations=spec["per_round"], warmup=spec["warmup"])
    blocks = [tuple(b) for b in spec["blocks"]]
    times: Dict[Tuple[int, ...], List[float]] = {b: [] for b in blocks}
    with ReplayPipeline(spec["db"], None, device_id=0, settings=settings) as pipe:
        space = BlockSpace(SpaceContext(pipe.baseline_config()), spec["space"])
        configs = {b: space.derived(dict(zip(bs.BLOCK_NAMES, b))) for b in blocks}
        compiled = {b: pipe.compile(c) for b, c in configs.items()}
        for r in range(spec["rounds"]):
            for b in (blocks if r % 2 == 0 else blocks[::-1]):
                res = pipe.run(compiled[b], configs[b])
                if res.status != "verified":
                    raise RuntimeError(f"replay of block {bs.shape_text(b)}: {res.status}: {res.error[:300]}")
                times[b] += [t / 1e3 for t in res.exec_time]
    return {"blocks": [{"block": list(b), "us": benchlib.median(t), "min_us": min(t), "n": len(t)} for b, t in times.items()]}


WORKERS = {"kt": kt_worker, "cupy": cupy_worker, "replay": replay_worker}


def worker(spec_json: str, verbose: bool) -> int:
    """Runs one worker and prints its `BENCH {json}` line (an error is a line too)."""
    spec = json.loads(spec_json)
    try:
        out = WORKERS[spec["kind"]](spec)
    except Exception as e:  # noqa: BLE001 - the driver shows it in the row
        out = benchlib.error_row({}, e, verbose)
    print(LINE + json.dumps(out, default=str), flush=True)
    return 0


def run_worker(spec: Dict[str, Any], timeout: float, env: Optional[Dict[str, str]] = None,
               verbose: bool = False) -> Tuple[Dict[str, Any], float]:
    """(the worker's result, wall seconds of its process); RuntimeError when it failed."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)] + (["--verbose"] if verbose else [])
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=benchlib.ROOT)
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(LINE)]
    if verbose and p.stderr:
        print(p.stderr, file=sys.stderr)
    if not lines:
        raise RuntimeError(f"{spec['kind']} worker exited {p.returncode}: {(p.stderr or p.stdout)[-600:] or 'no output'}")
    out = json.loads(lines[-1][len(LINE):])
    if "error" in out:
        raise RuntimeError(f"in the {spec['kind']} worker: {out['error']}" + (f" (at {out['where']})" if out.get('where') else ""))
    return out, wall


# ---- mneme ----------------------------------------------------------------------------------------

def record(kernel: Kernel, root: Path) -> str:
    """`mneme record` of the example app at the timing size; the record DB of its kernel."""
    from mneme.record.db import RecordedExecution, find_dbs

    out = root / f"{kernel.example}-rec"
    app = BIN / kernel.example
    if not app.exists():
        raise FileNotFoundError(f"{app} is missing: build the examples (make examples / make gpu-bundle)")
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "record", "-rdb", str(out), "--quiet", "--", str(app),
                        *kernel.app_args], capture_output=True, text=True, timeout=300, cwd=benchlib.ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"mneme record {kernel.example} exited {p.returncode}: {(p.stderr or p.stdout)[-600:]}")
    for db in find_dbs(str(out)):
        rec = RecordedExecution.from_json(db)
        if kernel.function in (rec.demangled_name or rec.kernel_name):
            return db
    raise RuntimeError(f"no record DB of {kernel.function} in {out}")


def mneme_command(db: str, space: str, trials: int, out: Path, iterations: int, warmup: int,
                  compile_jobs: Optional[int], devices: str = "0") -> List[str]:
    argv = [sys.executable, "-m", "mneme.cli", "tune", "-rdb", str(db), "--space-module", SPACE_MODULE,
            "--space-arg", f"space={space}", "--sampler", "exhaustive", "--trials", str(trials), "--devices", devices,
            "-it", str(iterations), "--warmup", str(warmup), "--no-track", "--quiet", "--json", "-o", str(out)]
    if compile_jobs:
        argv += ["--compile-jobs", str(compile_jobs)]
    return argv


def python_env() -> Dict[str, str]:
    """This environment with the repository root on PYTHONPATH (mneme imports bench.kt_space from there)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(benchlib.ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _when(stamp: Optional[str]) -> Optional[datetime.datetime]:
    try:
        return datetime.datetime.fromisoformat(stamp) if stamp else None
    except ValueError:
        return None


def parse_mneme(out: Path) -> Dict[str, Any]:
    """A results directory of `mneme tune` as the comparison needs it: every trial's block and own time
    (median of its iterations, mneme's metric), the best block, and the search span."""
    configs: List[Dict[str, Any]] = []
    ends = []
    for line in (out / "trials.jsonl").read_text().splitlines():
        t = json.loads(line)
        if t.get("flag") in ("rejected", "surplus", "retried"):
            continue
        res = t.get("result") or {}
        block = list(bs.block_of(t.get("params") or {}))
        ends.append(_when(res.get("end_time")))
        times = [x / 1e3 for x in res.get("exec_time") or []]
        if t.get("status") == "verified" and times:
            configs.append({"block": block, "us": benchlib.median(times), "times_us": times, "status": "verified"})
        else:
            error = f"{t.get('status')}: {res.get('error', '')[:200]}"
            configs.append({"block": block, "status": t.get("status"), "error": error})
    base = json.loads((out / "baseline.json").read_text())
    start = _when((base.get("result") or {}).get("start_time"))
    last = max((e for e in ends if e), default=None)
    best_path = out / "best.json"
    best = json.loads(best_path.read_text()) if best_path.exists() else None
    return {
        "configs": configs,
        "search_s": (last - start).total_seconds() if start and last else None,
        "best_block": [int(best["config"]["block"][a]) for a in "xyz"] if best else None,
        "best_us": best["metric_ns"] / 1e3 if best and best.get("metric_ns") else None,
        "baseline_us": base["metric_ns"] / 1e3 if base.get("metric_ns") else None,
    }


def tune_with_mneme(argv: List[str], out: Path, timeout: float) -> Dict[str, Any]:
    """Runs a `mneme tune` command line writing to `out`; its parsed results, compile count and wall time."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=python_env(), cwd=benchlib.ROOT)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"mneme tune exited {p.returncode}: {(p.stderr or p.stdout)[-600:]}")
    run = parse_mneme(out)
    try:
        run["compiles"] = (json.loads(p.stdout).get("executor") or {}).get("compiles")
    except ValueError:
        run["compiles"] = None
    run.update(wall_s=wall, command=" ".join(["mneme"] + argv[argv.index("tune"):]))
    return run


def run_mneme(db: str, space: str, trials: int, root: Path, args) -> Dict[str, Any]:
    out = root / f"mneme-{space}"
    run = tune_with_mneme(mneme_command(db, space, trials, out, args.iterations, args.warmup, args.compile_jobs),
                          out, args.timeout)
    run["backend"] = f"mneme tune exhaustive, {args.compile_jobs or os.cpu_count()} compile jobs"
    return run


def run_kt(kernel: str, space: str, answer: bool, root: Path, args) -> Dict[str, Any]:
    env = python_env()
    env["CUPY_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"cupy-{kernel}-", dir=root)  # cold: every compile counted
    spec = {"kind": "kt", "kernel": kernel, "space": space, "answer": answer, "iterations": args.iterations,
            "lang": args.kt_lang, "seed": args.seed}
    out, wall = run_worker(spec, args.timeout, env, args.verbose)
    ok = [c for c in out["configs"] if "error" not in c]
    best = min(ok, key=lambda c: c["us"]) if ok else None
    return {**out, "wall_s": wall, "best_block": best["block"] if best else None, "best_us": best["us"] if best else None,
            "compiles": sum(1 for c in out["configs"] if c.get("compile_ms", 0) > 0),
            "backend": f"kernel_tuner {out.get('version')} brute_force, {out.get('lang')}"}


# ---- assembling the tables ---------------------------------------------------------------------------

def tool_row(kernel: str, tool: str, run: Dict[str, Any], expected: List[bs.Block]) -> Dict[str, Any]:
    """One tool's row: counts, the set it searched against the definition, throughput, its best."""
    configs = run["configs"]
    searched = sorted(tuple(c["block"]) for c in configs)
    n = len(configs)
    return {
        "kernel": kernel, "tool": tool, "backend": run.get("backend"), "configs": n,
        "ok": sum(1 for c in configs if "error" not in c), "compiles": run.get("compiles"),
        "same_space": "yes" if searched == sorted(expected) else f"NO ({n} vs {len(expected)})",
        "wall_s": run["wall_s"], "per_s": benchlib.ratio(n, run["wall_s"]), "search_s": run.get("search_s"),
        "best_block": bs.shape_text(run["best_block"]) if run.get("best_block") else None,
        "best_own_us": run.get("best_us"),
    }


def ranks(values: Sequence[float]) -> List[float]:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
    """Spearman's rank correlation of two equally long samples (None below 3 points or without spread)."""
    if len(a) != len(b) or len(a) < 3:
        return None
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / (va * vb) ** 0.5 if va > 0 and vb > 0 else None


def per_config_row(kernel: str, mneme: Dict[str, Any], kt: Dict[str, Any]) -> Dict[str, Any]:
    """Both tools' own timings of the configurations both timed: medians against medians."""
    def medians(run):
        return {tuple(c["block"]): benchlib.median(c.get("times_us") or [c["us"]]) for c in run["configs"] if "error" not in c}

    m, k = medians(mneme), medians(kt)
    both = sorted(set(m) & set(k))
    ratios = [m[b] / k[b] for b in both if k[b] > 0]
    return {
        "kernel": kernel, "both": len(both), "ratio_median": benchlib.median(ratios),
        "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
        "spearman": spearman([m[b] for b in both], [k[b] for b in both]),
        "mneme_best": bs.shape_text(min(both, key=lambda b: m[b])) if both else None,
        "kt_best": bs.shape_text(min(both, key=lambda b: k[b])) if both else None,
    }


def verdict(mneme_value: Optional[float], kt_value: Optional[float], higher_is_better: bool) -> str:
    """Which tool the figure favours, in words (within EVEN of each other: even)."""
    if mneme_value is None or kt_value is None or kt_value <= 0:
        return "n/a"
    r = mneme_value / kt_value
    if abs(r - 1.0) <= EVEN:
        return "even"
    return "mneme ahead" if (r > 1.0) == higher_is_better else "Kernel Tuner ahead"


def kernel_summary(kernel: str, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The ratio-line figures of one kernel: throughput and the common-method best times, mneme / KT."""
    by_tool = {r["tool"]: r for r in rows if r.get("kernel") == kernel and "error" not in r}
    m, k = by_tool.get(MNEME), by_tool.get(KT)
    s: Dict[str, Any] = {"kernel": kernel}
    for key in ("per_s", "best_cupy_us", "best_replay_us", "best_own_us"):
        mv, kv = (m or {}).get(key), (k or {}).get(key)
        s[key] = {"mneme": mv, "kt": kv, "ratio": benchlib.ratio(mv, kv),
                  "verdict": verdict(mv, kv, higher_is_better=(key == "per_s"))}
    ka = by_tool.get(KT_ANSWER)
    if m and ka:
        s["per_s_vs_answer"] = {"ratio": benchlib.ratio(m.get("per_s"), ka.get("per_s")),
                                "verdict": verdict(m.get("per_s"), ka.get("per_s"), True)}
    return s


def ratio_line(summaries: List[Dict[str, Any]]) -> str:
    f = benchlib.fmt
    parts = []
    for s in summaries:
        t = s["per_s"]
        b, how = next(((s[k], h) for k, h in COMMON if s[k]["ratio"] is not None), (s[COMMON[0][0]], "common re-measurement"))
        text = f"{s['kernel']}: configs/s mneme / KT {f(t['ratio'], '.2fx')} ({t['verdict']}"
        if s.get("per_s_vs_answer"):
            text += f"; vs KT + answer {f(s['per_s_vs_answer']['ratio'], '.2fx')}"
        text += f"), best time mneme / KT {f(b['ratio'], '.3fx')} ({how}; {b['verdict']})"
        parts.append(text)
    return "; ".join(parts) if parts else "no kernel measured"


def common_row(measured: Dict[str, Any], runs: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """A re-measured block with the tools that found it best."""
    picked = [t for t, r in runs.items() if r.get("best_block") and list(r["best_block"]) == list(measured["block"])]
    return {"block": bs.shape_text(measured["block"]), "picked_by": ", ".join(picked), "us": measured["us"],
            "min_us": measured.get("min_us"), "n": measured.get("n")}


def fill_common(rows: List[Dict[str, Any]], kernel: str, key: str, result: Dict[str, Any]) -> None:
    """Puts a common re-measurement's time of each best block into the rows of the tools that chose it."""
    us = {bs.shape_text(b["block"]): b["us"] for b in result["blocks"]}
    for r in rows:
        if r.get("kernel") == kernel and r.get("best_block") in us:
            r[key] = us[r["best_block"]]


# ---- the run -------------------------------------------------------------------------------------------

def compare_kernel(name: str, root: Path, args, rows: List[Dict[str, Any]], common_rows: List[Dict[str, Any]],
                   raw: Dict[str, Any]) -> None:
    """Record, tune with both tools, re-measure the best blocks; appends the rows (failures as rows)."""
    k = KERNELS[name]
    space = k.quick_space if args.quick else k.space
    expected = bs.enumerate_blocks(bs.space_def(space))
    tools = [MNEME, KT] + ([] if args.no_kt_answer else [KT_ANSWER])
    db: Optional[str] = None
    t0 = time.perf_counter()
    try:
        db = record(k, root)
        check = dict(space_check(db, space, k.problem), record_s=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - mneme's row says why; Kernel Tuner still runs
        db, check = None, benchlib.error_row({}, e, args.verbose)
    runs: Dict[str, Dict[str, Any]] = {}
    for tool in tools:
        def one(tool=tool):
            if tool == MNEME:
                if db is None:
                    raise RuntimeError(f"recording: {check['error']}")
                runs[tool] = run_mneme(db, space, len(expected), root, args)
            else:
                runs[tool] = run_kt(name, space, tool == KT_ANSWER, root, args)
            return tool_row(name, tool, runs[tool], expected)

        rows.append(benchlib.guarded({"kernel": name, "tool": tool}, one, args.verbose))
        print(f"  {name}: {tool} done", file=sys.stderr, flush=True)
    blocks = sorted({tuple(r["best_block"]) for r in runs.values() if r.get("best_block")})
    common: Dict[str, Any] = {}
    spec = {"kernel": name, "space": space, "db": db, "blocks": [list(b) for b in blocks], "seed": args.seed,
            "rounds": args.rounds, "per_round": args.per_round, "warmup": 5}
    for kind, key, method in COMMON_METHODS:
        ident = {"kernel": name, "method": method}
        try:
            if not blocks:
                raise RuntimeError("no tool found a best block")
            if kind == "replay" and db is None:
                raise RuntimeError(f"no recording: {check['error']}")
            common[kind], _ = run_worker({**spec, "kind": kind}, args.timeout, python_env(), args.verbose)
            fill_common(rows, name, key, common[kind])
            common_rows += [{**ident, **common_row(b, runs)} for b in common[kind]["blocks"]]
        except Exception as e:  # noqa: BLE001 - the tools' own figures stand without it
            common[kind] = benchlib.error_row({}, e, args.verbose)
            common_rows.append({**ident, **common[kind]})
    raw[name] = {"space": space, "expected": [list(b) for b in expected], "space_check": check, "runs": runs,
                 "common": common}


def space_check(db: str, space: str, problem: Sequence[int]) -> Dict[str, Any]:
    """mneme's configurations for the recording against Kernel Tuner's: the same blocks with the same grids."""
    from bench.kt_space import BlockSpace
    from mneme.tune.space import SpaceContext
    from mneme.tune.tuner import recorded_baseline
    from mneme.record.db import RecordedExecution

    rec = RecordedExecution.from_json(db)
    inst = rec.instance(None)
    mspace = BlockSpace(SpaceContext(recorded_baseline(db, inst.dynamic_hash), rec, inst), space)
    mine = sorted((tuple(c.block), tuple(c.grid)) for c in mspace.configurations())
    theirs = sorted((b, bs.grid_for(problem, b)) for b in bs.enumerate_blocks(bs.space_def(space)))
    if mine != theirs:
        raise RuntimeError(f"the recorded work {mspace.problem} gives mneme other launches than Kernel Tuner's problem "
                           f"size {tuple(problem)}: {len(mine)} vs {len(theirs)} configurations, first difference "
                           f"{next((a, b) for a, b in zip(mine + [None], theirs + [None]) if a != b)}")
    return {"configurations": len(mine), "problem": list(mspace.problem), "identical": True}


def main(argv: List[str] = None) -> int:
    ap = benchlib.arguments(NAME, __doc__)
    ap.add_argument("--only", default=None, help=f"comma list of kernels (default {','.join(KERNELS)})")
    ap.add_argument("--iterations", type=int, default=10, help="timed iterations per configuration, both tools (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="mneme's warm-up runs per configuration (default 2, its default)")
    ap.add_argument("--compile-jobs", type=int, default=None,
                    help="mneme's compile processes (default: its own, the CPU count)")
    ap.add_argument("--kt-lang", default="auto", help="Kernel Tuner backend: auto (cupy, else nvcuda), cupy, nvcuda")
    ap.add_argument("--no-kt-answer", action="store_true", help="skip the Kernel Tuner row that checks every output")
    ap.add_argument("--rounds", type=int, default=None, help="common re-measurement rounds (default 10; --quick 4)")
    ap.add_argument("--per-round", type=int, default=None, help="launches per block and round (default 20; --quick 10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=None, help="seconds per tool run (default 300; --quick 150)")
    ap.add_argument("--tmp", type=Path, default=None, help="where recordings and results go (default a temporary directory)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.verbose)
    args.rounds = args.rounds or (4 if args.quick else 10)
    args.per_round = args.per_round or (10 if args.quick else 20)
    args.timeout = args.timeout or (150 if args.quick else 300)

    names = args.only.split(",") if args.only else list(KERNELS)
    run = benchlib.Run(NAME, __doc__, args.quick)
    rows: List[Dict[str, Any]] = []
    common_rows: List[Dict[str, Any]] = []
    raw: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mneme-bench-kt-", dir=args.tmp) as tmp:
        for name in names:
            if name not in KERNELS:
                rows.append({"kernel": name, "tool": "-", "error": f"unknown kernel; choose from {', '.join(KERNELS)}"})
                continue
            compare_kernel(name, Path(tmp), args, rows, common_rows, raw)
    per_config = [benchlib.guarded({"kernel": n}, lambda n=n: per_config_row(n, raw[n]["runs"][MNEME], raw[n]["runs"][KT]))
                  for n in names if n in raw and MNEME in raw[n]["runs"] and KT in raw[n]["runs"]]
    iters = f"{args.iterations} timed iterations per configuration"
    run.add(benchlib.table(f"The same block-shape space by brute force, one GPU ({iters})", MAIN_COLUMNS, rows, ident=2))
    run.add(benchlib.table(f"The best blocks re-measured alike ({args.rounds} alternating rounds of {args.per_round})",
                           COMMON_COLUMNS, common_rows or [{"kernel": "-", "method": "-", "error": "nothing to re-measure"}],
                           ident=2))
    run.add(benchlib.table("Per configuration, each tool's own timing (median of its iterations)", PER_CONFIG_COLUMNS,
                           per_config or [{"kernel": "-", "error": "no kernel timed by both tools"}]))
    summaries = [kernel_summary(n, rows) for n in names if n in KERNELS]
    run.summary = {"kernels": summaries, "raw": raw,
                   "settings": {k: v for k, v in vars(args).items() if k not in ("out", "tmp", "worker")}}
    run.ratio = ratio_line(summaries)
    return run.finish(args.out)


if __name__ == "__main__":
    sys.exit(main())
