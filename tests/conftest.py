"""Shared test setup: the `gpu` marker runs only where a GPU run was asked for (make gpu-check)."""

import os
from pathlib import Path

import pytest

from mnemetest import ROOT


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

