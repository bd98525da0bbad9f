"""Shared test setup: the `gpu` marker runs only where a GPU run was asked for (make gpu-check)."""

import os
from pathlib import Path

import pytest

from mnemetest import ROOT
from pgserver import postgres_server


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



@pytest.fixture(scope="session")
def postgres():
    """The session's PostgreSQL server (see pgserver.py): call it for a new database's URL."""
    yield from postgres_server()


@pytest.fixture
def postgres_url(postgres):
    """postgresql://... of a database of this test's own."""
    return postgres()
