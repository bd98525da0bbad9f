"""`mneme record`'s command line: bad options and a machine without a driver are refused before the app
starts (this machine has no GPU, so the driver check always fires here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

MNEME = [sys.executable, "-m", "mneme.cli"]


def record(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*MNEME, "record", *map(str, args)], capture_output=True, text=True, timeout=120, **kw)


def test_no_driver_is_a_clear_error_before_the_app_starts(tmp_path):
    marker = tmp_path / "the-app-ran"
    db = tmp_path / "db"
    r = record("-rdb", db, "--", "sh", "-c", f"touch {marker}")
    assert r.returncode == 2
    assert "no NVIDIA driver" in r.stderr and "libcuda.so.1" in r.stderr and "not started" in r.stderr
    assert not marker.exists() and not db.exists()


@pytest.mark.parametrize("options, message", [
    (["--record-ranks", "3-1"], "runs backwards"),
    (["--record-ranks", "first"], "--record-ranks"),
    (["--kernels", "vec("], "not a valid regular expression"),
    (["--va-size", "0"], "--va-size"),
    (["--max-recordings", "-1"], "--max-recordings"),
    (["--skip", "-2"], "--skip"),
])
def test_bad_options_are_refused_before_anything_runs(tmp_path, options, message):
    marker = tmp_path / "ran"
    r = record("-rdb", tmp_path / "db", *options, "--", "sh", "-c", f"touch {marker}")
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not marker.exists()


def test_an_app_is_required(tmp_path):
    r = record("-rdb", tmp_path / "db")
    assert r.returncode == 2 and "no app to record" in r.stderr


def test_unknown_epilogue_format_is_an_argparse_error(tmp_path):
    r = record("-rdb", tmp_path / "db", "--epilogue-format", "zip", "--", "true")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_record_settings_map_onto_the_recorder_environment(tmp_path):
    from mneme.record.runner import GIB, RecordSettings, recorder_env

    s = RecordSettings(db_dir=tmp_path, kernels="vecAdd", max_recordings=3, skip=2, va_size_gib=8,
                       epilogue_format="best", record_ranks="0,2", va_base=0x200000000000)
    env = recorder_env(s, Path("/x/librecord.so"), tmp_path / ".raw-1", tmp_path / "k.tsv",
                       base={"LD_PRELOAD": "/y/other.so", "MNEME_KERNELS": "stale"})
    assert env["LD_PRELOAD"] == "/x/librecord.so:/y/other.so"
    assert env["MNEME_RECORD_DIR"] == str(tmp_path / ".raw-1") and env["MNEME_RUN_ID"] == ".raw-1"
    assert (env["MNEME_KERNELS"], env["MNEME_MAX_RECORDINGS"], env["MNEME_SKIP"]) == ("vecAdd", "3", "2")
    assert env["MNEME_VA_BYTES"] == str(8 * GIB) and env["MNEME_VA_BASE"] == "0x200000000000"
    assert env["MNEME_EPILOGUE_FORMAT"] == "best" and env["MNEME_RECORD_RANKS"] == "0,2"
    assert env["MNEME_KERNEL_TABLE"] == str(tmp_path / "k.tsv")
    assert (env["MNEME_RETIME"], env["MNEME_RETIME_BUDGET_US"]) == ("10", "1000000"), "10 reruns or 1 s, whichever first"
    assert env["MNEME_SNAPSHOT_FSYNC"] == "0", "snapshot files are not fsynced unless asked"
    s.snapshot_fsync = True
    assert recorder_env(s, Path("/x.so"), tmp_path, None)["MNEME_SNAPSHOT_FSYNC"] == "1"
    s.snapshot_fsync = False
    assert recorder_env(s, Path("/x.so"), tmp_path, None, base={"MNEME_SNAPSHOT_FSYNC": "1"})["MNEME_SNAPSHOT_FSYNC"] == "1"
    assert recorder_env(s, Path("/x.so"), tmp_path, None, base={"MNEME_SNAPSHOT_FSYNC": "yes"})["MNEME_SNAPSHOT_FSYNC"] == "0"
    for seconds, us in ((0.25, "250000"), (1e-9, "1"), (0, "0")):  # a tiny budget is not "no bound"
        s.retime_budget_s = seconds
        assert recorder_env(s, Path("/x.so"), tmp_path, None)["MNEME_RETIME_BUDGET_US"] == us
    s.retime_budget_s = -1
    from mneme.errors import RecordError

    with pytest.raises(RecordError, match="--retime-budget"):
        s.validate()
    s.retime_budget_s = 1.0
    s.kernels = None
    assert "MNEME_KERNELS" not in recorder_env(s, Path("/x.so"), tmp_path, None, base={"MNEME_KERNELS": "stale"})
