"""Fleet arithmetic for one configuration. Pure; table-tested in tests/unit/test_fleet.py.

replicas         = ceil(target_rps x (1 + headroom) / capacity_rps)
gpus             = replicas x gpus_per_replica          (gpus_per_replica = TP x PP)
cost_per_hour    = replicas x price_per_replica_hour    (price_per_replica_hour = GPU price x TP x PP
                                                         on GPUs; the user's server-hour on CPU)
cost_per_mtok    = price_per_replica_hour / (tokens_per_s x 3600) x 1e6
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_ROUNDING = 1e-9  # 40 x 1.2 / 8 is 6.000000000000001 in floats: still 6 replicas


def replicas_for(target_rps: float, capacity_rps: float | None, headroom: float = 0.0) -> int | None:
    """ceil(target x (1 + headroom) / capacity); None when no rate held the SLA (capacity <= 0
    or unknown): no number of replicas makes such a configuration meet it."""
    if capacity_rps is None or not capacity_rps > 0:
        return None
    if target_rps < 0 or headroom < 0:
        raise ValueError(f"target {target_rps} and headroom {headroom} must be >= 0")
    return max(1, math.ceil(target_rps * (1.0 + headroom) / capacity_rps - _ROUNDING))


def cost_per_mtok(price_per_replica_hour: float | None, tokens_per_s: float | None) -> float | None:
    """Cost of a million tokens at a replica's measured throughput: price / (tok/s x 3600) x 1e6."""
    if price_per_replica_hour is None or tokens_per_s is None or not tokens_per_s > 0:
        return None
    return price_per_replica_hour / (tokens_per_s * 3600.0) * 1e6


@dataclass(frozen=True)
class Fleet:
    """The answer for one configuration at one target: None where it has no answer (no capacity
    measured, or no price)."""

    target_rps: float
    headroom: float
    replicas: int | None
    gpus_per_replica: int
    gpus: int | None
    price_per_replica_hour: float | None
    cost_per_hour: float | None


def fleet_for(target_rps: float, capacity_rps: float | None, *, headroom: float = 0.0,
              tp: int = 1, pp: int = 1, price_per_replica_hour: float | None = None,
              dp: int = 1) -> Fleet:
    """Replicas, GPUs and cost per hour to carry `target_rps` with replicas of this shape
    (TP x PP x DP devices each: a data-parallel server is one replica of DP engines)."""
    if tp < 1 or pp < 1 or dp < 1:
        raise ValueError(f"TP {tp}, PP {pp} and DP {dp} must be >= 1")
    replicas = replicas_for(target_rps, capacity_rps, headroom)
    per_replica = tp * pp * dp
    cost = None if replicas is None or price_per_replica_hour is None \
        else replicas * price_per_replica_hour
    return Fleet(target_rps=target_rps, headroom=headroom, replicas=replicas,
                 gpus_per_replica=per_replica,
                 gpus=None if replicas is None else replicas * per_replica,
                 price_per_replica_hour=price_per_replica_hour, cost_per_hour=cost)
