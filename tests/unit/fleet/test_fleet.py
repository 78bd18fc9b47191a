"""Fleet arithmetic (framework.fleet) against hand computations: replicas with headroom, GPUs as
replicas x TP x PP, cost per hour and per million tokens, and where a price comes from."""

from __future__ import annotations

from pathlib import Path

import pytest

from framework.base.errors import ConfigError
from framework.config.target_spec import PricingSpec
from framework.config.target_spec import TargetSpec
from framework.engine.memory_model import GPUS
from framework.fleet.prices import NO_PUBLIC_PRICE
from framework.fleet.prices import PRICES
from framework.fleet.prices import read_price_file
from framework.fleet.prices import resolve_price
from framework.fleet.sizing import cost_per_mtok
from framework.fleet.sizing import fleet_for
from framework.fleet.sizing import replicas_for


@pytest.mark.parametrize(("target", "capacity", "headroom", "replicas"), [
    (40, 8.0, 0.0, 5),      # 40 / 8 = 5 exactly
    (40, 7.9, 0.0, 6),      # 5.06 -> 6
    (40, 8.0, 0.2, 6),      # 48 / 8 = 6 exactly (6.000000000000001 in floats)
    (40, 8.0, 0.25, 7),     # 50 / 8 = 6.25 -> 7
    (1, 100.0, 0.0, 1),     # a fraction of one replica is one replica
    (0, 5.0, 0.0, 1),       # no load still needs one server
    (40, 0.0, 0.0, None),   # nothing held the SLA: no answer
    (40, None, 0.0, None),
])
def test_replicas(target, capacity, headroom, replicas):
    assert replicas_for(target, capacity, headroom) == replicas


@pytest.mark.parametrize(("tp", "pp", "price", "replicas", "gpus", "cost"), [
    (1, 1, 2.0, 5, 5, 10.0),        # 5 replicas x 1 GPU; 5 x $2
    (2, 1, 4.0, 5, 10, 20.0),       # TP 2: 10 GPUs; replica-hour = 2 GPUs x $2
    (2, 2, 8.0, 5, 20, 40.0),       # TP 2 x PP 2: 20 GPUs
    (1, 1, None, 5, 5, None),       # no price: GPUs, no cost
])
def test_fleet(tp, pp, price, replicas, gpus, cost):
    fleet = fleet_for(40, 8.0, tp=tp, pp=pp, price_per_replica_hour=price)
    assert (fleet.replicas, fleet.gpus, fleet.gpus_per_replica) == (replicas, gpus, tp * pp)
    assert fleet.cost_per_hour == (None if cost is None else pytest.approx(cost))


def test_a_data_parallel_replica_counts_every_engine():
    # capacity 8 req/s is the whole DP server's: 40 req/s needs 5 of them, each 2 x TP 2 GPUs
    fleet = fleet_for(40, 8.0, tp=2, pp=1, dp=2, price_per_replica_hour=8.0)
    assert (fleet.replicas, fleet.gpus_per_replica, fleet.gpus) == (5, 4, 20)
    assert fleet.cost_per_hour == pytest.approx(40.0)
    with pytest.raises(ValueError, match="DP 0"):
        fleet_for(40, 8.0, dp=0)


def test_a_data_parallel_replica_is_priced_per_gpu():
    price = resolve_price(PricingSpec(per_gpu_hour=2.5), engine="gpu", gpu="H100-80GB", tp=2, dp=2)
    assert price is not None and price.per_replica_hour == pytest.approx(10.0)


def test_fleet_without_capacity_has_no_gpus_or_cost():
    fleet = fleet_for(40, 0.0, tp=2, price_per_replica_hour=4.0)
    assert (fleet.replicas, fleet.gpus, fleet.cost_per_hour) == (None, None, None)


@pytest.mark.parametrize(("price", "tok_s", "expected"), [
    (3.6, 1000.0, 1.0),          # $3.6/h over 3.6 M tokens/h
    (3.9492, 2500.0, 3.9492 / 9),  # 2500 tok/s x 3600 = 9 M tokens an hour
    (3.6, 0.0, None),
    (None, 1000.0, None),
])
def test_cost_per_mtok(price, tok_s, expected):
    got = cost_per_mtok(price, tok_s)
    assert got == (None if expected is None else pytest.approx(expected, rel=1e-4))


def test_table_covers_every_gpu_type_of_the_memory_model():
    assert set(PRICES) | set(NO_PUBLIC_PRICE) == set(GPUS)
    assert not set(PRICES) & set(NO_PUBLIC_PRICE)
    assert all(p.date and p.source.startswith("https://") for p in PRICES.values())


@pytest.mark.parametrize(("pricing", "gpu", "tp", "per_replica", "source_starts"), [
    # TP 2: two GPU-hours at the table's list price
    (PricingSpec(), "H100-80GB", 2, 2 * PRICES["H100-80GB"].per_gpu_hour, "Modal list price"),
    (PricingSpec(per_gpu_hour=2.0), "H100-80GB", 2, 4.0, "sweep pricing.per_gpu_hour"),
    (PricingSpec(gpus={"H100-80GB": 2.5}), "H100-80GB", 1, 2.5, "sweep pricing.gpus"),
    (PricingSpec(gpus={"B200": 6.0}), "B200", 4, 24.0, "sweep pricing.gpus"),
    (PricingSpec(per_replica_hour=9.0), "H100-80GB", 2, 9.0, "sweep pricing.per_replica_hour"),
])
def test_resolve_price_gpu(pricing, gpu, tp, per_replica, source_starts):
    price = resolve_price(pricing, engine="gpu", gpu=gpu, tp=tp)
    assert price is not None
    assert price.per_replica_hour == pytest.approx(per_replica)
    assert price.source.startswith(source_starts)


def test_resolve_price_never_invents_one():
    assert resolve_price(PricingSpec(), engine="gpu", gpu="H200-141GB") is None
    assert resolve_price(PricingSpec(), engine="gpu", gpu=None) is None
    assert resolve_price(PricingSpec(per_gpu_hour=3.0), engine="cpu", gpu=None) is None
    cpu = resolve_price(PricingSpec(per_replica_hour=0.4, currency="EUR"), engine="cpu", gpu=None)
    assert cpu is not None and (cpu.per_replica_hour, cpu.per_gpu_hour, cpu.currency) == (0.4, None, "EUR")


def test_price_file_overrides_the_table_and_bad_entries_name_the_key(tmp_path: Path):
    good = tmp_path / "prices.yaml"
    good.write_text("H100-80GB: 2.25\nL4-24GB: 0.5\n")
    prices = read_price_file(good)
    price = resolve_price(PricingSpec(file=good), engine="gpu", gpu="H100-80GB", tp=2,
                          file_prices=prices)
    assert price is not None and price.per_replica_hour == pytest.approx(4.5)
    bad = tmp_path / "bad.yaml"
    bad.write_text("H100-80GB: free\n")
    with pytest.raises(ConfigError, match="H100-80GB: 'free'"):
        read_price_file(bad)


@pytest.mark.parametrize(("data", "ok"), [
    ({"request_rate": 40}, True),
    ({"from_trace": True, "headroom": 0.2}, True),
    ({}, False),
    ({"request_rate": 40, "from_trace": True}, False),
    ({"request_rate": 0}, False),
    ({"request_rate": 40, "headroom": -0.1}, False),
])
def test_target_spec(data, ok):
    if ok:
        TargetSpec(**data)
    else:
        with pytest.raises(ValueError):
            TargetSpec(**data)


@pytest.mark.parametrize(("servers", "capacity", "replicas", "gpus", "cost", "per_mtok"), [
    # one TP-2 server at $4/h, 8 req/s: 40 req/s needs 5 servers, 10 GPUs, $20/h
    (1, 8.0, 5, 10, 20.0, 4.0 / (1000 * 3600) * 1e6),
    # two TP-2 servers measured together carry 12 req/s: 40 needs 4 groups = 8 servers
    (2, 12.0, 8, 16, 32.0, 8.0 / (1000 * 3600) * 1e6),
    # three servers, 30 req/s together: 2 groups = 6 servers
    (3, 30.0, 6, 12, 24.0, 12.0 / (1000 * 3600) * 1e6),
])
def test_a_replicas_deployment_is_sized_in_whole_groups_of_its_servers(servers, capacity, replicas,
                                                                      gpus, cost, per_mtok):
    from framework.fleet.columns import Sizing
    from framework.fleet.columns import Target
    from framework.fleet.columns import fleet_values

    one = resolve_price(PricingSpec(per_gpu_hour=2.0), engine="gpu", gpu="H100-80GB", tp=2)
    sizing = Sizing(Target(40.0), one, tp=2, servers=servers)
    values = fleet_values({"capacity_rps": capacity, "output_throughput": 1000.0}, sizing.target,
                          sizing.price, sizing.tp, sizing.pp, sizing.dp, sizing.servers)
    assert values["price_per_replica_hour"] == pytest.approx(4.0)  # one server's, always
    assert values["replicas_for_target"] == replicas  # servers, in whole groups
    assert values["gpus_for_target"] == gpus
    assert values["cost_per_hour_for_target"] == pytest.approx(cost)
    # the group's price over the group's measured throughput
    assert values["cost_per_mtok_output"] == pytest.approx(per_mtok)
