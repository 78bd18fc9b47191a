"""The tuner's contract (tests/unit/search/test_tuner.py: every test there that takes a study
location) run again with the study in a real PostgreSQL server (tests/storage_servers.py: Debian's
PostgreSQL in a temp folder, on a unix socket), a new database per test: `search.storage:
postgresql://...` must resume, close interrupted trials and tell recorded ones exactly as the
journal file does (issue #35 item 2). Optuna's own pattern: one storage contract, run against
each backend (optuna/testing/pytest_storages.py)."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterator

import pytest

from tests.storage_servers import Postgres
from tests.storage_servers import create_database
from tests.storage_servers import postgres_server
from tests.unit.search import test_tuner as contract

CONTRACT = {name: test for name, test in vars(contract).items()
            if name.startswith("test_") and "journal" in inspect.signature(test).parameters}
globals().update(CONTRACT)  # collected here too, with this module's `journal`


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with postgres_server() as server:
        yield server


@pytest.fixture
def journal(postgres) -> str:
    """A new database of the module's server: where this test's study lives."""
    return create_database(postgres, f"t{uuid.uuid4().hex[:12]}")


def test_the_contract_is_here():
    assert len(CONTRACT) >= 10, sorted(CONTRACT)
