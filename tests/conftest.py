"""Shared test setup: the `gpu` marker runs only where a GPU run was asked for (make gpu-check)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MNEME = [sys.executable, "-m", "mneme.cli"]


def pytest_collection_modifyitems(config, items):
    if os.environ.get("MNEME_GPU_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU: run `make gpu-check` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


def run_mneme(*args, check=True, **kw) -> subprocess.CompletedProcess:
    """Run the `mneme` CLI in a subprocess, as a user would."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    p = subprocess.run([*MNEME, *map(str, args)], **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"mneme {' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p
