"""Predicted vs measured (`search.prior`): how far the predictor's numbers (the rows'
`predicted_<metric>` columns, engine/prediction.py) were from what this cluster measured.

- per metric: MAPE = mean |predicted - measured| / measured over the measured trials, with a
  95% bootstrap interval (resampling the trials, seeded), and the median ratio
  measured / predicted (the model's bias on this cluster);
- per flag: for the objective's metric, the mean ln(measured / predicted) at each value of a
  parameter; the flags whose values differ most are where the model was wrong;
- the per-cluster correction (engine/correction.py), judged leave-one-out: each trial's
  prediction corrected by a fit on the other trials, its MAPE beside the raw one;
- the predictor's memory per GPU (weights, KV space) against our memory model's.
Pure: trial rows in, numbers and HTML out.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from framework.engine.correction import fit
from framework.engine.correction import mape
from framework.engine.prediction import PREDICTED_METRICS

BOOTSTRAP = 2000
PREFIX = "predicted_"


@dataclass(frozen=True)
class MetricError:
    metric: str
    n: int
    mape: float
    low: float  # 95% bootstrap interval of the MAPE
    high: float
    bias: float  # median measured / predicted


def _pairs(trials: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Measured trials (COMPLETE, confirmations included) with both numbers > 0."""
    col = PREFIX + metric
    if trials.empty or col not in trials.columns or metric not in trials.columns:
        return pd.DataFrame()
    done = trials[trials["state"] == "COMPLETE"]
    p, m = pd.to_numeric(done[col], errors="coerce"), pd.to_numeric(done[metric], errors="coerce")
    keep = (p > 0) & (m > 0) & np.isfinite(p) & np.isfinite(m)
    return done[keep].assign(_p=p[keep], _m=m[keep])


def errors(trials: pd.DataFrame, seed: int = 0) -> list[MetricError]:
    """Each predicted metric's error over the measured trials (metrics without a pair left
    out)."""
    out = []
    rng = np.random.default_rng(seed)
    for metric in PREDICTED_METRICS:
        pairs = _pairs(trials, metric)
        if pairs.empty:
            continue
        ape = (np.abs(pairs["_p"] - pairs["_m"]) / pairs["_m"]).to_numpy()
        boot = ape[rng.integers(0, len(ape), size=(BOOTSTRAP, len(ape)))].mean(axis=1)
        out.append(MetricError(metric, len(ape), float(ape.mean()),
                               float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5)),
                               float(np.median(pairs["_m"] / pairs["_p"]))))
    return out


def flag_errors(trials: pd.DataFrame, metric: str) -> list[tuple[str, dict[str, float]]]:
    """For `metric`: each parameter with >= 2 values among the measured trials, with the mean
    ln(measured / predicted) at each value; the largest spread between values first."""
    pairs = _pairs(trials, metric)
    out = []
    for col in (c for c in pairs.columns if c.startswith("param_")):
        groups = pairs.groupby(pairs[col].astype(str), dropna=False)
        means = {str(v): float(np.log(g["_m"] / g["_p"]).mean()) for v, g in groups}
        if len(means) >= 2:
            out.append((col[len("param_"):], means))
    return sorted(out, key=lambda item: -(max(item[1].values()) - min(item[1].values())))


def corrected_loo(trials: pd.DataFrame, metric: str) -> tuple[float, float] | None:
    """(raw MAPE, leave-one-out corrected MAPE) of `metric`; None with fewer than 3 trials."""
    pairs = _pairs(trials, metric)
    if len(pairs) < 3:
        return None
    params = [{c: (None if pd.isna(v) else v) for c, v in row.items() if c.startswith("param_")}
              for _, row in pairs.iterrows()]
    p, m = pairs["_p"].tolist(), pairs["_m"].tolist()
    corrected = []
    for i in range(len(p)):
        c = fit(metric, [(params[j], p[j], m[j]) for j in range(len(p)) if j != i])
        corrected.append((c.apply(params[i], p[i]) if c else p[i], m[i]))
    raw, loo = mape(list(zip(p, m, strict=True))), mape(corrected)
    return None if raw is None or loo is None else (raw, loo)


MEMORY_PAIRS = (("predicted_weights_gib_per_gpu", "est_weights_gib_per_gpu", "weights"),
                ("predicted_kv_gib_per_gpu", "est_kv_budget_gib_per_gpu", "KV cache space"))


def memory_check(trials: pd.DataFrame) -> list[tuple[str, int, float]]:
    """The predictor's memory model against ours (engine/memory_model.py), per GPU: for weights
    and KV space, (what, trials, median predictor / ours) over the trials both estimated (> 0)."""
    out = []
    for theirs, ours, what in MEMORY_PAIRS:
        if trials.empty or theirs not in trials.columns or ours not in trials.columns:
            continue
        a, b = pd.to_numeric(trials[theirs], errors="coerce"), pd.to_numeric(trials[ours],
                                                                            errors="coerce")
        keep = (a > 0) & (b > 0)
        if keep.any():
            out.append((what, int(keep.sum()), float((a[keep] / b[keep]).median())))
    return out


def prediction_section(trials: pd.DataFrame, objective: str) -> str:
    """The section's HTML, or a sentence when the sweep has no predictions."""
    found = errors(trials)
    if not found:
        return "<p>No predictions: the sweep has no <code>search.prior</code> (or none of its " \
               "measured trials was predicted).</p>"
    source = trials["predictor"].dropna().iloc[0] if "predictor" in trials.columns and \
        trials["predictor"].notna().any() else "?"
    lines = [f"<p class='small'>Predictor <code>{html.escape(str(source))}</code>. MAPE = mean "
             "|predicted - measured| / measured over the measured trials, 95% bootstrap interval; "
             "bias = median measured / predicted. A prediction never decided a verdict.</p>",
             "<table id='prediction'><thead><tr><th>metric</th><th>trials</th><th>MAPE</th>"
             "<th>95% interval</th><th>bias</th></tr></thead><tbody>"]
    for e in found:
        lines.append(f"<tr><td>{e.metric}</td><td class='n'>{e.n}</td><td class='n'>{e.mape:.1%}"
                     f"</td><td class='n'>{e.low:.1%} - {e.high:.1%}</td>"
                     f"<td class='n'>{e.bias:.2f}x</td></tr>")
    lines.append("</tbody></table>")
    metric = objective if any(e.metric == objective for e in found) else found[0].metric
    flags = flag_errors(trials, metric)[:3]
    if flags:
        lines.append(f"<p>Where the model was wrong ({html.escape(metric)}: measured / predicted "
                     "at each value):</p><ul>")
        for name, means in flags:
            text = ", ".join(f"{html.escape(v)}: {math.exp(x):.2f}x" for v, x in means.items())
            lines.append(f"<li><code>{html.escape(name)}</code>: {text}</li>")
        lines.append("</ul>")
    memory = memory_check(trials)
    if memory:
        lines.append("<p>Memory per GPU, the predictor's model against ours (the feasibility "
                     "model's <code>est_</code> columns): " + "; ".join(
                         f"{what} {ratio:.2f}x ours (median of {n} trials)"
                         for what, n, ratio in memory) + ".</p>")
    loo = corrected_loo(trials, metric)
    if loo is not None:
        lines.append(f"<p>Per-cluster correction (fitted on this sweep's measurements, judged "
                     f"leave-one-out): {metric} MAPE {loo[0]:.1%} raw, {loo[1]:.1%} corrected.</p>")
    return "\n".join(lines)
