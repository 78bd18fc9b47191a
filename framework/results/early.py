"""Rows whose metrics come from a load stopped early: the run ended once its SLA was surely
broken (`search.stop_early`, often after a few requests), or once it was over-saturated, its
queue growing without bound (`search.saturation`; trial.saturation), which says nothing of an
SLA. Pure; one row (a mapping) at a time.

Such a row keeps its verdict (the full run's), but its throughputs cover a fraction of the
load and its client-side peaks count only the requests that finished: the report keeps it out
of the plots, `status` and the tables mark it, and the diagnosis reads the server's peaks.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from collections.abc import Sequence

from framework.trial.saturation import OVER_SATURATED

SLA_BROKEN = "SLA surely broken"
QUEUE_GREW = "over-saturated: queue kept growing"


def text(value: object) -> str:
    """A text cell as a string ("" for null / NaN)."""
    return value if isinstance(value, str) else ""


def cut_short(row: Mapping[str, object]) -> bool:
    """True when the row's metrics come from a load stopped early (`stopped_early` set). In
    capacity mode a trial with capacity_rps > 0 is measured at a step that held the SLA, which
    ran in full, whatever earlier steps stopped."""
    if not text(row.get("stopped_early")):
        return False
    capacity = row.get("capacity_rps")
    return not (isinstance(capacity, numbers.Real) and float(capacity) > 0)


def requests_done(row: Mapping[str, object]) -> str:
    """Requests a row's metrics cover (completed + failed), or "a few" if unknown."""
    try:
        return str(int(float(row["completed"]) + float(row["failed"])))  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError, OverflowError):
        return "a few"


def causes(row: Mapping[str, object]) -> list[str]:
    """Why a row's load stopped early, each cause once in order of its runs: QUEUE_GREW for an
    over-saturated run, SLA_BROKEN for any other stop; [] when every run ran out."""
    parts = [p for p in text(row.get("stopped_early")).split("; ") if p]
    return list(dict.fromkeys(QUEUE_GREW if p.startswith(OVER_SATURATED) else SLA_BROKEN
                              for p in parts))


def causes_text(rows: Sequence[Mapping[str, object]]) -> str:
    """The causes of these rows' early stops (SLA_BROKEN when none says), joined by " or "."""
    found = list(dict.fromkeys(c for row in rows for c in causes(row)))
    return " or ".join(found or [SLA_BROKEN])


def stopped_text(row: Mapping[str, object]) -> str:
    """`stopped early after 12 requests` when its SLA was surely broken, else with the cause:
    `stopped early after 12 requests (over-saturated: queue kept growing)`."""
    found = causes(row)
    why = "" if found in ([], [SLA_BROKEN]) else f" ({causes_text([row])})"
    return f"stopped early after {requests_done(row)} requests{why}"
