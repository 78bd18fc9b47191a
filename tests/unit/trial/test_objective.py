"""SLA + metrics -> objective, Optuna constraints and verdict (values computed by hand)."""

from __future__ import annotations

import math

import pytest

from framework.trial.objective import error_rate
from framework.trial.objective import evaluate
from framework.trial.objective import evaluate_repeated
from framework.trial.objective import gain
from framework.trial.objective import goodput_slo_ms
from framework.trial.objective import surely_broken
from framework.trial.objective import violation_text

# 95 completed + 5 failed -> error rate 5 / 100 = 0.05
METRICS = {
    "completed": 95, "failed": 5, "output_throughput": 1234.5, "request_throughput": 10.0,
    "p99_ttft_ms": 600.0, "p99_tpot_ms": 8.0, "mean_ttft_ms": 100.0, "p99.9_itl_ms": 30.0,
}


def test_evaluate_without_sla_is_feasible():
    v = evaluate(METRICS, {}, "output_throughput")
    assert v.objective == 1234.5
    assert v.feasible is True
    assert dict(v.constraints) == {}
    assert v.violations == ()


def test_evaluate_feasible_constraints_are_normalized_and_negative():
    # (600 - 1000) / 1000 = -0.4 ; (8 - 16) / 16 = -0.5 ; (100 - 125) / 125 = -0.2
    v = evaluate(METRICS, {"p99_ttft_ms": 1000, "p99_tpot_ms": 16, "mean_ttft_ms": 125},
                 "output_throughput")
    assert v.feasible is True
    assert v.violations == ()
    assert list(v.constraints) == ["p99_ttft_ms", "p99_tpot_ms", "mean_ttft_ms"]  # SLA order
    assert v.constraints["p99_ttft_ms"] == pytest.approx(-0.4)
    assert v.constraints["p99_tpot_ms"] == pytest.approx(-0.5)
    assert v.constraints["mean_ttft_ms"] == pytest.approx(-0.2)


def test_evaluate_one_violated():
    # ttft: (600 - 500) / 500 = +0.2 (violated); tpot: (8 - 10) / 10 = -0.2
    v = evaluate(METRICS, {"p99_ttft_ms": 500, "p99_tpot_ms": 10}, "output_throughput")
    assert v.feasible is False
    assert v.constraints["p99_ttft_ms"] == pytest.approx(0.2)
    assert v.constraints["p99_tpot_ms"] == pytest.approx(-0.2)
    assert v.violations == ("p99_ttft_ms 600 ms > 500 ms (+20%)",)
    assert v.objective == 1234.5  # the objective is reported even when infeasible


def test_evaluate_all_violated_lists_each():
    # ttft (600 - 300) / 300 = 1.0 ; itl (30 - 20) / 20 = 0.5
    v = evaluate(METRICS, {"p99_ttft_ms": 300, "p99.9_itl_ms": 20}, "request_throughput")
    assert v.feasible is False
    assert v.constraints == {"p99_ttft_ms": pytest.approx(1.0), "p99.9_itl_ms": pytest.approx(0.5)}
    assert v.violations == ("p99_ttft_ms 600 ms > 300 ms (+100%)",
                            "p99.9_itl_ms 30 ms > 20 ms (+50%)")
    assert v.objective == 10.0


def test_value_equal_to_limit_is_feasible():
    v = evaluate(METRICS, {"p99_tpot_ms": 8}, "output_throughput")
    assert v.constraints["p99_tpot_ms"] == 0.0
    assert v.feasible is True  # Optuna: feasible iff constraint <= 0


@pytest.mark.parametrize(("limit", "constraint", "feasible"), [
    (0.01, 0.04, False),   # 0.05 - 0.01, not divided by the limit
    (0.1, -0.05, True),    # 0.05 - 0.1
    (0.05, 0.0, True),
])
def test_error_rate_constraint_is_absolute(limit, constraint, feasible):
    v = evaluate(METRICS, {"error_rate": limit}, "output_throughput")
    assert v.constraints["error_rate"] == pytest.approx(constraint)
    assert v.feasible is feasible
    assert (v.violations == ()) is feasible
    if not feasible:
        assert v.violations == ("error_rate 5% > 1% (+4 points)",)  # points, not relative


@pytest.mark.parametrize(("key", "value", "limit", "text"), [
    ("p99_tpot_ms", 6.12, 4.5, "p99_tpot_ms 6.12 ms > 4.5 ms (+36%)"),
    ("p99_ttft_ms", 500.6, 500, "p99_ttft_ms 500.6 ms > 500 ms (+0.12%)"),  # 2 digits below 10
    ("p99_ttft_ms", 1600.0, 500, "p99_ttft_ms 1,600 ms > 500 ms (+220%)"),
    ("mean_e2el_ms", 3.0, 0, "mean_e2el_ms 3 ms > 0 ms (+3 ms)"),  # no ratio to a 0 limit
    ("error_rate", 0.05, 0.0, "error_rate 5% > 0% (+5 points)"),
    ("error_rate", 0.125, 0.1, "error_rate 12.5% > 10% (+2.5 points)"),
])
def test_violation_text_names_the_limit_its_unit_and_the_excess(key, value, limit, text):
    assert violation_text(key, value, limit) == text


def test_error_rate_limit_zero_with_no_failures():
    metrics = {**METRICS, "completed": 100, "failed": 0}
    v = evaluate(metrics, {"error_rate": 0}, "output_throughput")
    assert v.constraints["error_rate"] == 0.0
    assert v.feasible is True


def test_error_rate_limit_zero_with_one_failure():
    metrics = {**METRICS, "completed": 99, "failed": 1}
    v = evaluate(metrics, {"error_rate": 0}, "output_throughput")  # no division by a 0 limit
    assert v.constraints["error_rate"] == pytest.approx(0.01)
    assert v.feasible is False


def test_error_rate_computed_not_taken_from_metrics():
    metrics = {**METRICS, "error_rate": 0.9}  # a stale value must not win over completed/failed
    v = evaluate(metrics, {"error_rate": 0.1}, "output_throughput")
    assert v.constraints["error_rate"] == pytest.approx(-0.05)


def test_latency_objective_and_type():
    v = evaluate({"completed": 3, "failed": 0, "p99_ttft_ms": 42}, {}, "p99_ttft_ms")
    assert v.objective == 42.0 and isinstance(v.objective, float)


def test_missing_sla_metric_raises():
    with pytest.raises(KeyError, match="p99_e2el_ms"):
        evaluate(METRICS, {"p99_e2el_ms": 100}, "output_throughput")


@pytest.mark.parametrize(("sla", "expected"), [
    ({}, {}),
    ({"p99_ttft_ms": 250}, {"ttft": 250}),
    ({"p99_ttft_ms": 250, "mean_ttft_ms": 100}, {"ttft": 100}),   # tightest wins
    ({"mean_ttft_ms": 100, "p99_ttft_ms": 250}, {"ttft": 100}),   # in any order
    ({"p50_ttft_ms": 300, "p99.9_ttft_ms": 400}, {"ttft": 300}),
    ({"p99_tpot_ms": 20, "median_e2el_ms": 900}, {"tpot": 20, "e2el": 900}),
    ({"std_ttft_ms": 5}, {}),              # a spread is no per-request limit
    ({"p99_itl_ms": 30}, {}),              # vLLM goodput has no itl SLO
    ({"error_rate": 0.01}, {}),
    ({"error_rate": 0.01, "p90_e2el_ms": 2000, "std_e2el_ms": 1}, {"e2el": 2000}),
])
def test_goodput_slo_ms(sla, expected):
    assert goodput_slo_ms(sla) == expected


@pytest.mark.parametrize(("best", "baseline", "maximize", "expected"), [
    (120.0, 100.0, True, 0.2),
    (80.0, 100.0, True, -0.2),
    (100.0, 100.0, True, 0.0),
    (80.0, 100.0, False, 0.2),     # lower latency is better
    (120.0, 100.0, False, -0.2),
    (-1.0, -2.0, True, 0.5),       # |baseline| in the denominator
    (-3.0, -2.0, False, 0.5),
    (5.0, 0.0, True, None),
    (5.0, 0.0, False, None),
])
def test_gain(best, baseline, maximize, expected):
    result = gain(best, baseline, maximize)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)


@pytest.mark.parametrize(("completed", "failed", "expected"), [
    (95, 5, 0.05),
    (100, 0, 0.0),
    (0, 10, 1.0),
    (1, 2, 2 / 3),
    (0, 0, 0.0),   # nothing sent
])
def test_error_rate(completed, failed, expected):
    assert error_rate({"completed": completed, "failed": failed}) == pytest.approx(expected)


def brute_force_broken(values, n_total, limit, q):
    """Completing `values` with the best case (0 ms) up to n_total: is numpy's pQ over limit?"""
    import numpy as np

    full = list(values) + [0.0] * (n_total - len(values))
    return float(np.percentile(full, q)) > limit


@pytest.mark.parametrize("q", [50, 90, 95, 99, 100])
@pytest.mark.parametrize("n_total", [1, 7, 20, 200])
def test_surely_broken_percentile_bound_matches_the_best_case_completion(q, n_total):
    import random

    rng = random.Random(q * 1000 + n_total)
    for _ in range(60):
        done = rng.randint(0, n_total)
        values = [rng.choice([100.0, 900.0]) for _ in range(done)]
        key = "median_ttft_ms" if q == 50 else f"p{q}_ttft_ms"
        verdict = surely_broken({"ttft": values}, 0, n_total, {key: 500.0})
        assert (verdict is not None) == brute_force_broken(values, n_total, 500.0, q), values


@pytest.mark.parametrize("values_ms, failed, total, sla, expected", [
    # 197 zeros + 3 x 900: p99 (index 197.01) = 900
    ({"ttft": [900.0, 900.0, 900.0]}, 0, 200, {"p99_ttft_ms": 500},
     "p99_ttft_ms: at least 900 ms whatever the other 197 requests do (3 done)"),
    ({"ttft": [900.0, 900.0]}, 0, 200, {"p99_ttft_ms": 500}, None),  # 0 + 0.01 x 900 = 9
    ({"ttft": [900.0, 900.0]}, 150, 200, {"p99_ttft_ms": 500}, "p99_ttft_ms: at least 900"),
    ({"tpot": [30.0] * 10}, 0, 20, {"mean_tpot_ms": 10}, "mean_tpot_ms: at least 15 ms"),
    ({"tpot": [30.0] * 5}, 0, 20, {"mean_tpot_ms": 10}, None),  # 150 / 20 = 7.5 ms
    ({"e2el": [800.0] * 11}, 0, 20, {"median_e2el_ms": 500}, "median_e2el_ms"),
    ({"e2el": [800.0] * 10}, 0, 20, {"median_e2el_ms": 500}, None),  # (0 + 800) / 2 = 400
    ({}, 3, 100, {"error_rate": 0.02}, "error_rate: 3 of 100"),
    ({"itl": [999.0] * 50}, 0, 50, {"p99_itl_ms": 10}, None),  # ITL: never early
    ({"ttft": [999.0] * 50}, 0, 50, {"std_ttft_ms": 10}, None),
])
def test_surely_broken_cases(values_ms, failed, total, sla, expected):
    verdict = surely_broken(values_ms, failed, total, sla)
    assert (verdict is None) if expected is None else verdict.startswith(expected), verdict


def run(ttft: float, out: float, failed: int = 0) -> dict:
    return {"completed": 10 - failed, "failed": failed, "output_throughput": out,
            "p99_ttft_ms": ttft}


def test_repeated_runs_objective_is_the_mean_with_its_interval():
    runs = [run(400.0, 100.0), run(420.0, 110.0), run(440.0, 120.0)]
    verdict, extra = evaluate_repeated(runs, {"p99_ttft_ms": 500}, "output_throughput")
    assert verdict.objective == pytest.approx(110.0) and verdict.feasible
    # hand computation: mean 110, s = 10, h = t(0.975, 2) x s / sqrt(n) = 4.303 x 10 / sqrt(3)
    h = 4.303 * 10 / math.sqrt(3)  # 24.843
    assert extra["objective_ci95_low"] == pytest.approx(110 - h)
    assert extra["objective_ci95_high"] == pytest.approx(110 + h)
    assert extra["objective_cv"] == pytest.approx(10 / 110)
    # ttft: mean 420, s = 20, h = 4.303 x 20 / sqrt(3) = 49.69 -> high 469.69
    assert extra["p99_ttft_ms_ci95_high"] == pytest.approx(420 + 4.303 * 20 / math.sqrt(3))
    assert extra["repeats"] == 3


def test_sla_on_the_upper_confidence_bound_is_stricter_than_on_the_mean():
    runs = [run(380.0, 100.0), run(480.0, 100.0), run(430.0, 100.0)]  # mean 430, high ~554
    on_mean, _ = evaluate_repeated(runs, {"p99_ttft_ms": 500}, "output_throughput", sla_on="mean")
    on_ci, extra = evaluate_repeated(runs, {"p99_ttft_ms": 500}, "output_throughput",
                                     sla_on="ci_upper")
    assert on_mean.feasible and not on_ci.feasible
    high = extra["p99_ttft_ms_ci95_high"]
    assert on_ci.violations == (
        f"p99_ttft_ms {high:.4g} ms > 500 ms (+{(high - 500) / 500 * 100:.0f}%)",)


def test_repeated_error_rate_and_counts():
    runs = [run(100.0, 1.0, failed=0), run(100.0, 1.0, failed=2)]
    verdict, extra = evaluate_repeated(runs, {"error_rate": 0.05}, "output_throughput")
    assert not verdict.feasible  # mean error rate 0.1 > 0.05
    assert extra["error_rate_ci95_high"] > 0.1
