"""The `apply` section of docs/BENCHMARKS.md from the H200 runs of `mneme apply` (issue 18): one row per applied
kernel, predicted (the tune's replay speedup) beside realized (the app's in-app original / tuned median, the
recorder's timer, observed and applied runs side by side in one call), then the summary line.

    python bench/apply_table.py --evidence .gpu/apply-evidence.jsonl --corpus docs/corpus.json

--evidence: the lines tests/gpu/test_apply_gpu.py appends (examples); --corpus: docs/corpus.json after the
campaign's apply stage (bench/corpus/applystage.py). Either may be given alone, or several times.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

HEAD = ("| program | kernel | source | predicted | realized | gain share | app ok | wall speedup |\n"
        "|---|---|---|---:|---:|---:|---|---:|")


def short(name: str, width: int = 60) -> str:
    """A kernel's name cut to `width` characters (CUB's template names run to several hundred)."""
    return name if len(name) <= width else name[:width - 3] + "..."


def rows_of(program: str, source: str, apply: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [{"program": program, "source": source, "kernel": short((k.get("kernel") or "-").split("(")[0]),
             "predicted": k.get("predicted"), "realized": k.get("realized"),
             "gain": gain(k.get("predicted"), k.get("realized")), "app_ok": apply.get("app_ok"),
             "wall": apply.get("wall_speedup")} for k in apply.get("kernels") or []]


def gain(predicted: Optional[float], realized: Optional[float]) -> Optional[float]:
    """The share of the predicted gain the app saw (mneme apply's own definition)."""
    from mneme.apply.evidence import gain_ratio

    return gain_ratio(predicted, realized)


def from_evidence(lines: Iterable[str]) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    for line in lines:
        if line.strip():
            e = json.loads(line)
            out += rows_of(e["test"], "examples (tests/gpu/test_apply_gpu.py)", e["apply"])
    return out


def from_corpus(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [r for a in doc.get("apps", []) if a.get("apply") for r in rows_of(a["name"], "corpus", a["apply"])]


def _f(v: Optional[float], spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def render(rows: List[Dict[str, Any]]) -> str:
    lines = [HEAD]
    for r in rows:
        lines.append(f"| {r['program']} | {r['kernel']} | {r['source'].split(' ')[0]} | {_f(r['predicted'], '.3f', 'x')} | "
                     f"{_f(r['realized'], '.3f', 'x')} | {_f(r['gain'], '.0%')} | "
                     f"{'-' if r['app_ok'] is None else ('yes' if r['app_ok'] else '**no**')} | {_f(r['wall'], '.3f', 'x')} |")
    return "\n".join(lines) + "\n\n" + summary(rows) + "\n"


def summary(rows: List[Dict[str, Any]]) -> str:
    """The closing line: kernels applied, apps ok, the gain share's median and how many reach 90 %."""
    programs = {r["program"] for r in rows}
    ok = {r["program"] for r in rows if r["app_ok"]}
    bar = [r for r in rows if r["predicted"] is not None and r["predicted"] >= 1.05]
    gains = [r["gain"] for r in bar if r["gain"] is not None]
    med = f", gain share median {statistics.median(gains):.0%}" if gains else ""
    return (f"apply: {len(rows)} kernels applied in {len(programs)} programs, app ok {len(ok)}/{len(programs)}"
            f"{med}, {sum(1 for g in gains if g >= 0.9)} of {len(bar)} predicted >= 1.05x realize >= 90 % of the gain")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evidence", action="append", type=Path, default=[], help="apply-evidence.jsonl (repeatable)")
    ap.add_argument("--corpus", action="append", type=Path, default=[], help="docs/corpus.json (repeatable)")
    args = ap.parse_args(argv)
    rows: List[Dict[str, Any]] = []
    for p in args.evidence:
        rows += from_evidence(p.read_text().splitlines())
    for p in args.corpus:
        rows += from_corpus(json.loads(p.read_text()))
    print(render(rows), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
