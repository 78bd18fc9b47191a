"""Rows whose metrics come from a load stopped early (`search.stop_early`: the run ended once
its SLA was surely broken, often after a few requests). Pure; one row (a mapping) at a time.

Such a row keeps its verdict (the full run's), but its throughputs cover a fraction of the
load and its client-side peaks count only the requests that finished: the report keeps it out
of the plots, `status` and the tables mark it, and the diagnosis reads the server's peaks.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping


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
    return not (isinstance(capacity, numbers.Real) and capacity > 0)


def requests_done(row: Mapping[str, object]) -> str:
    """Requests a row's metrics cover (completed + failed), or "a few" if unknown."""
    try:
        return str(int(float(row["completed"]) + float(row["failed"])))  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError, OverflowError):
        return "a few"
