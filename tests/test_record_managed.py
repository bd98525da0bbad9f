"""librecord's bookkeeping of managed and app-registered host memory (native/recorder/managed.c) without a
GPU: a probe reaches a stand-in driver (tests/data/managed/fake_libcuda.c) through librecord's wrapped
cuGetProcAddress, allocates managed memory, frees some, registers host memory; the exit event's `memory`
line lists what the recorder would snapshot with each launch. A registered range whose device address
the driver cannot tell stays foreign (reported, not snapshotted). The GPU side: tests/gpu/test_managed_gpu.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from mnemetest import build_standin

DATA = Path(__file__).resolve().parent / "data" / "managed"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_standin(tmp_path_factory.mktemp("managed"), DATA, "probe")


def test_managed_ranges_are_tracked_until_freed_and_unplaceable_registrations_stay_foreign(built, tmp_path):
    from mneme.record.rawlog import read_log
    from mneme.record.runner import find_librecord

    raw = tmp_path / "raw"
    raw.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEME_") and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(built / "fake"), LD_PRELOAD=str(find_librecord()), MNEME_RECORD_DIR=str(raw))
    p = subprocess.run([str(built / "probe")], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    out = dict(kv.split("=") for kv in p.stdout.split())
    assert out["rc"] == "0", p.stdout
    (log,) = raw.glob("r0-p*.jsonl")
    events = [json.loads(x) for x in log.read_text().splitlines()]
    (mem,) = [e for e in events if e["ev"] == "memory"]
    m0, m2 = int(out["m0"]), int(out["m2"])
    assert mem["managed"] == sorted([[m0, 4096], [m2, 16384]]), "the freed middle range is gone"
    assert mem["managed_n"] == 2 and mem["managed_bytes"] == 4096 + 16384
    # the stand-in driver answers no cuMemHostGetDevicePointer: where the device sees `a` is unknown
    assert "registered" not in mem and mem["foreign"] == 1, mem
    assert read_log(log).exit is not None and events[-1]["ev"] == "exit"
