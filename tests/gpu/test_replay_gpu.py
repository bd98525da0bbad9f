"""Replay on the H200: every recorded example instance verifies under the standard variants, a
configuration that changes the result is reported (and does not leak into the next replay), and
replay timing is faithful to the in-app timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
#: recorded examples whose every instance must replay and verify
REPLAYED = ["vecadd", "stencil2d", "matmul", "reduce", "rdc", "structarg", "manylaunch", "ptrglobal", "pinned",
            "launchex", "cooperative", "shlib", "driverapi", "consttable", "devcounter", "halo", "managed", "zerocopy",
            "streamalloc", "graph", "graphupdate"]


def matrix(mode: str, dbs: List[Path]) -> List[dict]:
    p = subprocess.run([sys.executable, str(HERE / "replay_matrix.py"), mode, *map(str, dbs)],
                       capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert p.returncode == 0, f"replay_matrix exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return rows


@pytest.mark.parametrize("name", REPLAYED)
def test_every_instance_verifies_under_every_standard_variant(small_recordings, name):
    rec = small_recordings[name]
    assert rec.returncode == 0, rec.stderr
    rows = matrix("matrix", rec.dbs())
    assert rows, "nothing was replayed"
    bad = [r for r in rows if not r["verified"]]
    assert not bad, "\n".join(f"{r['kernel']} {r['variant']}: {r['status']} {r['error']}" for r in bad)
    assert {r["variant"] for r in rows} >= {"O3", "O0", "O3+specialize", "O3+dims", "O3+bounds"}


@pytest.mark.parametrize("name, kernel", [("devcounter", "countAbove"), ("ptrglobal", "ptrGlobal")])
def test_a_kernel_that_accumulates_in_device_variables_verifies_on_every_replay(small_recordings, name, kernel):
    # the same module replayed again and again (as a tune's launch-space trials share the baseline's cubin):
    # the variables must start from their recorded values before every verification and timed run
    rows = matrix("repeat", [small_recordings[name].db(kernel)])
    assert len(rows) == 4, rows
    assert all(r["verified"] for r in rows), "\n".join(f"{r['variant']}: {r['status']} {r['error']}" for r in rows)


def test_a_result_changing_override_fails_verification_and_the_next_replay_verifies(small_recordings):
    rows = matrix("override", [small_recordings["vecadd"].db("vecAdd")])
    by = {r["variant"]: r for r in rows}
    assert by["half-grid"]["status"] == "failed_verification" and not by["half-grid"]["verified"]
    assert by["O3-after"]["verified"], by["O3-after"]


def test_replay_is_faithful_to_the_in_app_time(big_recordings):
    dbs = [p for rec in big_recordings.values() for p in rec.dbs()]
    rows = matrix("fidelity", dbs)
    timed = [r for r in rows if r["in_app_ns"] and r["in_app_ns"] >= 20_000]
    assert timed, rows
    for r in timed:
        assert r["verified"], r
        assert 0.8 <= r["fidelity"] <= 1.25, f"{r['kernel']}: replay {r['median_ns']} ns vs in-app {r['in_app_ns']} ns"


def test_mneme_replay_cli_verifies_and_prints_a_summary(small_recordings, tmp_path):
    db = small_recordings["stencil2d"].db("stencil2d")
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "replay", "-rdb", str(db), "default<O2>", "-it", "5",
                        "--json", str(tmp_path / "r.json"), "--output-ptx", str(tmp_path / "k.ptx")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "verified" in p.stdout and "fidelity" in p.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["result"]["verified"] and len(doc["result"]["exec_time"]) == 5
    assert ".entry" in (tmp_path / "k.ptx").read_text()


def test_replay_refuses_an_invalid_configuration_before_compiling(small_recordings):
    db = small_recordings["vecadd"].db("vecAdd")
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "replay", "-rdb", str(db), "-bidx", "2048"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "1024" in p.stderr, p.stdout + p.stderr
