"""Texture and surface parameters read from real clang-22 IR (mneme/ir/textures.py): which parameters
are handles, which handles come from memory, which surfaces are written (that the kernel table keeps
handles out of specialization: tests/test_record_textures.py)."""

import pytest
from irutil import bc_dir, build  # noqa: F401  (fixtures)

from mneme.ir import link_modules, parse_module
from mneme.ir.textures import texture_uses

KERNELS = {
    "fetch1d": "_Z7fetch1dyPfi",
    "copy2d": "_Z6copy2dyxyi",
    "pick": "_Z4pickyyiPf",
    "from_memory": "_Z11from_memoryPK6HolderPf",
    "no_textures": "_Z11no_texturesxPf",
    "by_value": "_Z8by_value6Params",
}


@pytest.fixture(scope="module")
def uses(build):
    bc = build("textures.cu")
    mod = parse_module(bc.read_bytes())
    return {name: texture_uses(mod, mangled) for name, mangled in KERNELS.items()}


def test_a_handle_parameter_is_found_through_the_headers_inline_ptx(uses):
    u = uses["fetch1d"]
    assert u.params == {0: ("tex",)} and not u.from_memory and not u.writes
    assert "clone" in u.analyzed


def test_a_surface_write_and_a_texture_read_in_one_kernel(uses):
    u = uses["copy2d"]
    assert u.params == {0: ("sust",), 2: ("tex",)}  # the i64 scalar (parameter 1) is no handle
    assert u.writes == (0,) and not u.from_memory


def test_a_handle_selected_between_two_parameters_makes_both_handles(uses):
    assert set(uses["pick"].params) == {0, 1} and not uses["pick"].from_memory


def test_handles_read_from_memory_are_named_not_guessed(uses):
    u = uses["from_memory"]
    assert not u.params
    text = " ".join(u.from_memory)
    assert "g_tex" in text and "through a pointer" in text and len(u.from_memory) == 2


def test_handles_in_a_struct_passed_by_value_are_found_at_their_offsets(uses):
    u = uses["by_value"]
    assert u.params == {0: ("tex",)} and u.offsets == {0: (8, 24)} and not u.from_memory


def test_a_kernel_without_texture_instructions_has_no_handles(uses):
    u = uses["no_textures"]
    assert not u.any and not u.params and not u.from_memory
