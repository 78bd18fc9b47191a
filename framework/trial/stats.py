"""Repeated measurements: mean, 95% confidence interval, coefficient of variation. Pure.

For n values x_1..x_n (n >= 2): mean m, sample standard deviation s (ddof = 1),
half-width h = t(0.975, n - 1) x s / sqrt(n) (Student's t), interval [m - h, m + h];
coefficient of variation cv = s / m. With n = 1 the interval is [m, m] and cv is None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

from framework.base.vocabulary import split_class_key

# t(0.975, df) for df = 1..30; beyond, the normal 1.96 is within 2%.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    cv: float | None


def mean_ci(values: Sequence[float]) -> Interval:
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    m = sum(values) / n
    if n == 1:
        return Interval(m, m, m, None)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    h = t975(n - 1) * s / math.sqrt(n)
    return Interval(m, m - h, m + h, s / m if m else None)


def combine(runs: Sequence[Mapping[str, float]], sums: Sequence[str] = (),
            maxima: Sequence[str] = ()) -> dict[str, float]:
    """Every metric over repeated runs (keys of the first run): the sum for counts (`sums`),
    the largest for peaks (`maxima`), else the mean; a mix class's key (`chat.completed`)
    like its metric's."""
    out: dict[str, float] = {}
    for key in runs[0]:
        values = [r[key] for r in runs]
        metric = split_class_key(key)[1]
        if metric in sums:
            out[key] = sum(values)
        elif metric in maxima:
            out[key] = max(values)
        else:
            out[key] = sum(float(v) for v in values) / len(values)
    return out
