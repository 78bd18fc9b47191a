"""Pure arithmetic over time intervals for the scheduling scale test
(tests/e2e/test_scheduling_scale.py: 2x2 by default, 4x8 in benchmarks/scheduling.py): the size
of its emulated cluster, the union of intervals, the busy fraction while trials were queued, and
how many trials waited at once. No Ray, no processes; checked by hand in
tests/unit/test_scheduling_math.py.

An interval is (start, end) in seconds, end exclusive."""

from __future__ import annotations

SCALE_VAR = "SCALE_CLUSTER"  # the environment variable that sizes the emulated cluster


def cluster_shape(value: str) -> tuple[int, int]:
    """`NODESxGPUS` (e.g. "4x8") as (nodes, GPUs per node), both >= 1; ValueError otherwise."""
    nodes, _, gpus = value.lower().partition("x")
    shape = int(nodes), int(gpus)
    if min(shape) < 1:
        raise ValueError(f"{SCALE_VAR}={value!r}: want NODESxGPUS, both >= 1")
    return shape


def merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, as disjoint sorted intervals."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def busy_fraction_while_queued(intervals: list[tuple[float, float]], queued: list[tuple[float, float]],
                               devices: int) -> float:
    """Mean over queued time of (devices in use / devices), by sweeping interval endpoints.
    `intervals` holds one interval per device in use. Overlapping queued intervals count once
    each (time weighted by trials waiting); pass merged(queued) for the time any trial waited.
    1.0 when nothing was queued."""
    total = busy = 0.0
    for q0, q1 in queued:
        cuts = sorted({q0, q1, *[t for iv in intervals for t in iv if q0 < t < q1]})
        for a, b in zip(cuts, cuts[1:]):
            mid = (a + b) / 2
            in_use = sum(1 for s, e in intervals if s <= mid < e)
            busy += (b - a) * in_use / devices
            total += b - a
    return busy / total if total else 1.0


def most_waiting_at_once(queued: list[tuple[float, float]]) -> int:
    """The largest number of the intervals that hold one moment (an end is exclusive)."""
    events = sorted([(a, 1) for a, _ in queued] + [(b, -1) for _, b in queued])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most
