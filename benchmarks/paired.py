"""Paired comparison of two clients run in pairs on one server (trace_parity.py): each pair's
difference, ours / vllm bench - 1, of a per-run value, and their median with a distribution-
free confidence interval. Pairing cancels the server's drift between pairs, which on this box
is as large as the effect looked for (trace_parity_aa.py: 12-14% between two runs of one
client).

Median CI (order statistics, no distribution assumed): for n sorted values x_(1..n), the
interval [x_(k), x_(n+1-k)] with k the largest integer such that P(Binomial(n, 1/2) < k)
<= (1 - level) / 2 covers the population median with probability >= level (Conover,
Practical Nonparametric Statistics, 3rd ed., 3.2). Too few values for any such k: (-inf, inf).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high) of `values`; low/high are -inf/inf when n is too small."""
    xs = sorted(values)
    n = len(xs)
    tail, k, below = (1 - level) / 2, 0, 0.0
    while k < n and below + math.comb(n, k) / 2 ** n <= tail:
        below += math.comb(n, k) / 2 ** n
        k += 1
    if k == 0:
        return statistics.median(xs), -math.inf, math.inf
    return statistics.median(xs), xs[k - 1], xs[n - k]


def pair_differences(rows: Sequence[dict[str, Any]], key: str, clients: tuple[str, str]
                     ) -> list[float]:
    """Per pair (rows' `pair`), `key` of clients[1] / `key` of clients[0] - 1."""
    out = []
    for pair in sorted({r["pair"] for r in rows}):
        a, b = (next(r[key] for r in rows if r["pair"] == pair and r["client"] == c)
                for c in clients)
        out.append(b / a - 1)
    return out


def paired_table(rows: Sequence[dict[str, Any]], clients: tuple[str, str],
                 keys: Sequence[tuple[str, str, bool]], within: float = 0.10) -> list[str]:
    """Markdown rows: per (key, label, has_target) the median pair difference [95% CI], the
    pairs within +-`within`, and the verdict (met: |median| <= within; the CI tells whether
    that holds with 95% confidence)."""
    lines = ["| paired, ours vs vllm bench per pair | median [95% CI] | pairs within "
             f"{within:.0%} | within {within:.0%} |", "| --- | ---: | ---: | --- |"]
    for key, label, target in keys:
        diffs = pair_differences(rows, key, clients)
        mid, lo, hi = median_ci(diffs)
        inside = sum(abs(d) <= within for d in diffs)
        verdict = "(no target)"
        if target:
            verdict = "met" if abs(mid) <= within else "MISSED"
            verdict += (", CI inside" if -within <= lo and hi <= within else ", CI not inside")
        ci = "n too small" if math.isinf(lo) else f"{100 * lo:+.1f}% .. {100 * hi:+.1f}%"
        lines.append(f"| {label} | {100 * mid:+.1f}% [{ci}] | {inside} of {len(diffs)} | "
                     f"{verdict} |")
    return lines
