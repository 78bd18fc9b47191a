"""One trial's outcome judged as it is recorded. Pure.

A measured outcome's metrics (each run's, and their mean) per device (objective.per_device)
with the fleet objectives (fleet.columns.with_objectives); the SLA verdict over its runs and
the interval columns (objective.evaluate_repeated); with several workloads, each one's verdict
and the trial's (workloads.judge_workloads); the precision columns (precision.
precision_columns); and the trial's fleet columns (fleet.columns.fleet_values). An outcome
that measured nothing has no verdict, and fleet columns without measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import replace

from framework.config.specs import ObjectiveSpec
from framework.fleet.columns import Sizing
from framework.fleet.columns import fleet_values
from framework.fleet.columns import with_objectives
from framework.trial.objective import Verdict
from framework.trial.objective import evaluate_repeated
from framework.trial.objective import per_device
from framework.trial.precision import PrecisionRule
from framework.trial.precision import precision_columns
from framework.trial.run import TrialOutcome
from framework.trial.workloads import judge_workloads


@dataclass(frozen=True)
class Judged:
    """`outcome` with its metrics (and workloads) as recorded; `verdict` and `intervals` None
    when it measured nothing; `each`: each workload's verdict; `fleet`: its fleet columns."""

    outcome: TrialOutcome
    verdict: Verdict | None
    intervals: dict[str, float | str | None] | None  # row columns
    each: list[Verdict]
    fleet: dict[str, object]


def judge(outcome: TrialOutcome, sla: Mapping[str, float], objective: ObjectiveSpec, *,
          sla_on: str, judged: Mapping[str, float] | None, devices: int, sizing: Sizing,
          precision: PrecisionRule | None) -> Judged:
    """The module docstring's judgement of `outcome` on `devices` devices; `judged`: SLA
    values measured once per trial (the quality probe's), `sizing`: the fleet's target,
    price and replica shape."""
    verdict: Verdict | None = None
    intervals: dict[str, float | str | None] | None = None
    each: list[Verdict] = []
    target, price, tp, pp, dp = sizing.target, sizing.price, sizing.tp, sizing.pp, sizing.dp
    servers = sizing.servers
    if outcome.ok:
        runs = with_objectives([per_device(r, devices) for r in outcome.runs or (outcome.metrics,)],
                               target, price, tp, pp, dp, servers)
        outcome = replace(outcome, metrics=with_objectives(
            [per_device(outcome.metrics, devices)], target, price, tp, pp, dp, servers)[0])
        verdict, repeated = evaluate_repeated(runs, sla, objective.metric, objective.pareto_with,
                                              sla_on, judged)
        if outcome.workloads:  # the SLA on each workload, their objectives aggregated
            results, verdict, each = judge_workloads(outcome.workloads, devices, sla, objective,
                                                     judged)
            outcome = replace(outcome, workloads=results)
        intervals = {**repeated, **precision_columns([float(r[objective.metric]) for r in runs
                                                      if objective.metric in r],  # no value: none
                                                     precision, outcome.precision_stop)}
    return Judged(outcome, verdict, intervals,
                  each, fleet_values(outcome.metrics, target, price, tp, pp, dp, servers))
