"""`mneme apply` as a function: TUNED -> wisdom -> manifest + cubins -> observed and applied runs -> report.

    apply_app(["mneme-tune/vecAdd"], ["./vecadd"], check=1)          -> ApplyReport
    campaign_apply(["rec/"], ["./app", "args"])                      -> {"kernels_applied", "app_ok", ...}
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from mneme.apply.evidence import ApplyReport, build_report, track, write_report
from mneme.apply.manifest import write_manifest
from mneme.apply.prepare import load_tuned, prepare
from mneme.apply.runner import ApplyRunner
from mneme.errors import ConfigurationError


def apply_app(tuned: Sequence[str], argv: Sequence[str], *, workdir: Optional[str] = None, rule: Optional[str] = None,
              check: int = 0, rounds: int = 1, atol: Optional[float] = None, rtol: Optional[float] = None,
              tol_type: str = "f32", arch: Optional[str] = None, track_run: bool = False,
              tracking_uri: Optional[str] = None, experiment: Optional[str] = None, quiet: bool = False,
              app_timeout: Optional[float] = None, timer: str = "auto") -> ApplyReport:
    if not argv:
        raise ConfigurationError("no app to run: mneme apply TUNED... -- ./app ARGS")
    wd = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="mneme-apply-"))
    wd.mkdir(parents=True, exist_ok=True)
    wisdom = load_tuned(tuned, rule)
    entries, notes = prepare(wisdom, wd, arch)
    if not entries:
        raise ConfigurationError("no tuned kernel can be applied: " +
                                 "; ".join(f"{k}: {' '.join(v)}" for k, v in notes.items()))
    manifest = write_manifest(entries, wd / "manifest.txt")
    runner = ApplyRunner(manifest, wd, list(argv), check=check, atol=atol, rtol=rtol, tol_type=tol_type, quiet=quiet,
                         timeout=app_timeout, timer=timer, kernels=[e.kernel for e in entries])
    rep = build_report(entries, runner.rounds(rounds), notes)
    rep.workdir = str(wd)
    write_report(rep, wd)
    if track_run:
        track(rep, wisdom, list(argv), wd, tracking_uri, experiment)
    return rep


def campaign_apply(tuned: Sequence[str], argv: Sequence[str], **kw: Any) -> Dict[str, Any]:
    """What the corpus campaign stores per program (docs/corpus.json "apply")."""
    return apply_app(tuned, argv, **kw).campaign()
