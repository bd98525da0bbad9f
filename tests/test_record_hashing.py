"""The hashing rules of the record DB (mneme/record/hashing.py)."""

from __future__ import annotations

import struct

import pytest

from mneme.errors import RecordError
from mneme.record.hashing import (
    DYNAMIC_HASH_CHARS,
    dynamic_hash,
    masked_args,
    merge_ranges,
    static_hash_without_ir,
)

STATIC = "ab" * 32
PTR_A = struct.pack("<Q", 0x153940000000)
PTR_B = struct.pack("<Q", 0x153940004000)


def args(ptr: bytes, n: int, scale: float = 2.0) -> bytes:
    return ptr + struct.pack("<if", n, scale)


MASK = [(0, 8)]


def h(**kw):
    base = dict(static=STATIC, grid=(4, 1, 1), block=(256, 1, 1), shared_mem=0, args=args(PTR_A, 1024), masked=MASK)
    base.update(kw)
    return dynamic_hash(**base)


def test_dynamic_hash_is_stable_and_short():
    assert h() == h()
    assert len(h()) == DYNAMIC_HASH_CHARS and int(h(), 16) >= 0


def test_pointer_values_do_not_change_the_dynamic_hash():
    assert h(args=args(PTR_A, 1024)) == h(args=args(PTR_B, 1024))


def test_unmasked_pointer_bytes_would_change_it():
    assert h(args=args(PTR_A, 1024), masked=[]) != h(args=args(PTR_B, 1024), masked=[])


@pytest.mark.parametrize("change", [
    dict(static="cd" * 32),
    dict(grid=(8, 1, 1)),
    dict(grid=(4, 2, 1)),
    dict(block=(128, 1, 1)),
    dict(block=(256, 1, 2)),
    dict(shared_mem=1024),
    dict(args=args(PTR_A, 2048)),
    dict(args=args(PTR_A, 1024, scale=3.0)),
    dict(cluster=(2, 1, 1)),
    dict(cooperative=True),
])
def test_every_launch_field_and_scalar_changes_the_dynamic_hash(change):
    assert h(**change) != h()


def test_unset_cluster_is_the_plain_launch():
    assert h(cluster=None) == h(cluster=(0, 0, 0)) == h()


def test_masked_args_zeroes_exactly_the_masked_ranges():
    buf = bytes(range(1, 25))
    out = masked_args(buf, [(0, 8), (20, 10)])
    assert out[:8] == bytes(8) and out[8:20] == buf[8:20] and out[20:] == bytes(4)
    assert masked_args(buf, []) == buf
    with pytest.raises(RecordError):
        masked_args(buf, [(-1, 4)])


def test_bad_dimensions_are_refused():
    with pytest.raises(RecordError):
        h(grid=(1, 1))
    with pytest.raises(RecordError):
        h(block=(1, 1, 2**32))


def test_static_hash_without_ir_depends_on_the_name_only():
    a = static_hash_without_ir("_Z6vecAddPKfS0_Pfi")
    assert a == static_hash_without_ir("_Z6vecAddPKfS0_Pfi")
    assert a != static_hash_without_ir("_Z6vecAddPfS_S_i")
    assert len(a) == 64


def test_merge_ranges():
    assert merge_ranges([(16, 4), (0, 8), (8, 4), (30, 0), (18, 6)]) == ((0, 12), (16, 8))
