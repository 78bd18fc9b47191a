"""Confidence intervals of repeated measurements, checked against a hand computation."""

from __future__ import annotations

import math

import pytest

from framework.trial.stats import combine
from framework.trial.stats import mean_ci
from framework.trial.stats import t975


def test_interval_matches_a_hand_computation():
    # 100, 110, 120: mean 110, s = 10, t(0.975, 2) = 4.303, h = 4.303 * 10 / sqrt(3) = 24.843
    got = mean_ci([100.0, 110.0, 120.0])
    assert got.mean == 110.0
    assert got.low == pytest.approx(110 - 4.303 * 10 / math.sqrt(3))
    assert got.high == pytest.approx(110 + 4.303 * 10 / math.sqrt(3))
    assert got.cv == pytest.approx(10 / 110)


def test_two_values_and_one_value():
    got = mean_ci([1.0, 3.0])  # s = sqrt(2), h = 12.706 * sqrt(2) / sqrt(2) = 12.706
    assert (got.low, got.high) == (pytest.approx(2 - 12.706), pytest.approx(2 + 12.706))
    one = mean_ci([5.0])
    assert (one.mean, one.low, one.high, one.cv) == (5.0, 5.0, 5.0, None)
    with pytest.raises(ValueError):
        mean_ci([])


@pytest.mark.parametrize("df, expected", [(1, 12.706), (4, 2.776), (30, 2.042), (31, 1.96), (500, 1.96)])
def test_t_quantiles(df, expected):
    assert t975(df) == expected


def test_identical_values_have_a_zero_width_interval():
    got = mean_ci([7.0] * 4)
    assert got.low == got.high == 7.0 and got.cv == 0.0


def test_combine_means_sums_counts_and_keeps_peaks():
    runs = [{"a": 1.0, "n": 40, "peak": 7}, {"a": 3.0, "n": 38, "peak": 9}]
    assert combine(runs, sums=("n",), maxima=("peak",)) == {"a": 2.0, "n": 78, "peak": 9}
    assert math.isclose(combine([{"x": 0.1}] * 3)["x"], 0.1)
