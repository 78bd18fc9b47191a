"""Sweeps of one model and workload on different hardware, side by side, and the cheapest way
to serve the target within the SLA.

Each sweep contributes what it ships (results.deploy.shipped: the verdict's configuration, which
meets the SLA; capacity_rps is measured at the SLA). Sweeps compare only when their rows carry
the same model config and workload digests (results.provenance) and their specs the same
objective, SLA and target; otherwise `problems` says which differ.

Cheapest: with a target, the least cost per hour of the fleet that carries it (ties: fewer GPUs,
then the sweep's name); without one, the least cost per million output tokens of one replica.
A sweep without a price or without a fleet (no capacity measured) is shown but never picked.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from framework.base.vocabulary import with_unit
from framework.config.specs import SweepSpec
from framework.results.deploy import Shipped
from framework.results.verdict import SweepVerdict
from framework.results.verdict import number


@dataclass(frozen=True)
class Entry:
    """One sweep: what it ships, or (shipped None) its verdict saying why nothing ships."""

    spec: SweepSpec
    shipped: Shipped | None
    verdict: SweepVerdict
    model_sha256: str | None = None
    workload_sha256: str | None = None


def digests(trials: pd.DataFrame) -> tuple[str | None, str | None]:
    """(model config, workload) digests of a sweep's measured rows; "several" when its own rows
    differ (the sweep's files changed between runs)."""
    done = trials[trials["state"] == "COMPLETE"]
    found = []
    for column in ("model_config_sha256", "workload_sha256"):
        values = set(done[column].dropna()) if column in done else set()
        found.append(None if not values else values.pop() if len(values) == 1 else "several")
    return found[0], found[1]


@dataclass(frozen=True)
class Cheapest:
    entry: Entry | None
    basis: str  # what was minimized, or why nothing could be picked


def problems(entries: Sequence[Entry], check_target: bool = True) -> list[str]:
    """What makes these sweeps incomparable: different model or workload digests, objective,
    SLA or (`check_target`) target. Empty when they compare."""
    found: list[str] = []
    facts: dict[str, Callable[[Entry], object]] = {
        "model config digest": lambda e: e.model_sha256,
        "workload digest": lambda e: e.workload_sha256,
        "objective": lambda e: (e.spec.objective.metric, e.spec.objective.direction),
        "SLA": lambda e: tuple(sorted(e.spec.sla.items())),
        "target": lambda e: e.spec.target.model_dump_json() if e.spec.target else None,
    }
    if not check_target:
        del facts["target"]
    for what, fact in facts.items():
        values = {e.spec.name: fact(e) for e in entries}
        known = {v for v in values.values() if v is not None}
        if len(known) > 1:
            shown = ", ".join(f"{name}: {_short(v)}" for name, v in values.items())
            found.append(f"different {what} ({shown})")
    return found


def _short(value: object) -> str:
    text = str(value)
    return text[:12] if len(text) == 64 else text  # a SHA-256 digest: its first 12 hex digits


def cheapest(entries: Sequence[Entry], has_target: bool) -> Cheapest:
    """The module docstring's rule."""
    if has_target:
        fleets = [(e, e.shipped.fleet) for e in entries if e.shipped and e.shipped.fleet
                  and e.shipped.fleet.cost_per_hour is not None]
        if not fleets:
            return Cheapest(None, "no sweep has both a fleet (capacity_rps measured) and a price")
        best, _ = min(fleets, key=lambda p: (p[1].cost_per_hour, p[1].gpus, p[0].spec.name))
        return Cheapest(best, "cost per hour of the fleet that carries the target")
    costs = [(e, e.shipped.cost_per_mtok) for e in entries
             if e.shipped and e.shipped.cost_per_mtok is not None]
    if not costs:
        return Cheapest(None, "no sweep has a price and a measured output throughput")
    best, _ = min(costs, key=lambda p: (p[1], p[0].spec.name))
    return Cheapest(best, "cost per million output tokens of one replica (no target)")


def _money(value: float | None, currency: str) -> str:
    return "no price" if value is None else f"{value:,.2f} {currency}"


def entry_lines(e: Entry) -> list[str]:
    """One sweep's block of the comparison."""
    s = e.shipped
    where = f"{e.spec.engine}" + (f" {e.spec.gpu}" if e.spec.gpu else "")
    if s is None:
        return [f"{e.spec.name} ({where}): nothing to ship: {e.verdict.headline}"]
    what = "vLLM's defaults" if s.verdict.number is None else f"trial {s.trial}"
    lines = [f"{s.sweep} ({where}; {s.hardware or 'hardware unknown'}): ships {what} "
             f"[{s.verdict.kind}]", f"  {s.serve_command}"]
    if s.value is not None:
        ci = (f" (95% interval {number(s.value.low)}-{number(s.value.high)}, "
              f"{s.value.servers} servers)"
              if s.value.low is not None and s.value.high is not None else " (noise unknown: no interval)")
        lines.append(f"  {s.objective} {with_unit(s.objective, s.value.value)}{ci}")
    if s.capacity_rps is not None and s.objective != "capacity_rps":
        lines.append(f"  capacity_rps {with_unit('capacity_rps', s.capacity_rps)}")
    currency = s.price.currency if s.price else ""
    price = ("no price (set pricing: in the sweep)" if s.price is None
             else f"{_money(s.price.per_replica_hour, currency)}/replica-hour ({s.price.source})")
    lines.append(f"  price {price}; per million output tokens "
                 f"{_money(s.cost_per_mtok, currency)}")
    f = s.fleet
    if f is not None and f.target_rps is not None:  # a fleet always has its target
        fleet = ("no capacity measured: no fleet" if f.replicas is None else
                 f"{f.replicas} replicas x {s.devices} = {f.gpus} devices, "
                 f"{_money(f.cost_per_hour, currency)}/hour")
        lines.append(f"  fleet for {number(f.target_rps)} req/s (headroom {f.headroom:.0%}): {fleet}")
    return lines


def report_lines(entries: Sequence[Entry], has_target: bool) -> list[str]:
    """The whole comparison: each sweep's block, then the cheapest answer."""
    lines: list[str] = []
    for e in entries:
        lines += entry_lines(e)
    pick = cheapest(entries, has_target)
    if pick.entry is None or pick.entry.shipped is None:
        lines.append(f"cheapest: none ({pick.basis})")
    else:
        s = pick.entry.shipped
        cost = (f"{_money(s.fleet.cost_per_hour, s.price.currency)}/hour, {s.fleet.replicas} "
                f"replicas" if has_target and s.fleet and s.price
                else f"{_money(s.cost_per_mtok, s.price.currency if s.price else '')} per million "
                     "output tokens")
        lines.append(f"cheapest: {s.sweep} ({pick.entry.spec.engine}"
                     f"{' ' + s.gpu if s.gpu else ''}): {cost}; by {pick.basis}")
    return lines
