"""Metrics + SLA -> objective value, Optuna constraints and a verdict. Pure.

Every SLA entry is an upper bound, `metric <= limit`, except `min_token_agreement`, a lower
bound (`value >= limit`; base.vocabulary.LOWER_BOUND_KEYS). Each becomes one Optuna constraint,
feasible iff <= 0 (Optuna's convention): `(value - limit) / limit`, so violations of different
metrics are comparable; `error_rate` uses `value - limit` and `min_token_agreement` `limit -
value` (both are already fractions).

A measured trial whose objective has no value (a fleet objective, base.vocabulary.
FLEET_OBJECTIVES, where no rate held the SLA or nothing was generated) is infeasible: its
objective is NaN and its violations say why. It is never 0 GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from framework.base.vocabulary import COUNT_METRICS
from framework.base.vocabulary import FLEET_OBJECTIVES
from framework.base.vocabulary import PEAK_METRICS
from framework.base.vocabulary import PERCENT
from framework.base.vocabulary import SLO_METRICS
from framework.base.vocabulary import is_lower_bound
from framework.base.vocabulary import parse_latency_key
from framework.base.vocabulary import split_class_key
from framework.base.vocabulary import unit_of
from framework.base.vocabulary import with_unit
from framework.trial.stats import combine
from framework.trial.stats import mean_ci


@dataclass(frozen=True)
class Verdict:
    """`objective`: the primary metric's value; `values`: every objective's (primary first)."""

    objective: float
    feasible: bool
    constraints: Mapping[str, float]
    violations: tuple[str, ...]
    values: tuple[float, ...] = ()


def per_device(metrics: Mapping[str, float], devices: int) -> dict[str, float]:
    """`metrics` plus output_throughput_per_gpu and request_goodput_per_gpu (= the metric /
    devices, the trial's TP x PP x DP; CPU engine: per worker)."""
    out = dict(metrics)
    for key in ("output_throughput", "request_goodput"):
        if key in metrics and metrics[key] is not None:
            out[f"{key}_per_gpu"] = float(metrics[key]) / max(1, devices)
    return out


def error_rate(metrics: Mapping[str, float]) -> float:
    """failed / (completed + failed); 0.0 when nothing was sent."""
    total = metrics["completed"] + metrics["failed"]
    return metrics["failed"] / total if total else 0.0


def goodput_slo_ms(sla: Mapping[str, float]) -> dict[str, float]:
    """Per-request limits for vLLM's goodput from the SLA: the tightest limit per metric among
    its percentile/mean keys (p99_ttft_ms: 250 -> {"ttft": 250})."""
    slo: dict[str, float] = {}
    for key, limit in sla.items():
        parsed = parse_latency_key(key)
        if parsed is not None and parsed.metric in SLO_METRICS and parsed.stat != "std":
            slo[parsed.metric] = min(limit, slo.get(parsed.metric, limit))
    return slo


def violation_text(key: str, value: float, limit: float) -> str:
    """One broken SLA limit, which and by how much: `p99_tpot_ms 6.12 ms > 4.5 ms (+36%)`, the
    excess relative to the limit; for a fraction (error_rate) the excess in percentage points,
    `error_rate 5% > 1% (+4 points)`; a lower bound the shortfall, `min_token_agreement 33.4% <
    95% (-62 points)`."""
    if is_lower_bound(key):
        short = (f"{_short((limit - value) * 100)} points" if unit_of(key) == PERCENT
                 else _short(limit - value))
        return f"{key} {with_unit(key, value)} < {with_unit(key, limit)} (-{short})"
    if unit_of(key) == PERCENT:
        excess = f"+{_short((value - limit) * 100)} points"
    elif limit > 0:
        excess = f"+{_short((value - limit) / limit * 100)}%"
    else:
        excess = f"+{with_unit(key, value - limit)}"
    return f"{key} {with_unit(key, value)} > {with_unit(key, limit)} ({excess})"


def _short(number: float) -> str:
    """A positive number in 2 significant digits below 10, whole above: 0.24, 3.6, 36, 150."""
    return f"{number:.0f}" if number >= 10 else f"{number:.2g}"


def no_value(metric: str) -> str:
    """Why an objective has no value for a measured trial."""
    if metric in FLEET_OBJECTIVES[:2]:
        return (f"{metric}: none, no rate held the SLA (no number of replicas carries the "
                "target)")
    return f"{metric}: none (no price, or no tokens measured to divide it by)"


def evaluate(metrics: Mapping[str, float], sla: Mapping[str, float], objective_metric: str,
             also: Sequence[str] = (), judged: Mapping[str, float] | None = None) -> Verdict:
    """Apply the SLA to one trial's metrics (which must hold every SLA key and objective but
    a fleet objective);
    `also`: further objectives (multi-objective search); `judged`: SLA values to use instead
    of the metrics' own (repeated runs; min_token_agreement, which no load run measures).
    error_rate is computed from completed and failed. A fleet objective absent from the
    metrics has no value (module docstring)."""
    values = {**metrics, "error_rate": error_rate(metrics), **(judged or {})}
    constraints: dict[str, float] = {}
    violations: list[str] = []
    for key, limit in sla.items():
        value = float(values[key])
        lower = is_lower_bound(key)
        excess = limit - value if lower else value - limit
        constraints[key] = excess if key == "error_rate" or lower else excess / limit
        if excess > 0:
            violations.append(violation_text(key, value, limit))
    objectives = [values.get(m) if m in FLEET_OBJECTIVES else values[m]
                  for m in (objective_metric, *also)]
    violations += [no_value(m) for m, v in zip((objective_metric, *also), objectives) if v is None]
    numbers = tuple(math.nan if v is None else float(v) for v in objectives)
    return Verdict(objective=numbers[0], feasible=not violations, constraints=constraints,
                   violations=tuple(violations), values=numbers)


def evaluate_repeated(runs: Sequence[Mapping[str, float]], sla: Mapping[str, float],
                      objective_metric: str, also: Sequence[str] = (),
                      sla_on: str = "mean", judged: Mapping[str, float] | None = None
                      ) -> tuple[Verdict, dict[str, float | None]]:
    """Verdict over repeated runs of one configuration: the objective is the mean; each SLA
    metric is judged on its mean (`sla_on: mean`) or on the upper end of its 95% confidence
    interval (`ci_upper`: the limit must hold with confidence, not just on average). `judged`:
    values of SLA keys measured once per trial, not per run (min_token_agreement: the quality
    probe), used as given. Also returns the interval columns: objective_ci95_low/high,
    objective_cv, <sla key>_ci95_high (for the per-run keys)."""
    combined = combine(runs, COUNT_METRICS, PEAK_METRICS)
    judged = dict(judged or {})
    extra: dict[str, float | None] = {"repeats": float(len(runs))}
    if all(objective_metric in r for r in runs):  # else a fleet objective without a value
        objective = mean_ci([float(r[objective_metric]) for r in runs])
        extra.update(objective_ci95_low=objective.low, objective_ci95_high=objective.high,
                     objective_cv=objective.cv)
    for key in (k for k in sla if k not in judged):
        values = [error_rate(r) if key == "error_rate" else float(r[key]) for r in runs]
        interval = mean_ci(values)
        extra[f"{key}_ci95_high"] = interval.high
        judged[key] = interval.high if sla_on == "ci_upper" else interval.mean
    return evaluate(combined, sla, objective_metric, also, judged), extra


def gain(best: float, baseline: float, maximize: bool) -> float | None:
    """Relative improvement of `best` over `baseline` (0.25 = 25% better); None if undefined."""
    if baseline == 0:
        return None
    return (best - baseline) / abs(baseline) if maximize else (baseline - best) / abs(baseline)


def by_class(sla: Mapping[str, float]) -> dict[str | None, dict[str, float]]:
    """The SLA's limits grouped by request class, unprefixed (`summarize.p99_ttft_ms: 2000` ->
    {"summarize": {"p99_ttft_ms": 2000}}); None groups the run's own limits."""
    groups: dict[str | None, dict[str, float]] = {}
    for key, limit in sla.items():
        request_class, metric = split_class_key(key)
        groups.setdefault(request_class, {})[metric] = limit
    return groups


def surely_broken(values_ms: Mapping[str, Sequence[float]], failed: int, total: int,
                  sla: Mapping[str, float]) -> str | None:
    """An SLA limit this run can no longer meet, whatever its remaining requests do (None if
    every limit is still reachable): what lets a run stop early without changing its verdict.

    `values_ms`: per-request metric ("ttft", "tpot", "e2el") -> values of the requests done so
    far; `failed`: failures so far; `total`: requests the run will send. The best case for
    the rest is n - len(values) more values of 0 ms, n = total - failed (the most values a
    metric can end with; fewer only raises percentiles and means of what is there):
    - pP / median / mean: the statistic of that best case (numpy linear percentiles) > limit;
    - error_rate: failed / total > limit.
    std and ITL limits are never judged early.
    """
    n = total - failed
    for key, limit in sla.items():
        if key == "error_rate":
            if total and failed / total > limit:
                return f"error_rate: {failed} of {total} requests failed already"
            continue
        parsed = parse_latency_key(key)
        if parsed is None:
            continue
        metric, q = parsed.metric, parsed.percentile
        values = values_ms.get(metric)
        if not values or metric == "itl" or parsed.stat == "std" or n < len(values):
            continue
        best = np.zeros(n)
        best[: len(values)] = values
        floor = float(best.mean()) if q is None else float(np.percentile(best, q))
        if floor > limit:
            return (f"{key}: at least {floor:.4g} ms whatever the other {n - len(values)} "
                    f"requests do ({len(values)} done)")
    return None
