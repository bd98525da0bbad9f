"""mneme's files in the temporary directory: made so that none outlives its process, and reaped when one did.

- Compile directories (`mneme-ptxas-<pid>-*`) carry the creating process's pid; `TemporaryDirectory` removes
  them on normal exit, errors and Ctrl-C, and `reap` removes those of processes that no longer run (a
  worker killed with SIGKILL never ran its cleanup).
- Lock files (`mneme-sqlite-*.lock`, flock; see mneme.track.bulk.CommitLock) are removed by whoever finds
  one unlocked: `remove_if_unlocked` takes the lock without waiting, checks that the path still names the
  locked file, and unlinks it. A process that still has the old file open notices on its next acquire
  (`same_file`) and opens the path again, so removing a lock file never lets two processes in at once.

`reap` runs when the CLI and the Hydra app exit (so a run reaps what killed workers of earlier runs left).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Optional

_PID_DIR = re.compile(r"^mneme-(?:ptxas|cc|workers|artifacts|overhead|summary)-(\d+)-")
LOCK_GLOB = "mneme-sqlite-*.lock"


def pid_dir(kind: str) -> "tempfile.TemporaryDirectory[str]":
    """A private temporary directory named for this process (reaped if the process is killed)."""
    return tempfile.TemporaryDirectory(prefix=f"mneme-{kind}-{os.getpid()}-")


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host still runs (a zombie does not)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def same_file(fd: int, path: str) -> bool:
    """Whether `path` still names the open file `fd` (False once it was removed or replaced)."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def remove_if_unlocked(path: str, fd: Optional[int] = None) -> bool:
    """Unlink the lock file `path` when no process holds its lock; `fd`: an open descriptor of it to use
    (closed by the caller). True when it was removed."""
    own = fd is None
    try:
        if own:
            fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # in use: its holder (or the last one after it) removes it
        try:
            if same_file(fd, path):
                os.unlink(path)
                return True
            return False
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        return False
    finally:
        if own:
            os.close(fd)


def _entries(tmp: Path, pattern: str) -> Iterator[Path]:
    try:
        yield from tmp.glob(pattern)
    except OSError:
        return


def reap(tmp: Optional[str] = None) -> int:
    """Remove mneme's leftovers in the temporary directory: directories of processes that no longer run and
    lock files nobody holds. Returns how many were removed; never raises."""
    root = Path(tmp or tempfile.gettempdir())
    removed = 0
    for d in _entries(root, "mneme-*-*"):
        m = _PID_DIR.match(d.name)
        if m and d.is_dir() and not pid_alive(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)
            removed += not d.exists()
    for f in _entries(root, LOCK_GLOB):
        removed += remove_if_unlocked(str(f))
    return removed
