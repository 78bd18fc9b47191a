"""The workloads table: one row per (trial, workload) of a sweep with several workloads
(`workloads:`), that workload's metrics and verdict; results/<sweep>/workloads/ (store.py).
The trial table keeps their aggregate (framework.trial.workloads). Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence

from framework.base.vocabulary import metric_names
from framework.config.workload_spec import WorkloadSpec
from framework.results.rows import _INT_METRICS
from framework.results.rows import class_columns
from framework.trial.objective import Verdict
from framework.trial.objective import error_rate
from framework.trial.run import TrialOutcome
from framework.trial.saturation import SATURATION_COLUMNS
from framework.trial.saturation import saturation_values

# The workload's offered-load settings (search_space.RUN_SETTINGS' fields): along a load curve
# (sweep.load_curve) the one that varies is the curve's x.
LOAD_COLUMNS: tuple[tuple[str, str], ...] = (("request_rate", "float"), ("max_concurrency", "int"),
                                             ("burstiness", "float"), ("speed_up", "float"))


def load_settings(w: WorkloadSpec) -> dict[str, float | int | None]:
    """A workload's LOAD_COLUMNS values: request_rate None when unpaced (inf: as fast as the
    server answers), max_concurrency None when unbounded."""
    return {"request_rate": None if math.isinf(w.request_rate) else w.request_rate,
            "max_concurrency": w.max_concurrency, "burstiness": w.burstiness,
            "speed_up": w.speed_up}


def workload_columns(percentiles: Sequence[float], classes: Sequence[str] = ()
                     ) -> list[tuple[str, str]]:
    """The workloads table's schema: trial and workload, the workload's verdict, its metrics
    (and its mix classes'; in capacity mode its own capacity), the over-saturation evidence of
    its run."""
    columns = [("trial_number", "int"), ("workload", "str"), ("weight", "float"),
               *LOAD_COLUMNS, ("feasible", "bool"), ("sla_violations", "str"),
               ("objective", "float"), ("error_rate", "float")]
    columns += [(m, "int" if m in _INT_METRICS else "float") for m in metric_names(percentiles)]
    columns += [("request_goodput", "float"), ("output_throughput_per_gpu", "float"),
                ("request_goodput_per_gpu", "float"), ("capacity_rps", "float"),
                ("capacity_steps", "int"), ("capacity_speed_up", "float")]
    columns += class_columns(classes, percentiles)
    columns += [*SATURATION_COLUMNS, ("stopped_early", "str")]
    return columns


def workload_rows(number: int, outcome: TrialOutcome, verdicts: Sequence[Verdict],
                  columns: Sequence[tuple[str, str]],
                  specs: Mapping[str, WorkloadSpec]) -> list[dict[str, object]]:
    """One row per workload of `outcome` (in the order measured), with its verdict and its load
    settings (`specs`: the sweep's workloads by name)."""
    rows = []
    for result, verdict in zip(outcome.workloads, verdicts):
        row: dict[str, object] = {name: None for name, _ in columns}
        row.update({k: v for k, v in result.metrics.items() if k in row})
        if result.name in specs:
            row.update(load_settings(specs[result.name]))
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
