"""The snapshot format's texture records (native/snapshot.c: ARRY and TEXO): written and read back field
by field through the one C implementation, array sizes checked against the layout (levels, layers, cubemap
faces), and what the writer refuses."""

from __future__ import annotations

import struct

import pytest

from mneme.errors import SnapshotError
from mneme.snapshot import Snapshot, SnapshotType, Writer, _native

F32, U8, U16 = 0x20, 0x01, 0x02
LAYERED, CUBEMAP = 0x01, 0x04


def test_arrays_and_objects_round_trip(tmp_path):
    path = tmp_path / "p.prologue"
    vol = struct.pack("<24f", *range(24))
    with Writer(path, SnapshotType.PROLOGUE) as w:
        w.blob(0x1000, bytes(256))
        w.array(0xA0, vol, width=4, height=3, depth=2, format=F32)
        w.array(0xB0, bytes(4 * 4 * 2 + 2 * 2 * 2 + 1 * 2), width=4, height=4, format=U16, levels=3)
        w.texobj(0x11, resource="array", array=0xA0, filter_mode=1, address_mode=[0, 1, 2], tex_flags=2,
                 border_color=[0.5, 0, 0, 1], has_view=1, view_format=0x15, view_width=4, view_height=3,
                 last_layer=1)
        w.texobj(0x12, resource="mipmapped", array=0xB0, mipmap_filter_mode=1, max_mipmap_level_clamp=2.0)
        w.texobj(0x13, surface=True, resource="pitch2d", dev_ptr=0x1000, width=16, height=4, pitch=64,
                 format=F32, channels=1)
    with Snapshot.read(path) as s:
        a, b = s.arrays
        assert (a.handle, a.width, a.height, a.depth, a.elem, a.levels) == (0xA0, 4, 3, 2, "f32", 0)
        assert bytes(a.contents) == vol and len(b.contents) == 42 and b.elem == "u16"
        t, m, p = s.texobjs
        assert (t.handle, t.surface, t.resource) == (0x11, False, "array")
        assert t.fields["address_mode"] == [0, 1, 2] and t.fields["border_color"] == [0.5, 0.0, 0.0, 1.0]
        assert (t.fields["filter_mode"], t.fields["tex_flags"], t.fields["view_format"], t.fields["last_layer"]) == (1, 2, 0x15, 1)
        assert m.resource == "mipmapped" and m.fields["max_mipmap_level_clamp"] == 2.0
        assert p.surface and (p.fields["dev_ptr"], p.fields["pitch"], p.fields["height"]) == (0x1000, 64, 4)
        assert s.find_array(0xB0) is b and s.find_array(0xC0) is None


@pytest.mark.parametrize("dims,flags,levels,elem_bytes,want", [
    ((16, 0, 0), 0, 0, 4, 64),                  # 1D
    ((8, 4, 0), 0, 4, 1, 32 + 8 + 2 + 1),       # 2D mipmapped: 8x4, 4x2, 2x1, 1x1
    ((4, 4, 4), 0, 3, 1, 64 + 8 + 1),           # 3D mipmapped: depth halves too
    ((4, 4, 3), LAYERED, 2, 1, 48 + 12),        # layers do not halve
    ((8, 8, 6), CUBEMAP, 2, 4, 6 * 256 + 6 * 64),  # nor do the 6 faces of a cubemap
])
def test_array_bytes_follow_the_levels(dims, flags, levels, elem_bytes, want):
    ffi, lib = _native()
    a = ffi.new("mn_array *")
    a.width, a.height, a.depth = dims
    a.format, a.channels, a.flags, a.levels = {1: U8, 4: F32}[elem_bytes], 1, flags, levels
    assert lib.mn_array_bytes(a) == want


@pytest.mark.parametrize("write,says", [
    (lambda w: w.array(0xA0, bytes(15), width=4, format=F32), "holds 15 bytes, its dimensions need 16"),
    (lambda w: w.array(0xA0, bytes(16), width=4, format=0xB0), "not an array mneme stores"),
    (lambda w: w.array(0xA0, bytes(48), width=4, format=F32, channels=3), "not an array mneme stores"),
    (lambda w: w.texobj(1, resource="array"), "names no array"),
    (lambda w: w.texobj(1, resource="linear", dev_ptr=0x1000, format=0x99), "unknown element format"),
])
def test_the_writer_refuses_what_it_could_not_read_back(tmp_path, write, says):
    with Writer(tmp_path / "p", SnapshotType.PROLOGUE) as w:
        with pytest.raises(SnapshotError, match=says):
            write(w)


def test_objects_belong_to_prologues_and_arrays_to_both(tmp_path):
    with Writer(tmp_path / "e", SnapshotType.EPILOGUE) as w:
        w.array(0xA0, bytes(16), width=4, format=F32)
        with pytest.raises(SnapshotError, match="only a prologue holds texture objects"):
            w.texobj(1, resource="array", array=0xA0)
    with Snapshot.read(tmp_path / "e") as s:
        assert [a.handle for a in s.arrays] == [0xA0] and s.texobjs == []


def test_a_damaged_array_record_is_refused_with_its_offset(tmp_path):
    path = tmp_path / "p"
    with Writer(path, SnapshotType.PROLOGUE) as w:
        w.array(0xA0, bytes(16), width=4, format=F32)
    raw = bytearray(path.read_bytes())
    raw[32 + 16 + 8] ^= 0xFF  # the array's width, inside the first record (its checksum no longer matches)
    path.write_bytes(bytes(raw))
    with pytest.raises(SnapshotError, match=r"byte 32: checksum mismatch"):
        Snapshot.read(path)
