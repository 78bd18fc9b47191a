"""Capacity search (bracket, then bisect) against servers whose SLA holds up to a threshold."""

from __future__ import annotations

import math

import pytest

from framework.trial.capacity import CapacitySettings
from framework.trial.capacity import capacity
from framework.trial.capacity import next_rate
from framework.trial.capacity import requests_for
from framework.trial.capacity import trace_arrivals


def search(threshold: float, s: CapacitySettings) -> list[tuple[float, bool]]:
    """Drive next_rate against a server that holds the SLA at rates <= threshold."""
    history: list[tuple[float, bool]] = []
    while (rate := next_rate(history, s)) is not None:
        history.append((rate, rate <= threshold))
    return history


@pytest.mark.parametrize("threshold", [0.7, 1.0, 3.3, 10.0, 47.0, 100.0])
def test_finds_the_threshold_within_the_tolerance(threshold):
    s = CapacitySettings(start_rate=1.0, max_rate=256.0, tolerance=0.1, max_steps=20)
    history = search(threshold, s)
    found = capacity(history)
    assert found <= threshold
    assert found >= threshold / 1.1 - 1e-9, (found, history)


def test_steps_double_then_bisect_geometrically():
    s = CapacitySettings(start_rate=1.0, tolerance=0.1, max_steps=20)
    rates = [r for r, _ in search(5.0, s)]
    assert rates[:4] == [1.0, 2.0, 4.0, 8.0]
    assert rates[4] == pytest.approx(math.sqrt(4.0 * 8.0))


def test_stops_at_max_rate_when_it_holds():
    s = CapacitySettings(start_rate=4.0, max_rate=20.0, max_steps=20)
    history = search(1000.0, s)
    assert [r for r, _ in history] == [4.0, 8.0, 16.0, 20.0]
    assert capacity(history) == 20.0


def test_nothing_holds_gives_zero_after_bracketing_down():
    s = CapacitySettings(start_rate=1.0, max_steps=20)
    history = search(0.0, s)
    assert [r for r, _ in history] == [1.0, 0.5, 0.25, 0.125, 0.0625]
    assert capacity(history) == 0.0


def test_max_steps_bounds_the_search_and_noise_is_tolerated():
    s = CapacitySettings(start_rate=1.0, tolerance=0.001, max_steps=5)
    assert len(search(37.0, s)) == 5
    # a noisy break below an earlier hold: the bracket uses the lowest break above the best hold
    assert next_rate([(1.0, True), (2.0, False), (4.0, True), (8.0, False)], s) == \
        pytest.approx(math.sqrt(32.0))


@pytest.mark.parametrize("rate, expected", [(0.5, 20), (2.0, 30), (10.0, 150), (100.0, 200)])
def test_requests_per_step(rate, expected):
    assert requests_for(rate, CapacitySettings(step_duration_s=15.0, min_requests=20,
                                               max_requests=200)) == expected


# A trace of mean rate R = 2 req/s at speed-up 1 (offsets 0, 0.5, 1.5, 2.0 s: its first four).
@pytest.mark.parametrize(("rate", "n", "expected"), [
    (2.0, 4, [0.0, 0.5, 1.5, 2.0]),     # at its own rate: speed-up 1, its own times
    (4.0, 4, [0.0, 0.25, 0.75, 1.0]),   # twice its rate: speed-up 2, every gap halved
    (1.0, 3, [0.0, 1.0, 3.0]),          # half its rate, the first 3 requests
])
def test_a_step_on_a_trace_replays_its_times_at_rate_over_its_mean_rate(rate, n, expected):
    """The trace's shape is kept (bursts stay bursts), only its pace changes: the step at
    `rate` is the trace at speed-up rate / R."""
    assert trace_arrivals([0.0, 0.5, 1.5, 2.0], 2.0, rate, n) == pytest.approx(expected)
