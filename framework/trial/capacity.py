"""Capacity at SLA: the highest request rate at which the SLA still holds, found on one running
server by bracketing, then bisecting. Pure (the caller measures each step).

Steps, given the (rate, SLA held) pairs measured so far:
1. none yet: `start_rate`;
2. every step held: double the highest (at most `max_rate`; done once `max_rate` held);
3. every step broke: halve the lowest (done below start_rate / 16: capacity 0);
4. otherwise low = the highest rate that held, high = the lowest rate above it that broke:
   done when high / low - 1 <= `tolerance`, else try sqrt(low x high) (bisection in log
   space: rates span orders of magnitude).
Never more than `max_steps` steps. Capacity = the highest rate that held (0 if none).
Requests per step: round(rate x step_duration_s), clamped to [min_requests, max_requests].

A timed trace has its own timing: a step at `rate` replays the trace's first requests at
speed-up k = rate / R, R the trace's mean rate at speed-up 1 over the whole file (the rate
`target.from_trace` takes): send offset_i = trace offset_i / k. The capacity in speed-up is then
capacity_rps / R, and a fleet sized for R carries the trace's own traffic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

FLOOR_FACTOR = 16.0


@dataclass(frozen=True)
class CapacitySettings:
    start_rate: float = 1.0
    max_rate: float = 256.0
    tolerance: float = 0.1
    max_steps: int = 8
    step_duration_s: float = 15.0
    min_requests: int = 20
    max_requests: int = 200


def next_rate(history: Sequence[tuple[float, bool]], s: CapacitySettings) -> float | None:
    """The next rate to measure after `history` [(rate, held)], or None when done."""
    if not history:
        return s.start_rate
    if len(history) >= s.max_steps:
        return None
    held = [rate for rate, ok in history if ok]
    low = max(held, default=None)
    broke = [rate for rate, ok in history if not ok and (low is None or rate > low)]
    high = min(broke, default=None)
    if high is None:
        assert low is not None
        return None if low >= s.max_rate else min(2 * low, s.max_rate)
    if low is None:
        lower = high / 2
        return None if lower < s.start_rate / FLOOR_FACTOR else lower
    if high / low - 1 <= s.tolerance:
        return None
    return math.sqrt(low * high)


def capacity(history: Sequence[tuple[float, bool]]) -> float:
    """The highest rate at which the SLA held (0.0 if it never did)."""
    return max((rate for rate, ok in history if ok), default=0.0)


def requests_for(rate: float, s: CapacitySettings) -> int:
    return max(s.min_requests, min(s.max_requests, round(rate * s.step_duration_s)))


def trace_arrivals(offsets: Sequence[float], trace_rate: float, rate: float, n: int) -> list[float]:
    """Send offsets of a step at `rate` on a timed trace (module docstring): the first `n` of
    the trace's `offsets` (at speed-up 1) divided by the speed-up rate / `trace_rate`."""
    return [t * trace_rate / rate for t in offsets[:n]]
