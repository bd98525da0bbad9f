"""The sections of a cubin (an ELF file), read once and fast.

Every compile reads its cubin's sections twice (mneme.ir.codegen.binary_digest and
mneme.ir.ptxas.constant_banks). pyelftools builds its parsing structures anew for every ELFFile, about 1.5-4 ms
of pure Python per cubin on the dev machine, 5-12 % of a configuration's whole compile. A cubin is a 64-bit
little-endian ELF with an ordinary section table, which `struct` reads in tens of microseconds; anything else
(32-bit or big-endian ELF, an extended section count, compressed sections) is read with pyelftools, so both
readers give the same sections for every input.
"""

from __future__ import annotations

import io
import struct
from typing import List, NamedTuple

SHT_NOBITS = 8
_SHF_COMPRESSED = 0x800
_SHN_XINDEX = 0xFFFF
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")


class Section(NamedTuple):
    name: str
    #: SHT_NOBITS: the section takes memory but no bytes in the file (.bss, .nv.shared.*)
    nobits: bool
    #: sh_size (for a NOBITS section the memory it takes)
    size: int
    #: the bytes in the file (b"" for a NOBITS section)
    data: bytes


def sections(elf: bytes) -> List[Section]:
    """Every section of `elf` in table order (the null section first), as pyelftools' iter_sections lists them.
    Raises ValueError for bytes that are not an ELF file."""
    fast = _fast_sections(elf)
    return fast if fast is not None else _elftools_sections(elf)


def _fast_sections(elf: bytes):
    if len(elf) < _EHDR.size or elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return None  # not 64-bit little-endian: pyelftools decides (and raises for non-ELF)
    hdr = _EHDR.unpack_from(elf)
    shoff, shentsize, shnum, shstrndx = hdr[6], hdr[11], hdr[12], hdr[13]
    if shnum == 0 or shstrndx == _SHN_XINDEX or shentsize < _SHDR.size or shoff + shnum * shentsize > len(elf):
        return None
    raw = [_SHDR.unpack_from(elf, shoff + i * shentsize) for i in range(shnum)]
    if shstrndx >= shnum or any(h[2] & _SHF_COMPRESSED for h in raw):
        return None
    str_off, str_size = raw[shstrndx][4], raw[shstrndx][5]
    strtab = elf[str_off:str_off + str_size]
    out = []
    for h in raw:
        end = strtab.find(b"\0", h[0])
        name = strtab[h[0]:end if end >= 0 else len(strtab)].decode("utf-8", errors="replace")
        nobits = h[1] == SHT_NOBITS
        out.append(Section(name, nobits, h[5], b"" if nobits else elf[h[4]:h[4] + h[5]]))
    return out


def _elftools_sections(elf: bytes) -> List[Section]:
    from elftools.elf.elffile import ELFFile

    try:
        out = []
        for s in ELFFile(io.BytesIO(elf)).iter_sections():
            nobits = s.header.sh_type == "SHT_NOBITS"
            out.append(Section(s.name, nobits, s.data_size, b"" if nobits else s.data()))
        return out
    except Exception as e:  # noqa: BLE001 - pyelftools raises ELFError, struct errors and more on bad input
        raise ValueError(f"not a readable ELF file: {e}") from None
