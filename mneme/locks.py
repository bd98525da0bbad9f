"""An exclusive lock between processes (and threads) through flock on a file that stays in place.

Why flock rather than a lock file created and removed per hold: the kernel wakes a waiter as soon as the lock
is free (no sleeping retry loop), drops the lock of a process that dies (nothing to wait out or clean up), and
taking it touches no file-system metadata, so it does not queue behind other processes' disk writes.
"""

from __future__ import annotations

import fcntl
import os
import threading
from typing import Any, Optional


class FileLock:
    def __init__(self, path: str):
        self.path = str(path)
        self._fd: Optional[int] = None
        self._pid = 0
        # the threads of one process share the open file, and flock lets all of them in: they queue here first
        self._threads = threading.Lock()

    def _file(self) -> int:
        if self._fd is None or self._pid != os.getpid():  # a forked child opens its own (flock is per open file)
            self._fd, self._pid = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666), os.getpid()
        return self._fd

    def acquire(self) -> bool:
        self._threads.acquire()
        try:
            fcntl.flock(self._file(), fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        return True

    def release(self) -> None:
        try:
            fcntl.flock(self._file(), fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
