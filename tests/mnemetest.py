"""Helpers the tests import (conftest.py cannot be imported by name: tests/gpu has its own)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MNEME = [sys.executable, "-m", "mneme.cli"]
FIXTURES = ROOT / "tests" / "fixtures"


def run_mneme(*args, check=True, **kw) -> subprocess.CompletedProcess:
    """Run the `mneme` CLI in a subprocess, as a user would."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    p = subprocess.run([*MNEME, *map(str, args)], **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"mneme {' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p
