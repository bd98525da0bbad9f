"""The bench scripts' parts that need no GPU: tables, ratios, results files, the report, and the whole
compile benchmark on the committed fixtures. (The GPU runs happen through scripts/bench.sh.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import bench_compile  # noqa: E402
import bench_record  # noqa: E402
import bench_replay  # noqa: E402
import bench_tune_throughput  # noqa: E402
import benchlib  # noqa: E402
import report  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
MANYLAUNCH_DB = next((FIXTURES / "manylaunch").glob("*.json"))


# ---- benchlib ------------------------------------------------------------------------------------

def test_cells_format_missing_values_ratios_and_percentages():
    assert benchlib.fmt(None, ".2f") == "-"
    assert benchlib.fmt(1.23456, ".2fx") == "1.23x"
    assert benchlib.fmt(0.256, ".1%") == "25.6%"
    assert benchlib.fmt(1234567, ",d") == "1,234,567"
    assert benchlib.fmt("O3", ".2f") == "O3"
    assert benchlib.ratio(3.0, 2.0) == 1.5
    assert benchlib.ratio(3.0, 0.0) is None and benchlib.ratio(None, 2.0) is None


def test_nvidia_smi_lines_become_gpus():
    gpus = benchlib.parse_nvidia_smi("NVIDIA H200, 580.159.04, 143771 MiB\nNVIDIA H200, 580.159.04, 143771 MiB\n")
    assert len(gpus) == 2 and gpus[0] == {"name": "NVIDIA H200", "driver": "580.159.04", "memory": "143771 MiB"}
    assert benchlib.parse_nvidia_smi("") == []


def test_the_commit_comes_from_mneme_commit_when_set(monkeypatch):
    monkeypatch.setenv("MNEME_COMMIT", "abc123")
    assert benchlib.git_commit() == "abc123"
    assert benchlib.header("x")["commit"] == "abc123"


def test_a_failing_row_keeps_its_identity_and_shows_the_error():
    def boom():
        raise ValueError("the kernel | fell over")

    bad = benchlib.guarded({"example": "vecadd", "kernel": "vecAdd"}, boom)
    good = benchlib.guarded({"example": "stencil2d", "kernel": "stencil"}, lambda: {"t": 1.5})
    assert bad.pop("where").startswith("test_bench.py:")  # where it was raised, kept in the results JSON
    assert bad == {"example": "vecadd", "kernel": "vecAdd", "error": "ValueError: the kernel | fell over"}
    tab = benchlib.table("T <O3>", [["example", "example"], ["kernel", "kernel"], ["t", "t ms", ".2f"]], [bad, good], ident=2)
    text = benchlib.render_text(tab).splitlines()
    assert text[0] == "T <O3>"
    assert text[3].startswith("vecadd") and "ERROR: ValueError: the kernel | fell over" in text[3]
    assert text[4].split() == ["stencil2d", "stencil", "1.50"]
    md = benchlib.render_markdown(tab).splitlines()
    assert md[0] == "**T &lt;O3&gt;**"
    assert md[4] == "| vecadd | vecAdd | ERROR: ValueError: the kernel \\| fell over |"
    assert md[5] == "| stencil2d | stencil | 1.50 |"


def test_markdown_escapes_angle_brackets_outside_code_only():
    assert benchlib.md_text("default<O3> and `default<O0>`") == "default&lt;O3&gt; and `default<O0>`"


def test_a_run_writes_its_results_and_ends_with_one_ratio_line(tmp_path, capsys):
    run = benchlib.Run("demo", "Demo.\n\nMethod text.\n\nUsage: nothing", quick=True)
    run.add(benchlib.table("rows", [["k", "key"], ["v", "value", ".1f"]], [{"k": "a", "v": 2.0}]))
    run.ratio = "a / b = 2.0"
    assert run.finish(tmp_path / "r" / "demo.json") == 0
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1] == "ratio: a / b = 2.0" and sum(line.startswith("ratio:") for line in out) == 1
    doc = json.loads((tmp_path / "r" / "demo.json").read_text())
    assert doc["bench"] == "demo" and doc["header"]["quick"] is True
    assert doc["method"] == "Demo.\n\nMethod text." and doc["tables"][0]["rows"] == [{"k": "a", "v": 2.0}]
    run.add(benchlib.table("bad", [["k", "key"]], [{"k": "b", "error": "x"}]))
    assert run.finish(tmp_path / "demo2.json") == 1


# ---- bench_compile (runs for real: no GPU needed) -----------------------------------------------------

def test_stage_rows_total_the_per_configuration_stages_without_link():
    row = bench_compile.stage_row({"link": [0.002], "specialize": [0.001, 0.003], "optimize": [0.004],
                                   "ptx": [0.002], "cubin": [0.012]}, 16, 4096)
    assert row["specialize_ms"] == pytest.approx(2.0) and row["config_ms"] == pytest.approx(20.0)
    assert row["cubin_share"] == pytest.approx(0.6) and row["regs"] == 16
    s = bench_compile.summarize([{"variant": "O3", **row}, {"variant": "O3+spec", **row},
                                 {"variant": "*", "error": "boom"}])
    assert s["kernels"] == 1 and s["failed_rows"] == 1 and s["budget_ratio"] == pytest.approx(2.0)
    line = bench_compile.ratio_line(s)
    assert "= 2.00" in line and ">= 2 compile jobs" in line and "cubin 60%" in line


def test_compile_benchmark_measures_every_stage_of_a_fixture_kernel(tmp_path, capsys):
    out = tmp_path / "compile.json"
    rc = bench_compile.main(["--reps", "1", "--record-dir", str(FIXTURES / "vecadd"),
                             "--record-dir", str(FIXTURES / "manylaunch"), "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    doc = json.loads(out.read_text())
    rows = doc["tables"][0]["rows"]
    assert {(r["example"], r["kernel"], r["variant"]) for r in rows} == {
        ("vecadd", "vecAdd", "O3"), ("vecadd", "vecAdd", "O3+spec"),
        ("manylaunch", "scaleAdd", "O3"), ("manylaunch", "scaleAdd", "O3+spec")}
    for r in rows:
        assert all(r[f"{s}_ms"] > 0 for s in bench_compile.STAGES), r
        assert r["cubin_bytes"] > 0 and r["regs"] > 0
    assert text.rstrip().splitlines()[-1].startswith("ratio: per-configuration compile")
    assert doc["summary"]["kernels"] == 2


# ---- bench_record (the pure parts; the runs need a GPU) --------------------------------------------------

def test_snapshot_bytes_of_the_recorded_many_launch_fixture():
    rows = bench_record.snapshot_rows(str(MANYLAUNCH_DB))
    assert [r["grid"] for r in rows] == ["(4,1,1)", "(8,1,1)", "(16,1,1)"]
    for r in rows:
        assert r["raw_bytes"] == 2 * r["state_bytes"] > 0
        assert 0 < r["stored_bytes"] <= r["on_disk"]
        assert r["stored_vs_raw"] == pytest.approx(r["stored_bytes"] / r["raw_bytes"])
    total = bench_record.total_row(rows)
    assert total["state_bytes"] == sum(r["state_bytes"] for r in rows)
    assert total["stored_vs_raw"] == pytest.approx(sum(r["stored_bytes"] for r in rows) / (2 * total["state_bytes"]))
    assert bench_record.total_row([{"instance": "?", "error": "x"}])["stored_vs_raw"] is None


def test_record_modes_and_bandwidth_ratios():
    plain = bench_record.mode_row("plain", [{"wall": 1.0, "checksum": "1e3"}, {"wall": 3.0, "checksum": "1e3"},
                                            {"wall": 2.0, "checksum": "1e3"}], None, None)
    assert plain["app_s"] == 2.0 and plain["vs_plain"] is None and plain["runs"] == 3
    rec = bench_record.mode_row("recorded, retime 0", [{"wall": 3.0, "checksum": "1e3", "post": 0.5, "instances": 4,
                                                        "launches": 800}], 2.0, "1e3")
    assert rec["vs_plain"] == 1.5 and rec["checksum_same"] == "yes" and rec["instances"] == 4
    assert bench_record.mode_row("x", [{"wall": 1.0, "checksum": "2e3"}], 2.0, "1e3")["checksum_same"] == "NO"
    assert bench_record.checksum("hello\nchecksum=1.5000000000e+06\n") == "1.5000000000e+06"
    bw = bench_record.bandwidth_rows(2_000_000_000, 1.0, 1 << 30, {"d2h": (1 << 30) / 10e9, "h2d": (1 << 30) / 20e9})
    assert bw[0]["gb_s"] == pytest.approx(2.0) and bw[0]["vs_d2h"] == pytest.approx(0.2)
    assert bw[1]["gb_s"] == pytest.approx(10.0) and bw[2]["vs_d2h"] == pytest.approx(2.0)
    failed = bench_record.bandwidth_rows(None, None, 1 << 30, {"what": "copies", "error": "no GPU"})
    assert failed[1]["error"] == "no GPU" and failed[0]["gb_s"] is None
    total = bench_record.total_row(bench_record.snapshot_rows(str(MANYLAUNCH_DB)))
    line = bench_record.ratio_line({"plain": plain, "recorded, retime 0": rec}, total, bw)
    assert line.startswith("app wall recorded (retime 0) / plain = 1.50x") and "snapshot throughput / D2H = 0.20" in line


# ---- bench_replay (the pure parts; the worker's GPU half fails cleanly here) ------------------------

def _raw(example, bytes_written, reset_s, fid=1.01, in_app=50_000, d2d=None):
    return {"example": example, "kernel": f"k_{example}", "instance": "0123456789abcdef", "grid": "(1,1,1)",
            "block": "(256,1,1)", "in_app_ns": in_app, "replay_ns": in_app * fid, "fidelity": fid,
            "status": "verified", "copies": 1, "bytes": bytes_written, "reset_s": reset_s, "empty_s": 10e-6,
            "d2d": d2d or {}}


def test_replay_fidelity_reset_and_bandwidth_summaries():
    big = _raw("vecadd", 64 << 20, 10e-6 + 64e-6, fid=1.02,
               d2d={"copies": 3, "bytes": 3 * (64 << 20), "seconds": 10e-6 + 192e-6, "empty_seconds": 10e-6})
    raws = [big, _raw("matmul", 4 << 20, 14e-6, fid=0.95), _raw("reduce", 4, 11e-6, fid=1.5, in_app=5_000),
            {"example": "stencil2d", "kernel": "*", "instance": "*", "error": "record failed"}]
    d2d = bench_replay.best_d2d(raws)
    assert d2d["example"] == "vecadd" and d2d["copy_b_s"] == pytest.approx(float(1 << 20) * 1e6)
    assert d2d["rw_gb_s"] == pytest.approx(2 * (1 << 20) * 1e6 / 1e9)
    fid = [bench_replay.fidelity_row(r) for r in raws]
    assert fid[0]["timed"] == "yes" and fid[2]["timed"] == "no" and fid[0]["instance"] == "01234567"
    assert fid[3]["error"] == "record failed"
    resets = [bench_replay.reset_row(r, d2d["copy_b_s"]) for r in raws]
    assert resets[0]["net_us"] == pytest.approx(64.0) and resets[0]["ideal_us"] == pytest.approx(64.0)
    assert resets[0]["net_vs_ideal"] == pytest.approx(1.0) and "error" in resets[3]
    s = bench_replay.summarize(fid, resets, d2d)
    assert s["timed"] == 2 and s["failed"] == 1 and s["fidelity_median"] == pytest.approx(0.985)
    assert s["fidelity_worst"] == 0.95 and s["fidelity_worst_kernel"] == "matmul/k_matmul"
    assert s["within_goal"] == 1 and s["goal_met"] is True
    assert s["reset_largest"]["example"] == "vecadd"
    line = bench_replay.ratio_line(s)
    assert line.startswith("replay / in-app median fidelity 0.985 over 2 instances >= 20 us (worst 0.950")
    assert "goal median within +-3%: met" in line and "reset net / ideal 1.00 at 64.0 MiB" in line
    none = bench_replay.summarize([fid[3]], [resets[3]], None)
    assert "no verified instance" in bench_replay.ratio_line(none) and none["goal_met"] is False


def test_replay_worker_reports_each_instance_and_survives_a_machine_without_gpu():
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_replay.py"), "--worker", str(FIXTURES / "vecadd"),
                        "--iterations", "2", "--reset-reps", "2"], capture_output=True, text=True, timeout=120)
    rows = bench_replay.parse_worker(p.stdout)
    assert p.returncode == 0 and len(rows) == 1, p.stdout + p.stderr
    assert rows[0]["kernel"] == "vecAdd"
    if os.environ.get("MNEME_GPU_TESTS") != "1":
        assert "error" in rows[0]


# ---- report and bench.sh --------------------------------------------------------------------------------

def test_report_renders_results_and_the_tune_rows(tmp_path):
    run = benchlib.Run("replay", "Replay.\n\nDefault<O3> method.", quick=False)
    run.add(benchlib.table("fidelity", [["k", "kernel"], ["f", "replay / in-app", ".3f"]], [{"k": "vecAdd", "f": 1.004}]))
    run.anchor("d2d", 4.1e12, 4.3e12, "B/s", "anchor")
    run.ratio = "fidelity 1.004"
    (tmp_path / "replay.json").write_text(json.dumps(run.to_dict()))
    (tmp_path / "machine.json").write_text(json.dumps(benchlib.header("machine")))
    (tmp_path / "tune_throughput.json").write_text(json.dumps([
        {"mode": "executor", "preset": "launch", "jobs": 16, "configs": 300, "distinct": 280, "wall_s": 2.5,
         "per_s": 120.0, "compiles": 200, "cache_hit_rate": 0.3, "best_speedup": 1.2, "statuses": {"verified": 300}},
        {"mode": "tune+mlflow", "preset": "launch", "jobs": 16, "configs": 1000, "distinct": 7, "wall_s": 3.0,
         "finish_s": 0.25, "per_s": 333.3, "compiles": 1, "cache_hit_rate": 0.875, "best_speedup": 1.1,
         "statuses": {"verified": 1000}},
        {"mode": "mneme tune", "preset": "launch", "jobs": 16, "configs": 200, "error": "exit 1"}]))
    (tmp_path / "tune_throughput.log").write_text("...\nratio: 120.0 configs/s\n")
    md = report.render(report.load([tmp_path]))
    assert md.startswith("# Benchmark results")
    assert md.index("## Replay fidelity") < md.index("## Tuning throughput")
    assert "| vecAdd | 1.004 |" in md and "Default&lt;O3&gt; method." in md
    assert "| executor | launch | 16 | 300 | 280 | 2.50 | - | 120.0 | 200 | 30.0% | 1.200 | verified 300 |" in md
    assert "| tune+mlflow | launch | 16 | 1000 | 7 | 3.00 | 0.25 | 333.3 | 1 | 87.5% | 1.100 | verified 1000 |" in md
    assert "| mneme tune | launch | 16 | ERROR: exit 1 |" in md
    assert "Ratio: 120.0 configs/s" in md and "Ratio: fidelity 1.004" in md
    assert "| d2d | 4.1e+12 | 4.3e+12 | B/s | 0.953 | anchor |" in md


def test_bench_sh_rejects_an_unknown_part_and_reports_existing_results(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    p = subprocess.run(["bash", str(ROOT / "scripts" / "bench.sh"), "nonsense"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 2 and "unknown part" in p.stdout
    run = benchlib.Run("compile", "Compile.", quick=True)
    run.ratio = "x"
    (tmp_path / "compile.json").write_text(json.dumps(run.to_dict()))
    p = subprocess.run(["bash", str(ROOT / "scripts" / "bench.sh"), "report"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "## Compile time per stage" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "machine.json").read_text())["bench"] == "machine"


def test_best_speedup_without_a_gpu_fails_its_row_and_says_so(tmp_path):
    import shutil

    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU machine records for real (tests/gpu covers mneme tune there)")
    out = tmp_path / "best.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_best_speedup.py"), "--only", "vecadd", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 1  # a failed row is a failed run
    assert p.stdout.rstrip().splitlines()[-1] == "ratio: best / baseline speedup: no instance tuned (see the errors above)"
    rows = json.loads(out.read_text())["tables"][0]["rows"]
    assert rows[0]["example"] == "vecadd" and "no NVIDIA driver" in rows[0]["error"]


def test_multi_gpu_bench_without_a_gpu_stops_at_the_recording_naming_why(tmp_path):
    import shutil

    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU machine records for real")
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_multi_gpu.py"), "--out", str(tmp_path / "m.json")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode != 0
    # a clean clone has no example binaries; a dev machine that built them has no driver
    assert ("examples/bin/vecadd is missing: build the examples" in p.stderr
            or ("mneme record failed" in p.stderr and "no NVIDIA driver" in p.stderr)), p.stderr


def test_tracking_pairs_are_read_in_abba_order():
    """The per-pair tracked / untracked ratios pair each run with its neighbour, whichever mode came first."""
    def row(mode, per_s, preset="launch"):
        return {"mode": mode, "preset": preset, "per_s": per_s}

    rows = [row("executor", 99.0), row("mneme tune", 400.0), row("tune+mlflow", 360.0),  # off-on
            row("tune+mlflow", 300.0), row("mneme tune", 400.0),  # on-off
            row("mneme tune", 500.0, "compiler"), row("tune+mlflow", 250.0, "compiler"),
            row("mneme tune", 380.0), row("tune+mlflow", 0.0)]  # a failed tracked run has no ratio
    assert bench_tune_throughput.pair_ratios(rows, "launch") == pytest.approx([0.9, 0.75])
    assert bench_tune_throughput.pair_ratios(rows, "compiler") == pytest.approx([0.5])
