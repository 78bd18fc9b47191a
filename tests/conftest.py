"""Shared fixtures: the tiny model and a short temp dir; the order of test files, costliest
first, for pytest-xdist's lanes (tests/lanes.py). Helpers are in tests/*.py, one module per
what they serve: paths, procs (processes by marker), cli, clusters, engines, sweeps, streams,
leftovers, browser, isolated_nodes, ray_start, reservations, scheduling_math."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.lanes import costliest_first
from tests.lanes import file_costs
from tests.paths import ROOT
from tests.paths import TINY_MODEL


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Costliest files first (tests/lanes.py); within a file, pytest's order."""
    def file_of(item: pytest.Item) -> str:
        return Path(str(item.path)).relative_to(ROOT).as_posix()

    order = costliest_first([file_of(i) for i in items], file_costs())
    rank = {name: n for n, name in enumerate(order)}
    items.sort(key=lambda i: rank[file_of(i)])  # stable: a file's tests keep their order


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
