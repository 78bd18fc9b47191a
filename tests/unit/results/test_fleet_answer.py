"""results.decision.fleet_answer, the one builder of the shipped configuration's fleet: from
the fleet columns its sizing row stored, or re-sized at another target and price (what
`export` and `compare --target` show); both agree at the stored target and price."""

from __future__ import annotations

import pytest

from framework.fleet.columns import Sizing
from framework.fleet.columns import Target
from framework.fleet.prices import Price
from framework.results.decision import fleet_answer
from framework.results.verdict import decide
from tests.unit.fleet.test_fleet_wiring import _rows

PRICE = Price(2.0, None, "USD", "sweep pricing.per_replica_hour")


def _answers(sizing: Sizing):
    trials = _rows([10.0, 8.0, 9.0])  # stored at target 40 req/s, 2.0 per replica-hour
    verdict = decide(trials, "capacity_rps", True, {"p99_ttft_ms": 500})
    return fleet_answer(trials, verdict), fleet_answer(trials, verdict, sizing=sizing)


def test_resized_at_the_stored_target_and_price_is_the_stored_answer():
    stored, resized = _answers(Sizing(Target(40), PRICE))
    assert stored is not None and resized == stored


@pytest.mark.parametrize("sizing, replicas, gpus, cost, per_mtok", [
    # 80 x 1.5 / 8 = 15 replicas of TP 2 = 30 GPUs, 15 x 2.0 = 30 per hour
    (Sizing(Target(80, 0.5), PRICE, tp=2), 15, 30, 30.0, 2.0 / (1000 * 3600) * 1e6),
    (Sizing(Target(80, 0.5), None, tp=2), 15, 30, None, None),  # no price: no cost
    (Sizing(None, PRICE), None, None, None, 2.0 / (1000 * 3600) * 1e6),  # no target: no fleet
])
def test_resized_on_the_least_favourable_measurement(sizing, replicas, gpus, cost, per_mtok):
    _, f = _answers(sizing)
    assert f is not None and (f.trial, f.capacity_rps) == (1, 8.0)
    assert (f.replicas, f.gpus, f.cost_per_hour) == (replicas, gpus, cost)
    assert f.cost_per_mtok_output == pytest.approx(per_mtok)
    assert f.target_rps == (sizing.target.rps if sizing.target else None)
    assert f.headroom == (sizing.target.headroom if sizing.target else 0.0)
