"""`mneme ir BINARY [--json]`: the device IR modules embedded in a binary and its shared libraries,
with the kernels each defines (mangled and demangled)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List

from mneme.cc.embedded import EmbeddedModule, build_settings, collect_embedded
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
        "build": build_settings(mod),
        "kernels": [{"name": k, "demangled": demangle(k)} for k in kernels],
    }


def list_modules(binary: Path, ld_library_path: str = None) -> List[Dict[str, object]]:
    if not binary.exists():
        raise RecordError(f"{binary}: no such file")
    mods = collect_embedded(binary, ld_library_path)
    if not mods:
        raise RecordError(f"{binary}: no embedded device IR (section .mneme_ir): build it with `mneme cc`")
    return [describe(m) for m in mods]


def _settings_line(b: Dict[str, object]) -> str:
    """One line of a module's device build settings: "nvcc -O3 ftz prec-div=false ... ptxas -v"."""
    words = [str(b.get("compiler")), f"-O{b.get('opt_level')}"]
    words += [f"ftz={str(b.get('ftz')).lower()}", f"prec-div={str(b.get('prec_div')).lower()}",
              f"prec-sqrt={str(b.get('prec_sqrt')).lower()}", f"fmad={str(b.get('fmad')).lower()}"]
    if b.get("maxrregcount") is not None:
        words.append(f"maxrregcount={b['maxrregcount']}")
    if b.get("ptxas_opt") is not None:
        words.append(f"ptxas-O{b['ptxas_opt']}")
    if b.get("ptxas"):
        words.append("ptxas " + " ".join(map(str, b["ptxas"])))
    if b.get("rdc"):
        words.append("rdc" + ("+dlto" if b.get("dlto") else ""))
    if b.get("compiler") == "unknown":
        words.append("(not recorded: built before mneme recorded build settings)")
    return " ".join(words)


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
        print(f"    built: {_settings_line(m['build'])}")
        for k in m["kernels"]:
            print(f"    {k['name']}" + (f"  {k['demangled']}" if k["demangled"] != k["name"] else ""))
        if not m["kernels"]:
            print("    (no kernels)")
    return 0
