"""Texture and surface objects in the record DB without a GPU (mneme/record/textures.py): raw logs and
snapshots as librecord writes them, post-processed with a real app's IR. A captured object becomes a
`Textures` entry and keeps the kernel replayable; a handle that was no live object, memory outside the
arena, a missing epilogue array or a failed capture each make it not replayable with a reason that says so."""

from __future__ import annotations

import struct

import pytest

from mneme.errors import MnemeError
from mneme.record.db import RecordedExecution, find_dbs
from mneme.record.postprocess import postprocess
from mneme.record.textures import replay_args, texture_summary
from test_record_pipeline import BASE, TEXREAD, RawRun, app, index  # noqa: F401  (fixtures)

F32 = 0x20
ARGS = struct.pack("<QQi", 7, BASE + 64, 32)
PARAMS = [(0, 8), (8, 8), (16, 4)]


def record(app, index, tmp_path, snapshots=None, event=None, args=ARGS):
    run = RawRun(tmp_path / ".raw-1", app)
    run.instance(TEXREAD, args, PARAMS, [(8, 8)], bytes(256), bytes(128) + b"\1" * 128, tex=[0],
                 snapshots=snapshots, event=event)
    run.exit()
    postprocess(run.raw, tmp_path / "db", index=index)
    (path,) = [p for p in find_dbs(str(tmp_path / "db")) if RecordedExecution.from_json(p).kernel_name == TEXREAD]
    db = RecordedExecution.from_json(path)
    attrs = next(iter(db.extra["InstanceAttributes"].values()))
    return db, attrs.get("Textures", [])


def linear(pro, epi, ptr=BASE, size=128):
    pro.texobj(7, resource="linear", dev_ptr=ptr, size_bytes=size, format=F32, channels=1)


def test_a_linear_texture_in_recorded_memory_is_replayable(app, index, tmp_path):
    db, tex = record(app, index, tmp_path, linear)
    assert db.replayable, db.not_replayable_reason
    assert tex == [{"Param": 0, "Offset": 0, "Handle": "0x7", "Kind": "texture", "Resource": "linear", "Format": "f32",
                    "Channels": 1, "Dims": [128, 0, 0], "Levels": 0, "Flags": 0, "Bytes": 0, "Written": False}]
    assert db.specializations[0] is False, "a handle must never be baked into the code"
    assert texture_summary(tex) == "arg 0: texture over linear 128 f32x1"


def test_an_array_texture_carries_its_array_in_both_snapshots(app, index, tmp_path):
    data = struct.pack("<12f", *range(12))

    def arrays(pro, epi):
        pro.texobj(7, resource="array", array=0xA0, filter_mode=1, address_mode=[1, 1, 1])
        pro.array(0xA0, data, width=4, height=3, format=F32)
        epi.array(0xA0, data, width=4, height=3, format=F32)

    db, tex = record(app, index, tmp_path, arrays)
    assert db.replayable, db.not_replayable_reason
    assert tex[0]["Resource"] == "array" and tex[0]["Dims"] == [4, 3, 0] and tex[0]["Bytes"] == 48


@pytest.mark.parametrize("snapshots,event,says", [
    (None, None, "holds 0x7, which was no live texture or surface object"),
    (lambda p, e: linear(p, e, ptr=0x7F0000000000), None, "outside the memory mneme records"),
    (lambda p, e: linear(p, e, size=4096), None, "outside the memory mneme records"),
    (lambda p, e: (p.texobj(7, resource="array", array=0xA0), p.array(0xA0, bytes(16), width=4, format=F32)), None,
     "the epilogue lacks the contents of array 0xa0"),
    (None, {"tex_why": "array 0xa0 has a layout mneme does not store (format 0xb0 x 1 channels)"},
     "could not be recorded: array 0xa0 has a layout"),
], ids=["not-live", "outside-arena", "past-the-blob", "no-epilogue-array", "capture-failed"])
def test_what_replay_could_not_recreate_is_named(app, index, tmp_path, snapshots, event, says):
    db, tex = record(app, index, tmp_path, snapshots, event)
    assert not db.replayable and says in db.not_replayable_reason, db.not_replayable_reason
    assert "argument 0 (t)" in db.not_replayable_reason or "could not be recorded" in says


def test_replay_puts_its_own_handles_at_the_recorded_offsets():
    entries = [{"Param": 0, "Offset": 0, "Handle": "0x7"}, {"Param": 2, "Offset": 16, "Handle": "0x9"}]
    raw = struct.pack("<QQQ", 7, BASE, 9)
    out = replay_args(raw, entries, {7: 0x1001, 9: 0x2002}.__getitem__)
    assert struct.unpack("<QQQ", out) == (0x1001, BASE, 0x2002)
    with pytest.raises(MnemeError, match="the DB and its snapshots disagree"):
        replay_args(struct.pack("<QQQ", 8, BASE, 9), entries, lambda h: h)


def test_a_texture_kernel_compiles_for_replay_with_its_handle_left_a_parameter(app, index, tmp_path):
    from dataclasses import replace

    from mneme.replay.pipeline import ReplayPipeline

    db, _ = record(app, index, tmp_path, linear)
    pipe = ReplayPipeline(db.path, device_id=None)
    r = pipe.compile_only(replace(pipe.baseline_config(), specialize=True))
    assert r.status == "compiled", r.error
    assert set(pipe.arg_values()) == {2}, "n is baked in, the handle never"


def test_an_array_that_differs_is_named_with_its_first_values():
    from mneme.record.verdict import Verdict, buffer_verdict
    from mneme.record.verification import BufferPolicy
    from mneme.snapshot import Check

    expected = struct.pack("<8f", *range(8))
    actual = bytearray(expected)
    actual[4:8] = struct.pack("<f", 9.0)
    p = BufferPolicy(("array", 0x55), 0x55, 32, name="4x2", elem="f32", elem_source="the array's format",
                     checks=[Check("array", 0x55, 0x55, 0, 32, "f32")])
    text = str(Verdict(passed=False, buffers=[buffer_verdict(p, memoryview(expected), memoryview(bytes(actual)))]))
    assert "FAIL array 0x55 (4x2, f32 from the array's format, 32 B)" in text
    assert "[1] expected 1 got 9" in text


def test_handles_inside_a_struct_argument_are_entries_at_their_offsets(tmp_path):
    from mneme.ir.textures import TextureUses
    from mneme.record.textures import instance_textures
    from mneme.snapshot import SnapshotType, Writer

    args = struct.pack("<QQiiQ", BASE, 7, 32, 0, 9)  # struct {float *out; tex; int n; tex2;} by value
    with Writer(tmp_path / "p", SnapshotType.PROLOGUE) as w:
        w.blob(BASE, bytes(256))
        linear(w, None)
        w.texobj(9, resource="linear", dev_ptr=BASE + 128, size_bytes=128, format=F32, channels=1)
    with Writer(tmp_path / "e", SnapshotType.EPILOGUE) as w:
        w.blob(BASE, bytes(256))
    uses = TextureUses(params={0: ("tex",)}, offsets={0: (8, 24)})
    entries, why = instance_textures(uses, tmp_path / "p", tmp_path / "e", [(0, 32)], args, ["p"])
    assert not why and [(e["Param"], e["Offset"], e["Handle"]) for e in entries] == [(0, 8, "0x7"), (0, 24, "0x9")]
    entries, why = instance_textures(uses, tmp_path / "p", tmp_path / "e", [(0, 32)], args[:24] + bytes(8), ["p"])
    assert why == ["argument 0 (p at byte 24) holds 0x0, which was no live texture or surface object at the launch "
                   "(created before recording started, or already destroyed)"]
