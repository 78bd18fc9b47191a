"""A per-cluster correction of a predictor (engine/predictor.py), fitted on what one sweep
measured: how far this cluster's measurements are from the model, as a function of the flags.

For one metric, each measured trial gives y = ln(measured / predicted). The correction is a
ridge regression y ~ b + w . x(params) (intercept b not penalised; x: the trial's features,
`features`), fitted by the closed form w = (X'X + lambda I)^-1 X'(y - b) on centred data;
the corrected prediction of an untried configuration is predicted x exp(b + w . x). With one
or two trials it is little more than the mean bias b; each further trial lets it learn which
flags the model gets wrong. Pure (numpy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from framework.base.vocabulary import Scalar

RIDGE = 1.0  # lambda: with features of order 1 (log2 steps, 0/1), a weight needs ~2 trials' say


def features(params: Mapping[str, Scalar | None]) -> dict[str, float]:
    """A configuration's features: a number > 0 as its log2 (flags such as max-num-seqs act on
    a ratio scale), any other number as itself, a bool as 0/1, a string as a one-hot
    `name=value`; a parameter left out (None) adds nothing."""
    out: dict[str, float] = {}
    for name, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            out[name] = float(value)
        elif isinstance(value, (int, float)):
            out[name] = math.log2(value) if value > 0 else float(value)
        else:
            out[f"{name}={value}"] = 1.0
    return out


@dataclass(frozen=True)
class Correction:
    """ln(measured / predicted) ~ intercept + sum(weights[f] x feature f); `n` trials fitted."""

    metric: str
    intercept: float
    weights: Mapping[str, float]
    means: Mapping[str, float]  # each feature's mean over the fitted trials (centring)
    n: int

    def factor(self, params: Mapping[str, Scalar | None]) -> float:
        """exp(intercept + w . (x - mean)): what the prediction of `params` is multiplied by."""
        x = features(params)
        z = sum(w * (x.get(f, 0.0) - self.means[f]) for f, w in self.weights.items())
        return math.exp(self.intercept + z)

    def apply(self, params: Mapping[str, Scalar | None], predicted: float) -> float:
        return predicted * self.factor(params)


def fit(metric: str, trials: Sequence[tuple[Mapping[str, Scalar | None], float, float]],
        ridge: float = RIDGE) -> Correction | None:
    """The correction of `metric` from (params, predicted, measured) of measured trials; trials
    with a value <= 0 or not finite on either side are left out. None without any left."""
    kept = [(p, pr, me) for p, pr, me in trials
            if math.isfinite(pr) and math.isfinite(me) and pr > 0 and me > 0]
    if not kept:
        return None
    rows = [features(p) for p, _, _ in kept]
    names = sorted({f for r in rows for f in r})
    y = np.array([math.log(me / pr) for _, pr, me in kept])
    x = np.array([[r.get(f, 0.0) for f in names] for r in rows]).reshape(len(kept), len(names))
    means = x.mean(axis=0) if len(names) else np.zeros(0)
    xc = x - means
    intercept = float(y.mean())
    w = np.linalg.solve(xc.T @ xc + ridge * np.eye(len(names)), xc.T @ (y - intercept)) \
        if len(names) else np.zeros(0)
    return Correction(metric=metric, intercept=intercept,
                      weights={f: float(v) for f, v in zip(names, w, strict=True)},
                      means={f: float(v) for f, v in zip(names, means, strict=True)}, n=len(kept))


def mape(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Mean absolute percentage error of (predicted, measured) pairs: mean |p - m| / m, as a
    fraction; pairs with m <= 0 or a non-finite value left out (None if none is left)."""
    errors = [abs(p - m) / m for p, m in pairs if math.isfinite(p) and math.isfinite(m) and m > 0]
    return sum(errors) / len(errors) if errors else None
