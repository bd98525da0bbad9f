"""What a trial's configuration changed in the compiled code, against the baseline: registers, spills, PTX
instructions, cubin size, and whether the machine code is the baseline's own (then any time difference is noise).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from mneme.config import ExperimentResult

#: (result field, label) compared against the baseline
FIELDS = (("reg_usage", "registers"), ("spill_stores", "spill_stores"), ("spill_loads", "spill_loads"),
          ("ptx_instructions", "ptx_instructions"), ("obj_size", "cubin_bytes"), ("local_mem_usage", "local_mem"))


def compiled(result: Optional[ExperimentResult]) -> bool:
    return result is not None and bool(result.binary_digest or result.obj_size)


def code_change(baseline: Optional[ExperimentResult], result: Optional[ExperimentResult]) -> Optional[Dict[str, Any]]:
    """{label: [baseline, trial]} for each quantity, `same_code` (equal binary digests) and `same_binary_as`;
    None when either side was not compiled."""
    if not (compiled(baseline) and compiled(result)):
        return None
    out: Dict[str, Any] = {label: [getattr(baseline, f), getattr(result, f)] for f, label in FIELDS}
    out["same_code"] = bool(result.binary_digest) and result.binary_digest == baseline.binary_digest
    if result.same_binary_as:
        out["same_binary_as"] = result.same_binary_as
    return out


def code_change_text(change: Optional[Dict[str, Any]]) -> str:
    """`registers 32->26, ptx 420->537 instructions, spills 0->0` (or `the baseline's machine code`)."""
    if not change:
        return ""
    if change.get("same_code"):
        return "the baseline's machine code"
    parts = []
    for label, text in (("registers", "registers"), ("ptx_instructions", "PTX instructions"),
                        ("cubin_bytes", "cubin bytes")):
        a, b = change[label]
        parts.append(f"{text} {a}->{b}" if a != b else f"{text} {a}")
    (sa, ta), (sb, tb) = change["spill_stores"], change["spill_loads"]
    if sa or sb or ta or tb:
        parts.append(f"spills (st/ld bytes) {sa}/{sb}->{ta}/{tb}")
    return ", ".join(parts)
