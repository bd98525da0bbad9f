"""The results directory of a study, written from the Optuna storage alone.

    config.json     the tuning options and the record they searched
    space.json      the search space (dimensions, domains, launch candidates)
    baseline.json   the recorded configuration compiled as the app was built (or mneme's defaults), its result and code
    trials.jsonl    one line per trial: number, state, status, params, configuration, values, result
    verified.csv    verified trials sorted by time (compiled.csv, by the objective, without a GPU)
    best.json/.yaml the best configuration, its result, speedup and spread
    best.sh         the `mneme replay` command line that reproduces it
    best.md         what to change in the app's build to get it
    wisdom.yaml     the best configuration as a wisdom file, for `mneme apply` (docs/APPLY.md)
    summary.json/.txt  counts per status, baseline, best
"""

from __future__ import annotations

import json
import math
import os
import shlex
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from mneme.config import KNOB_DEFAULTS, ExperimentConfiguration, ExperimentResult
from mneme.tune.attribution import A_ATTRIBUTION, attribution_text
from mneme.tune.codechange import code_change, code_change_text
from mneme.tune.failures import failures
from mneme.tune.objective import Objective, metric_ns, succeeded
from mneme.tune.study import (
    A_BANNED, A_BASELINE, A_FINGERPRINTS, A_OPTIONS, A_RECORD, A_SPACE, T_RESULT, claim, flag,
)


@dataclass
class TrialRow:
    number: int
    state: str
    status: str
    flag: str
    params: Dict[str, Any]
    config: Optional[ExperimentConfiguration]
    config_hash: str
    result: Optional[ExperimentResult]
    values: Optional[List[float]]
    duplicate_of: Optional[int] = None
    owner: str = ""
    reasons: List[str] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        return {
            "number": self.number, "state": self.state, "status": self.status, "flag": self.flag,
            "params": self.params, "config": self.config.to_dict() if self.config else None,
            "config_hash": self.config_hash, "values": self.values, "duplicate_of": self.duplicate_of,
            "owner": self.owner, "reasons": self.reasons,
            "result": self.result.to_dict() if self.result else None,
        }


def row_of(trial) -> TrialRow:
    c = claim(trial)
    raw = dict(trial.user_attrs.get(T_RESULT) or {})
    duplicate_of = raw.pop("duplicate_of", None)
    reasons = list(raw.pop("reasons", []) or [])
    result = ExperimentResult.from_dict(raw) if "exec_time" in raw else None  # rejected samples carry no result
    status = raw.get("status") or ("running" if trial.state.name == "RUNNING" else trial.state.name.lower())
    config = ExperimentConfiguration.from_dict(c["config"]) if c.get("config") else None
    return TrialRow(
        number=trial.number, state=trial.state.name, status=status, flag=flag(trial), params=dict(trial.params),
        config=config, config_hash=c.get("config_hash", ""), result=result,
        values=list(trial.values) if trial.values is not None else None, duplicate_of=duplicate_of,
        owner=c.get("owner", ""), reasons=reasons,
    )


@dataclass
class StudyReport:
    name: str
    meta: Dict[str, Any]
    rows: List[TrialRow]
    objective: Objective
    baseline_config: Optional[ExperimentConfiguration]
    baseline_result: Optional[ExperimentResult]
    baseline_ns: Optional[float]
    #: which code the baseline compiled (mneme.ir.appbuild.Baseline.to_dict); None for older studies
    baseline_code: Optional[Dict[str, Any]] = None

    @property
    def options(self) -> Dict[str, Any]:
        return self.meta.get("options") or {}

    @property
    def counted(self) -> List[TrialRow]:
        return [r for r in self.rows if r.flag not in ("rejected", "surplus", "retried") and r.state != "WAITING"]

    def successes(self) -> List[TrialRow]:
        return [r for r in self.counted if succeeded(r.result, self.objective.device_less)]

    def rank_key(self, r: TrialRow):
        if self.objective.device_less:
            v = r.values[0] if r.values else math.inf
            return (v, r.number)
        return (metric_ns(r.result.exec_time, self.objective.metric), r.number)

    def best(self) -> Optional[TrialRow]:
        ok = self.successes()
        return min(ok, key=self.rank_key) if ok else None


def load_report(study) -> StudyReport:
    attrs = study.user_attrs
    opts = attrs.get(A_OPTIONS) or {}
    objective = Objective.of(opts.get("objective", "time"), opts.get("metric", "median"), opts.get("sampler", "tpe"))
    base = attrs.get(A_BASELINE) or {}
    bconf = ExperimentConfiguration.from_dict(base["config"]) if base.get("config") else None
    bres = ExperimentResult.from_dict(base["result"]) if base.get("result") else None
    meta = {
        "study": study.study_name, "options": opts, "record": attrs.get(A_RECORD) or {}, "space": attrs.get(A_SPACE) or {},
        "fingerprints": attrs.get(A_FINGERPRINTS) or {}, "banned": attrs.get(A_BANNED) or [],
        "attribution": attrs.get(A_ATTRIBUTION), "launch_analysis": (attrs.get(A_SPACE) or {}).get("launch_analysis"),
        "directions": [d.name.lower() for d in study.directions],
    }
    rows = [row_of(t) for t in study.get_trials(deepcopy=False)]
    return StudyReport(study.study_name, meta, rows, objective, bconf, bres, base.get("metric_ns"), base.get("code"))


# -- the best configuration, three ways ------------------------------------------------------------
def replay_command(record_db: str, record_id: Optional[str], config: ExperimentConfiguration,
                   iterations: Optional[int] = None, warmup: Optional[int] = None) -> str:
    """A ready `mneme replay` command line for a configuration."""
    c = config.grounded()
    argv = ["mneme", "replay", "-rdb", os.path.abspath(str(record_db))]  # best.sh runs from anywhere
    if record_id:
        argv += ["-rid", str(record_id)]
    for name, d in (("grid", c.grid), ("block", c.block)):
        for axis, v in zip("xyz", d):
            argv += [f"--{name}-dim-{axis}", str(v)]
    argv += ["--shared-mem", str(c.shared_mem)]
    argv.append("--specialize" if c.specialize else "--no-specialize")
    if c.specialize_dims:
        argv.append("--specialize-dims")
    if c.set_launch_bounds:
        argv += ["--set-launch-bounds", "--max-threads", str(c.max_threads), "--min-blocks-per-sm", str(c.min_blocks_per_sm)]
    argv += ["--codegen-opt", str(c.codegen_opt), "--codegen-method", c.codegen_method]
    argv += knob_flags(c)
    if iterations:
        argv += ["--iterations", str(iterations)]
    if warmup is not None:
        argv += ["--warmup", str(warmup)]
    if not c.internalize:
        argv.append("--no-internalize")
    argv += ["--baseline", "mneme-defaults"]  # the flags above are absolute: set against mneme's defaults
    argv.append(c.passes)
    return " ".join(shlex.quote(a) for a in argv)


def knob_flags(c: ExperimentConfiguration) -> List[str]:
    """`mneme replay` flags for the code knobs that differ from their defaults."""
    from mneme.config import KNOB_DEFAULTS

    out: List[str] = []
    for name, default in KNOB_DEFAULTS.items():
        v = getattr(c, name)
        if v == default:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            out.append(flag if v else "--no-" + name.replace("_", "-"))
        else:
            out += [flag, str(v)]
    return out


#: how to get each code knob in an application's own build (clang / nvcc)
KNOB_BUILD = {
    "unroll": lambda v: ("`#pragma unroll 1` on the kernel's loops (no unrolling)" if v == 1 else
                         f"`#pragma unroll {v}` on the kernel's loops"),
    "inline_threshold": lambda v: f"clang `-Xarch_device -mllvm -Xarch_device -inline-threshold={v}`",
    "vectorize": lambda v: "clang `-Xarch_device -fno-vectorize -Xarch_device -fno-slp-vectorize`",
    "fma": lambda v: "`-ffp-contract=off` (clang) / `--fmad=false` (nvcc)",
    "fast_math": lambda v: "`-ffast-math -fcuda-flush-denormals-to-zero` (clang) / `--use_fast_math` (nvcc)",
    "ptxas_opt": lambda v: f"`-Xcuda-ptxas -O{v}` (clang) / `-Xptxas -O{v}` (nvcc)",
    "max_regs": lambda v: f"`-maxrregcount={v}` (nvcc) / `-Xcuda-ptxas --maxrregcount={v}` (clang)",
    "dlcm": lambda v: f"`-Xptxas -dlcm={v}` (nvcc) / `-Xcuda-ptxas -dlcm={v}` (clang)",
    "expensive_opts": lambda v: "`-Xptxas --allow-expensive-optimizations=true`",
    "whole_program": lambda v: ("whole-program device code: drop `-rdc=true` (nvcc) / `-fgpu-rdc` (clang), or add "
                                "`-dlto`" if v else "relocatable device code: `-rdc=true` (nvcc) / `-fgpu-rdc` (clang)"),
    "prec_div": lambda v: ("`--prec-div=true` (nvcc) / no `-nvptx-prec-divf32=0` (clang)" if v else
                           "`--prec-div=false` (nvcc) / `-Xarch_device -mllvm -Xarch_device -nvptx-prec-divf32=0` (clang)"),
    "contract_all": lambda v: ("`-ffp-contract=fast` (clang's CUDA default) / `--fmad=true` (nvcc)" if v else
                               "`-ffp-contract=on` (clang)"),
    "cross_unit_inline": lambda v: ("`-dlto` (nvcc) / `-foffload-lto` (clang): device code linked as one module" if v
                                    else "separate compilation: `-rdc=true` without `-dlto`"),
    "prec_sqrt": lambda v: ("`--prec-sqrt=true` (nvcc) / `-Xarch_device -mllvm -Xarch_device "
                            "-nvvm-reflect-add=__CUDA_PREC_SQRT=1` (clang)" if v else "`--prec-sqrt=false` (nvcc)"),
}


def build_changes(config: ExperimentConfiguration, baseline: Optional[ExperimentConfiguration],
                  kernel: str = "the kernel", arch: str = "sm_90", spec_args: Optional[List[str]] = None) -> List[str]:
    """What to change in the application's build or launch code to get `config` there."""
    c = config.grounded()
    b = baseline.grounded() if baseline else ExperimentConfiguration()
    out: List[str] = []
    if (c.block.to_dict(), c.grid.to_dict()) != (b.block.to_dict(), b.grid.to_dict()):
        out.append(
            f"Launch {kernel} with blocks of dim3({c.block.x}, {c.block.y}, {c.block.z}) (was dim3({b.block.x}, "
            f"{b.block.y}, {b.block.z})) and a grid that covers the same work, ceil(work / block) per dimension: "
            f"dim3({c.grid.x}, {c.grid.y}, {c.grid.z}) for the recorded problem size (was dim3({b.grid.x}, "
            f"{b.grid.y}, {b.grid.z}))."
        )
    if c.shared_mem != b.shared_mem:
        out.append(f"Pass {c.shared_mem} bytes of dynamic shared memory at launch (was {b.shared_mem}).")
    if c.set_launch_bounds:
        out.append(f"Declare the kernel with __launch_bounds__({c.max_threads}, {c.min_blocks_per_sm}): "
                   f"`__global__ void __launch_bounds__({c.max_threads}, {c.min_blocks_per_sm}) {kernel}(...)`.")
    if c.specialize:
        which = f" ({', '.join(spec_args)})" if spec_args else ""
        out.append(f"Make the scalar arguments{which} compile-time constants with their recorded values "
                   "(template parameters or constexpr), so the compiler folds them.")
    if c.specialize_dims:
        out.append("Make the launch dimensions compile-time constants (e.g. the block size as a template "
                   "parameter used instead of blockDim), so bounds and index math fold.")
    if c.passes != b.passes:
        if c.passes.startswith("default<O") and c.passes.endswith(">"):
            level = c.passes[len("default<O"):-1]
            out.append(f"Optimize the device code at -O{level} instead of the {b.passes} pipeline "
                       f"(clang: `-Xarch_device -O{level}`).")
        else:
            out.append(
                "Optimize the device IR with the pass pipeline "
                f"'{c.passes}': emit device bitcode (`clang++ -x cuda --cuda-device-only -emit-llvm -O3 -Xclang "
                f"-disable-llvm-optzns`), run `opt -passes='{c.passes}'`, then `llc -O{c.codegen_opt} -mcpu={arch}` "
                "and assemble with ptxas."
            )
    if c.codegen_opt != b.codegen_opt:
        out.append(f"Generate machine code at optimization level {c.codegen_opt} (was {b.codegen_opt}): "
                   f"`-Xcuda-ptxas -O{c.codegen_opt}` (and llc -O{c.codegen_opt} for a custom pipeline).")
    from mneme.config import KNOB_DEFAULTS

    for name, default in KNOB_DEFAULTS.items():
        v = getattr(c, name)
        if v != getattr(b, name):  # also a knob set back to mneme's default that the app's build had changed
            out.append(f"Compile with {KNOB_BUILD[name](v)} ({name}={v!r}).")
    if not out:
        out.append("Nothing: the recorded configuration is the best one found.")
    return out


def _quantiles(values: List[float]) -> Dict[str, float]:
    s = sorted(values)
    if len(s) == 1:
        return {"min": s[0], "p25": s[0], "median": s[0], "p75": s[0], "max": s[0]}
    q = statistics.quantiles(s, n=4, method="inclusive")
    return {"min": s[0], "p25": q[0], "median": q[1], "p75": q[2], "max": s[-1]}


def time_stats(times: List[float]) -> Dict[str, float]:
    if not times:
        return {}
    out = _quantiles([float(t) for t in times])
    out["mean"] = float(statistics.fmean(times))
    out["std"] = float(statistics.pstdev(times)) if len(times) > 1 else 0.0
    return out


def speedup_spread(baseline_ns: Optional[float], times: List[float]) -> Dict[str, float]:
    """The baseline metric divided by each timed iteration: how much the speedup moves between iterations."""
    if not baseline_ns or not times:
        return {}
    return _quantiles([baseline_ns / float(t) for t in times if t > 0])


# -- writing ------------------------------------------------------------------------------------------
def verified_table(rep: StudyReport):
    import pandas as pd

    rows = []
    for r in rep.successes():
        res, c = r.result, r.config or ExperimentConfiguration()
        t = res.exec_time
        rows.append({
            "number": r.number, "status": r.status,
            f"{rep.objective.metric}_ns": metric_ns(t, rep.objective.metric) if t else None,
            "mean_ns": metric_ns(t, "mean") if t else None, "median_ns": metric_ns(t, "median") if t else None,
            "min_ns": metric_ns(t, "min") if t else None,
            "speedup": (rep.baseline_ns / metric_ns(t, rep.objective.metric)) if (t and rep.baseline_ns) else None,
            "block": f"{c.block.x}x{c.block.y}x{c.block.z}", "grid": f"{c.grid.x}x{c.grid.y}x{c.grid.z}",
            "shared_mem": c.shared_mem, "passes": c.passes, "codegen_opt": c.codegen_opt,
            "specialize": c.specialize, "specialize_dims": c.specialize_dims,
            "set_launch_bounds": c.set_launch_bounds, "max_threads": c.max_threads,
            "min_blocks_per_sm": c.min_blocks_per_sm, "registers": res.reg_usage, "local_mem": res.local_mem_usage,
            "spill_stores": res.spill_stores, "spill_loads": res.spill_loads, "obj_size": res.obj_size,
            "ptx_instructions": res.ptx_instructions, "same_binary_as": res.same_binary_as or None,
            **{k: getattr(c, k) for k in KNOB_DEFAULTS},
            "gpu_id": res.gpu_id, "duplicate_of": r.duplicate_of, "config_hash": r.config_hash,
            "value": r.values[0] if r.values else None,
        })
    df = pd.DataFrame(rows)
    if not df.empty:
        key = "value" if rep.objective.device_less else f"{rep.objective.metric}_ns"
        df = df.sort_values([key, "number"], kind="stable").reset_index(drop=True)
    return df


def summarize(rep: StudyReport) -> Dict[str, Any]:
    counted = rep.counted
    by_status: Dict[str, int] = {}
    for r in counted:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    flags = {f: sum(1 for r in rep.rows if r.flag == f) for f in ("rejected", "surplus", "retried")}
    opts = rep.options
    summary: Dict[str, Any] = {
        "study": rep.name, "kernel": rep.meta["record"].get("demangled") or rep.meta["record"].get("kernel"),
        "record_db": opts.get("record_db"),
        "record_id": rep.meta["record"].get("dynamic_hash") or opts.get("record_id"),
        "space": rep.meta["space"].get("name"), "sampler": opts.get("sampler"),
        **rep.objective.describe(),
        "trials": {
            "requested": opts.get("trials"), "counted": len(counted), "succeeded": len(rep.successes()),
            "by_status": by_status, "duplicates": sum(1 for r in counted if r.duplicate_of is not None), **flags,
            "same_binary": sum(1 for r in counted if r.result is not None and r.result.same_binary_as),
            "verified_fraction": (sum(1 for r in counted if r.status == "verified") / len(counted)) if counted else None,
        },
        "failures": failures(rep.counted),
        "banned_shapes": rep.meta.get("banned", []),
        "launch_rules": ((rep.meta.get("launch_analysis") or {}).get("rules") or {}).get("lines"),
        "attribution": rep.meta.get("attribution"),
        "baseline": None, "best": None,
    }
    if rep.baseline_config is not None:
        summary["baseline"] = {
            "config": rep.baseline_config.to_dict(), "status": rep.baseline_result.status if rep.baseline_result else None,
            "metric_ns": rep.baseline_ns, "times": time_stats(rep.baseline_result.exec_time) if rep.baseline_result else {},
            "registers": rep.baseline_result.reg_usage if rep.baseline_result else None,
            "code": rep.baseline_code,
        }
    best = rep.best()
    if best is not None:
        res = best.result
        t = metric_ns(res.exec_time, rep.objective.metric) if res.exec_time else None
        summary["best"] = {
            "number": best.number, "config": best.config.to_dict() if best.config else None,
            "config_hash": best.config_hash, "status": best.status, "values": best.values, "metric_ns": t,
            "speedup": (rep.baseline_ns / t) if (t and rep.baseline_ns) else None,
            "speedup_spread": speedup_spread(rep.baseline_ns, res.exec_time),
            "times": time_stats(res.exec_time), "registers": res.reg_usage, "spills": res.spill_stores + res.spill_loads,
            "obj_size": res.obj_size, "gpu_id": res.gpu_id, "gpu_name": res.gpu_name,
            "code_change": code_change(rep.baseline_result, res),
        }
    if rep.objective.multi:
        summary["pareto"] = pareto(rep)
    if opts.get("derived"):
        from mneme.tune import derived

        try:
            summary["derived"] = derived.for_results(
                opts["derived"], opts.get("record_db"), summary["record_id"],
                {"baseline": rep.baseline_result, "best": best.result if best is not None else None}, rep.objective.metric)
        except Exception as e:  # noqa: BLE001 - the results directory must not fail on a derived metric
            summary["derived_error"] = f"{type(e).__name__}: {e}"
    return summary


def pareto(rep: StudyReport) -> List[Dict[str, Any]]:
    """Non-dominated successful trials (all objectives as Optuna was told them)."""
    pts = [r for r in rep.successes() if r.values]
    signs = [1 if d == "minimize" else -1 for d in rep.objective.directions]

    def dominated(a: TrialRow) -> bool:
        av = [s * v for s, v in zip(signs, a.values)]
        for b in pts:
            bv = [s * v for s, v in zip(signs, b.values)]
            if all(x <= y for x, y in zip(bv, av)) and any(x < y for x, y in zip(bv, av)):
                return True
        return False

    return [{"number": r.number, "values": r.values, "config_hash": r.config_hash}
            for r in sorted(pts, key=lambda r: r.values) if not dominated(r)]


def _fmt_ns(v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f} us" if v >= 1000 else f"{v:.0f} ns"


def summary_text(summary: Dict[str, Any]) -> str:
    tr = summary["trials"]
    lines = [
        f"study {summary['study']}: {summary.get('kernel')} ({summary.get('space')} space, {summary.get('sampler')} "
        f"sampler, objective {summary['objective']}/{summary['metric']})",
        f"trials: {tr['counted']} of {tr['requested']} counted, {tr['succeeded']} succeeded; "
        + ", ".join(f"{k} {v}" for k, v in sorted(tr["by_status"].items()))
        + (f"; {tr['duplicates']} answered from an earlier identical trial" if tr["duplicates"] else "")
        + (f"; {tr['rejected']} samples rejected by constraints (no GPU time)" if tr["rejected"] else "")
        + (f"; {tr['same_binary']} reused the run of an identical binary" if tr.get("same_binary") else ""),
    ]
    for f in (summary.get("failures") or {}).get("reasons", [])[:5]:
        lines.append(f"  {f['count']} x {f['status']}: {f['reason']}")
    b = summary.get("baseline")
    if b:
        lines.append(f"baseline (recorded launch, {b['config']['passes']}): {b['status']}, {_fmt_ns(b['metric_ns'])}")
        code = b.get("code") or {}
        lines.append(f"baseline code: {code.get('description') or 'mneme-defaults (the study predates recorded builds)'}")
    best = summary.get("best")
    if best:
        sp = best.get("speedup")
        spread = best.get("speedup_spread") or {}
        sp_text = (f"{sp:.3f}x over the baseline (per-iteration spread {spread['min']:.3f}-{spread['max']:.3f}x, "
                   f"IQR {spread['p25']:.3f}-{spread['p75']:.3f}x)") if sp and spread else ""
        lines.append(f"best: trial {best['number']}, {_fmt_ns(best['metric_ns'])}, {best['registers']} registers "
                     f"{sp_text}".rstrip())
        if best.get("code_change"):
            lines.append(f"best's code against the baseline: {code_change_text(best['code_change'])}")
        if summary.get("attribution"):
            lines.append(attribution_text(summary["attribution"]))
    else:
        lines.append("best: none (no trial succeeded)")
    if summary.get("derived"):
        from mneme.tune.derived import text

        lines.append(text(summary["derived"]))
    elif summary.get("derived_error"):
        lines.append(f"derived metrics: not computed ({summary['derived_error']})")
    if summary.get("banned_shapes"):
        lines.append(f"banned block shapes (failed to launch, killed the CUDA context or answered wrongly): {', '.join(summary['banned_shapes'])}")
    return "\n".join(lines)


def write_results(study, out_dir: str) -> Dict[str, Any]:
    """Write the results directory from the storage; returns the summary (with 'files')."""
    import yaml

    rep = load_report(study)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def dump(name: str, obj: Any) -> Path:
        p = out / name
        p.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
        return p

    files = [
        dump("config.json", {"study": rep.name, "options": rep.options, "record": rep.meta["record"],
                             "fingerprints": rep.meta["fingerprints"], "directions": rep.meta["directions"]}),
        dump("space.json", rep.meta["space"]),
        dump("baseline.json", {
            "config": rep.baseline_config.to_dict() if rep.baseline_config else None,
            "result": rep.baseline_result.to_dict() if rep.baseline_result else None, "metric_ns": rep.baseline_ns,
            "code": rep.baseline_code,
        }),
    ]
    p = out / "trials.jsonl"
    with open(p, "w") as fd:
        for r in rep.rows:
            row = r.to_json()
            row["code_change"] = code_change(rep.baseline_result, r.result)
            fd.write(json.dumps(row, sort_keys=True, default=str) + "\n")
    files.append(p)
    table = verified_table(rep)
    p = out / ("compiled.csv" if rep.objective.device_less else "verified.csv")
    table.to_csv(p, index=False)
    files.append(p)

    summary = summarize(rep)
    best = rep.best()
    for stale in ("best.json", "best.yaml", "best.sh", "best.md", "wisdom.yaml"):
        (out / stale).unlink(missing_ok=True)
    if best is not None and best.config is not None:
        opts = rep.options
        rec = rep.meta["record"]
        cmd = replay_command(opts.get("record_db", "REC.json"), rec.get("dynamic_hash") or opts.get("record_id"),
                             best.config, opts.get("iterations"), opts.get("warmup"))
        kernel = (rec.get("demangled") or rec.get("kernel") or "the kernel").split("(")[0]
        changes = build_changes(best.config, rep.baseline_config, kernel,
                                opts.get("arch") or rec.get("arch") or "sm_90", rec.get("specializable_args"))
        doc = {"config": best.config.to_dict(), "config_hash": best.config_hash, "trial": best.number,
               "speedup": summary["best"]["speedup"], "speedup_spread": summary["best"]["speedup_spread"],
               "metric": rep.objective.metric, "metric_ns": summary["best"]["metric_ns"],
               "baseline_ns": rep.baseline_ns, "replay_command": cmd, "build_changes": changes,
               "result": best.result.to_dict()}
        files.append(dump("best.json", doc))
        p = out / "best.yaml"
        p.write_text(yaml.safe_dump({k: doc[k] for k in doc if k != "result"}, sort_keys=False))
        files.append(p)
        p = out / "best.sh"
        p.write_text(f"#!/bin/sh\n# best configuration of study {rep.name} (trial {best.number})\n{cmd}\n")
        p.chmod(0o755)
        files.append(p)
        p = out / "best.md"
        sp = summary["best"]["speedup"]
        head = f"# Best configuration: trial {best.number}" + (f", {sp:.3f}x over the baseline" if sp else "")
        p.write_text(head + "\n\nTo get it in the application:\n\n" + "".join(f"- {c}\n" for c in changes)
                     + f"\nReplay it:\n\n    {cmd}\n")
        files.append(p)
        files.append(_write_wisdom(out))
        summary["best"]["replay_command"] = cmd
        summary["best"]["build_changes"] = changes
    text = summary_text(summary)
    (out / "summary.txt").write_text(text + "\n")
    files.append(out / "summary.txt")
    summary["out_dir"] = str(out)
    summary["files"] = [str(f) for f in files] + [str(out / "summary.json")]
    dump("summary.json", summary)
    summary["text"] = text
    return summary


def _write_wisdom(out: Path) -> Path:
    """wisdom.yaml from config.json and best.json (the schema lives with `mneme apply`; it imports only config)."""
    from mneme.apply.wisdom import WISDOM_NAME, from_tune_results, write_wisdom

    return write_wisdom(from_tune_results(out), out / WISDOM_NAME)
