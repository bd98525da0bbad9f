"""Why trials failed, for the summary: each failed trial with the line of its error that says why, and the
reasons counted, so a knob value that breaks compiles shows up as one reason with a count, not as N opaque
`compile_error`s (trials.jsonl keeps every error in full)."""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, Optional

from mneme.tune.objective import FAILURES

#: failed trials listed one by one in the summary (all of them are in trials.jsonl)
MAX_FAILURES_LISTED = 20
_NUMBERS = re.compile(r"\d+")


_ERROR_LINE = re.compile(r"\berror\s*:", re.I)


def failure_reason(error: Optional[str]) -> str:
    """What says why a trial failed: its error's first line, and the first later line that reads `error:`
    (the compiler's own words under mneme's line: LLVM's parser, ptxas)."""
    lines = [ln.strip() for ln in (error or "").splitlines() if ln.strip()]
    if not lines:
        return "no error text"
    detail = next((ln for ln in lines[1:] if _ERROR_LINE.search(ln)), None)
    return (f"{lines[0]} | {detail}" if detail else lines[0])[:300]


def failures(counted: Iterable[Any]) -> Dict[str, Any]:
    """Why trials failed: each failed trial (number, status, reason, what it set), and the reasons counted
    (numbers folded, so 'line 171' and 'line 173' of the same parse error count together)."""
    rows, counts, example = [], {}, {}
    for r in counted:
        if r.status not in FAILURES:
            continue
        reason = failure_reason(r.result.error if r.result else "; ".join(r.reasons))
        key = f"{r.status}: {_NUMBERS.sub('N', reason)}"
        counts[key] = counts.get(key, 0) + 1
        example.setdefault(key, reason)
        if len(rows) < MAX_FAILURES_LISTED:
            rows.append({"number": r.number, "status": r.status, "reason": reason, "params": r.params})
    reasons = [{"status": k.split(":", 1)[0], "count": n, "reason": example[k]}
               for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return {"trials": rows, "reasons": reasons, "listed": len(rows), "total": sum(counts.values())}
