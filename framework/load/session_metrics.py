"""Session metrics of a multi-turn run (pure): how long sessions took and how TTFT grows with the
conversation. The per-request metrics (load.metrics) treat every turn as one request.

Over the run's records that carry a ``session_id`` (a turn of a session, load.sessions):
- ``sessions``: sessions with at least one turn sent;
- ``sessions_completed``: of those, sessions whose every planned turn succeeded (``planned``:
  session id -> its number of turns; without it, every sent turn succeeded);
- ``mean_turns_per_session``: turns sent / sessions;
- ``mean_session_duration_s``, ``median_session_duration_s``, ``p99_session_duration_s``
  (numpy linear): over completed sessions, last turn's ``end_s`` - first turn's ``send_s``
  (think times included);
- ``median_ttft_first_turn_ms``: median TTFT of the successful turns 0;
- ``median_ttft_last_turn_ms``: median TTFT of each completed session's last turn, sessions
  of one turn left out (its first turn is its last).
An empty set gives 0.0 (as load.metrics does).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from framework.load.loadgen import RequestRecord

SESSION_COUNTS = ("sessions", "sessions_completed")  # summed over repeated runs
SESSION_METRICS = (*SESSION_COUNTS, "mean_turns_per_session", "mean_session_duration_s",
                   "median_session_duration_s", "p99_session_duration_s",
                   "median_ttft_first_turn_ms", "median_ttft_last_turn_ms")


def _median(values: Sequence[float]) -> float:
    return float(np.median(values)) if values else 0.0


def by_session(records: Sequence[RequestRecord]) -> dict[int, list[RequestRecord]]:
    """Records of each session, turns in order; records without a session_id are left out."""
    found: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.session_id is not None:
            found[r.session_id].append(r)
    return {sid: sorted(turns, key=lambda r: r.turn or 0) for sid, turns in found.items()}


def completed(turns: Sequence[RequestRecord], planned: int | None) -> bool:
    """Every turn sent succeeded, and all `planned` turns were sent (when known)."""
    return all(r.success for r in turns) and (planned is None or len(turns) == planned)


def session_metrics(records: Sequence[RequestRecord],
                    planned: Mapping[int, int] | None = None) -> dict[str, float | int]:
    """The module docstring's metrics for `records`."""
    sessions = by_session(records)
    done = [t for sid, t in sessions.items() if completed(t, (planned or {}).get(sid))]
    durations = [t[-1].end_s - t[0].send_s for t in done if t[-1].end_s is not None]
    first = [t[0].ttft_s * 1000 for t in sessions.values()
             if t[0].turn == 0 and t[0].success and t[0].ttft_s is not None]
    last = [t[-1].ttft_s * 1000 for t in done if len(t) > 1 and t[-1].ttft_s is not None]
    sent = sum(len(t) for t in sessions.values())
    d = durations or [0.0]
    return {
        "sessions": len(sessions),
        "sessions_completed": len(done),
        "mean_turns_per_session": sent / len(sessions) if sessions else 0.0,
        "mean_session_duration_s": float(np.mean(d)),
        "median_session_duration_s": float(np.median(d)),
        "p99_session_duration_s": float(np.percentile(d, 99)),
        "median_ttft_first_turn_ms": _median(first),
        "median_ttft_last_turn_ms": _median(last),
    }
