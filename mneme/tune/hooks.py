"""The observer interface through which tracking (mneme.track) watches a tuning run.

Tune never imports tracking: the CLI looks up a hook factory by name (`TRACK_HOOK`), and the tuner calls the
hook's methods at fixed points. A hook that raises is reported once and then ignored: tracking must never
stop a search.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Dict, Optional

from mneme.config import ExperimentConfiguration, ExperimentResult

#: "module:callable" of the tracking hook factory: callable(options: TuneOptions) -> TuneHook
TRACK_HOOK = "mneme.track.tunehook:make_hook"


class TuneHook:
    """No-op base; override what you observe. Every call happens in the tuner's main thread."""

    def on_start(self, info: Dict[str, Any]) -> None:
        """The study is open: info has study, storage, record (kernel, hashes), space, sampler, objective,
        directions, options, resumed, output."""

    def on_baseline(self, config: ExperimentConfiguration, result: ExperimentResult, metric_ns: Optional[float]) -> None:
        """The baseline was measured (or taken from the study when resuming)."""

    def on_trial(self, trial: Dict[str, Any]) -> None:
        """One trial ended: number, status, config (ExperimentConfiguration), result (ExperimentResult), values,
        speedup (None when it did not verify), duplicate_of, params."""

    def on_search_end(self, info: Dict[str, Any]) -> None:
        """The last trial ended normally (info: search_s, trials); the workers stop and the results directory is
        written next, then on_end. Work that needs every trial can start here and overlap with those."""

    def on_end(self, summary: Dict[str, Any]) -> None:
        """The run ended (normally, by failure or interrupted): the summary written to summary.json, and
        out_dir."""


class SafeHook:
    """Calls a hook and swallows (after one warning) whatever it raises."""

    def __init__(self, hook: Optional[Any]):
        self.hook = hook
        self.warned = False

    def __call__(self, method: str, *args: Any) -> None:
        fn = getattr(self.hook, method, None) if self.hook is not None else None
        if fn is None:
            return
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - an observer must not stop the search
            if not self.warned:
                print(f"mneme tune: warning: tracking hook {method} failed ({e!r}); the search goes on", file=sys.stderr)
                self.warned = True


def load_track_hook(options: Any, spec: str = TRACK_HOOK) -> Optional[Any]:
    """The tracking hook, or None when tracking is not installed (a missing module is not an error)."""
    modname, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name and (modname == e.name or modname.startswith(e.name + ".")):
            return None
        raise
    return getattr(mod, attr)(options)
