"""Benchmark metrics with the names and formulas of `vllm bench serve` (pure functions).

Matches ``vllm.benchmarks.serve.calculate_metrics`` and the result dict of
``benchmark()`` (vLLM 0.32), except ``max_concurrent_requests``, computed exactly here.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from framework.base.vocabulary import COUNT_METRICS  # noqa: F401 - re-exported: the load's metric names
from framework.base.vocabulary import DEFAULT_PERCENTILES
from framework.base.vocabulary import LATENCY_METRICS
from framework.base.vocabulary import PEAK_METRICS  # noqa: F401 - re-exported: the load's metric names
from framework.base.vocabulary import SLO_METRICS
from framework.base.vocabulary import SUMMARY_KEYS  # noqa: F401 - re-exported: the load's metric names
from framework.base.vocabulary import metric_names  # noqa: F401 - re-exported: the load's metric names
from framework.base.vocabulary import percentile_key

if TYPE_CHECKING:
    from framework.load.loadgen import RequestRecord

def latency_stats_ms(
    metric: str, values_s: Sequence[float], percentiles: Sequence[float]
) -> dict[str, float]:
    """mean, median, std (population, ddof=0) and numpy-linear percentiles, in ms.

    An empty ``values_s`` gives 0.0 everywhere (vLLM evaluates ``np.mean(values or 0)``).
    """
    values = np.asarray(values_s if len(values_s) else [0.0], dtype=float)
    stats = {
        f"mean_{metric}_ms": float(np.mean(values)) * 1000,
        f"median_{metric}_ms": float(np.median(values)) * 1000,
        f"std_{metric}_ms": float(np.std(values)) * 1000,
    }
    for p in percentiles:
        stats[percentile_key(metric, p)] = float(np.percentile(values, p)) * 1000
    return stats


def max_in_flight(intervals: Sequence[tuple[float, float]]) -> int:
    """Largest number of half-open intervals [start, end) that contain a common instant.

    A request ending at t and one starting at t do not overlap.
    """
    events = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def max_chunks_per_second(records: Sequence[RequestRecord]) -> float:
    """vLLM's max_output_tokens_per_s over successful ``records``.

    Buckets of one second start at t0 = min(send_s); there are
    ceil(max(end_s) - t0) + 1 of them; each content chunk time t counts 1 in bucket
    int(t - t0). Result: the fullest bucket. vLLM counts chunks, not tokens, so a chunk
    carrying several tokens counts once.
    """
    if not records:
        return 0.0
    t0 = min(r.send_s for r in records)
    last = max(r.end_s for r in records if r.end_s is not None)
    buckets = np.zeros(int(np.ceil(last - t0)) + 1)
    for record in records:
        for t in record.chunk_s:
            bucket = int(t - t0)
            if 0 <= bucket < len(buckets):
                buckets[bucket] += 1
    return float(np.max(buckets))


def count_good(records: Sequence[RequestRecord], goodput_slo_ms: Mapping[str, float]) -> int:
    """Successful requests meeting every given SLO: value_s <= limit_ms / 1000.

    Keys are "ttft", "tpot", "e2el"; a request with <= 1 output token has TPOT 0 here
    (vLLM's rule).
    """
    unknown = set(goodput_slo_ms) - set(SLO_METRICS)
    if unknown:
        raise ValueError(f"unknown SLO metric(s) {sorted(unknown)}; expected {list(SLO_METRICS)}")
    negative = {k: v for k, v in goodput_slo_ms.items() if v < 0}
    if negative:
        raise ValueError(f"SLO limits must be >= 0, got {negative}")
    good = 0
    for record in records:
        values = {
            "ttft": record.ttft_s or 0.0,
            "tpot": record.tpot_s or 0.0,
            "e2el": record.e2el_s or 0.0,
        }
        if all(values[name] <= limit / 1000 for name, limit in goodput_slo_ms.items()):
            good += 1
    return good


def compute_metrics(
    records: Sequence[RequestRecord],
    duration_s: float,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput_slo_ms: Mapping[str, float] | None = None,
) -> dict[str, float | int]:
    """vLLM bench serve's metrics for ``records`` over a run of ``duration_s`` seconds.

    S = successful records (only they enter statistics); everything else counts as failed.
    - completed = |S|, failed = len(records) - |S|, duration = duration_s
    - total_input_tokens = sum(prompt_tokens over S), total_output_tokens likewise
    - request_throughput = completed / duration
    - request_goodput = good / duration (only if ``goodput_slo_ms`` is non-empty, like
      vLLM; see count_good)
    - output_throughput = total_output_tokens / duration
    - total_token_throughput = (total_input_tokens + total_output_tokens) / duration
    - max_output_tokens_per_s: see max_chunks_per_second
    - max_concurrent_requests: max over instants of requests of S in flight, intervals
      [send_s, end_s) (vLLM's per-second bucketing over-reports; not copied)
    - TTFT = first content chunk - send; E2EL = last content chunk - send
    - TPOT = (E2EL - TTFT) / (output_tokens - 1), only requests with output_tokens > 1
    - ITL = gaps between consecutive content chunks, pooled over S (chunk-weighted)
    - for each of these: mean/median/std (ddof=0) and p{P} (numpy linear), in ms;
      an empty set gives 0.0
    The caller chooses the records (e.g. drops warm-up requests) and the duration.
    """
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    ok = [r for r in records if r.success]
    total_input = sum(r.prompt_tokens for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    result: dict[str, float | int] = {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration": float(duration_s),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration_s,
    }
    if goodput_slo_ms:
        result["request_goodput"] = count_good(ok, goodput_slo_ms) / duration_s
    result["output_throughput"] = total_output / duration_s
    result["total_token_throughput"] = (total_input + total_output) / duration_s
    result["max_output_tokens_per_s"] = max_chunks_per_second(ok)
    result["max_concurrent_requests"] = max_in_flight(
        [(r.send_s, r.end_s) for r in ok if r.end_s is not None]
    )

    samples: dict[str, list[float]] = {
        "ttft": [r.ttft_s for r in ok if r.ttft_s is not None],
        "tpot": [t for r in ok if (t := r.tpot_s) is not None],
        "itl": [gap for r in ok for gap in r.itl_s],
        "e2el": [e for r in ok if (e := r.e2el_s) is not None],
    }
    for metric in LATENCY_METRICS:
        result.update(latency_stats_ms(metric, samples[metric], percentiles))
    return result
