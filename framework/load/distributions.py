"""Draws from a workload's stated distributions (config.multi_turn_spec.DistributionSpec), from a
seeded numpy Generator: same generator state, same draws. Pure."""

from __future__ import annotations

import math

import numpy as np

from framework.config.multi_turn_spec import LOGNORMAL_MEDIAN_RATIO
from framework.config.multi_turn_spec import DistributionSpec


def draw(dist: DistributionSpec, rng: np.random.Generator, size: int) -> np.ndarray:
    """`size` floats: constant `value`; uniform on [min, max]; exponential of mean `mean`;
    lognormal with mean `average` and median `average * median_ratio` (default 0.85, vLLM's):
    sigma = sqrt(2 ln(1 / median_ratio)), mu = ln(average * median_ratio). Then capped at
    `max` where given. Unlike vLLM's benchmark the draws are not rescaled to their sample
    mean, so a draw does not depend on how many are drawn with it."""
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if dist.distribution == "constant":
        values = np.full(size, float(dist.value or 0.0))
    elif dist.distribution == "uniform":
        values = rng.uniform(float(dist.min or 0.0), float(dist.max or 0.0), size=size)
    elif dist.distribution == "exponential":
        values = rng.exponential(float(dist.mean or 0.0), size=size)
    else:
        ratio = dist.median_ratio or LOGNORMAL_MEDIAN_RATIO
        average = float(dist.average or 0.0)
        values = rng.lognormal(math.log(average * ratio), math.sqrt(2 * math.log(1 / ratio)),
                               size=size)
    capped: np.ndarray = np.minimum(values, dist.upper)  # a ufunc's result is untyped
    return capped


def draw_counts(dist: DistributionSpec, rng: np.random.Generator, size: int) -> list[int]:
    """`size` whole numbers >= 1: draw() rounded half to even, then raised to 1 (a turn
    count, a token count). A uniform count takes each integer of [round(min), round(max)]
    with equal probability."""
    if dist.distribution == "uniform":
        low, high = round(dist.min or 0.0), round(dist.max or 0.0)
        values = rng.integers(low, high + 1, size=size)
    else:
        values = np.rint(draw(dist, rng, size))
    return [max(1, int(v)) for v in values]
