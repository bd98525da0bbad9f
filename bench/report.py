"""Turns bench results (the JSON files the bench scripts write) into the markdown of docs/BENCHMARKS.md:
a header table (date, GPU, driver, commit of every run), then per benchmark its method, tables, anchors
and ratio line, exactly as measured.

    python bench/report.py                         # bench/results/*.json -> stdout
    python bench/report.py DIR... --out FILE.md    # several result directories (later ones win per bench)

The tuning-throughput script writes a plain list of rows (--json); its header comes from `machine.json`
(written by scripts/bench.sh next to the results) and its ratio line from `tune_throughput.log`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ORDER = ["record", "compile", "replay", "tune_throughput", "track_corpus", "best_speedup", "kernel_tuner", "multi_gpu"]
TITLES = {
    "record": "Record overhead (`bench/bench_record.py`)",
    "compile": "Compile time per stage (`bench/bench_compile.py`)",
    "replay": "Replay fidelity and reset cost (`bench/bench_replay.py`)",
    "tune_throughput": "Tuning throughput (`bench/bench_tune_throughput.py`)",
    "track_corpus": "Tracking on / off on corpus kernels (`bench/bench_track_corpus.py`)",
    "best_speedup": "Best speedup found per example (`bench/bench_best_speedup.py`)",
    "multi_gpu": "Multi-GPU scaling (`bench/bench_multi_gpu.py`)",
    "kernel_tuner": "Side by side with Kernel Tuner (`bench/bench_kernel_tuner.py`)",
}
TUNE_COLUMNS = [
    ["mode", "mode"], ["preset", "preset"], ["jobs", "jobs", "d"], ["configs", "configs", "d"],
    ["distinct", "distinct", "d"], ["wall_s", "wall s", ".2f"], ["finish_s", "of it finish s", ".2f"],
    ["per_s", "configs/s", ".1f"],
    ["compiles", "compiles", "d"], ["cache_hit_rate", "cache hit", ".1%"], ["best_speedup", "best x", ".3f"],
    ["statuses", "statuses"],
]
TUNE_METHOD = ("Configurations per second on one GPU: the AsyncReplayExecutor fed configurations drawn from "
               "the `launch` and `compiler` presets with 1, 4 and 16 compile processes, each compiled (or found "
               "in the cache), verified and timed; see the script's docstring.")


def load(dirs: List[Path]) -> Dict[str, Dict[str, Any]]:
    """Results by bench name; later directories override earlier ones."""
    out: Dict[str, Dict[str, Any]] = {}
    for d in dirs:
        machine = _read(d / "machine.json")
        for f in sorted(d.glob("*.json")):
            if f.name == "machine.json":
                continue
            doc = _read(f)
            if isinstance(doc, dict) and "bench" in doc and "tables" in doc:
                out[doc["bench"]] = doc
            elif isinstance(doc, list):
                out[f.stem] = legacy(f.stem, doc, machine, f.with_suffix(".log"))
    return out


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def last_ratio(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text().splitlines() if ln.startswith("ratio:")]
    except OSError:
        return ""
    return lines[-1][len("ratio:"):].strip() if lines else ""


def legacy(name: str, rows: List[Dict[str, Any]], machine: Optional[Dict[str, Any]], log: Path) -> Dict[str, Any]:
    """A results file that is a bare list of rows (bench_tune_throughput.py --json) in the common form."""
    rows = [dict(r, statuses=", ".join(f"{k} {v}" for k, v in sorted((r.get("statuses") or {}).items())))
            if isinstance(r.get("statuses"), dict) else r for r in rows]
    head = dict(machine or {}, bench=name)
    return {"bench": name, "header": head, "method": TUNE_METHOD if name == "tune_throughput" else "",
            "tables": [benchlib.table("Configurations per second", TUNE_COLUMNS, rows, ident=3)],
            "summary": {}, "anchors": [], "ratio": last_ratio(log)}


def header_table(results: Dict[str, Dict[str, Any]]) -> str:
    rows = []
    for name in ordered(results):
        h = results[name].get("header") or {}
        rows.append({"bench": name, "date": h.get("date"), "gpu": h.get("gpu"), "driver": h.get("driver"),
                     "commit": h.get("commit"), "quick": "yes" if h.get("quick") else "no",
                     "wall_s": results[name].get("wall_s")})
    cols = [["bench", "benchmark"], ["date", "date (UTC)"], ["gpu", "GPU"], ["driver", "driver"], ["commit", "commit"],
            ["quick", "--quick"], ["wall_s", "wall s", ".0f"]]
    return benchlib.render_markdown(benchlib.table("Runs", cols, rows))


def ordered(results: Dict[str, Any]) -> List[str]:
    return [n for n in ORDER if n in results] + sorted(n for n in results if n not in ORDER)


def anchors_md(anchors: List[Dict[str, Any]]) -> str:
    cols = [["name", "figure"], ["measured", "measured", ".4g"], ["anchor", "anchor", ".4g"], ["unit", "unit"],
            ["ratio", "measured / anchor", ".3f"], ["source", "source"]]
    return benchlib.render_markdown(benchlib.table("Against the anchors", cols, anchors))


def section(doc: Dict[str, Any]) -> str:
    name = doc["bench"]
    h = doc.get("header") or {}
    out = [f"## {TITLES.get(name, name)}", ""]
    argv = " ".join(h.get("argv") or [])
    out.append(f"{h.get('date', '?')} on {h.get('gpu', '?')} (driver {h.get('driver') or '-'}), commit "
               f"`{h.get('commit', '?')}`" + (f", `{argv}`" if argv else "") + ".")
    out.append("")
    if doc.get("method"):
        out += [benchlib.md_text(doc["method"]), ""]
    for tab in doc.get("tables", []):
        out += [benchlib.render_markdown(tab), ""]
    if doc.get("anchors"):
        out += [anchors_md(doc["anchors"]), ""]
    if doc.get("ratio"):
        out += [f"Ratio: {benchlib.md_text(doc['ratio'])}", ""]
    return "\n".join(out)


def render(results: Dict[str, Dict[str, Any]]) -> str:
    if not results:
        return "No bench results found.\n"
    parts = ["# Benchmark results (generated by `python bench/report.py`)", "", header_table(results), ""]
    parts += [section(results[n]) for n in ordered(results)]
    return "\n".join(parts).rstrip() + "\n"


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="*", type=Path, default=[benchlib.RESULTS], help="result directories")
    ap.add_argument("--out", type=Path, default=None, help="write the markdown here (default stdout)")
    args = ap.parse_args(argv)
    text = render(load(args.dirs))
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
