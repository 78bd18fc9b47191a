"""How well a configuration's objective is known, and when to stop measuring it. Pure.

A measurement of one configuration on one fresh server, averaged over n runs, varies for two
reasons: run-to-run noise on that server (relative standard deviation s_r, known from the runs)
and server-to-server spread (relative variance v_s: a fresh server of the same configuration
lands elsewhere, estimated from configurations measured on several fresh servers: the
interleaved baseline and the confirmation runs). Everything is relative, on the log scale
(log x has standard deviation ~ the coefficient of variation for small spreads).

Half-widths of the 95% interval of one server's n-run mean, relative to the mean:
    within = t(0.975, n - 1) x s_r / sqrt(n)        (n >= 2; else the sweep's pooled s_r, z = 1.96)
    server = t(0.975, df_s) x sqrt(v_s)             (0 while v_s is not estimated)
    total  = sqrt(within^2 + server^2)
Runs on one server shrink `within` only: once `server` alone is wider than the target, more
runs cannot reach it, and the trial stops as soon as `within` is at most half of `server`
(the total is then within 12% of what endless runs would give).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from framework.trial.stats import t975


@dataclass(frozen=True)
class Noise:
    """The sweep's noise so far: server-to-server relative variance `server_var` on `df`
    degrees of freedom (None: no configuration measured on two fresh servers yet), and the
    pooled run-to-run coefficient of variation `within_cv` (None: no repeated runs yet)."""

    server_var: float | None = None
    df: int = 0
    within_cv: float | None = None


@dataclass(frozen=True)
class Width:
    """Relative 95% half-widths: total, its run-to-run part and its server-to-server part."""

    total: float
    within: float
    server: float


@dataclass(frozen=True)
class PrecisionRule:
    """`search.precision`: measure until the objective's relative half-width is <= `target`,
    at most `max_runs` runs or `max_load_s` seconds under load. `best`: the best feasible
    objective so far in the same units (None: none yet), for stopping a clearly worse trial;
    `metric` / `devices`: the objective and the divisor of its `_per_gpu` form."""

    target: float
    max_runs: int
    max_load_s: float
    metric: str = "output_throughput"
    devices: int = 1
    noise: Noise = Noise()
    best: float | None = None
    maximize: bool = True


def width(values: Sequence[float], noise: Noise) -> Width:
    """The relative half-widths of the mean of `values` (one server's runs): module docstring."""
    n = len(values)
    mean = sum(values) / n
    if n >= 2 and mean:
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        within = t975(n - 1) * sd / abs(mean) / math.sqrt(n)
    elif noise.within_cv is not None:
        within = 1.96 * noise.within_cv / math.sqrt(n)
    else:
        within = math.inf
    server = (t975(noise.df) * math.sqrt(noise.server_var)
              if noise.server_var is not None and noise.df >= 1 else 0.0)
    return Width(total=math.hypot(within, server), within=within, server=server)


def stop_reason(values: Sequence[float], load_s: float, rule: PrecisionRule) -> str | None:
    """Why measuring stops after these runs (None: run again). In order: the target is reached;
    the trial is clearly worse than the best (its interval lies entirely on the wrong side of
    the best's value); server-to-server spread alone exceeds the target and the run-to-run part
    is already below half of it; the run or time cap is hit."""
    w = width(values, rule.noise)
    mean = sum(values) / len(values)
    if w.total <= rule.target:
        return "reached"
    if rule.best is not None and math.isfinite(w.total):
        bound = mean * (1 + w.total) if rule.maximize else mean * (1 - w.total)
        if (bound < rule.best) if rule.maximize else (bound > rule.best):
            return "clearly worse than the best"
    if w.server > rule.target and w.within <= w.server / 2:
        return "server-to-server spread exceeds the target"
    if len(values) >= rule.max_runs:
        return f"cap: {rule.max_runs} runs"
    if load_s >= rule.max_load_s:
        return f"cap: {rule.max_load_s:g} s under load"
    return None


def pooled_noise(groups: Sequence[Sequence[tuple[float, float | None]]],
                 within_cvs: Sequence[tuple[float, int]]) -> Noise:
    """The sweep's noise from its measurements.

    `groups`: one per configuration measured on >= 2 fresh servers, each member (value, the
    relative variance of that value's own run mean, or None if it had one run). The total
    log-variance of a one-server measurement is pooled over groups,
        v = sum_g sum_i (log x_gi - mean_g log x)^2 / sum_g (n_g - 1),
    and the server part is v less the mean run-to-run variance of the members' means (a member
    with one run counts the pooled within_cv^2), at least 0.
    `within_cvs`: (coefficient of variation, runs) of every trial measured with >= 2 runs;
    pooled as sqrt(sum (n - 1) cv^2 / sum (n - 1))."""
    dof = sum(n - 1 for _, n in within_cvs if n >= 2)
    within_cv = (math.sqrt(sum((n - 1) * cv * cv for cv, n in within_cvs if n >= 2) / dof)
                 if dof else None)
    usable = [[(x, w) for x, w in g if x > 0] for g in groups]
    usable = [g for g in usable if len(g) >= 2]
    df = sum(len(g) - 1 for g in usable)
    if not df:
        return Noise(None, 0, within_cv)
    ss = 0.0
    own: list[float] = []
    for g in usable:
        logs = [math.log(x) for x, _ in g]
        m = sum(logs) / len(logs)
        ss += sum((v - m) ** 2 for v in logs)
        own += [w if w is not None else (within_cv or 0.0) ** 2 for _, w in g]
    total = ss / df
    return Noise(max(0.0, total - sum(own) / len(own)), df, within_cv)


def precision_columns(values: Sequence[float], rule: PrecisionRule | None,
                      stop: str | None) -> dict[str, float | str | None]:
    """The trial row's precision columns: the target, the half-widths reached (relative:
    total, run-to-run, server-to-server; None where unknown), whether the target was reached
    and why measuring stopped. Empty without a rule or values."""
    if rule is None or not values:
        return {}
    w = width(values, rule.noise)

    def known(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {"precision_target": rule.target, "ci95_halfwidth": known(w.total),
            "ci95_halfwidth_within": known(w.within),
            "ci95_halfwidth_server": w.server if rule.noise.server_var is not None else None,
            "precision_reached": w.total <= rule.target, "precision_stop": stop}
