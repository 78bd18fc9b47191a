"""Every test under tests/e2e/ starts real servers (vLLM on CPU or FakeEngine) or a Ray cluster:
each is marked `server`, so `-m "not server"` leaves them all out."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/e2e/" in str(item.path):
            item.add_marker(pytest.mark.server)
