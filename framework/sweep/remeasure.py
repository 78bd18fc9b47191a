"""Measuring again, so the verdict knows its noise (results.verdict): the baseline re-measured on
fresh servers during the search (`search.baseline_repeats`), the confirmation runs at its end
(`search.confirm_top`), and the precision rule a trial is launched with (`search.precision`).

Schedule: with r = baseline_repeats and n the search's trials, re-measurement j = 1..r-1 is
queued once n x j / r trials have started (it counts toward n), and the last one among the
confirmation runs, after the top configuration's (so the baseline brackets the search).
"""

from __future__ import annotations

import math

import pandas as pd

from framework.config.search_space import SearchSpace
from framework.config.specs import SweepSpec
from framework.results.rows import param_column
from framework.results.rows import plain
from framework.results.verdict import sweep_noise
from framework.search.tuner import Tuner
from framework.trial.precision import PrecisionRule


def _present(value: object) -> bool:
    """A stored cell holds a value: not null (None, or NaN where a null number was read)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _baseline_params(space: SearchSpace, trials: pd.DataFrame, number: int) -> dict:
    row = trials[trials["trial_number"] == number]
    if row.empty:
        return dict(space.defaults())
    return {n: plain(row.iloc[0][param_column(n)]) for n in space.parameters
            if param_column(n) in row and _present(row.iloc[0][param_column(n)])}


def queue_interleaved(spec: SweepSpec, space: SearchSpace, tuner: Tuner, started: int,
                      n: int) -> bool:
    """Queue the next mid-search baseline re-measurement if `started` trials have reached its
    point (module docstring). True if queued."""
    r = spec.search.baseline_repeats if spec.search.baseline else 0
    base = tuner.baseline_number()
    if r < 2 or base is None:
        return False
    due = sum(1 for j in range(1, r) if started >= math.ceil(n * j / r))
    if tuner.interleaved() >= due:
        return False
    tuner.enqueue_confirmation(space.defaults(), True, base, interleaved=True)
    return True


def queue_confirmations(spec: SweepSpec, space: SearchSpace, tuner: Tuner,
                        trials: pd.DataFrame) -> tuple[int, int]:
    """Once the trials are done: queue the `confirm_top` best feasible configurations once more
    (distinct configurations; not the baseline when it is re-measured on its own; confirmation
    runs not themselves confirmed), then the baseline's last re-measurement; nothing if the
    study already holds confirmations. Returns how many configurations and baseline runs were
    queued."""
    if tuner.has_confirmations() or trials.empty:
        return 0, 0
    base = tuner.baseline_number()
    remeasure_base = spec.search.baseline and spec.search.baseline_repeats >= 1 and base is not None
    ok = trials[(trials["state"] == "COMPLETE") & (trials["feasible"] == True)  # noqa: E712
                & trials["confirmation_of"].isna()]
    if remeasure_base:
        ok = ok[ok["is_baseline"] != True]  # noqa: E712
    ok = ok.sort_values("objective", ascending=spec.objective.direction != "maximize")
    top = ok.drop_duplicates("serve_command").head(spec.search.confirm_top)
    for _, row in top.iterrows():
        params = {n: plain(row[param_column(n)]) for n in space.parameters
                  if param_column(n) in row and _present(row[param_column(n)])}
        tuner.enqueue_confirmation(params, bool(row["is_baseline"]), int(row["trial_number"]))
    if remeasure_base and base is not None:
        tuner.enqueue_confirmation(_baseline_params(space, trials, base), True, base)
    return len(top), int(remeasure_base)


def precision_rule(spec: SweepSpec, devices: int, trials: pd.DataFrame) -> PrecisionRule | None:
    """The rule a trial launched now measures under: the sweep's noise so far and its best
    feasible single-trial objective (None without `search.precision`)."""
    s = spec.search
    if s.precision is None:
        return None
    maximize = spec.objective.direction == "maximize"
    best = None
    if not trials.empty:
        ok = trials[(trials["state"] == "COMPLETE") & (trials["feasible"] == True)]  # noqa: E712
        if "stopped_early" in ok:
            ok = ok[ok["stopped_early"].isna()]
        if not ok.empty:
            values = ok["objective"].astype(float)
            best = float(values.max() if maximize else values.min())
    return PrecisionRule(target=s.precision, max_runs=s.precision_max_runs,
                         max_load_s=s.precision_max_load_s, metric=spec.objective.metric,
                         devices=devices, noise=sweep_noise(trials), best=best,
                         maximize=maximize)
