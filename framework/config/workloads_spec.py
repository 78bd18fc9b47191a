"""Several workloads in one sweep (`workloads:`, a list of named workloads): the rules they obey
together. Each trial measures them one after another on its server, prefix cache reset between
them; the SLA must hold on each, and `objective.aggregate` (min: the worst workload's value;
mean: the weighted mean, weights `weight`) makes one objective of theirs.

Combinations rejected at validate, for now: `search.screen`, `search.repeats` > 1 and
`search.precision` (runs are repeated per workload, not per trial, and their intervals would not
combine yet). In capacity mode each workload finds its own capacity and the trial's combines them
by the same aggregate (framework.trial.workloads).
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import Protocol

from framework.base.vocabulary import split_class_key
from framework.config.mix_spec import RequestClassSpec
from framework.config.yaml_io import EntryError


class _Mixed(Protocol):  # read-only members: the specs are frozen
    @property
    def mix(self) -> tuple[RequestClassSpec, ...]: ...


class _Named(_Mixed, Protocol):
    @property
    def name(self) -> str: ...

    @property
    def percentiles(self) -> tuple[float, ...]: ...


def check_workloads(workloads: Sequence[_Named]) -> str | None:
    """What is wrong with the workloads together (None: nothing): fewer than two, a repeated
    name, or different percentiles (the trial table has one set of percentile columns)."""
    names = [w.name for w in workloads]
    if len(workloads) < 2:
        return "list at least two workloads (a single one is `workload:`)"
    if len(set(names)) != len(names):
        return "repeats a name"
    if len({tuple(w.percentiles) for w in workloads}) > 1:
        return "every workload needs the same percentiles (one set of percentile columns)"
    return None


def combination_problem(screen: float | None, repeats: int, precision: float | None) -> str | None:
    """Why `workloads:` cannot go with these settings (None: it can). Capacity mode is no
    objection: each workload finds its own capacity and the trial's combines them
    (trial.workloads)."""
    if screen is not None:
        return "several workloads do not combine with search.screen yet"
    if repeats > 1 or precision is not None:
        return ("several workloads do not combine with search.repeats or search.precision yet "
                "(each workload is measured once per trial)")
    return None


def class_names(mixes: Iterable[Sequence[RequestClassSpec]]) -> list[str]:
    """Every request class name of the given mixes, in order of appearance, once."""
    return list(dict.fromkeys(c.name for mix in mixes for c in mix))


def first_workload(data: Any) -> Any:
    """A sweep file's data with `workloads:` given `workload:` = the first of them (what reads
    one workload sees); EntryError when the file gives both."""
    if not isinstance(data, dict) or not data.get("workloads"):
        return data
    if data.get("workload") is not None:
        raise EntryError("workload", "(with workloads:)",
                         "give either workload: or workloads:, not both")
    first = data["workloads"][0]
    if isinstance(first, dict):
        first = {k: v for k, v in first.items() if k not in ("name", "weight")}
    return {**data, "workload": first}


def workloads_problem(workloads: Sequence[_Named], workload: _Mixed, sla: Mapping[str, float],
                      search: Any) -> EntryError | None:
    """What is wrong with the sweep's workloads (None: nothing): check_workloads and
    combination_problem for several, or an SLA key naming a class no mix has."""
    if workloads and (problem := check_workloads(workloads) or combination_problem(
            search.screen, search.repeats, search.precision)):
        return EntryError("workloads", [w.name for w in workloads], problem)
    classes = class_names(w.mix for w in (*workloads, workload))
    for key, limit in sla.items():
        request_class, _ = split_class_key(key)
        if request_class is not None and request_class not in classes:
            return EntryError(f"sla.{key}", limit, f"no request class {request_class!r} in the "
                              f"workload's mix (classes: {', '.join(classes) or 'none'})")
    return None
