"""Record-DB paths are relative to the DB's own directory, whatever form `-rdb` took and whatever the
working directory (the main-job issue: `mneme record -rdb demo/rec` stored `demo/rec/RecordedIR_...bc`).
DBs are written through the real post-processing with the app's real IR, from another working
directory, and read back from a third; schema-1 DBs with working-directory paths still read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mneme.record.db import RecordedExecution, find_dbs
from mneme.record.housekeeping import relocate
from mneme.record.kerneltable import IRIndex
from mneme.record.postprocess import postprocess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_record_pipeline import APP_SOURCE, BASE, SCALE, RawRun, scale_args  # noqa: E402


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("app")
    (d / "app.cu").write_text(APP_SOURCE)
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "cc", "-O2", "-o", str(d / "app"), str(d / "app.cu")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return d / "app"


@pytest.fixture(scope="module")
def index(app) -> IRIndex:
    idx = IRIndex()
    idx.add_file(app)
    return idx


def record_into(rdb: str, cwd: Path, app: Path, index: IRIndex) -> None:
    """What `mneme record -rdb RDB` does after the app exited, run from `cwd`."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        raw = Path(rdb) / ".raw-test"
        run = RawRun(raw, app)
        args, params, masked = scale_args(BASE, 256)
        run.instance(SCALE, args, params, masked, bytes(1024), b"\x01" * 1024)
        run.kstat(SCALE, 1, 1, 1)
        run.exit()
        postprocess(raw, Path(rdb), index=index)
    finally:
        os.chdir(old)


def check_db(db_dir: Path, reader_cwd: Path) -> dict:
    old = os.getcwd()
    os.chdir(reader_cwd)
    try:
        (path,) = find_dbs(str(db_dir))
        data = json.loads(Path(path).read_text())
        db = RecordedExecution.from_json(path)
        for f in db.llvm_files + [p for i in db.values() for p in (i.prologue_fn, i.epilogue_fn)]:
            assert Path(f).is_file(), f
        db.link_llvm_modules()
        return data
    finally:
        os.chdir(old)


@pytest.mark.parametrize("form", ["demo/rec", "./demo/rec", "../work/demo/rec", "ABS", "link/rec"])
def test_every_form_of_rdb_stores_paths_relative_to_the_db(app, index, tmp_path, form):
    work = tmp_path / "work"
    (work / "demo").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if form == "ABS":
        form = str(work / "demo" / "rec")
    if form.startswith("link/"):
        (work / "real").mkdir()
        os.symlink(work / "real", work / "link")
    cwd = work / "demo" if form.startswith("../") else work
    if form.startswith("../"):
        form = "../../work/demo/rec"
    record_into(form, cwd, app, index)
    db_dir = (cwd / form) if not os.path.isabs(form) else Path(form)
    data = check_db(db_dir.resolve(), elsewhere)
    (mod,) = data["Modules"]
    assert mod == f"RecordedIR_{data['StaticHash']}.bc", f"-rdb {form}: stored {mod!r}"
    for inst in data["instances"].values():
        assert inst["Prologue"].startswith("snapshots/") and inst["Epilogue"].startswith("snapshots/")


def test_a_db_written_with_working_directory_paths_still_reads_and_is_rewritten_clean(app, index, tmp_path):
    record_into("demo/rec", tmp_path, app, index)
    (path,) = find_dbs(str(tmp_path / "demo" / "rec"))
    data = json.loads(Path(path).read_text())
    data["Modules"] = [f"demo/rec/{data['Modules'][0]}"]  # what the schema-1 recorder stored
    Path(path).write_text(json.dumps(data))
    db = RecordedExecution.from_json(path)
    assert Path(db.llvm_files[0]).is_file()
    db.to_json()
    assert json.loads(Path(path).read_text())["Modules"] == [f"RecordedIR_{data['StaticHash']}.bc"]


def test_copy_keeps_a_relatively_recorded_db_valid(app, index, tmp_path):
    record_into("demo/rec", tmp_path, app, index)
    (path,) = find_dbs(str(tmp_path / "demo" / "rec"))
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        (copied,) = relocate([os.path.relpath(path, tmp_path)], "copy", move=False)
    finally:
        os.chdir(old)
    data = check_db((tmp_path / copied).parent, tmp_path / "demo")
    assert not any(m.startswith("demo/") or m.startswith("/") for m in data["Modules"])
