"""The record-DB schema (mneme/record/schema.py) against the committed fixtures: each reads (schema 1, through
the migration), writes back as the current schema (3) with the SHA-256 of every file it owns, and that
validates; version 2 stays readable; each kind of violation is refused in one line naming the file and the
field path."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from mnemetest import FIXTURES
from mneme.errors import RecordError
from mneme.record import integrity
from mneme.record.db import RecordedExecution, find_dbs
from mneme.record.schema import SCHEMA_VERSION, RecordDB, json_schema, validate

FIXTURE_DBS = [db for d in sorted(FIXTURES.iterdir()) if d.is_dir() for db in find_dbs(str(d))]


def test_there_are_fixtures_of_every_kind():
    assert len(FIXTURE_DBS) >= 6


@pytest.mark.parametrize("path", FIXTURE_DBS, ids=lambda p: Path(p).parent.name + "/" + Path(p).name[:8])
def test_every_fixture_validates_and_migrates_to_the_current_version(path, tmp_path):
    data = json.loads(Path(path).read_text())
    model = validate(data, path)
    assert model.SchemaVersion in (1, SCHEMA_VERSION)
    copy_dir = tmp_path / "db"
    shutil.copytree(Path(path).parent, copy_dir)
    db = RecordedExecution.from_json(str(copy_dir / Path(path).name))
    db.to_json()
    written = json.loads((copy_dir / Path(path).name).read_text())
    assert written["SchemaVersion"] == SCHEMA_VERSION == 3
    current = RecordDB.model_validate(written)  # the current model, no migration
    for rel, digest in zip(current.Modules, current.ModuleSha256):
        assert integrity.sha256(str(copy_dir / rel)) == digest
    for inst in current.instances.values():
        assert integrity.sha256(str(copy_dir / inst.Prologue)) == inst.PrologueSha256
        assert integrity.sha256(str(copy_dir / inst.Epilogue)) == inst.EpilogueSha256
    again = RecordedExecution.from_json(str(copy_dir / Path(path).name))
    assert again.schema_version == 3 and sorted(again) == sorted(db)
    # nothing the schema does not name is lost on the way
    assert {k for k in data if k != "SchemaVersion"} <= set(written)


def _one(path: str) -> dict:
    return json.loads(Path(path).read_text())


VECADD = [p for p in FIXTURE_DBS if "/vecadd/" in p][0]
DH = next(iter(_one(VECADD)["instances"]))

#: (change, field path the message must name, what it must say)
CASES = [
    (lambda d: d["instances"][DH]["BlockDims"].update(x=256.7), f"instances.{DH}.BlockDims.x", "integer"),
    (lambda d: d["instances"][DH].update(GridDims="64"), f"instances.{DH}.GridDims", "dictionary"),
    (lambda d: d["instances"][DH]["GridDims"].update(x="abc"), f"instances.{DH}.GridDims.x", "integer"),
    (lambda d: d["instances"][DH].update(SharedMem=None), f"instances.{DH}.SharedMem", "integer"),
    (lambda d: d["instances"][DH].pop("Prologue"), f"instances.{DH}.Prologue", "missing"),
    (lambda d: d.update(Modules=[""]), "Modules.0", "at least 1 character"),
    (lambda d: d.update(Replayable="false"), "Replayable", "boolean"),
    (lambda d: d.update(VAddr=12), "VAddr", "string"),
    (lambda d: d["instances"][DH].update(Args=["zz"]), f"instances.{DH}.Args.0", "matching"),
    (lambda d: d.update(Specializations=[True]), "Specializations", "4 entries"),
    (lambda d: d["instances"][DH].update(Occurrences=0), f"instances.{DH}.Occurrences", "greater than or equal to 1"),
    (lambda d: d.update(instances={"nothex": d["instances"][DH]}), "instances.nothex", "matching"),
]


def _attrs(d: dict) -> dict:
    return d.setdefault("InstanceAttributes", {}).setdefault(DH, {})


#: version 3's SnapshottedMemory: strict too
CASES += [
    (lambda d: _attrs(d).update(SnapshottedMemory={"texture": {"Ranges": 1, "Bytes": 4}}),
     f"InstanceAttributes.{DH}.SnapshottedMemory.texture", "'managed' or 'host_registered'"),
    (lambda d: _attrs(d).update(SnapshottedMemory={"managed": {"Ranges": -1, "Bytes": 4}}),
     f"InstanceAttributes.{DH}.SnapshottedMemory.managed.Ranges", "greater than or equal to 0"),
    (lambda d: _attrs(d).update(SnapshottedMemory={"managed": {"Ranges": 1, "Bytes": 4,
                                                               "Named": [{"Address": 4096, "Bytes": 4}]}}),
     f"InstanceAttributes.{DH}.SnapshottedMemory.managed.Named.0.Address", "string"),
]


def _current(data: dict) -> dict:
    """A fixture as the current version (its hashes are not checked by validate)."""
    d = copy.deepcopy(data)
    d["SchemaVersion"] = SCHEMA_VERSION
    d["ModuleSha256"] = ["0" * 64] * len(d["Modules"])
    for inst in d["instances"].values():
        inst["PrologueSha256"] = inst["EpilogueSha256"] = "0" * 64
    return d


def test_version_2_reads_and_version_3_keeps_snapshotted_memory():
    v3 = _current(_one(VECADD))
    _attrs(v3)["SnapshottedMemory"] = {"managed": {"Ranges": 2, "Bytes": 4096,
                                                   "Named": [{"Address": "0x7f0000200000", "Bytes": 4096}]}}
    m = validate(v3, "v3.json")
    assert m.SchemaVersion == 3 and m.InstanceAttributes[DH].SnapshottedMemory["managed"].Named[0].Bytes == 4096
    v2 = copy.deepcopy(v3)
    v2["SchemaVersion"] = 2
    del v2["InstanceAttributes"][DH]["SnapshottedMemory"]
    assert validate(v2, "v2.json").SchemaVersion == 2
    v4 = dict(v3, SchemaVersion=4)
    with pytest.raises(Exception, match=r"version 4 is not supported \(this mneme reads versions 1, 2, 3\)"):
        validate(v4, "v4.json")


@pytest.mark.parametrize("change,field,says", CASES, ids=[c[1] + ":" + c[2] for c in CASES])
def test_each_violation_is_one_line_naming_file_and_field(change, field, says, tmp_path):
    data = _one(VECADD)
    bad = copy.deepcopy(data)
    change(bad)
    path = tmp_path / Path(VECADD).name
    path.write_text(json.dumps(bad))
    with pytest.raises(RecordError) as e:
        RecordedExecution.from_json(str(path))
    lines = str(e.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{path}: ") and field in lines[0] and says in lines[0], lines[0]


def test_a_top_level_that_is_not_an_object_is_refused(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(RecordError, match=r"x\.json: \(top level\): expected a JSON object.*got list"):
        RecordedExecution.from_json(str(path))


def test_the_json_schema_documents_the_current_version():
    s = json_schema()
    assert s["properties"]["SchemaVersion"]["const"] == SCHEMA_VERSION
    assert {"ModuleSha256", "instances", "StaticHash"} <= set(s["required"])
    doc = (Path(__file__).resolve().parent.parent / "docs" / "RECORD_DB.md").read_text()
    for name in s["properties"]:
        assert f"`{name}`" in doc, f"docs/RECORD_DB.md does not describe {name}"


TEXTURE = {"Param": 0, "Offset": 0, "Handle": "0x7", "Kind": "surface", "Resource": "array", "Format": "f32",
           "Channels": 1, "Dims": [64, 48, 0], "Levels": 0, "Flags": 2, "Bytes": 12288, "Written": True}


def _with_textures(tmp_path, entries, version=None):
    d = tmp_path / "db"
    shutil.copytree(Path(VECADD).parent, d)
    path = d / Path(VECADD).name
    data = _one(VECADD)
    data.setdefault("InstanceAttributes", {}).setdefault(DH, {})["Textures"] = entries
    if version is not None:
        data["SchemaVersion"] = version
    path.write_text(json.dumps(data))
    return path


def test_texture_entries_round_trip_as_version_3(tmp_path):
    path = _with_textures(tmp_path, [TEXTURE])
    db = RecordedExecution.from_json(str(path))
    db.to_json()
    written = json.loads(path.read_text())
    assert written["SchemaVersion"] == 3
    assert written["InstanceAttributes"][DH]["Textures"] == [TEXTURE]
    assert RecordDB.model_validate(written).InstanceAttributes[DH].Textures[0].Written is True


@pytest.mark.parametrize("change,field,says", [
    (dict(Kind="sampler"), "Textures.0.Kind", "'texture' or 'surface'"),
    (dict(Handle="7"), "Textures.0.Handle", "matching"),
    (dict(Dims=[64, 48]), "Textures.0.Dims", "at least 3"),
    (dict(Offset=-8), "Textures.0.Offset", "greater than or equal to 0"),
])
def test_a_bad_texture_entry_is_one_line_naming_its_field(tmp_path, change, field, says):
    path = _with_textures(tmp_path, [dict(TEXTURE, **change)])
    with pytest.raises(RecordError) as e:
        RecordedExecution.from_json(str(path))
    lines = str(e.value).splitlines()
    assert len(lines) == 1 and f"InstanceAttributes.{DH}.{field}" in lines[0] and says in lines[0], lines[0]


def test_a_version_2_db_is_still_read(tmp_path):
    d = tmp_path / "db"
    shutil.copytree(Path(VECADD).parent, d)
    db = RecordedExecution.from_json(str(d / Path(VECADD).name))
    db.to_json()
    data = json.loads((d / Path(VECADD).name).read_text())
    data["SchemaVersion"] = 2
    assert validate(data, "x.json").SchemaVersion == 2
