"""One trial's deployment answer as row columns (docs/RESULTS.md). Pure.

target_rps, replicas_for_target, gpus_for_target, cost_per_hour_for_target: sizing.fleet_for
at the sweep's target from the trial's capacity_rps and shape (null without a target, and null
where no rate held the SLA or, for the cost, where there is no price);
price_per_replica_hour, price_source: the trial's replica-hour price (prices.resolve_price);
cost_per_mtok_output = price / (output_throughput x 3600) x 1e6 and cost_per_mtok_total the
same over total_token_throughput (sizing.cost_per_mtok; null without a price or throughput).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from framework.base.vocabulary import FLEET_OBJECTIVES
from framework.fleet.prices import Price
from framework.fleet.sizing import cost_per_mtok
from framework.fleet.sizing import fleet_for

FLEET_COLUMNS: list[tuple[str, str]] = [
    ("target_rps", "float"), ("replicas_for_target", "int"), ("gpus_for_target", "int"),
    ("cost_per_hour_for_target", "float"), ("price_per_replica_hour", "float"),
    ("price_source", "str"), ("cost_per_mtok_output", "float"), ("cost_per_mtok_total", "float"),
]


@dataclass(frozen=True)
class Target:
    """The load a deployment must carry (requests/s) and the spare capacity kept per replica."""

    rps: float
    headroom: float = 0.0


@dataclass(frozen=True)
class Sizing:
    """What fleet_values sizes a configuration with: the target (None: no fleet), a replica's
    price (None: no cost) and its TP x PP x DP."""

    target: Target | None
    price: Price | None
    tp: int = 1
    pp: int = 1
    dp: int = 1
    servers: int = 1  # measured together (the replicas shape): fleet_values


def fleet_values(metrics: Mapping[str, float | None], target: Target | None,
                 price: Price | None, tp: int = 1, pp: int = 1, dp: int = 1,
                 servers: int = 1) -> dict[str, object]:
    """The FLEET_COLUMNS of a trial measured as `metrics` (empty when it measured nothing),
    with replicas (servers) of TP x PP x DP devices at `price` each. A trial of `servers`
    servers measured together is sized in whole groups of them: groups = fleet_for over the
    group's capacity, replicas_for_target = groups x `servers`; its cost per million tokens
    is the group's price over the group's throughput."""
    per_hour = None if price is None else price.per_replica_hour
    group_hour = None if per_hour is None else per_hour * servers
    out: dict[str, object] = {name: None for name, _ in FLEET_COLUMNS}
    out.update(price_per_replica_hour=per_hour, price_source=None if price is None else price.source,
               cost_per_mtok_output=cost_per_mtok(group_hour, metrics.get("output_throughput")),
               cost_per_mtok_total=cost_per_mtok(group_hour, metrics.get("total_token_throughput")))
    if target is not None:
        fleet = fleet_for(target.rps, metrics.get("capacity_rps"), headroom=target.headroom,
                          tp=tp, pp=pp, dp=dp * servers, price_per_replica_hour=group_hour)
        out.update(target_rps=target.rps,
                   replicas_for_target=None if fleet.replicas is None else fleet.replicas * servers,
                   gpus_for_target=fleet.gpus, cost_per_hour_for_target=fleet.cost_per_hour)
    return out


def with_objectives(runs: list[dict[str, float]], target: Target | None, price: Price | None,
                    tp: int = 1, pp: int = 1, dp: int = 1, servers: int = 1
                    ) -> list[dict[str, float]]:
    """Each run's metrics plus the fleet objectives (base.vocabulary.FLEET_OBJECTIVES) that
    have a value in every run: what trial.objective evaluates. One left out has no value."""
    values = [fleet_values(r, target, price, tp, pp, dp, servers) for r in runs]
    known = [m for m in FLEET_OBJECTIVES if all(v[m] is not None for v in values)]
    return [{**r, **{m: float(v[m]) for m in known}}  # type: ignore[arg-type]
            for r, v in zip(runs, values)]
