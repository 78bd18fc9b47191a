"""trial.precision: half-widths, the stop rule, and pooling the sweep's noise."""

from __future__ import annotations

import math
import random

import pytest

from framework.trial.precision import Noise
from framework.trial.precision import PrecisionRule
from framework.trial.precision import pooled_noise
from framework.trial.precision import precision_columns
from framework.trial.precision import stop_reason
from framework.trial.precision import width


def test_width_of_runs_alone_is_students_interval():
    w = width([100.0, 110.0], Noise())
    # relative half-width: t(0.975, 1) x sd / sqrt(n) / mean, sd = sqrt(50) = 7.071: 0.605
    assert w.within == pytest.approx(12.706 * math.sqrt(50) / math.sqrt(2) / 105)
    assert w.server == 0.0 and w.total == pytest.approx(w.within)


def test_server_part_adds_in_quadrature_and_does_not_shrink_with_runs():
    noise = Noise(server_var=0.05 ** 2, df=10)
    few = width([100.0, 102.0, 98.0], noise)
    many = width([100.0, 102.0, 98.0] * 5, noise)
    assert few.server == many.server == pytest.approx(2.228 * 0.05, rel=1e-3)
    assert many.within < few.within
    assert many.total == pytest.approx(math.hypot(many.within, many.server))


def test_one_run_uses_the_pooled_run_to_run_cv_else_is_unknown():
    assert math.isinf(width([100.0], Noise()).total)
    assert width([100.0], Noise(within_cv=0.05)).within == pytest.approx(1.96 * 0.05)


RULE = PrecisionRule(target=0.03, max_runs=5, max_load_s=60.0)


@pytest.mark.parametrize("values, load_s, rule, expected", [
    ([100.0, 100.5, 99.8, 100.2], 8.0, RULE, "reached"),
    ([100.0, 130.0], 4.0, RULE, None),  # wide, under the caps: run again
    ([100.0, 130.0, 90.0, 120.0, 95.0], 10.0, RULE, "cap: 5 runs"),
    ([100.0, 130.0], 61.0, RULE, "cap: 60 s under load"),
    # clearly worse: even the interval's top (t(1) is wide: ~+166%, 306) stays under the best's 400
    ([100.0, 130.0], 4.0, PrecisionRule(0.03, 5, 60.0, best=400.0), "clearly worse than the best"),
    # minimizing: clearly worse means clearly above the best
    ([100.0, 101.0, 99.0], 4.0, PrecisionRule(0.001, 5, 60.0, best=50.0, maximize=False),
     "clearly worse than the best"),
    # the server-to-server part alone is +-11%: runs on this server cannot reach +-3%
    ([100.0, 101.0, 99.5], 4.0, PrecisionRule(0.03, 5, 60.0, noise=Noise(0.05 ** 2, 10)),
     "server-to-server spread exceeds the target"),
])
def test_stop_reason(values, load_s, rule, expected):
    assert stop_reason(values, load_s, rule) == expected


def test_pooled_noise_recovers_a_known_server_spread():
    rng = random.Random(7)
    groups = [[(1000 * math.exp(rng.gauss(0, 0.08)), None) for _ in range(4)] for _ in range(30)]
    noise = pooled_noise(groups, [])
    assert noise.df == 90
    assert math.sqrt(noise.server_var) == pytest.approx(0.08, rel=0.2)


def test_pooled_noise_subtracts_the_run_to_run_part_and_pools_cvs():
    # each member's own mean varies by cv^2 / n = 0.04^2 / 4; the group's spread is that alone
    groups = [[(100.0, 0.0004), (102.0, 0.0004)], [(200.0, 0.0004), (196.0, 0.0004)]]
    noise = pooled_noise(groups, [(0.04, 4), (0.02, 2), (0.5, 1)])
    total = ((math.log(100) - math.log(102)) ** 2 / 2 + (math.log(200) - math.log(196)) ** 2 / 2) / 2
    assert noise.server_var == pytest.approx(max(0.0, total - 0.0004))
    assert noise.within_cv == pytest.approx(math.sqrt((3 * 0.04 ** 2 + 1 * 0.02 ** 2) / 4))


def test_no_configuration_on_two_servers_means_no_server_estimate():
    assert pooled_noise([[(100.0, None)]], []) == Noise(None, 0, None)


def test_precision_columns_say_whether_the_target_was_reached():
    cols = precision_columns([100.0, 130.0], PrecisionRule(0.03, 2, 60.0), "cap: 2 runs")
    assert cols["precision_reached"] is False and cols["precision_stop"] == "cap: 2 runs"
    assert cols["ci95_halfwidth"] > 0.03 and cols["ci95_halfwidth_server"] is None
    assert precision_columns([100.0], None, None) == {}
