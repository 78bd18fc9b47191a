"""tests/scheduling_math.py by hand: the interval arithmetic and the cluster size that the
scheduling scale test (tests/e2e/test_scheduling_scale.py) and benchmarks/scheduling.py rely on."""

from __future__ import annotations

import pytest

from tests.scheduling_math import busy_fraction_while_queued
from tests.scheduling_math import cluster_shape
from tests.scheduling_math import merged
from tests.scheduling_math import most_waiting_at_once


def test_busy_fraction_by_hand():
    """2 devices; trial A holds one over [0, 10), B both over [10, 20); C waits over [5, 15)
    and D over [12, 14): per waiting trial (5x0.5 + 5x1 + 2x1) / 12 = 0.792; at any waiting
    moment (5x0.5 + 5x1) / 10 = 0.75."""
    held = [(0.0, 10.0), (10.0, 20.0), (10.0, 20.0)]
    queued = [(5.0, 15.0), (12.0, 14.0)]
    assert busy_fraction_while_queued(held, queued, 2) == pytest.approx(9.5 / 12)
    assert merged(queued) == [(5.0, 15.0)]
    assert busy_fraction_while_queued(held, merged(queued), 2) == pytest.approx(0.75)
    assert merged([(3.0, 4.0), (0.0, 1.0), (1.0, 2.0)]) == [(0.0, 2.0), (3.0, 4.0)]
    assert most_waiting_at_once(queued) == 2
    assert most_waiting_at_once([(0.0, 1.0), (1.0, 2.0)]) == 1  # one ends as the next starts
    assert most_waiting_at_once([]) == 0


def test_cluster_shape():
    assert cluster_shape("4x8") == (4, 8) and cluster_shape("2X4") == (2, 4)
    for bad in ("4", "0x8", "x", "4x8x2"):
        with pytest.raises(ValueError):
            cluster_shape(bad)
