"""bench/bench_track_corpus.py without a GPU: which corpus kernels it picks from a work folder of record DBs,
how it reads tracked and untracked `mneme tune` runs into one line per kernel, and one whole run, compile-only,
on a fixture record DB with a real MLflow store whose runs it counts back."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import bench_track_corpus as btc  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture
def work(tmp_path):
    """A corpus work folder as `corpus.sh record` leaves it: <app>/rdb with the record DBs."""
    for app in ("vecadd", "matmul", "manylaunch"):
        shutil.copytree(FIXTURES / app, tmp_path / app / "rdb")
    return tmp_path


def test_one_kernel_per_app_inside_the_time_window(work):
    # matmul: panel 9.98 us, dynamic 9.54 us, static 6.14 us in-app; vecadd 3.36 us
    targets, skipped = btc.corpus_targets(work, ["vecadd", "matmul", "nbody"], min_us=5, max_us=9.8)
    assert [t["label"] for t in targets] == ["matmul/matmulDynamic"]  # the heaviest inside the window
    assert targets[0]["in_app_us"] == pytest.approx(9.536) and Path(targets[0]["db"]).is_file()
    why = {s["app"]: s["why"] for s in skipped}
    assert why["vecadd"] == "no replayable instance of 5-9.8 us" and "no record DB under" in why["nbody"]


def test_an_app_that_cannot_be_recorded_is_left_out_with_why_and_the_others_go_on(work):
    recorded = []

    def record(app):
        recorded.append(app)
        raise FileNotFoundError(f"{app}: not in the pack .corpus/packtrack (it has simpleStreams)")

    targets, skipped = btc.corpus_targets(work, ["nbody", "matmul"], min_us=5, max_us=9.8, record=record)
    assert recorded == ["nbody"] and [t["app"] for t in targets] == ["matmul"]  # matmul has its DBs: not recorded
    assert skipped == [{"app": "nbody", "why": "recording failed: FileNotFoundError: nbody: not in the pack "
                                               ".corpus/packtrack (it has simpleStreams)"}]


def test_kernels_whose_baseline_replay_failed_are_passed_over(work):
    replay = [{"name": "_Z13matmulDynamicPKfS0_Pfii", "replayed": [{"id": "342e545afa517589", "status": "failed"}]},
              {"name": "_Z12matmulStaticPKfS0_Pfi", "replayed": [{"id": "54cdad926e4f883b", "status": "verified"}]}]
    (work / "matmul" / "replay.json").write_text(json.dumps(replay))
    targets, _ = btc.corpus_targets(work, ["matmul"], min_us=5, max_us=9.8)
    assert [t["label"] for t in targets] == ["matmul/matmulStatic"]


def _row(kernel, mode, per_s, pair, **kw):
    return {"kernel": kernel, "mode": mode, "per_s": per_s, "pair": pair, "trials": 100, "statuses": "verified 100", **kw}


def test_pairs_medians_and_the_ratio_line():
    a, b = "simpleZeroCopy/vectorAddGPU", "graphMemoryNodes/squareArray"
    rows = [_row(a, btc.OFF, 10.0, 1), _row(a, btc.ON, 9.5, 1, store_trial_runs=100),
            _row(a, btc.ON, 10.2, 2, store_trial_runs=99), _row(a, btc.OFF, 10.2, 2),
            _row(b, btc.OFF, 12.0, 1), {"kernel": b, "mode": btc.ON, "pair": 1, "error": "RuntimeError: no timing"}]
    ka = btc.kernel_summary(rows, {"label": a, "in_app_us": 192.8})
    assert ka["pairs_run"] == 2 and ka["pair_min"] == pytest.approx(0.95) and ka["pair_max"] == pytest.approx(1.0)
    assert ka["off_per_s"] == 10.0 and ka["on_per_s"] == 9.5 and ka["ratio"] == pytest.approx(0.95)  # lower middles
    assert ka["runs_logged"] == 99  # the fewest trial runs any tracked run left in its store
    kb = btc.kernel_summary(rows, {"label": b})
    assert kb["failed_runs"] == 1 and "ratio" not in kb
    line = btc.ratio_line([ka, kb], 100, 2, "standard")
    assert line.startswith("tracking on / off, 1 corpus kernel(s), `standard` space, 100 trials, medians of 2")
    assert "geomean 0.950" in line and f"{a} 0.950 (9.5 vs 10.0/s)" in line and line.endswith("met)")
    assert btc.ratio_line([kb], 100, 2, "standard").endswith("no kernel measured in both modes")
    assert "NOT met" in btc.ratio_line([dict(ka, ratio=0.8)], 100, 2, "standard")


@pytest.mark.slow
def test_a_whole_run_compile_only_counts_the_runs_in_a_real_mlflow_store(work, tmp_path, capsys):
    out = tmp_path / "track.json"
    code = btc.main(["--work", str(work), "--apps", "vecadd,matmul,manylaunch", "--min-us", "1", "--kernels", "2",
                     "--budget", "1", "--compile-only", "--trials", "3", "--pairs", "1", "--synthetic-trials", "2",
                     "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    doc = json.loads(out.read_text())
    (k,) = doc["summary"]["kernels"]
    assert k["kernel"] == "vecadd/vecAdd" and k["trials"] == 3 and k["runs_logged"] == 3, k
    assert k["ratio"] == pytest.approx(k["on_per_s"] / k["off_per_s"]) and k["off_per_s"] > 0
    assert k["tracking_us_per_trial"] > 0 and k["synthetic_error"] is None
    runs = doc["tables"][1]["rows"]
    assert [r["mode"] for r in runs] == [btc.OFF, btc.ON] and "store_trial_runs" not in runs[0]
    # the first kernel always runs; the second does not fit a 1-second budget; the third is over --kernels
    why = {s["app"]: s["why"] for s in doc["summary"]["skipped"]}
    assert why["matmul"].startswith("budget: ") and why["manylaunch"] == "over --kernels 2" and len(why) == 2
    partial = json.loads(out.with_suffix(".partial.json").read_text())  # what a cut call would have left
    assert [r["mode"] for r in partial["rows"]] == [btc.OFF, btc.ON]
    assert "| kernel | in-app us | trials | off configs/s | on configs/s | on / off |" in printed
    assert printed.strip().splitlines()[-1] == "ratio: " + doc["ratio"]
