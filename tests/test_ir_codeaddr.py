"""Device function addresses in variables (mneme.ir.codeaddr) and the code map replay builds from them
(mneme.replay.codemap): which words of which variables name a function, read from clang-22's IR; that a kernel
calling through a pointer keeps its module's tables (and the functions they name) in its closure, consistently
at record and at replay; and how app addresses become the replay module's."""

from __future__ import annotations

import struct

import pytest
from irutil import bc_dir, build  # noqa: F401  (fixtures)

from mneme.ir import extract_kernel_closure, link_modules, module_globals
from mneme.ir.codeaddr import closure_roots, code_tables
from mneme.ir.hashing import static_hash
from mneme.ir.module import new_context, parse_module
from mneme.replay import codemap

APPLY_FN, APPLY_TABLE, PLAIN, VIRT = "_Z7applyFnPfPFffEi", "_Z10applyTablePfi", "_Z5plainPf", "_Z4virtPi"
TWICE, PLUS_ONE = "_Z5twicef", "_Z7plusOnef"


@pytest.fixture(scope="module")
def bc(build) -> bytes:
    return build("codetables.cu").read_bytes()


def test_the_words_that_hold_function_addresses_are_found_at_their_offsets(bc):
    tables = code_tables(parse_module(bc))
    assert tables["d_twice"] == [(0, TWICE)]
    assert tables["d_table"] == [(0, TWICE), (8, PLUS_ONE)]
    # struct Mixed { int a; fn f; double d; fn g[2]; }: f at 8, g[1] at 32 (g[0] is null)
    assert tables["d_mixed"] == [(8, PLUS_ONE), (32, TWICE)]
    vtable = tables["_ZTV5Twice"]  # offset-to-top and RTTI first, then f and the two destructors
    assert [off for off, _ in vtable] == [16, 24, 32] and vtable[0][1] == "_ZN5Twice1fEi"
    assert "d_plain" not in tables, "an int variable holds no code address"


def test_a_kernel_that_calls_through_a_pointer_keeps_the_modules_tables(bc):
    mod = parse_module(bc)
    tables = sorted(code_tables(mod, kept=True))
    assert tables == ["d_mixed", "d_table", "d_twice"], "vtables are linkonce: a prune drops them unused"
    assert closure_roots(mod, APPLY_FN) == [APPLY_FN] + tables
    assert closure_roots(mod, PLAIN) == [PLAIN], "no indirect call: the closure stays the kernel's reach"
    closure, _ = extract_kernel_closure([("codetables.cu", bc)], APPLY_FN)
    names = {g.name for g in module_globals(closure)}
    assert {"d_twice", "d_table", "d_mixed"} <= names and "d_plain" not in names
    assert {TWICE, PLUS_ONE} <= {f.name for f in closure.functions if not f.is_declaration}
    plain, _ = extract_kernel_closure([("codetables.cu", bc)], PLAIN)
    assert {g.name for g in module_globals(plain)} == {"d_plain"}


def test_replay_links_and_hashes_the_recorded_closure_as_the_recorder_did(bc):
    closure, _ = extract_kernel_closure([("codetables.cu", bc)], APPLY_FN)
    recorded = closure.as_bitcode()
    at_record = static_hash(parse_module(recorded, context=new_context()), APPLY_FN)
    relinked = link_modules([recorded], APPLY_FN)  # what ReplayPipeline.linked() does with RecordedIR_*.bc
    assert "d_twice" in {g.name for g in module_globals(relinked)}, "replay's prune kept the tables"
    assert static_hash(relinked, APPLY_FN) == at_record
    assert sorted(code_tables(relinked)) == sorted(code_tables(closure))


def _w(*words: int) -> bytes:
    return struct.pack(f"<{len(words)}Q", *words)


def test_the_code_map_pairs_the_apps_addresses_with_the_modules():
    tables = {"d_twice": [(0, "twice")], "d_table": [(0, "twice"), (8, "plusOne")], "gone": [(0, "x")]}
    recorded = {"d_twice": _w(0xA1), "d_table": _w(0xA1, 0xA2), "gone": _w(0xA9)}
    fresh = {"d_twice": _w(0xB1), "d_table": _w(0xB1, 0xB2)}
    cmap = codemap.build(tables, recorded, fresh.get)
    assert cmap.pairs == {0xA1: 0xB1, 0xA2: 0xB2} and cmap.names == {0xA1: "twice", 0xA2: "plusOne"}
    assert not cmap.conflicts
    # the app swapped its table's entries before the launch: twice is paired with two app addresses
    swapped = dict(recorded, d_table=_w(0xA2, 0xA1))
    cmap = codemap.build(tables, swapped, fresh.get)
    assert "twice" in cmap.conflicts and 0xA1 not in cmap.pairs


def test_a_function_pointer_argument_gets_the_modules_address_or_a_clear_error():
    cmap = codemap.CodeMap(pairs={0xA1: 0xB1}, names={0xA1: "twice"})
    raw = _w(0x7000, 0xA1) + struct.pack("<i4x", 5)
    out = codemap.relocate_args(raw, [0, 8, 16], [8, 8, 4], [1], ["v", "f", "n"], cmap)
    assert out == _w(0x7000, 0xB1) + struct.pack("<i4x", 5)
    assert codemap.relocate_args(_w(0, 0), [0, 8], [8, 8], [1], ["v", "f"], cmap) == _w(0, 0), "null stays null"
    with pytest.raises(Exception) as e:
        codemap.relocate_args(_w(0, 0xC3), [0, 8], [8, 8], [1], ["v", "f"], cmap, "rec.json: ")
    msg = str(e.value)
    assert msg.startswith("rec.json: argument 1 (f) holds 0xc3") and "twice" in msg and "cudaMemcpyFromSymbol" in msg
