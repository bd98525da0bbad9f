"""The corpus campaign's apply stage on the H200, end to end on two example apps packed as a corpus would be:
reduce at a timing size (its tune finds well over 1.05x) and vecadd (a kernel with little to gain). One `gpu`
chain runs record, replay, tune and apply; the apply row carries predicted and realized per kernel, the app's
success check passed on every applied run, and merge renders the Apply table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_corpus_gpu import _pack

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu


def test_corpus_apply_stage_on_examples(tmp_path):
    out = tmp_path / "results"
    pack = _pack(tmp_path, (("reduce", str(1 << 24)), ("vecadd", str(1 << 24))))
    p = subprocess.run([sys.executable, "-m", "bench.corpus", "gpu", "--stages", "record,replay,tune,apply",
                        "--pack", str(pack), "--work", str(tmp_path / "work"), "--out", str(out),
                        "--trials", "20", "--budget", "420", "--apply-rounds", "2", "--apply-min-speedup", "1.0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=480)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = {json.loads(f.read_text())["stage"]: json.loads(f.read_text()) for f in out.glob("*.json")}
    assert set(res) == {"record", "replay", "tune", "apply"}, p.stdout[-3000:]
    tune = res["tune"]["apps"]["reduce"]["tune"][0]
    assert tune["best_speedup"], tune
    row = res["apply"]["apps"]["reduce"]
    ap = row["apply"]
    assert ap is not None, row
    assert ap["app_ok"] and ap["app_ok_observed"] and ap["kernels_applied"] == 1, row
    (k,) = ap["kernels"]
    assert k["predicted"] == pytest.approx(tune["best_speedup"]) and k["realized"] and k["realized"] > 0, k
    assert k["applied"] == k["matched"] >= 2 and k["fell_back"] == 0, k
    print(json.dumps(row.get("apply_lines")))
    doc_json, doc_md = tmp_path / "corpus.json", tmp_path / "CORPUS.md"
    m = subprocess.run([sys.executable, "-m", "bench.corpus", "merge", str(out), "--json", str(doc_json), "--md",
                        str(doc_md)], cwd=ROOT, capture_output=True, text=True)
    assert m.returncode == 0, m.stderr
    assert "apply: " in m.stdout and "## Apply" in doc_md.read_text()
