"""The Kernel Tuner side by side on a GPU, small: each worker of bench/bench_kernel_tuner.py and the mneme run it
starts, on vecAdd at the timing size with the quick space (6 block sizes). The full comparison is
`bash scripts/bench.sh kt`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(1, str(ROOT))

import bench_kernel_tuner as bkt  # noqa: E402
from bench import block_spaces as bs  # noqa: E402

pytestmark = pytest.mark.gpu
QUICK = sorted(bs.enumerate_blocks(bs.SPACES["vecadd-quick"]))


def test_kernel_tuner_tunes_the_quick_vecadd_space_and_checks_every_answer():
    pytest.importorskip("kernel_tuner")
    pytest.importorskip("cupy")
    out, wall = bkt.run_worker({"kind": "kt", "kernel": "vecadd", "space": "vecadd-quick", "answer": True,
                                "iterations": 3, "lang": "cupy", "seed": 0}, timeout=300, env=bkt.python_env())
    configs = out["configs"]
    assert out["lang"] == "cupy" and sorted(tuple(c["block"]) for c in configs) == QUICK
    assert all("error" not in c for c in configs), configs
    assert all(c["us"] > 1 and len(c["times_us"]) == 3 and c["compile_ms"] > 0 and c["verification_ms"] > 0 for c in configs)
    assert 0 < out["search_s"] < wall


def test_both_common_methods_time_two_blocks(big_recordings):
    pytest.importorskip("cupy")
    db = big_recordings["vecadd"].db("vecAdd")
    spec = {"kernel": "vecadd", "space": "vecadd-quick", "db": str(db), "blocks": [[128, 1, 1], [1024, 1, 1]],
            "seed": 0, "rounds": 2, "per_round": 5, "warmup": 2}
    for kind in ("cupy", "replay"):
        out, _ = bkt.run_worker({**spec, "kind": kind}, timeout=300, env=bkt.python_env())
        assert [b["block"] for b in out["blocks"]] == spec["blocks"], kind
        assert all(b["n"] == 10 and 1 < b["min_us"] <= b["us"] < 10_000 for b in out["blocks"]), (kind, out)


def test_mneme_tune_searches_the_shared_space_and_verifies_every_block(big_recordings, tmp_path):
    db = str(big_recordings["vecadd"].db("vecAdd"))
    assert bkt.space_check(db, "vecadd-quick", (1 << 24,))["identical"]
    out = tmp_path / "out"
    run = bkt.tune_with_mneme(bkt.mneme_command(db, "vecadd-quick", len(QUICK), out, 3, 1, 4), out, timeout=300)
    assert sorted(tuple(c["block"]) for c in run["configs"]) == QUICK
    assert all(c.get("status") == "verified" for c in run["configs"]), run["configs"]
    assert run["compiles"] == 1 and run["best_us"] > 1 and 0 < run["search_s"] < run["wall_s"]
    assert tuple(run["best_block"]) in QUICK
