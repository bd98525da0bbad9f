"""What a failed replay says about device state its snapshots do not hold: the device heap (kernels that
malloc/new in device code, recorded as `DeviceState: ["heap"]`) and context limits replay could not set.

A kernel that reads objects another kernel allocated on the device heap (newdelete's containerFill reads
the container vectorCreate made with `new`) reads memory no recorded allocation holds; its own IR need not
call malloc at all. So a failure in a recording whose other kernels use the heap names those kernels.

The notes lead the error (`with_notes`): they are the likely cause, the error (a verdict's per-buffer diff,
often hundreds of characters) what it did; a reader of the first line, or of a shortened error, sees why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from mneme.record.db import RecordedExecution


def heap_kernels(record_db: str) -> List[str]:
    """Demangled names of the kernels recorded beside `record_db` (same directory) that use the device heap."""
    out: List[str] = []
    for path in sorted(Path(record_db).parent.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and "heap" in (doc.get("DeviceState") or []):
            out.append(doc.get("DemangledName") or doc.get("KernelName") or path.stem)
    return out


def failure_notes(record: RecordedExecution, record_db: str, limit_problems: Dict[str, str]) -> List[str]:
    """Sentences to append to a failed replay's error (empty when device state cannot be the cause)."""
    notes: List[str] = []
    state = record.extra.get("DeviceState") or []
    if "heap" in state:
        notes.append("this kernel allocates from the device heap (malloc/new in device code), which is not "
                     "recorded: replay's heap hands out other addresses than the app's")
    else:
        others = heap_kernels(record_db)
        if others:
            notes.append(f"the app's kernel(s) {', '.join(others[:4])} allocate from the device heap, which is not "
                         "recorded: if this kernel reads objects they allocated (heap pointers kept in memory), "
                         "those reads find no recorded memory")
    if "fnptr" in state:
        notes.append("the kernel calls device functions through pointers it loads from memory (virtual functions, "
                     "function tables): replay relocates those its module's variables hold, but pointers the app "
                     "stored in device memory (objects an earlier launch made, buffers copied from the host) hold "
                     "addresses of the app's code, not of replay's module")
    for name, why in sorted(limit_problems.items()):
        notes.append(f"context limit {name}: {why}")
    return notes


def with_notes(error: str, notes: List[str]) -> str:
    """A failed replay's error with the device-state notes first (the cause), then the error itself."""
    if not notes:
        return error
    head = "; ".join(notes)
    return f"{head}\n{error}" if error else head
