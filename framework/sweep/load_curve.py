"""A searched load setting as what it is: a latency-vs-load curve per configuration (#34 item 3).

A `kind: run` parameter (request-rate, max-concurrency, burstiness, speed-up) searched next to
vLLM flags made each of its values a separate competitor: trials ran different offered loads, and
the objective ranked the load, not the flags. Here its values become workloads of every trial
instead: each configuration is measured at each value, one after another on its own server
(prefix cache reset between them, as any `workloads:`; framework.trial.workloads), so every
trial carries the same ladder of loads. The workloads table keeps one row per (trial, value),
with the value in its load column (results.workload_rows: `request_rate`, `max_concurrency`,
`burstiness`, `speed_up`): the curve; the report draws it per configuration
(results.report_plots.load_curve_plot). The trial's objective combines the values by
`objective.aggregate` (min: the worst load's value), so the search and the verdict compare
configurations at equal loads.

One searched load setting per sweep (a curve has one axis); values from its choices or int steps.
The workload names are `<setting>-<value>` (with `workloads:`, `<name>-<setting>-<value>` for each
workload and value). `objective.allow_load_bound: true` keeps the setting searched as a
competitor (a study of the load itself; the verdict then ranks one load only). Capacity mode
refuses a searched rate or speed-up before this (loader.check_capacity_load). Pure.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from framework.base.errors import ConfigError
from framework.config.search_space import RUN_SETTINGS
from framework.config.search_space import SearchSpace
from framework.config.search_space import discrete_values
from framework.config.specs import SweepSpec

MAX_VALUES = 8  # loads per curve: each is a measured run of every trial


def curve_setting(spec: SweepSpec, space: SearchSpace) -> str | None:
    """The load setting a sweep measures as a curve (the space's one `kind: run` parameter), or
    None when it has none or keeps it searched (objective.allow_load_bound)."""
    if not space.run_params or spec.objective.allow_load_bound:
        return None
    return space.run_params[0]


def _label(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def curve_values(spec: SweepSpec, setting: str) -> list[str]:
    """The values of `setting` a curve's workloads run at, in order, once each."""
    field = RUN_SETTINGS[setting]
    return list(dict.fromkeys(_label(getattr(w, field)) for w in spec.workloads))


def as_load_curve(spec: SweepSpec, space: SearchSpace) -> tuple[SweepSpec, SearchSpace]:
    """The sweep with its searched load setting turned into workloads (module docstring), and
    the space without it; unchanged without one. ConfigError (naming the search space file and
    the parameter) for two load settings, a float range or more than MAX_VALUES values."""
    setting = curve_setting(spec, space)
    if setting is None:
        return spec, space
    where = str(spec.search_space)
    if len(space.run_params) > 1:
        raise ConfigError(where, f"parameters.{space.run_params[1]}", "kind: run",
                          f"one load setting per sweep makes a latency-vs-load curve "
                          f"({setting} already does); fix this one in the workload")
    values = discrete_values(space.parameters[setting], MAX_VALUES)
    if values is None or len(values) > MAX_VALUES:
        raise ConfigError(where, f"parameters.{setting}", "kind: run",
                          f"a load setting is measured at each of its values (a curve per "
                          f"configuration): give at most {MAX_VALUES} as choices")
    field = RUN_SETTINGS[setting]
    data = spec.model_dump(mode="python", exclude_unset=True, by_alias=True)
    bases = data.pop("workloads", None) or [data.pop("workload", None) or {}]
    data.pop("workload", None)
    workloads = []
    for base in bases:
        prefix = f"{base['name']}-" if "name" in base else ""
        for value in values:
            workloads.append({**base, field: value, "name": f"{prefix}{setting}-{_label(value)}"})
    data["workloads"] = workloads
    try:
        curved = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(where, f"parameters.{setting}", "kind: run",
                          f"its values are measured as workloads of every trial, and then "
                          f"{exc.errors()[0]['msg']}") from None
    kept = {n: p for n, p in space.parameters.items() if n != setting}
    return curved, space.model_copy(update={"parameters": kept})
