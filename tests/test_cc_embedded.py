"""The embedded-IR section format, reading it from ELF files and archives, and finding the shared
libraries that carry it. Real objects and libraries (assembled with clang, linked with gcc), no CUDA."""

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from mneme.cc.cc import Driver
from mneme.cc.cmdline import parse
from mneme.cc.embedded import (
    MAGIC,
    SECTION,
    archive_members,
    archive_rdc_sections,
    collect_embedded,
    has_embedded,
    ldd_libraries,
    libraries_with_ir,
    pack_entry,
    read_embedded,
    shared_library_deps,
    unpack_entries,
)
from mneme.cc.toolchain import Toolchain
from mneme.errors import RecordError

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed")


def entry(name: str, payload: bytes) -> bytes:
    return pack_entry(payload, {"name": name, "source": f"/src/{name}", "arch": "sm_90"})


def test_round_trip_with_linker_padding():
    a, b = entry("a.cu", b"BC\xc0\xde" + b"a" * 13), entry("b.cu", b"BC\xc0\xde" + b"b" * 40)
    assert len(a) % 8 == 0
    mods = unpack_entries(a + b"\0" * 16 + b, "app")
    assert [(m.name, m.source, m.arch) for m in mods] == [
        ("a.cu", "/src/a.cu", "sm_90"),
        ("b.cu", "/src/b.cu", "sm_90"),
    ]
    assert mods[1].bitcode == b"BC\xc0\xde" + b"b" * 40
    assert mods[1].sha256 == hashlib.sha256(mods[1].bitcode).hexdigest()
    assert mods[1].offset == len(a) + 16


def test_bad_magic_names_file_and_offset():
    a = entry("a.cu", b"x" * 10)
    bad = bytearray(entry("b.cu", b"y" * 10))
    bad[0:8] = b"NOTMNEME"
    with pytest.raises(RecordError, match=rf"app: section {SECTION} offset {len(a)}: bad magic"):
        unpack_entries(a + bytes(bad), "app")


def test_flipped_bitcode_bit_is_caught():
    e = bytearray(entry("a.cu", b"z" * 64))
    e[-12] ^= 0x01
    with pytest.raises(RecordError, match="offset 0: bitcode checksum mismatch"):
        unpack_entries(bytes(e), "lib.so")


def test_truncated_entry():
    e = entry("a.cu", b"z" * 64)
    with pytest.raises(RecordError, match="run past the section end"):
        unpack_entries(e[:-16], "app")
    with pytest.raises(RecordError, match="truncated entry header"):
        unpack_entries(e[:20], "app")


def test_unknown_version_asks_for_a_rebuild():
    e = bytearray(entry("a.cu", b"z"))
    e[8] = 9
    with pytest.raises(RecordError, match="version 9.*rebuild the binary"):
        unpack_entries(bytes(e), "app")


# ---- ELF files ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def driver():
    return Driver(parse([]), Toolchain.locate(), verbose=False)


def section_object(driver, tmp_path: Path, contents: bytes, name: str) -> Path:
    obj = Path(driver.section_object(contents, str(tmp_path), name))
    return obj.rename(tmp_path / name)


def test_read_from_object_and_not_elf(driver, tmp_path):
    obj = section_object(driver, tmp_path, entry("k.cu", b"bits") + entry("k.cu", b"bits"), "k.o")
    mods = read_embedded(obj)
    assert [m.name for m in mods] == ["k.cu"]  # the duplicate (same sha256) is listed once
    assert mods[0].elf_path == obj
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(RecordError, match=r"notes.txt: not an ELF"):
        read_embedded(text)
    assert not has_embedded(text)


def test_corrupt_section_in_a_file(driver, tmp_path):
    payload = b"P" * 200
    obj = section_object(driver, tmp_path, entry("k.cu", payload), "k.o")
    data = bytearray(obj.read_bytes())
    at = data.index(payload)
    data[at + 5] ^= 0xFF
    obj.write_bytes(bytes(data))
    with pytest.raises(RecordError, match=rf"{obj}: section {SECTION} offset 0: bitcode checksum mismatch"):
        read_embedded(obj)


def test_archive_members_and_rdc_sections(driver, tmp_path):
    plain = section_object(driver, tmp_path, entry("plain.cu", b"p"), "plain_member_with_a_long_name.o")
    # An RDC member carries clang's offload section next to ours.
    asm = tmp_path / "rdc.s"
    asm.write_text('\t.section .llvm.offloading,"e",@progbits\n\t.byte 1\n')
    off = tmp_path / "off.o"
    subprocess.run([driver.tc.clang_c, "-c", "-x", "assembler", str(asm), "-o", str(off)], check=True)
    ir = section_object(driver, tmp_path, entry("rdc.cu", b"r"), "ir.o")
    rdc = tmp_path / "rdc.o"
    subprocess.run(["ld", "-r", str(off), str(ir), "-o", str(rdc)], check=True)
    archive = tmp_path / "libdev.a"
    subprocess.run(["ar", "rcs", str(archive), str(plain), str(rdc)], check=True)

    members = dict(archive_members(archive))
    assert set(members) == {"plain_member_with_a_long_name.o", "rdc.o"}
    assert members["rdc.o"] == rdc.read_bytes()
    sections = archive_rdc_sections(archive)
    assert [m.name for s in sections for m in unpack_entries(s)] == ["rdc.cu"]
    with pytest.raises(RecordError, match="not an ar archive"):
        list(archive_members(plain))


# ---- shared libraries -----------------------------------------------------------------------


def gcc(*args):
    subprocess.run([GCC, *map(str, args)], check=True, capture_output=True)


@needs_gcc
def test_dependencies_through_runpath_rpath_and_library_path(driver, tmp_path):
    libdir, bindir = tmp_path / "lib", tmp_path / "bin"
    libdir.mkdir()
    bindir.mkdir()
    (tmp_path / "b.c").write_text("int b(void) { return 2; }\n")
    (tmp_path / "a.c").write_text("int b(void); int a(void) { return b() + 1; }\n")
    (tmp_path / "m.c").write_text("int a(void); int main(void) { return a() - 3; }\n")
    ir = section_object(driver, tmp_path, entry("a.cu", b"A"), "a_ir.o")
    gcc("-shared", "-fPIC", tmp_path / "b.c", "-o", libdir / "libb.so")
    # liba finds libb next to itself through DT_RUNPATH=$ORIGIN; it also carries device IR.
    gcc("-shared", "-fPIC", tmp_path / "a.c", ir, "-L", libdir, "-lb", "-Wl,--enable-new-dtags,-rpath,$ORIGIN",
        "-o", libdir / "liba.so")
    rpath = f"-Wl,--disable-new-dtags,-rpath,{libdir}"
    gcc(tmp_path / "m.c", "-L", libdir, "-la", rpath, "-o", bindir / "rpath_app")
    gcc(tmp_path / "m.c", "-L", libdir, "-la", "-o", bindir / "plain_app")

    deps = shared_library_deps(bindir / "rpath_app", ld_library_path="")
    assert deps[0] == libdir / "liba.so" and libdir / "libb.so" in deps  # breadth first, like the loader
    assert any(p.name.startswith("libc.so") for p in deps)
    # ldd prints the dynamic loader apart ("/lib64/ld-linux-x86-64.so.2 (0x...)", no "=>").
    ldd = {p.resolve() for p in ldd_libraries(bindir / "rpath_app")}
    assert {p for p in deps if not p.name.startswith("ld-")} == ldd
    assert subprocess.run([bindir / "rpath_app"]).returncode == 0

    # Without rpath the libraries are found only through the library path.
    assert libdir / "liba.so" not in shared_library_deps(bindir / "plain_app", ld_library_path="")
    found = shared_library_deps(bindir / "plain_app", ld_library_path=str(libdir))
    assert {libdir / "liba.so", libdir / "libb.so"} <= set(found)

    assert libraries_with_ir(bindir / "rpath_app", ld_library_path="") == [libdir / "liba.so"]
    mods = collect_embedded(bindir / "rpath_app", ld_library_path="")
    assert [(m.name, m.elf_path) for m in mods] == [("a.cu", libdir / "liba.so")]


def test_magic_is_eight_bytes():
    assert len(MAGIC) == 8 and entry("x", b"")[:8] == MAGIC
