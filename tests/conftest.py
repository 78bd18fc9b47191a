"""Shared fixtures: the tiny model and a short temp dir (helpers are in tests/helpers.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers import TINY_MODEL


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    if not (TINY_MODEL / "config.json").is_file():
        pytest.fail(f"{TINY_MODEL} is missing: run `make model` (make test does it)")
    return TINY_MODEL


@pytest.fixture
def short_tmp():
    """A short temp dir (Ray's unix socket paths must stay under ~107 characters)."""
    path = Path(tempfile.mkdtemp(prefix="vst-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
