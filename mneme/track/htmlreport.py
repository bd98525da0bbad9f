"""A sweep's trials as one self-contained HTML page (MLflow previews .html artifacts): a table sortable by any
column, and a parallel-coordinates picture of the knobs that vary against registers and time (inline SVG,
no external scripts or styles, so it renders offline and inside MLflow's artifact viewer)."""

from __future__ import annotations

import html
import math
from typing import List

import pandas as pd

from mneme.track import runs

_SORT_JS = """
document.querySelectorAll('th').forEach(function (th, i) {
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0], rows = Array.from(body.rows), up = th.dataset.up !== '1';
    rows.sort(function (a, b) {
      var x = a.cells[i].dataset.v, y = b.cells[i].dataset.v, nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
      return up ? c : -c;
    });
    th.dataset.up = up ? '1' : '0';
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""


def trial_columns(df: pd.DataFrame, metric: str = "median") -> pd.DataFrame:
    """run, kernel, status, time (µs), speedup, registers, local memory, then the replay knobs that vary."""
    def col(name):
        return df[name] if name in df else pd.Series([None] * len(df), index=df.index)

    out = pd.DataFrame({
        "run": col("run_name"), "kernel": col("params.kernel").fillna(col(runs.KERNEL)) if "params.kernel" in df
        else col(runs.KERNEL), "status": col("tags.mneme.status"),
        f"{metric} (µs)": pd.to_numeric(col(runs.time_column(metric)), errors="coerce") / 1000.0,
        "speedup (x)": pd.to_numeric(col("metrics.speedup"), errors="coerce"),
        "registers": pd.to_numeric(col("metrics.registers"), errors="coerce"),
        "local mem (B)": pd.to_numeric(col("metrics.local_mem_bytes"), errors="coerce"),
        "compile (s)": pd.to_numeric(col("metrics.compile_time_s"), errors="coerce"),
    })
    for c in (c for c in df.columns if c.startswith("params.replay.")):
        if df[c].nunique(dropna=False) > 1:
            out[c[len("params.replay."):]] = df[c]
    return out[[c for c in out.columns if c in ("run", "kernel") or out[c].notna().any()]].reset_index(drop=True)


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return '<td data-v=""></td>'
    if isinstance(v, float):
        text = f"{int(v)}" if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"
        return f'<td data-v="{v}">{text}</td>'
    return f'<td data-v="{html.escape(str(v))}">{html.escape(str(v))}</td>'


def _numeric(s: pd.Series):
    num = pd.to_numeric(s, errors="coerce")
    return num if num.notna().sum() >= max(1, len(s) // 2) else None


def parallel_coordinates_svg(table: pd.DataFrame, width: int = 900, height: int = 320) -> str:
    """One polyline per trial across the numeric columns (knobs, registers, time), darker = faster."""
    skip = {"run", "kernel", "status", "speedup (x)", "compile (s)", "local mem (B)"}
    axes: List[str] = [c for c in table.columns if c not in skip and _numeric(table[c]) is not None]
    time_cols = [c for c in axes if c.endswith("(µs)")]
    axes = [c for c in axes if c not in time_cols] + time_cols  # time last
    if len(axes) < 2 or table.empty:
        return "<p>(too few numeric columns for parallel coordinates)</p>"
    pad, top, bottom = 60, 30, 30
    xs = [pad + i * (width - 2 * pad) / (len(axes) - 1) for i in range(len(axes))]
    scaled = {}
    for c in axes:
        v = _numeric(table[c])
        lo, hi = float(v.min()), float(v.max())
        scaled[c] = ((v - lo) / (hi - lo) if hi > lo else v * 0 + 0.5, lo, hi)
    speed = pd.to_numeric(table.get("speedup (x)"), errors="coerce") if "speedup (x)" in table else None
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="11">']
    for i in range(len(table)):
        pts = []
        for x, c in zip(xs, axes):
            y = scaled[c][0].iloc[i]
            if pd.notna(y):
                pts.append(f"{x:.1f},{top + (1 - y) * (height - top - bottom):.1f}")
        s = speed.iloc[i] if speed is not None else float("nan")
        shade = 0.25 if pd.isna(s) else max(0.1, min(1.0, (float(s) - 0.5)))
        title = html.escape(str(table["run"].iloc[i]))
        parts.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="rgb(31,119,180)" '
                     f'stroke-opacity="{shade:.2f}" stroke-width="1.5"><title>{title}</title></polyline>')
    for x, c in zip(xs, axes):
        _, lo, hi = scaled[c]
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - bottom}" stroke="black"/>')
        parts.append(f'<text x="{x:.1f}" y="{top - 10}" text-anchor="middle">{html.escape(c)}</text>')
        parts.append(f'<text x="{x + 4:.1f}" y="{top + 4}">{hi:.4g}</text>')
        parts.append(f'<text x="{x + 4:.1f}" y="{height - bottom}">{lo:.4g}</text>')
    parts.append("</svg>")
    return "".join(parts)


def report(df: pd.DataFrame, metric: str = "median", title: str = "", note_md: str = "") -> str:
    """The page for the child runs `df` (runs.frame columns) of one sweep."""
    table = trial_columns(df, metric)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in table.itertuples(index=False))
    pcs = "".join(f"<h3>{html.escape(str(k) or 'all runs')}</h3>" + parallel_coordinates_svg(g.reset_index(drop=True))
                  for k, g in table.groupby("kernel", dropna=False, sort=True)) if "kernel" in table else ""
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title or 'sweep')}</title>
<style>body{{font-family:sans-serif;margin:16px}} table{{border-collapse:collapse;font-size:12px}}
th,td{{border:1px solid #ccc;padding:3px 6px;text-align:right}} th{{cursor:pointer;background:#f3f3f3}}
td:first-child,td:nth-child(2),td:nth-child(3){{text-align:left}} pre{{background:#f8f8f8;padding:8px}}</style>
</head><body><h2>{html.escape(title or 'sweep')}</h2><pre>{html.escape(note_md)}</pre>
<h3>parallel coordinates (one line per trial, darker = faster; hover for the run)</h3>{pcs}
<h3>trials (click a heading to sort)</h3><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<script>{_SORT_JS}</script></body></html>
"""
