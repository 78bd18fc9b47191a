"""The sweep's answer, stated only as far as it is known: which configuration wins, and whether
its gain over vLLM's defaults lies beyond the measured noise.

Measurements. A configuration's *origin* is the trial that first measured it; its confirmation
runs (`confirmation_of`) re-measure it on fresh servers: the winner's confirmations and the
interleaved re-measurements of the baseline (`search.baseline_repeats`). A measurement counts
for values when its trial COMPLETEd and was not cut short (results.early: a run cut after a few
requests says whether the SLA broke, not what the throughput is; a capacity whose deciding step
ran in full counts); it counts for the SLA verdict whenever it COMPLETEd.

Noise. `precision.pooled_noise` over every configuration measured on >= 2 fresh servers gives
the server-to-server variance v_s (df_s degrees of freedom) and the pooled run-to-run CV.

Estimates (log scale). A configuration measured on k fresh servers with values x_i has
L = mean(log x_i) and Var(L) = (v_s + mean(w_i)) / k, w_i the variance of x_i's own run mean.
The winner's estimate leaves out the measurement that picked it once it has confirmations (that
value won a maximum over many noisy trials and is biased upward: the winner's curse).
Gain: d = L_best - L_base, half-width h = t(0.975, df_s) x sqrt(Var_best + Var_base), the
ratio interval [exp(d - h), exp(d + h)]; gain = ratio - 1 when maximizing, 1 - ratio when
minimizing. Where the interval holds 0 the verdict is "not distinguishable from vLLM's
defaults", with x = the interval's half-width in percent.

One offered load. Where the space searched a load setting (a `kind: run` parameter of
config.search_space.RUN_SETTINGS: its `param_` column), trials of different settings ran
different traffic, and their objectives are not on one scale (sweep.load_meaning): only the
configurations measured at the baseline's setting (without a baseline, the first trial's) are
ranked, and a last line says which trials ran another load and were left out. A gain that came
from a load setting is never a winner.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from typing import Any

import pandas as pd

from framework.base.vocabulary import load_limits
from framework.base.vocabulary import unit_of
from framework.base.vocabulary import with_unit
from framework.config.search_space import RUN_SETTINGS
from framework.results.early import cut_short
from framework.results.rows import param_column
from framework.trial.precision import Noise
from framework.trial.precision import pooled_noise
from framework.trial.stats import t975

Member = tuple[float, float | None]  # value, variance of its own run mean (None: one run)


@dataclass(frozen=True)
class Estimate:
    """A configuration's objective from k fresh-server measurements: the geometric mean and
    its 95% interval (None where the noise is not yet known)."""

    value: float
    low: float | None
    high: float | None
    servers: int
    log_var: float | None


@dataclass(frozen=True)
class Gain:
    """Relative gain over the baseline with its 95% interval (0.05 = 5% better)."""

    value: float
    low: float
    high: float

    @property
    def distinguishable(self) -> bool:
        return self.low > 0 or self.high < 0

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


@dataclass(frozen=True)
class SweepVerdict:
    """`kind`: winner (a gain beyond the noise, or the defaults break the SLA and this meets it),
    not_distinguishable, defaults_better, no_feasible, no_baseline (no baseline measured: the
    best is named without a gain), no_results. `number`: the winning trial (None: no winner);
    `ship`: the trial whose command to ship, the winner or, when nothing beat vLLM's defaults,
    the baseline (None: nothing to ship). `lines`: what to print, headline first."""

    kind: str
    number: int | None
    estimate: Estimate | None
    baseline: Estimate | None
    gain: Gain | None
    baseline_breaks: str | None
    confirmed: bool
    lines: tuple[str, ...]
    baseline_number: int | None = None

    @property
    def headline(self) -> str:
        return self.lines[0]

    @property
    def ship(self) -> int | None:
        if self.number is not None:
            return self.number
        return self.baseline_number if self.kind in ("not_distinguishable", "defaults_better") \
            else None


def _estimate(members: list[Member], noise: Noise) -> Estimate | None:
    if not members:
        return None
    logs = [math.log(x) for x, _ in members]
    center = math.exp(sum(logs) / len(logs))
    if noise.server_var is None or noise.df < 1:
        return Estimate(center, None, None, len(members), None)
    own = [w if w is not None else (noise.within_cv or 0.0) ** 2 for _, w in members]
    var = (noise.server_var + sum(own) / len(own)) / len(members)
    h = t975(noise.df) * math.sqrt(var)
    return Estimate(center, center * math.exp(-h), center * math.exp(h), len(members), var)


def gain_interval(best: Estimate, base: Estimate, df: int, maximize: bool) -> Gain | None:
    """The module docstring's gain and interval; None without both variances."""
    if best.log_var is None or base.log_var is None or df < 1:
        return None
    d = math.log(best.value) - math.log(base.value)
    h = t975(df) * math.sqrt(best.log_var + base.log_var)
    ratios = (math.exp(d), math.exp(d - h), math.exp(d + h))
    if maximize:
        return Gain(ratios[0] - 1, ratios[1] - 1, ratios[2] - 1)
    return Gain(1 - ratios[0], 1 - ratios[2], 1 - ratios[1])


def _member(row: Mapping[str, object]) -> Member:
    cv: Any = row.get("objective_cv")  # a trial row's cells, from pandas
    n: Any = row.get("repeats")
    own = float(cv) ** 2 / int(n) if _num(cv) and _num(n) and int(n) >= 2 else None
    objective: Any = row["objective"]
    return float(objective), own


def _num(value: object) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _measured(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows whose objective is a value: COMPLETE, not cut short (early.cut_short: a capacity
    whose deciding step ran in full counts, whatever earlier steps stopped), positive."""
    done = rows[rows["state"] == "COMPLETE"]
    if "stopped_early" in done and not done.empty:
        done = done[~done.apply(lambda r: cut_short(r.to_dict()), axis=1).astype(bool)]
    return done[done["objective"].astype(float) > 0]


def origins(trials: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """Origin trial number -> its rows (the origin first, then its confirmation runs)."""
    if "confirmation_of" not in trials:
        trials = trials.assign(confirmation_of=None)
    origin = trials["confirmation_of"].astype(float).fillna(trials["trial_number"]).astype(int)
    return {int(o): rows.sort_values("trial_number") for o, rows in trials.groupby(origin)}


def sweep_noise(trials: pd.DataFrame) -> Noise:
    """precision.pooled_noise over this sweep's measurements."""
    if trials.empty:
        return Noise()
    groups = [[_member(r) for _, r in _measured(rows).iterrows()]
              for rows in origins(trials).values()]
    done = _measured(trials)
    within = [(float(r["objective_cv"]), int(r["repeats"])) for _, r in done.iterrows()
              if _num(r.get("objective_cv")) and _num(r.get("repeats"))]
    return pooled_noise(groups, within)


def _fmt(value: float, key: str) -> str:
    return with_unit(key, value)  # a fraction (error_rate) as a percentage


def breaks(rows: pd.DataFrame, sla: Mapping[str, float]) -> list[str]:
    """The load limits (vocabulary.load_limits) a configuration breaks, judged on the mean of
    each SLA metric over its COMPLETE measurements (every fresh server counts alike):
    "p99_tpot_ms 6.1 ms > 4.5 ms"."""
    done = rows[rows["state"] == "COMPLETE"]
    out = []
    for key, limit in load_limits(sla).items():
        if key in done and done[key].notna().any():
            mean = float(done[key].astype(float).mean())
            if mean > limit:
                out.append(f"{key} {_fmt(mean, key)} > {_fmt(limit, key)}")
    return out


def _meets(rows: pd.DataFrame, sla: Mapping[str, float]) -> bool:
    """Every measurement COMPLETE, and either each one feasible or, over several fresh servers,
    no load limit broken on the mean and no quality probe failed."""
    if not bool((rows["state"] == "COMPLETE").all()):
        return False
    if bool((rows["feasible"] == True).all()):  # noqa: E712
        return True
    quality_failed = "quality_ok" in rows and bool((rows["quality_ok"] == False).any())  # noqa: E712
    return len(rows) > 1 and not breaks(rows, sla) and not quality_failed


def confirmed_meeting(trials: pd.DataFrame, sla: Mapping[str, float]) -> list[int]:
    """The origins, baseline aside, measured on >= 2 fresh servers that meet the SLA (`_meets`):
    the configurations a verdict may name once confirmation runs exist."""
    if trials.empty:
        return []
    return [o for o, rows in origins(trials).items()
            if len(rows) > 1 and not bool(rows["is_baseline"].iloc[0]) and _meets(rows, sla)]


def sla_breaks(rows: pd.DataFrame, sla: Mapping[str, float]) -> str | None:
    """How the baseline breaks the SLA ("p99_tpot_ms 6.1 ms > 4.5 ms (mean of 3 fresh
    servers)"), None if it meets it (`_meets`)."""
    done = rows[rows["state"] == "COMPLETE"]
    if done.empty or _meets(done, sla):
        return None
    found = breaks(done, sla) or [
        str(v) for v in done.get("sla_violations", pd.Series(dtype=object)).dropna() if v][:1] \
        or ["its SLA"]
    n = len(done)
    return f"{', '.join(found)} ({f'mean of {n} fresh servers' if n > 1 else 'one server'})"


def load_columns(trials: pd.DataFrame) -> list[tuple[str, str]]:
    """(setting, column) of each searched load setting the trial table has (RUN_SETTINGS)."""
    return [(n, param_column(n)) for n in RUN_SETTINGS if param_column(n) in trials]


def _setting(row: pd.Series, columns: Sequence[tuple[str, str]]) -> str:
    return " ".join(f"{name}={row[column]}" for name, column in columns)


def at_one_load(trials: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The rows of the configurations measured at the reference load setting (the baseline's,
    else the first trial's) and a line naming the trials left out, or (trials, None) where
    no load setting was searched or all ran the same (module docstring, "One offered load")."""
    columns = load_columns(trials)
    if not columns:
        return trials, None
    groups = origins(trials)
    firsts = {o: rows.iloc[0] for o, rows in groups.items()}
    ref = next((o for o, r in firsts.items() if bool(r["is_baseline"])), min(firsts))
    load = _setting(firsts[ref], columns)
    others = sorted(o for o, r in firsts.items() if _setting(r, columns) != load)
    if not others:
        return trials, None
    kept = pd.concat([rows for o, rows in groups.items() if o not in others])
    named = ", ".join(f"{o} ({_setting(firsts[o], columns)})" for o in others)
    return kept, (f"Ranked at {load} only: trial(s) {named} ran another offered load, and a "
                  "load setting is not a configuration (their rows stay in the tables).")


def decide(trials: pd.DataFrame, objective: str, maximize: bool,
           sla: Mapping[str, float]) -> SweepVerdict:
    """The verdict over a sweep's trial rows (module docstring)."""
    if trials.empty or not (trials["state"] == "COMPLETE").any():
        return SweepVerdict("no_results", None, None, None, None, None, False,
                            ("No measured trial yet: no results to judge.",))
    same, left_out = at_one_load(trials)
    verdict = _decide(same, objective, maximize, sla)
    return verdict if left_out is None else replace(verdict, lines=(*verdict.lines, left_out))


def _decide(trials: pd.DataFrame, objective: str, maximize: bool,
            sla: Mapping[str, float]) -> SweepVerdict:
    if not (trials["state"] == "COMPLETE").any():
        return SweepVerdict("no_results", None, None, None, None, None, False,
                            ("No measured trial at the reference load yet: no results to "
                             "judge.",))
    noise = sweep_noise(trials)
    groups = origins(trials)
    base_no = next((o for o, rows in groups.items() if bool(rows["is_baseline"].iloc[0])), None)
    base_rows = groups.get(base_no) if base_no is not None else None
    breaks = sla_breaks(base_rows, sla) if base_rows is not None and sla else None
    base = (_estimate([_member(r) for _, r in _measured(base_rows).iterrows()], noise)
            if base_rows is not None and breaks is None else None)
    confirmed_any = any(len(rows) > 1 for o, rows in groups.items() if o != base_no)
    candidates: dict[int, Estimate] = {}
    for o, rows in groups.items():
        if o == base_no or not _meets(rows, sla) or (confirmed_any and len(rows) < 2):
            continue
        picked_by = rows.iloc[1:] if len(rows) > 1 else rows
        est = _estimate([_member(r) for _, r in _measured(picked_by).iterrows()], noise)
        if est is not None:
            candidates[o] = est
    unit = unit_of(objective)
    if not candidates and base is not None:
        return SweepVerdict(
            "not_distinguishable", None, None, base, None, None, confirmed_any,
            baseline_number=base_no,
            lines=(f"Only vLLM's defaults met your SLA: {objective} {_interval(base, unit)} over "
                   f"{base.servers} server(s); " + (
                       "no confirmed configuration met it on the mean of its fresh servers"
                       if confirmed_any else "no other configuration met it, or none was "
                       "measured") + ". Ship vLLM's defaults.",))
    if not candidates:
        why = ("no confirmed configuration met it on the mean of its fresh servers" if confirmed_any
               else "no configuration met the SLA")
        lines = [f"No feasible configuration: {why}."]
        if breaks:
            lines.insert(0, f"vLLM's defaults break your SLA: {breaks}.")
        return SweepVerdict("no_feasible", None, None, base, None, breaks, confirmed_any,
                            tuple(lines))
    number = (max if maximize else min)(candidates, key=lambda o: candidates[o].value)
    est = candidates[number]
    shown = f"{objective} {_interval(est, unit)}"
    conf = (f"confirmed on {est.servers} fresh server{'s' if est.servers > 1 else ''}"
            if confirmed_any else "not re-measured on a fresh server")
    if breaks is not None:
        return SweepVerdict("winner", number, est, None, None, breaks, confirmed_any, (
            f"vLLM's defaults break your SLA: {breaks}. The best configuration that meets it, "
            f"trial {number}, gives {shown} ({conf}).",))
    if base is None:
        return SweepVerdict("no_baseline", number, est, None, None, None, confirmed_any, (
            f"Best feasible configuration: trial {number}, {shown} ({conf}); no measured "
            "vLLM-default baseline to compare with.",))
    g = gain_interval(est, base, noise.df, maximize)
    base_text = f"vLLM's defaults {_interval(base, unit)} over {base.servers} server(s)"
    if g is None:
        return SweepVerdict(
            "not_distinguishable", None, est, base, None, None, confirmed_any,
            baseline_number=base_no,
            lines=(f"Trial {number} measured {shown}; {base_text}. Not distinguishable from "
                   "vLLM's defaults: no configuration was measured on two fresh servers, so the "
                   "noise is unknown.",))
    gain_text = (f"{g.value:+.1%} (95% interval {g.low:+.1%} to {g.high:+.1%})")
    if g.distinguishable and g.low > 0:
        return SweepVerdict("winner", number, est, base, g, None, confirmed_any, (
            f"Trial {number} beats vLLM's defaults: {objective} {gain_text}; {shown} "
            f"({conf}) vs {base_text}.",))
    kind = "defaults_better" if g.distinguishable else "not_distinguishable"
    head = ("vLLM's defaults are better than every configuration tried" if g.distinguishable
            else f"Nothing beat vLLM's defaults beyond ±{g.half_width:.1%}: not distinguishable "
                 "from vLLM's defaults")
    return SweepVerdict(kind, None, est, base, g, None, confirmed_any, baseline_number=base_no,
                        lines=(f"{head}. The best candidate, trial {number}, measured {gain_text} "
                               f"({shown}, {conf}) vs {base_text}.",))


def number(x: float) -> str:
    """4 significant digits, thousands separated, never in exponent form (5,272; 4.51)."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _interval(est: Estimate, unit: str) -> str:
    value = f"{number(est.value)} {unit}".rstrip()
    if est.low is None or est.high is None:
        return value
    return f"{value} (95% interval {number(est.low)}-{number(est.high)})"
