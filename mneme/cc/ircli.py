"""`mneme ir BINARY [--json]`: the device IR modules embedded in a binary and its shared libraries,
with the kernels each defines (mangled and demangled)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List

from mneme.cc.embedded import EmbeddedModule, collect_embedded
from mneme.errors import RecordError
from mneme.ir.module import demangle, module_kernels, parse_module


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("binary", type=Path, help="executable, shared library or object built with `mneme cc`")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--ld-library-path",
        default=None,
        help="search path for the binary's shared libraries (default: $LD_LIBRARY_PATH)",
    )


def describe(mod: EmbeddedModule) -> Dict[str, object]:
    """One module as a JSON-ready dict, with the kernels its bitcode defines."""
    kernels = module_kernels(parse_module(mod.bitcode, name=f"{mod.elf_path}: {mod.name}"))
    return {
        "elf": str(mod.elf_path),
        "name": mod.name,
        "source": mod.source,
        "arch": mod.arch,
        "sha256": mod.sha256,
        "bytes": len(mod.bitcode),
        "kernels": [{"name": k, "demangled": demangle(k)} for k in kernels],
    }


def list_modules(binary: Path, ld_library_path: str = None) -> List[Dict[str, object]]:
    if not binary.exists():
        raise RecordError(f"{binary}: no such file")
    mods = collect_embedded(binary, ld_library_path)
    if not mods:
        raise RecordError(f"{binary}: no embedded device IR (section .mneme_ir): build it with `mneme cc`")
    return [describe(m) for m in mods]


def run(args: argparse.Namespace) -> int:
    modules = list_modules(args.binary, args.ld_library_path)
    if args.json:
        print(json.dumps({"binary": str(args.binary), "modules": modules}, indent=2))
        return 0
    elf = None
    for m in modules:
        if m["elf"] != elf:
            elf = m["elf"]
            print(elf)
        print(f"  {m['name']}  ({m['arch']}, {m['bytes']} bytes, sha256 {str(m['sha256'])[:12]})  {m['source']}")
        for k in m["kernels"]:
            print(f"    {k['name']}" + (f"  {k['demangled']}" if k["demangled"] != k["name"] else ""))
        if not m["kernels"]:
            print("    (no kernels)")
    return 0
