"""mneme show / clean / copy / move on the committed fixtures (copied to a temp dir first)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mnemetest import ROOT, run_mneme
from mneme.errors import RecordError
from mneme.record.db import RecordedExecution, find_dbs
from mneme.record.housekeeping import owned_files

FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture
def recs(tmp_path) -> Path:
    for name in ("vecadd", "manylaunch", "matmul"):
        shutil.copytree(FIXTURES / name, tmp_path / name)
    return tmp_path


def test_show_ranks_kernels_by_total_in_app_time(recs):
    out = run_mneme("show", recs / "matmul", recs / "manylaunch").stdout
    heads = [line for line in out.splitlines() if not line.startswith(" ")]
    totals = []
    for db in (p for d in ("matmul", "manylaunch") for p in find_dbs(str(recs / d))):
        r = RecordedExecution.from_json(db)
        totals.append((r.total_in_app_time_ns, r.demangled_name))
    expected = [name for _, name in sorted(totals, reverse=True)]
    assert [h.split("  [")[0] for h in heads] == expected
    assert "scaleAdd" in out and out.count("x5") == 3, "manylaunch: three instances of five launches"
    assert "replayable" in out and "snapshots" in out


def test_show_says_what_to_do_without_any_db(tmp_path):
    p = run_mneme("show", tmp_path, check=False)
    assert p.returncode == 2 and "mneme record" in p.stderr


def test_copy_keeps_the_source_and_rewrites_paths(recs, tmp_path):
    (src,) = find_dbs(str(recs / "vecadd"))
    dest = tmp_path / "elsewhere"
    run_mneme("copy", src, dest)
    (copied,) = find_dbs(str(dest))
    a, b = RecordedExecution.from_json(src), RecordedExecution.from_json(copied)
    assert a.static_hash == b.static_hash and set(a) == set(b)
    for fa, fb in zip(owned_files(a), owned_files(b)):
        assert Path(fb).is_file() and str(dest) in fb and Path(fa).read_bytes() == Path(fb).read_bytes()
    assert str(tmp_path) not in Path(copied).read_text(), "stored paths stay relative"
    assert all(Path(f).exists() for f in owned_files(a)), "copy leaves the source alone"


def test_move_then_clean(recs, tmp_path):
    (src,) = find_dbs(str(recs / "manylaunch"))
    files = owned_files(RecordedExecution.from_json(src))
    run_mneme("move", src, tmp_path / "moved")
    assert not Path(src).exists() and not any(Path(f).exists() for f in files)
    (moved,) = find_dbs(str(tmp_path / "moved"))
    db = RecordedExecution.from_json(moved)
    assert len(db) == 3
    moved_files = owned_files(db)
    out = run_mneme("clean", moved).stdout
    assert not Path(moved).exists() and not any(Path(f).exists() for f in moved_files)
    assert out.count("removed") == len(moved_files) + 1


def test_copy_refuses_a_db_with_missing_files(recs, tmp_path):
    (src,) = find_dbs(str(recs / "vecadd"))
    data = json.loads(Path(src).read_text())
    next(iter(data["instances"].values()))["Epilogue"] = "snapshots/gone.epilogue"
    Path(src).write_text(json.dumps(data))
    p = run_mneme("copy", src, tmp_path / "x", check=False)
    assert p.returncode == 2 and "gone.epilogue" in p.stderr and "missing" in p.stderr, p.stderr
    assert not (tmp_path / "x" / Path(src).name).exists(), "nothing half-copied"


def test_clean_deletes_only_the_dbs_own_files(recs):
    """A hand-edited DB that names another DB's IR, or a file its hash and name do not tie to it, keeps them."""
    dbs = sorted(find_dbs(str(recs / "matmul")))
    for f in dbs:  # schema 2, with hashes
        RecordedExecution.from_json(f).to_json()
    victim, other = json.loads(Path(dbs[0]).read_text()), json.loads(Path(dbs[1]).read_text())
    victim["Modules"], victim["ModuleSha256"] = other["Modules"], other["ModuleSha256"]
    stray = recs / "matmul" / "notes.bin"
    stray.write_bytes(b"mine")
    inst = next(iter(victim["instances"].values()))
    own_epilogue = recs / "matmul" / inst["Epilogue"]
    inst["Epilogue"] = "notes.bin"
    Path(dbs[0]).write_text(json.dumps(victim))
    p = run_mneme("clean", dbs[0])
    assert not Path(dbs[0]).exists() and (recs / "matmul" / inst["Prologue"]).exists() is False
    assert (recs / "matmul" / other["Modules"][0]).is_file(), "another DB's IR was deleted"
    assert stray.is_file() and "notes.bin: kept" in p.stderr and "refers to it too" in p.stderr
    assert own_epilogue.is_file()  # no longer named by the edited DB: not touched
    RecordedExecution.from_json(dbs[1]).link_llvm_modules()  # the other DB still works
