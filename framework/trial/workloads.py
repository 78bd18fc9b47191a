"""Several workloads on one server (`workloads:`, config.workloads_spec): measured one after
another, prefix cache reset between them; their metrics combined into the trial's; the SLA
judged on each.

How a trial's metrics combine its workloads' (`aggregate_metrics`), per key (a class-prefixed
key like its metric): counts (completed, failed, tokens) and duration add up; peaks
(max_concurrent_requests, max_output_tokens_per_s) take the largest; latencies and every other
lower-is-better metric take the worst (largest) value, the one the SLA is judged on since it
must hold on each workload; throughputs (and in capacity mode each workload's capacity) follow
`objective.aggregate`: `min` = the worst (smallest) workload's value, `mean` = the mean
weighted by the workloads' `weight`.

The verdict (`evaluate_workloads`): each workload's own (objective.evaluate); the trial is
feasible iff every workload is, each constraint is its largest over the workloads, and each
objective combines the workloads' values (`min` in the objective's direction: the smallest
of a maximized one, the largest of a minimized one).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace

from framework.base.vocabulary import COUNT_METRICS
from framework.base.vocabulary import THROUGHPUT_METRICS
from framework.base.vocabulary import split_class_key
from framework.config.specs import ObjectiveSpec
from framework.trial.deadline import Deadline
from framework.trial.measure import LoadPlan
from framework.trial.measure import Measurement
from framework.trial.measure import Phase
from framework.trial.measure import measure_capacity
from framework.trial.measure import measure_fixed
from framework.trial.measure import run_once
from framework.trial.objective import Verdict
from framework.trial.objective import evaluate
from framework.trial.objective import per_device
from framework.trial.stats import combine

ADDED = (*COUNT_METRICS, "duration")
PEAKS = ("max_concurrent_requests", "max_output_tokens_per_s")
HIGHER_IS_BETTER = (*THROUGHPUT_METRICS, "capacity_rps", "capacity_speed_up", "capacity_steps")


@dataclass(frozen=True)
class WorkloadResult:
    """One workload's measurement in a trial: name, weight and metrics (over its runs)."""

    name: str
    weight: float
    metrics: Mapping[str, float]


def combine_values(values: Sequence[float], weights: Sequence[float], how: str,
                   maximize: bool) -> float:
    """`min`: the worst value (the smallest when higher is better, else the largest);
    `mean`: sum(w_i x v_i) / sum(w_i)."""
    if how == "min":
        return min(values) if maximize else max(values)
    if how == "mean":
        return sum(w * v for w, v in zip(weights, values)) / sum(weights)
    raise ValueError(f"aggregate must be min or mean, got {how!r}")


def aggregate_metrics(results: Sequence[WorkloadResult], how: str) -> dict[str, float]:
    """The trial's metrics from its workloads' (module docstring); a key only some workloads
    have (a class of one workload's mix) combines over those."""
    keys = list(dict.fromkeys(k for r in results for k in r.metrics))
    out: dict[str, float] = {}
    for key in keys:
        have = [r for r in results if r.metrics.get(key) is not None]
        if not have:
            continue
        values = [r.metrics[key] for r in have]
        metric = split_class_key(key)[1]
        if metric in ADDED:
            out[key] = sum(values)
        elif metric in PEAKS:
            out[key] = max(values)
        elif metric in HIGHER_IS_BETTER:
            out[key] = combine_values([float(v) for v in values], [r.weight for r in have], how,
                                      maximize=True)
        else:
            out[key] = max(values)
    return out


def evaluate_workloads(results: Sequence[WorkloadResult], sla: Mapping[str, float],
                       objectives: Sequence[str], maximize: Sequence[bool], how: str,
                       judged: Mapping[str, float] | None = None
                       ) -> tuple[Verdict, list[Verdict]]:
    """The trial's verdict and each workload's (module docstring). `objectives`: the primary
    metric first; `maximize`: their directions; `judged`: SLA values measured once per trial
    (min_token_agreement). A class-prefixed SLA key applies to the workloads whose mix has the
    class."""
    each = []
    for r in results:
        mine = {k: v for k, v in sla.items()
                if split_class_key(k)[0] is None or k in r.metrics}
        each.append(evaluate(r.metrics, mine, objectives[0], objectives[1:], judged))
    weights = [r.weight for r in results]
    values = tuple(combine_values([v.values[i] for v in each], weights, how, up)
                   for i, up in enumerate(maximize))
    constraints = {key: max(v.constraints[key] for v in each if key in v.constraints)
                   for key in sla if any(key in v.constraints for v in each)}
    violations = tuple(f"{r.name}: {text}" for r, v in zip(results, each) for text in v.violations)
    verdict = Verdict(objective=values[0], feasible=all(v.feasible for v in each),
                      constraints=constraints, violations=violations, values=values)
    return verdict, each


def judge_workloads(results: Sequence[WorkloadResult], devices: int, sla: Mapping[str, float],
                    objective: ObjectiveSpec, judged: Mapping[str, float] | None = None
                    ) -> tuple[tuple[WorkloadResult, ...], Verdict, list[Verdict]]:
    """The workloads with their per-device throughputs (objective.per_device), the trial's
    verdict and each workload's (evaluate_workloads with the objective's metrics, directions
    and aggregate)."""
    mine = tuple(WorkloadResult(r.name, r.weight, per_device(r.metrics, devices)) for r in results)
    verdict, each = evaluate_workloads(mine, sla, objective.metrics,
                                       [d == "maximize" for d in objective.directions],
                                       objective.aggregate, judged)
    return mine, verdict, each


def measure_workloads(base_url: str, plan: LoadPlan, deadline: Deadline, phase: Phase,
                      m: Measurement, reset: Callable[[], None],
                      still_serving: Callable[[], None]) -> list[WorkloadResult]:
    """Each of `plan.workloads` in turn on the server at `base_url`: prefix cache `reset` (from
    the second on), its warm-up, its measured run (measure.measure_fixed, SLA-guarded and
    watched like any) or in capacity mode its own capacity (measure.measure_capacity); its
    steps tagged with its name."""
    results = []
    for index, part in enumerate(plan.workloads):
        def said(text: str, name: str = part.name) -> None:
            phase(f"workload {name}: {text}")

        if index:
            said("prefix cache reset")
            reset()
        load, first = part.load, len(m.steps)
        try:
            if load.warmup:
                said(f"warming up ({len(load.warmup)} requests)")
                run_once(base_url, load, load.warmup, None, lambda _: None, deadline,
                         f"warming up for workload {part.name}")
            if load.capacity is None:
                metrics = combine(measure_fixed(base_url, load, deadline, said, m),
                                  COUNT_METRICS, PEAKS)
            else:
                metrics = measure_capacity(base_url, load, deadline, said, m, still_serving)
        finally:
            m.steps[first:] = [replace(s, workload=part.name) for s in m.steps[first:]]
        results.append(WorkloadResult(part.name, part.weight, metrics))
    return results
