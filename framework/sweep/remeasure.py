"""Measuring again, so the verdict knows its noise (results.verdict): the baseline re-measured on
fresh servers during the search (`search.baseline_repeats`), the confirmation runs at its end
(`search.confirm_top`), and the precision rule a trial is launched with (`search.precision`).

Schedule: with r = baseline_repeats and n the search's trials, re-measurement j = 1..r-1 is
queued once n x j / r trials have started (it counts toward n, except on the grid, whose
target grows by them: runner._grid_capped), and the last one among the confirmation runs,
after the top configurations' (so the baseline brackets the search).
The best feasible configuration sits on the SLA's edge when the objective pushes against it, so
its confirmation breaks the SLA about half the time: when no confirmed configuration meets it,
the next `confirm_top` are confirmed, up to CONFIRM_ROUNDS rounds in all.
`trials` below is the sweep's trial table (a pandas DataFrame: results/ owns pandas).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from framework.config.search_space import SearchSpace
from framework.config.specs import SweepSpec
from framework.results.queries import best_measured
from framework.results.queries import confirmation_candidates
from framework.results.queries import trial_params
from framework.results.verdict import confirmed_meeting
from framework.results.verdict import sweep_noise
from framework.search.tuner import Proposal
from framework.search.tuner import Tuner
from framework.trial.measure import LoadPlan
from framework.trial.precision import PrecisionRule


def queue_interleaved(spec: SweepSpec, space: SearchSpace, tuner: Tuner, started: int,
                      n: int) -> bool:
    """Queue the next mid-search baseline re-measurement if `started` trials have reached its
    point (module docstring). True if queued."""
    r = spec.search.baseline_repeats if spec.search.baseline else 0
    base = tuner.baseline_number()
    if not spec.search.interleaved_runs or base is None:
        return False
    due = sum(1 for j in range(1, r) if started >= math.ceil(n * j / r))
    if tuner.interleaved() >= due:
        return False
    tuner.enqueue_confirmation(space.defaults(), True, base, interleaved=True)
    return True


def queue_confirmations(spec: SweepSpec, space: SearchSpace, tuner: Tuner,
                        trials: Any) -> tuple[int, int]:
    """Once the trials are done: queue the `confirm_top` best feasible configurations once more
    (results.queries.confirmation_candidates; not the baseline when it is re-measured on its
    own), then the baseline's last re-measurement; nothing if the study already holds
    confirmations. Returns how many configurations and baseline runs were queued."""
    if tuner.has_confirmations() or trials.empty:
        return 0, 0
    base = tuner.baseline_number()
    remeasure_base = spec.search.baseline and spec.search.baseline_repeats >= 1 and base is not None
    top = confirmation_candidates(trials, list(space.parameters), spec.search.confirm_top,
                                  spec.objective.direction == "maximize", remeasure_base)
    for number, params, is_baseline in top:
        tuner.enqueue_confirmation(params, is_baseline, number)  # type: ignore[arg-type]
    if remeasure_base and base is not None:
        params = trial_params(trials, base, list(space.parameters)) or dict(space.defaults())
        tuner.enqueue_confirmation(params, True, base)  # type: ignore[arg-type]
    return len(top), int(remeasure_base)


CONFIRM_ROUNDS = 2


def queue_more_confirmations(spec: SweepSpec, space: SearchSpace, tuner: Tuner,
                             trials: Any) -> int:
    """Once a round of confirmation runs is done and no confirmed configuration met the SLA on
    its fresh servers (results.verdict.confirmed_meeting): queue the next `confirm_top` feasible
    configurations not confirmed yet, while fewer than CONFIRM_ROUNDS x confirm_top were.
    Returns how many were queued."""
    k = spec.search.confirm_top
    if k < 1 or trials.empty or not tuner.has_confirmations():
        return 0
    if confirmed_meeting(trials, spec.sla):
        return 0
    base = tuner.baseline_number()
    confirmed = set(trials["confirmation_of"].dropna().astype(int)) - {base}
    room = CONFIRM_ROUNDS * k - len(confirmed)
    if room < 1:
        return 0
    top = confirmation_candidates(trials, list(space.parameters), min(k, room),
                                  spec.objective.direction == "maximize", True)
    for number, params, is_baseline in top:
        tuner.enqueue_confirmation(params, is_baseline, number)  # type: ignore[arg-type]
    return len(top)


def queue_end_runs(spec: SweepSpec, space: SearchSpace, tuner: Tuner, trials: Any
                   ) -> tuple[int, str]:
    """At the search's target: the first round of confirmation runs (queue_confirmations) or,
    once it is done, the next (queue_more_confirmations). Returns how many runs were queued and
    the progress note that says why (0 and "": the sweep is done)."""
    top, base = queue_confirmations(spec, space, tuner, trials)
    if top + base:
        then = ", then vLLM's defaults" if base else ""
        return top + base, (f"confirmation runs on fresh servers: the {top} best feasible "
                            f"configurations once more{then}")
    more = queue_more_confirmations(spec, space, tuner, trials)
    return more, (f"no confirmed configuration met the SLA on its fresh servers: confirming "
                  f"the next {more} best feasible" if more else "")


def precision_rule(spec: SweepSpec, devices: int, trials: Any) -> PrecisionRule | None:
    """The rule a trial launched now measures under: the sweep's noise so far and its best
    feasible objective measured in full (None without `search.precision`)."""
    s = spec.search
    if s.precision is None:
        return None
    maximize = spec.objective.direction == "maximize"
    return PrecisionRule(target=s.precision, max_runs=s.precision_max_runs,
                         max_load_s=s.precision_max_load_s, metric=spec.objective.metric,
                         devices=devices, noise=sweep_noise(trials),
                         best=best_measured(trials, maximize), maximize=maximize)


def remeasure_load(spec: SweepSpec, load: LoadPlan, proposal: Proposal, devices: int,
                   trials: Any) -> LoadPlan:
    """The load a trial launched now measures: with the precision rule (precision_rule), and,
    for the confirmation of a configuration other than the baseline, without the early stop
    on a surely-broken SLA: the verdict judges a confirmed configuration on the mean of its
    fresh servers, so a confirmation cut short (its value unknown) would drop a configuration
    that meets the SLA on that mean."""
    rule = precision_rule(spec, devices, trials)
    if rule is not None:
        load = replace(load, precision=rule)
    if proposal.confirm_of is not None and not proposal.is_baseline:
        load = replace(load, sla_guard=None)
    return load
