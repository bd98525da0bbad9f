"""TUNED arguments -> wisdom -> manifest entries with their cubins.

A TUNED argument is a wisdom file, a `mneme tune` results directory, or a directory holding such results
(a record DB directory tuned into subdirectories): directories are searched up to three levels deep for
results directories (config.json + best.json). The cubin of each entry comes from the tune's compile cache
when it holds the code hash, else it is rebuilt from the recorded IR and the configuration through
mneme/ir exactly as replay builds it (ReplayPipeline.compile).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from mneme.apply.manifest import (
    ArgMatch, Entry, Variable, describe, param_offsets, scaled_refusal, unmasked_segments,
)
from mneme.apply.wisdom import KernelWisdom, Wisdom, from_tune_results, merge, read_wisdom
from mneme.errors import ConfigurationError, MnemeError


def results_dirs(root: Path, depth: int = 3) -> List[Path]:
    """The `mneme tune` results directories (config.json + best.json) at or below `root`, `depth` levels deep."""
    if (root / "config.json").is_file() and (root / "best.json").is_file():
        return [root]
    if depth == 0:
        return []
    out: List[Path] = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "cache"):
        out += results_dirs(sub, depth - 1)
    return out


def load_tuned(paths: Sequence[str], rule: Optional[str] = None) -> Wisdom:
    """One wisdom of all TUNED arguments; `rule` (exact/scaled) overrides the files' rules."""
    items: List[Wisdom] = []
    for text in paths:
        p = Path(text)
        if p.is_file():
            items.append(read_wisdom(p))
        elif p.is_dir():
            dirs = results_dirs(p)
            if not dirs:
                raise ConfigurationError(
                    f"{p}: no mneme tune results under it (a results directory holds config.json and best.json; "
                    "run `mneme tune -rdb DB -o DIR` first, or pass a wisdom file)")
            for d in dirs:
                try:
                    items.append(from_tune_results(d))
                except ConfigurationError as e:
                    if len(dirs) == 1:
                        raise
                    print(f"mneme apply: skipping {d}: {e}", file=sys.stderr)
        else:
            raise ConfigurationError(f"{p}: no such wisdom file or tune results directory")
    w = merge(items)
    if rule:
        for k in w.kernels:
            k.rule = rule  # type: ignore[assignment]
    return w


def _masked(record, dynamic_hash: str, pointer_ranges: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    attrs = (record.extra.get("InstanceAttributes") or {}).get(dynamic_hash) or {}
    masked = attrs.get("MaskedBytes")
    return [tuple(m) for m in masked] if masked is not None else pointer_ranges


def prepare_entry(k: KernelWisdom, workdir: Path, arch: Optional[str] = None) -> Tuple[Entry, List[str]]:
    """The manifest entry of one wisdom kernel and its notes (e.g. why `scaled` fell back to `exact`)."""
    from mneme.ir import CompileCache, kernel_params, module_globals
    from mneme.replay.pipeline import ReplayPipeline
    from mneme.config import MeasurementSettings

    notes: List[str] = []
    cache_dir = (k.provenance.compile_cache if k.provenance.compile_cache and Path(k.provenance.compile_cache).is_dir()
                 else str(workdir / "cache"))
    settings = MeasurementSettings(arch=arch or k.arch)
    pipe = ReplayPipeline(k.record.db, k.record.dynamic_hash or k.dynamic_hash, device_id=None, settings=settings,
                          cache=CompileCache(cache_dir))
    rec = pipe.record
    if rec.kernel_name != k.kernel:
        raise ConfigurationError(f"{k.record.db} records {rec.kernel_name}, the wisdom names {k.kernel}")
    if k.static_hash and rec.static_hash != k.static_hash:
        raise ConfigurationError(
            f"{k.record.db}: static hash {rec.static_hash[:16]} differs from the wisdom's {k.static_hash[:16]} "
            "(the kernel's code changed since it was tuned: record and tune it again)")
    inst = pipe.instance
    config = k.configuration()
    if k.cubin and Path(k.cubin).is_file():
        cubin_path = Path(k.cubin)
    else:
        ck = pipe.compile(config)
        if k.code_hash and ck.code_hash != k.code_hash:
            notes.append(f"rebuilt code hash {ck.code_hash[:16]} differs from the tuned {k.code_hash[:16]} "
                         "(another LLVM or ptxas?)")
        cubin_path = workdir / f"{ck.code_hash[:32]}.cubin"
        cubin_path.write_bytes(ck.cubin.cubin)
    linked = pipe.linked()
    params = kernel_params(linked, k.kernel)
    sizes = [p.size for p in params]
    offsets = param_offsets(sizes, [p.align for p in params])
    ptr_ranges = [(offsets[p.index] + o, n) for p in params for o, n in p.pointer_ranges]
    masked = _masked(rec, inst.dynamic_hash, ptr_ranges)
    values = [bytes.fromhex(a) for a in inst.args]
    if len(values) != len(params):
        raise ConfigurationError(f"{k.record.db}: {len(values)} recorded arguments, the IR declares {len(params)}")

    rule = k.rule
    if rule == "scaled":
        why = scaled_refusal(config, inst.grid_dim, inst.block_dim)
        if why:
            notes.append(f"rule scaled refused, exact only: {why}")
            rule = "exact"
    matches: List[ArgMatch] = []
    if rule == "exact":
        for p, v in zip(params, values):
            matches += [ArgMatch(p.index, off, seg) for off, seg in unmasked_segments(v, offsets[p.index], masked)]
    elif config.specialize:
        for i in pipe.arg_values():
            matches.append(ArgMatch(i, 0, values[i]))
    safety = k.provenance.launch_safety or "balanced"
    same_block = config.block.to_dict() == inst.block_dim.to_dict()
    variables = [Variable(g.name, g.size, g.addrspace == 4) for g in module_globals(linked) if g.defined and g.size > 0]
    e = Entry(
        kernel=k.kernel, cubin=str(cubin_path.resolve()), rule=rule, rec_grid=inst.grid_dim, rec_block=inst.block_dim,
        rec_shared=inst.shared_mem, tuned=config, round_up=(safety != "conservative") or same_block,
        param_sizes=sizes, param_offsets=offsets, matches=matches, variables=variables,
        pointers=[(p.index, o) for p in params for o, _ in p.pointer_ranges],
        demangled=k.demangled or rec.demangled_name, dynamic_hash=inst.dynamic_hash, expected_speedup=k.expected_speedup,
    )
    e.description = describe(e)
    return e, notes


def prepare(w: Wisdom, workdir: Path, arch: Optional[str] = None) -> Tuple[List[Entry], Dict[str, List[str]]]:
    """Entries (exact ones first, so an exact instance wins over a scaled rule) and notes per kernel."""
    workdir.mkdir(parents=True, exist_ok=True)
    entries: List[Entry] = []
    notes: Dict[str, List[str]] = {}
    for k in w.kernels:
        try:
            e, n = prepare_entry(k, workdir, arch)
        except MnemeError as err:
            notes.setdefault(k.kernel, []).append(f"not applied: {err}")
            continue
        entries.append(e)
        notes.setdefault(k.kernel, []).extend(n)
    entries.sort(key=lambda e: e.rule != "exact")
    (workdir / "entries.json").write_text(json.dumps([{
        "kernel": e.kernel, "rule": e.rule, "description": e.description, "cubin": e.cubin,
        "expected_speedup": e.expected_speedup, "dynamic_hash": e.dynamic_hash} for e in entries], indent=2) + "\n")
    return entries, notes
