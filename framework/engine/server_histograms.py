"""vLLM's own latency histograms from ``/metrics``: one scrape before a run and one after, the
difference is what the server measured for that run's requests (pure, except ``scrape``).

The histograms (``vllm/v1/metrics/loggers.py``, fed by ``vllm/v1/metrics/stats.py``):

- ``vllm:time_to_first_token_seconds``: from the request's arrival in the engine (set when the
  API server hands the tokenized prompt to the engine, ``AsyncLLM.add_request``) to the moment
  the API server's output handler receives the first token. A client's TTFT adds the HTTP
  request and response legs, the API server's parsing and tokenization, and its own delays.
- ``vllm:inter_token_latency_seconds``: gaps between the engine core's timestamps of a request's
  consecutive token batches (no network, no burst of chunks in one socket read).
- ``vllm:request_time_per_output_token_seconds``: per request, (last token - first token) /
  (generated tokens - 1), engine-core timestamps: the TPOT of vllm bench's definition.
- ``vllm:e2e_request_latency_seconds``: arrival to the request's finishing iteration.

The default buckets are too coarse for a tiny model on CPU (the first inter-token bucket is
10 ms); ``FINE_BUCKETS`` is a ``--custom-histogram-buckets`` value (``vllm/config/observability.py``)
fine enough that the interpolated median is within a few percent of the exact one.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
E2EL = "vllm:e2e_request_latency_seconds"
HISTOGRAMS: dict[str, str] = {"ttft": TTFT, "itl": ITL, "tpot": TPOT, "e2el": E2EL}


def _steps(start: float, stop: float, step: float) -> list[float]:
    n = round((stop - start) / step)
    return [round(start + i * step, 6) for i in range(n + 1)]


FINE_BUCKETS: dict[str, list[float]] = {
    # 0.5 ms steps to 100 ms, 5 ms to 500 ms, then coarse
    "time_to_first_token": [*_steps(0.0005, 0.1, 0.0005), *_steps(0.105, 0.5, 0.005),
                            1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
    # 0.1 ms steps to 20 ms, 1 ms to 100 ms, then coarse (ITL and TPOT share the family)
    "inter_token_latency": [*_steps(0.0001, 0.02, 0.0001), *_steps(0.021, 0.1, 0.001),
                            0.25, 0.5, 1.0, 2.5, 5.0],
    # 5 ms steps to 2 s, then coarse (e2e, queue, prefill, decode, inference share it)
    "request_latency": [*_steps(0.005, 2.0, 0.005), 5.0, 10.0, 30.0, 60.0, 120.0, 600.0],
}


def fine_buckets_flag() -> list[str]:
    """`vllm serve` arguments that install FINE_BUCKETS."""
    return ["--custom-histogram-buckets", json.dumps(FINE_BUCKETS, separators=(",", ":"))]


@dataclass(frozen=True)
class Histogram:
    """One Prometheus histogram, summed over its label sets: cumulative counts per upper
    bound (ascending, the last one +Inf), the sum of observations and their count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, before: Histogram) -> Histogram:
        """The observations made between ``before`` and this scrape (same bounds required)."""
        if [le for le, _ in self.buckets] != [le for le, _ in before.buckets]:
            raise ValueError("histograms with different bucket bounds")
        return Histogram(tuple((le, a - b) for (le, a), (_, b) in zip(self.buckets, before.buckets)),
                         self.sum - before.sum, self.count - before.count)

    def mean(self) -> float | None:
        """sum / count (exact, no bucket error); None without observations."""
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: rank = q * count; linear interpolation inside the
        first bucket whose cumulative count reaches the rank (lower bound 0 for the first
        bucket); the highest finite bound if the rank falls in +Inf. None without data."""
        if not 0 <= q <= 1:
            raise ValueError(f"q must be in [0, 1], got {q}")
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank and cumulative > below:
                if math.isinf(le):
                    return lower
                return lower + (le - lower) * (rank - below) / (cumulative - below)
            lower, below = le, cumulative
        return lower


_LE = re.compile(r'le="([^"]+)"')


def parse_histograms(text: str, names: Sequence[str] = tuple(HISTOGRAMS.values())
                     ) -> dict[str, Histogram]:
    """The histograms ``names`` in Prometheus exposition ``text`` (absent ones are absent),
    each summed over its label sets (several engines add up). Reads only the
    ``<name>_bucket{...le="..."...} v``, ``<name>_sum{...} v`` and ``<name>_count{...} v``
    lines; a malformed one raises ValueError."""
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(tuple(names)):
            continue
        series, _, value = line.rpartition(" ")
        metric = series.split("{", 1)[0]
        name, _, part = metric.rpartition("_")
        if name not in names:
            continue
        if part == "bucket":
            le = _LE.search(series)
            if le is None:
                raise ValueError(f"bucket without le: {line!r}")
            row = buckets.setdefault(name, {})
            row[float(le.group(1))] = row.get(float(le.group(1)), 0.0) + float(value)
        elif part == "sum":
            sums[name] = sums.get(name, 0.0) + float(value)
        elif part == "count":
            counts[name] = counts.get(name, 0.0) + float(value)
    return {name: Histogram(tuple(sorted(rows.items())), sums.get(name, 0.0),
                            counts.get(name, 0.0)) for name, rows in buckets.items()}


def run_summary(before: Mapping[str, Histogram], after: Mapping[str, Histogram]
                ) -> dict[str, float | None]:
    """Per metric key of HISTOGRAMS (ttft, itl, tpot, e2el), the run's delta as
    ``median_<key>_ms`` (interpolated), ``mean_<key>_ms`` (sum / count) and ``<key>_count``."""
    out: dict[str, float | None] = {}
    for key, name in HISTOGRAMS.items():
        if name not in before or name not in after:
            out.update({f"median_{key}_ms": None, f"mean_{key}_ms": None, f"{key}_count": None})
            continue
        delta = after[name].minus(before[name])
        median, mean = delta.quantile(0.5), delta.mean()
        out[f"median_{key}_ms"] = None if median is None else 1000 * median
        out[f"mean_{key}_ms"] = None if mean is None else 1000 * mean
        out[f"{key}_count"] = delta.count
    return out


def scrape(base_url: str, timeout_s: float = 10.0) -> dict[str, Histogram]:
    """GET {base_url}/metrics and parse HISTOGRAMS (OSError if the server does not answer 200)."""
    from framework.engine.server_metrics import fetch_text

    return parse_histograms(fetch_text(f"{base_url.rstrip('/')}/metrics", timeout_s))
