"""The workloads table: one row per (trial, workload) of a sweep with several workloads
(`workloads:`), that workload's metrics and verdict; results/<sweep>/workloads/ (store.py).
The trial table keeps their aggregate (framework.trial.workloads). Pure."""

from __future__ import annotations

from collections.abc import Sequence

from framework.base.vocabulary import metric_names
from framework.results.rows import _INT_METRICS
from framework.results.rows import class_columns
from framework.trial.objective import Verdict
from framework.trial.objective import error_rate
from framework.trial.run import TrialOutcome
from framework.trial.saturation import SATURATION_COLUMNS
from framework.trial.saturation import saturation_values


def workload_columns(percentiles: Sequence[float], classes: Sequence[str] = ()
                     ) -> list[tuple[str, str]]:
    """The workloads table's schema: trial and workload, the workload's verdict, its metrics
    (and its mix classes'; in capacity mode its own capacity), the over-saturation evidence of
    its run."""
    columns = [("trial_number", "int"), ("workload", "str"), ("weight", "float"),
               ("feasible", "bool"), ("sla_violations", "str"), ("objective", "float"),
               ("error_rate", "float")]
    columns += [(m, "int" if m in _INT_METRICS else "float") for m in metric_names(percentiles)]
    columns += [("request_goodput", "float"), ("output_throughput_per_gpu", "float"),
                ("request_goodput_per_gpu", "float"), ("capacity_rps", "float"),
                ("capacity_steps", "int"), ("capacity_speed_up", "float")]
    columns += class_columns(classes, percentiles)
    columns += [*SATURATION_COLUMNS, ("stopped_early", "str")]
    return columns


def workload_rows(number: int, outcome: TrialOutcome, verdicts: Sequence[Verdict],
                  columns: Sequence[tuple[str, str]]) -> list[dict[str, object]]:
    """One row per workload of `outcome` (in the order measured), with its verdict."""
    rows = []
    for result, verdict in zip(outcome.workloads, verdicts):
        row: dict[str, object] = {name: None for name, _ in columns}
        row.update({k: v for k, v in result.metrics.items() if k in row})
        steps = [s for s in outcome.steps if s.workload == result.name]
        row.update({
            "trial_number": number, "workload": result.name, "weight": result.weight,
            "feasible": verdict.feasible, "sla_violations": "; ".join(verdict.violations),
            "objective": verdict.objective, "error_rate": error_rate(result.metrics),
            "stopped_early": "; ".join(s.stopped for s in steps if s.stopped) or None,
            **saturation_values([s.saturation for s in steps]),
        })
        rows.append(row)
    return rows
