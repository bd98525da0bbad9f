"""librecord's held launches on the CPU (native/hold, shared with libapply: tests/test_apply_native.py runs the same
cases through libapply): the stand-in driver of tests/data/fakecuda models lazy loading and a launch that waits
for its held stream; tests/data/fakecuda/fakeapp.c launches kernel 0x1000 with the grid, block and n of argv,
each new n a new instance that librecord records (prologue, held and timed launch, epilogue)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Dict, List

import pytest

from mnemetest import ROOT, cc, run_mneme

FAKE = ROOT / "tests" / "data" / "fakecuda"
KERNEL = "_Z6vecAddPKfS0_Pfi"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("recordhold")
    cc("-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-Bsymbolic", "-o", str(d / "libcuda.so.1"), str(FAKE / "fakecuda.c"))
    cc("-o", str(d / "app"), str(FAKE / "fakeapp.c"), "-ldl")
    p = subprocess.run(["make", "-s", "-C", str(ROOT / "native" / "recorder"), f"OUT={d}"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return d


def record(built: Path, raw: Path, *launches, env_extra: Dict[str, str] = None) -> subprocess.CompletedProcess:
    raw.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "MNEME_")) and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(built), LD_PRELOAD=str(built / "librecord.so"), MNEME_RECORD_DIR=str(raw),
               **(env_extra or {}))
    p = subprocess.run([str(built / "app"), *map(str, launches)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "app done" in p.stdout, p.stdout + p.stderr
    return p


def events(raw: Path) -> List[dict]:
    (log,) = raw.glob("r0-p*.jsonl")
    return [json.loads(x) for x in log.read_text().splitlines()]


def holds(out: str) -> List[int]:
    return [int(v) for v in re.findall(r"hold until (\d+)", out)]


def test_a_launch_that_waits_for_its_held_stream_is_released_by_the_watchdog(built, tmp_path):
    # the driver waits for the held stream inside the launch (as a lazy load did on the H200): the watchdog
    # raises the flag, the launch happens once and untimed, and the next recorded instance is not held
    t0 = time.monotonic()
    p = record(built, tmp_path / "raw", 64, 256, 100, 64, 256, 101, 64, 256, 100,
               env_extra={"FAKE_LAUNCH_SYNCS": "1", "MNEME_RECORD_HOLD_MS": "50"})
    assert time.monotonic() - t0 < 8
    assert p.stdout.count("waits for the held stream") == 1 and "deadlock" not in p.stdout, p.stdout
    assert holds(p.stdout) == [1]
    assert p.stdout.count("launch 0x1000 grid 64 1 1 block 256 1 1") == 3, "every launch of the app exactly once"
    ev = events(tmp_path / "raw")
    insts = {e["i"]: e for e in ev if e["ev"] == "inst"}
    assert insts[0]["t_ns"] == 0, "the launch the watchdog released is not timed"
    assert insts[1]["t_ns"] == 4000, "the next instance's launch is timed, not held"
    (warn,) = [e for e in ev if e["ev"] == "warning" and e["what"] == "hold_broken"]
    assert KERNEL in warn["detail"] and "the watchdog released it" in warn["detail"]
    assert ev[-1]["ev"] == "exit" and ev[-1]["holds_broken"] == 1


def test_mneme_record_says_a_hold_broke(built, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "MNEME_")) and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(built), MNEME_LIBRECORD=str(built / "librecord.so"), FAKE_LAUNCH_SYNCS="1",
               MNEME_RECORD_HOLD_MS="50")
    p = run_mneme("record", "-rdb", tmp_path / "db", "--", built / "app", 64, 256, 100, 64, 256, 101, env=env, timeout=120)
    assert "1 timed launch stayed held until the hold watchdog released it (not timed)" in p.stderr, p.stderr
    assert f"hold_broken: {KERNEL}: a timed launch stayed held for more than 50 ms" in p.stderr
    assert "2 instances (2 new), 2 launches recorded, median 4.0 us in-app" in p.stdout, "the untimed launch adds no time"


def test_a_broken_hold_inside_the_reruns_leaves_only_that_rerun_untimed(built, tmp_path):
    # with a kernel table the new instance is rerun (MNEME_RETIME) on its prologue, each rerun held
    (tmp_path / "kernels.tsv").write_text(f"K\t{KERNEL}\t1\t4\t0:0:8,1:0:8,2:0:8\t-\n")
    p = record(built, tmp_path / "raw", 64, 256, 100,
               env_extra={"FAKE_LAUNCH_SYNCS": "1", "MNEME_RECORD_HOLD_MS": "50", "MNEME_RETIME": "3",
                          "MNEME_KERNEL_TABLE": str(tmp_path / "kernels.tsv")})
    assert p.stdout.count("waits for the held stream") == 1 and holds(p.stdout) == [1], p.stdout
    assert p.stdout.count("launch 0x1000 grid") == 4, "three reruns and the recorded launch"
    ev = events(tmp_path / "raw")
    (inst,) = [e for e in ev if e["ev"] == "inst"]
    assert inst["rt"] == [4000, 4000] and inst["t_ns"] == 4000, inst
    assert ev[-1]["holds_broken"] == 1


def test_functions_are_loaded_before_their_first_held_launch(built, tmp_path):
    # lazy loading: a launch that loads its function waits for the context's streams, the held one included
    p = record(built, tmp_path / "raw", 64, 256, 100, 64, 256, 101, env_extra={"FAKE_LAZY": "1"})
    out = p.stdout
    assert "load 0x1000" in out and out.index("load 0x1000") < out.index("hold until 1"), out
    assert "waits for the held stream" not in out and "deadlock" not in out
    assert holds(out) == [1, 2]
    ev = events(tmp_path / "raw")
    assert [e["t_ns"] for e in ev if e["ev"] == "inst"] == [4000, 4000]
    assert ev[-1]["holds_broken"] == 0 and not [e for e in ev if e["ev"] == "warning"]


def test_the_hold_flag_only_grows_and_MNEME_RECORD_HOLD_0_turns_holds_off(built, tmp_path):
    # a flag reset for the next hold re-blocks a wait the GPU has not reached yet
    p = record(built, tmp_path / "raw", *[v for n in range(5) for v in (64, 256, 100 + n)])
    assert holds(p.stdout) == [1, 2, 3, 4, 5] and "went down" not in p.stdout
    p = record(built, tmp_path / "raw0", 64, 256, 100, env_extra={"MNEME_RECORD_HOLD": "0"})
    assert holds(p.stdout) == [] and "launch 0x1000 grid" in p.stdout
    assert [e["t_ns"] for e in events(tmp_path / "raw0") if e["ev"] == "inst"] == [4000]
