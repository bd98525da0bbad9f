"""Ctrl-C that waits for the study write in progress.

A trial is asked, claimed and told in several storage writes. A KeyboardInterrupt between two of them (say,
after the answer left the pending list but before `tell`) leaves the trial RUNNING with nobody to give it
back, and a resume then waits `--stale-after` for it (seen in CI). While a guard is installed, SIGINT
inside a `critical` section is held until the section ends and raised there; outside one it raises at once.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


class InterruptGuard:
    def __init__(self) -> None:
        self.depth = 0
        self.held = False

    def _on_sigint(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        if self.depth:
            self.held = True
        else:
            raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator["InterruptGuard"]:
        """Route SIGINT through this guard; a no-op off the main thread or under a custom SIGINT handler."""
        if threading.current_thread() is not threading.main_thread() or \
                signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield self
            return
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    @contextmanager
    def critical(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.held:
                self.held = False
                raise KeyboardInterrupt
