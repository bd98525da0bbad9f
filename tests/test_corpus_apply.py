"""The corpus campaign's apply stage on the CPU (bench/corpus/applystage.py): which tune results it applies,
the real `mneme apply` run on a pack app through libapply and the stand-in driver (tests/data/fakecuda, as in
tests/test_apply_native.py), the success check per applied run, and the merge and render of its rows."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.corpus import applystage, build, gpu, merge, render, stage  # noqa: E402
from bench.corpus.apps import App  # noqa: E402
from test_apply_native import N, fake, tuned  # noqa: E402,F401  (the stand-in driver and a tuned fixture)


def results_dir(root: Path, name: str, speedup) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "best.json").write_text(json.dumps({"speedup": speedup, "config": {}}))
    return d


def test_only_kernels_tuned_to_the_bar_are_applied(tmp_path):
    fast = results_dir(tmp_path / "tune", "aaaa", 1.2)
    results_dir(tmp_path / "tune", "bbbb", 1.01)
    results_dir(tmp_path / "tune" / "nested", "cccc", None)
    picked, short = applystage.tuned_dirs(tmp_path / "tune")
    assert picked == [(fast, 1.2)]
    assert sorted(short) == ["bbbb: best 1.010x", "cccc: no speedup"]
    assert applystage.tuned_dirs(tmp_path / "none") == ([], [])


def pack(tmp_path, fake_dir, success="app done"):
    exe = tmp_path / "pack" / "bin" / "fakeapp" / "fakeapp"
    exe.parent.mkdir(parents=True)
    exe.write_bytes((fake_dir / "app").read_bytes())
    exe.chmod(0o755)
    entry = {**App("fakeapp", ".", "true", "fakeapp", f"64 256 {N}", success).to_dict(), "exe": "bin/fakeapp/fakeapp"}
    (tmp_path / "pack" / "manifest.json").write_text(json.dumps({"commit": "abc", "apps": [entry]}))
    ctx = gpu.Ctx(build.read_manifest(tmp_path / "pack"), tmp_path / "pack", tmp_path / "work", app_timeout=30)
    return ctx, App.from_dict(entry)


def test_a_program_without_a_fast_enough_tune_gets_a_note(tmp_path, fake):
    ctx, app = pack(tmp_path, fake)
    row = applystage.apply_app(app, stage.Budget(600), ctx, gpu.mneme())
    assert row == {"apply": None, "apply_note": "no tune results in the work folder (run the tune stage first, "
                                                "on this machine)"}
    results_dir(ctx.work / "fakeapp" / "tune", "aaaa", 1.02)
    row = applystage.apply_app(app, stage.Budget(600), ctx, gpu.mneme())
    assert row["apply"] is None and row["apply_note"] == "no kernel tuned to >= 1.05x (aaaa: best 1.020x)"


@pytest.fixture
def stand_in_driver(fake, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake))
    monkeypatch.setenv("MNEME_LIBAPPLY", str(fake / "libapply.so"))
    return fake


def tuned_copy(tuned, work: Path, speedup: float) -> Path:
    """The tune of the vecadd fixture (compile-only) as the tune stage leaves it, with a measured speedup."""
    import shutil

    d = work / "fakeapp" / "tune" / "0123456789abcdef"
    shutil.copytree(tuned, d)
    best = json.loads((d / "best.json").read_text())
    (d / "best.json").write_text(json.dumps({**best, "speedup": speedup}))
    return d


def test_the_stage_runs_mneme_apply_and_checks_every_applied_run(tmp_path, stand_in_driver, tuned):
    ctx, app = pack(tmp_path, stand_in_driver)
    d = tuned_copy(tuned, ctx.work, 1.2)
    row = applystage.apply_app(app, stage.Budget(600), ctx, gpu.mneme(), rounds=2)
    ap = row["apply"]
    assert ap is not None, row
    assert ap["app_ok"] and ap["app_ok_observed"] and ap["kernels_applied"] == 1 and ap["wall_speedup"] > 0
    (k,) = ap["kernels"]
    assert k["predicted"] == pytest.approx(1.2) and k["realized"] == pytest.approx(1.0)  # the stand-in times 4 us
    assert k["matched"] == 2 and k["applied"] == 2 and k["gain_ratio"] == pytest.approx(0.0)
    assert row["apply_tuned"] == [str(d)] and any(line.startswith("apply vecAdd:") for line in row["apply_lines"])
    # the corpus's success pattern is looked for in each applied run's own output
    ctx2, app2 = pack(tmp_path / "other", stand_in_driver, success="never printed")
    tuned_copy(tuned, ctx2.work, 1.2)
    row = applystage.apply_app(app2, stage.Budget(600), ctx2, gpu.mneme(), rounds=1)
    assert row["apply"]["app_ok"] is False and row["apply"]["app_ok_observed"] is False and "apply_log" in row


def test_split_runs_ends_the_last_run_at_the_report():
    out = ("mneme apply: [observe run 1] ./a\nok A\nmneme apply: [apply run 1] ./a\nok B\n"
           "apply vecAdd: exact instance ...\napply wall: 1 s -> 1 s\n")
    runs = applystage.split_runs(out, {"entries": [{"demangled": "vecAdd(float const*)"}]})
    assert runs == {("observe", 1): "ok A\n", ("apply", 1): "ok B\n"}


def test_merge_and_render_show_the_apply_table():
    base = {"commit": "c1", "gpu": "NVIDIA H200", "driver": "580"}
    res = [{**base, "stage": "apply", "date": "2026-12-03T10:00:00", "apps": {
        "A": {"apply": {"kernels_applied": 1, "app_ok": True, "wall_speedup": 1.01,
                        "kernels": [{"kernel": "k(float*)", "predicted": 1.2, "realized": 1.19, "gain_ratio": 0.95}]}},
        "B": {"apply": None, "apply_note": "no kernel tuned to >= 1.05x (x: best 1.010x)"}}}]
    doc = merge.merge(None, res, ["A", "B"])
    a, b = doc["apps"]
    assert a["apply"]["kernels"][0]["realized"] == 1.19 and b["apply"] is None and "1.010x" in b["apply_note"]
    assert "apply: 1 programs, 1 kernels applied, app ok 1/1, realized/predicted gain median 0.95" in doc["summary"]
    md = render.render(doc)
    assert "## Apply" in md and "| A | 1 | yes | 1.010x | k | 1.200x | 1.190x | 95% |" in md
    assert "| B | - | - | - | no kernel tuned to &gt;= 1.05x (x: best 1.010x) | - | - | - |" in md


def test_the_cli_knows_the_apply_stage(tmp_path):
    import subprocess

    p = subprocess.run([sys.executable, "-m", "bench.corpus", "apply", "--help"], cwd=ROOT, capture_output=True,
                       text=True, env={**os.environ})
    assert p.returncode == 0 and "--apply-rounds" in p.stdout and "--apply-min-speedup" in p.stdout


def test_the_benchmarks_apply_table_from_evidence_and_corpus(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    import apply_table

    ev = tmp_path / "apply-evidence.jsonl"
    ev.write_text(json.dumps({"test": "stencil2d", "apply": {"kernels_applied": 1, "app_ok": True, "wall_speedup": 1.02,
                                                             "kernels": [{"kernel": "stencil2d(float const*)",
                                                                          "predicted": 1.12, "realized": 1.11}]},
                              "lines": []}) + "\n"
                  # a tuned config predicted at no gain: no share (the H200 run once showed -38116 %)
                  + json.dumps({"test": "devcounter", "apply": {"kernels_applied": 1, "app_ok": True,
                                                               "wall_speedup": 1.0,
                                                               "kernels": [{"kernel": "countAbove(int const*)",
                                                                            "predicted": 0.999, "realized": 1.219}]},
                                "lines": []}) + "\n")
    doc = {"apps": [{"name": "lavaMD", "apply": {"kernels_applied": 1, "app_ok": False, "wall_speedup": None,
                                                 "kernels": [{"kernel": "kernel_gpu_cuda", "predicted": 1.3,
                                                              "realized": 1.15}]}},
                    {"name": "other", "apply": None}]}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        apply_table.main(["--evidence", str(ev), "--corpus", str(tmp_path / "c.json")])
    md = buf.getvalue()
    assert "| stencil2d | stencil2d | examples | 1.120x | 1.110x | 92% | yes | 1.020x |" in md
    assert "| lavaMD | kernel_gpu_cuda | corpus | 1.300x | 1.150x | 50% | **no** | - |" in md
    assert "| devcounter | countAbove | examples | 0.999x | 1.219x | - | yes | 1.000x |" in md
    assert md.strip().endswith("apply: 3 kernels applied in 3 programs, app ok 2/3, gain share median 71%, "
                               "1 of 2 predicted >= 1.05x realize >= 90 % of the gain")
