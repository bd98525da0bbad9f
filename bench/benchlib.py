"""What every bench script shares: the run's header (date, GPU, driver, commit), tables that print the
same way on a terminal and in docs/BENCHMARKS.md, rows that fail alone, and the one JSON results file.

A results file holds everything report.py needs to rebuild the tables without the script:

    {"bench": NAME, "header": {...}, "method": TEXT, "tables": [{"title", "columns", "rows"}],
     "summary": {...}, "anchors": [...], "ratio": LINE}

`columns` are [key, heading, format] triples; a row with an "error" key keeps its identifying values
and shows the error instead of its numbers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MISSING = "-"


# ---- the header -------------------------------------------------------------------------------

def _run(argv: Sequence[str], timeout: float = 20) -> Optional[str]:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def git_commit() -> str:
    """MNEME_COMMIT (set from the bundle on the GPU machine, which has no .git), else git's HEAD."""
    env = os.environ.get("MNEME_COMMIT", "").strip()
    if env and env != "unknown":
        return env
    head = _run(["git", "rev-parse", "--short=12", "HEAD"])
    if not head:
        return "unknown"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return head + ("-dirty" if dirty else "")


def parse_nvidia_smi(text: str) -> List[Dict[str, str]]:
    """`nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader` -> one dict per GPU."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0]:
            gpus.append({"name": parts[0], "driver": parts[1], "memory": parts[2] if len(parts) > 2 else ""})
    return gpus


def gpu_info() -> List[Dict[str, str]]:
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    return parse_nvidia_smi(out or "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def header(name: str, quick: bool = False, argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    gpus = gpu_info()
    return {
        "bench": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "gpu": gpus[0]["name"] if gpus else "none",
        "driver": gpus[0]["driver"] if gpus else "",
        "gpus": gpus,
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "quick": bool(quick),
        "argv": list(argv if argv is not None else sys.argv),
    }


# ---- numbers ----------------------------------------------------------------------------------

def median(values: Iterable[float]) -> Optional[float]:
    vals = [float(v) for v in values if v is not None]
    return statistics.median(vals) if vals else None


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    """num / den, or None when either is unknown or den is not positive."""
    if num is None or den is None or not den > 0:
        return None
    return float(num) / float(den)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def fmt(value: Any, spec: str = "") -> str:
    """A table cell: None -> '-', numbers through `spec` ('.2f', ',d', '.1%'; 'x' suffix = ratio with x)."""
    if value is None or value == "":
        return MISSING
    if spec.endswith("x") and isinstance(value, (int, float)):
        return format(value, spec[:-1]) + "x"
    if spec and isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return format(value, spec)
        except ValueError:
            return str(value)
    return str(value)


# ---- tables -----------------------------------------------------------------------------------

def table(title: str, columns: Sequence[Sequence[str]], rows: List[Dict[str, Any]], ident: int = 1) -> Dict[str, Any]:
    """A table: `columns` of [key, heading, format]; the first `ident` columns identify a row (they stay
    visible when the row failed)."""
    return {"title": title, "columns": [list(c) + [""] * (3 - len(c)) for c in columns], "rows": rows, "ident": ident}


def _cells(tab: Dict[str, Any], row: Dict[str, Any], width_hint: Optional[int] = None) -> List[str]:
    cols = tab["columns"]
    ident = tab.get("ident", 1)
    if "error" in row:
        cells = [fmt(row.get(k), f) for k, _, f in cols[:ident]]
        msg = " ".join(str(row["error"]).split())
        if width_hint:
            msg = msg[:width_hint]
        return cells + [f"ERROR: {msg}"] + [""] * (len(cols) - ident - 1)
    return [fmt(row.get(k), f) for k, _, f in cols]


def render_text(tab: Dict[str, Any]) -> str:
    """The table for a terminal: aligned columns; a failed row's error runs past the columns."""
    cols = tab["columns"]
    heads = [h for _, h, _ in cols]
    ident = tab.get("ident", 1)
    cells = [_cells(tab, r) for r in tab["rows"]]
    widths = [max([len(h)] + [len(c[i]) for c, r in zip(cells, tab["rows"]) if i < ident or "error" not in r])
              for i, h in enumerate(heads)]

    def line(cells: List[str]) -> str:
        return "  ".join(c.ljust(widths[i]) if i < ident else c.rjust(widths[i]) for i, c in enumerate(cells)).rstrip()

    out = [tab["title"], line(heads), "-" * len(line(heads))]
    for r in tab["rows"]:
        cells = _cells(tab, r, 300)
        if "error" in r:
            out.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(cells[:ident])) + "  " + cells[ident])
        else:
            out.append(line(cells))
    return "\n".join(out)


def md_text(text: str) -> str:
    """Markdown-safe prose: angle brackets outside `code` escaped (default<O3> is no HTML tag)."""
    parts = str(text).split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def render_markdown(tab: Dict[str, Any]) -> str:
    cols = tab["columns"]
    ident = tab.get("ident", 1)
    out = [f"**{md_text(tab['title'])}**", "", "| " + " | ".join(md_text(h) for _, h, _ in cols) + " |",
           "|" + "|".join("---" if i < ident else "---:" for i in range(len(cols))) + "|"]
    for r in tab["rows"]:
        cells = [md_text(c).replace("|", "\\|") for c in _cells(tab, r, 200)]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


# ---- rows that fail alone ---------------------------------------------------------------------

def error_row(ident: Dict[str, Any], exc: BaseException, verbose: bool = False) -> Dict[str, Any]:
    """`ident` with the error in place of the numbers."""
    if verbose:
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    msg = str(exc).strip() or repr(exc)
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    return {**ident, "error": f"{type(exc).__name__}: {msg}", **({"where": where} if where else {})}


def guarded(ident: Dict[str, Any], fn: Callable[[], Dict[str, Any]], verbose: bool = False) -> Dict[str, Any]:
    """fn()'s row merged over `ident`, or `ident` with the error when fn raises (the script goes on)."""
    try:
        return {**ident, **fn()}
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - a failing row must never end the benchmark
        return error_row(ident, e, verbose)


# ---- the run ----------------------------------------------------------------------------------

def arguments(name: str, doc: str) -> argparse.ArgumentParser:
    """The flags every bench script has: --quick and --out."""
    ap = argparse.ArgumentParser(prog=f"bench/bench_{name}.py", description=doc.split("\n\n")[0],
                                 epilog=doc.split("\n\n", 1)[1] if "\n\n" in doc else None,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="bounded run (about 30-60 s) for a time-limited GPU call")
    ap.add_argument("--out", type=Path, default=RESULTS / f"{name}.json",
                    help=f"results JSON (default bench/results/{name}.json)")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of failing rows")
    return ap


def method_of(doc: str) -> str:
    """The docstring without its command-line section: the method paragraphs report.py prints."""
    return doc.split("\nUsage:")[0].strip()


class Run:
    """One bench run: its header, tables, summary and the closing ratio line."""

    def __init__(self, name: str, doc: str, quick: bool):
        self.name = name
        self.doc = doc
        self.header = header(name, quick)
        self.tables: List[Dict[str, Any]] = []
        self.summary: Dict[str, Any] = {}
        self.anchors: List[Dict[str, Any]] = []
        self.ratio = ""
        self.t0 = time.perf_counter()

    def add(self, tab: Dict[str, Any]) -> Dict[str, Any]:
        self.tables.append(tab)
        return tab

    def anchor(self, name: str, measured: Optional[float], anchor: float, unit: str, source: str) -> None:
        """A published or physical figure the measurement is held against."""
        self.anchors.append({"name": name, "measured": measured, "anchor": anchor, "unit": unit,
                             "ratio": ratio(measured, anchor), "source": source})

    def to_dict(self) -> Dict[str, Any]:
        return {"bench": self.name, "header": self.header, "method": method_of(self.doc), "tables": self.tables,
                "summary": self.summary, "anchors": self.anchors, "ratio": self.ratio,
                "wall_s": round(time.perf_counter() - self.t0, 2)}

    def finish(self, out: Path) -> int:
        """Prints the tables and the ratio line, writes the results; 1 when a row failed (all still shown)."""
        h = self.header
        print(f"# {self.name}: {h['gpu']} (driver {h['driver'] or '-'}), commit {h['commit']}, {h['date']}"
              + (" [quick]" if h["quick"] else ""))
        for tab in self.tables:
            print()
            print(render_text(tab))
        if self.anchors:
            print()
            for a in self.anchors:
                print(f"anchor: {a['name']}: measured {fmt(a['measured'], '.4g')} {a['unit']} vs "
                      f"{fmt(a['anchor'], '.4g')} {a['unit']} ({a['source']}) = {fmt(a['ratio'], '.3f')}")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(self.to_dict(), indent=1, default=str) + "\n")
            where = f"results: {out}"
        except OSError as e:
            where = f"results NOT written to {out}: {e}"
        failed = self.failed_rows()
        print()
        print(where + (f"; {failed} row(s) FAILED" if failed else ""))
        print(f"ratio: {self.ratio}", flush=True)
        return 1 if failed else 0

    def failed_rows(self) -> int:
        return sum(1 for t in self.tables for r in t["rows"] if "error" in r)


if __name__ == "__main__":
    # `python bench/benchlib.py header NAME`: the header alone (scripts/bench.sh keeps one per part)
    if len(sys.argv) >= 2 and sys.argv[1] == "header":
        print(json.dumps(header(sys.argv[2] if len(sys.argv) > 2 else "machine"), indent=1))
    else:
        sys.exit("usage: python bench/benchlib.py header [NAME]")
