"""The interrupt guard with real signals: Ctrl-C inside a critical section waits for its end."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from mneme.tune.interrupt import InterruptGuard


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_inside_a_critical_section_is_raised_when_it_ends():
    guard, reached = InterruptGuard(), []
    with guard.installed():
        with pytest.raises(KeyboardInterrupt):
            with guard.critical():
                ctrl_c()
                with guard.critical():  # nested: still held
                    reached.append("inner")
                reached.append("outer")
        assert reached == ["inner", "outer"] and not guard.held
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()  # outside a section: at once
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_guard_installed_off_the_main_thread_changes_nothing():
    seen = []

    def body():
        guard = InterruptGuard()
        with guard.installed():
            seen.append(signal.getsignal(signal.SIGINT))

    th = threading.Thread(target=body)
    th.start()
    th.join()
    assert seen == [signal.default_int_handler]


def test_a_custom_sigint_handler_is_left_alone():
    calls = []
    previous = signal.signal(signal.SIGINT, lambda s, f: calls.append(s))
    try:
        guard = InterruptGuard()
        with guard.installed(), guard.critical():
            ctrl_c()
        assert calls == [signal.SIGINT] and not guard.held
    finally:
        signal.signal(signal.SIGINT, previous)
