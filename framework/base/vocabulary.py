"""The words every room shares, defined once: `Scalar` (a flag or parameter value), the metric
names and keys of `vllm bench serve` (vllm/benchmarks/serve.py, vLLM 0.32), and how an SLA or
objective key is read.

Keys: `{mean,median,std}_{metric}_ms` and `p{P}_{metric}_ms` for metric in LATENCY_METRICS,
with P written as an integer when whole (p99_ttft_ms, p99.9_itl_ms); `error_rate` for the SLA;
the THROUGHPUT_METRICS (maximized) for objectives. SLA keys are upper bounds (`value <=
limit`), except the LOWER_BOUND_KEYS (`min_token_agreement`: the quality probe's token
agreement with the baseline, framework.trial.quality, must be `>= limit`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

Scalar = bool | int | float | str

DEFAULT_PERCENTILES: tuple[float, ...] = (25, 50, 75, 90, 95, 99)
LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
SLO_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2el")  # per-request limits of goodput
SUMMARY_KEYS: tuple[str, ...] = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
)
# How repeated runs of one trial combine (trial.stats.combine): counts add up, peaks take the max.
COUNT_METRICS = ("completed", "failed", "total_input_tokens", "total_output_tokens")
PEAK_METRICS = ("max_concurrent_requests",)
THROUGHPUT_METRICS = ("request_throughput", "output_throughput", "total_token_throughput",
                      "request_goodput", "output_throughput_per_gpu", "request_goodput_per_gpu",
                      "capacity_rps")
ERROR_RATE = "error_rate"
MIN_TOKEN_AGREEMENT = "min_token_agreement"
LOWER_BOUND_KEYS = (MIN_TOKEN_AGREEMENT,)

_LATENCY_KEY = re.compile(r"^(mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


def percentile_key(metric: str, p: float) -> str:
    """vLLM's key for percentile ``p`` of ``metric``: p99_ttft_ms, p99.9_itl_ms."""
    p_word = str(int(p)) if int(p) == p else str(p)
    return f"p{p_word}_{metric}_ms"


def metric_names(percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> list[str]:
    """Every key `load.metrics.compute_metrics` returns except request_goodput, in a stable
    order."""
    names = list(SUMMARY_KEYS)
    for metric in LATENCY_METRICS:
        names += [f"mean_{metric}_ms", f"median_{metric}_ms", f"std_{metric}_ms"]
        names += [percentile_key(metric, p) for p in percentiles]
    return names


@dataclass(frozen=True)
class LatencyKey:
    """A latency key read: `stat` is mean, median, std or pP; `percentile` is P (median: 50,
    mean and std: None); `metric` one of LATENCY_METRICS."""

    stat: str
    metric: str
    percentile: float | None


def parse_latency_key(key: str) -> LatencyKey | None:
    """p99_ttft_ms -> LatencyKey("p99", "ttft", 99.0); None for anything else, including a
    percentile outside (0, 100]."""
    match = _LATENCY_KEY.match(key)
    if not match:
        return None
    stat, metric = match.group(1), match.group(3)
    if stat.startswith("p"):
        p = float(stat[1:])
        return LatencyKey(stat, metric, p) if 0 < p <= 100 else None
    return LatencyKey(stat, metric, 50.0 if stat == "median" else None)


def is_latency_metric(key: str) -> bool:
    """True for keys like p99_ttft_ms, mean_tpot_ms, p99.9_itl_ms (percentile in (0, 100])."""
    return parse_latency_key(key) is not None


def is_throughput_metric(key: str) -> bool:
    """Objectives that are maximized."""
    return key in THROUGHPUT_METRICS


def is_lower_bound(key: str) -> bool:
    """SLA keys that are lower bounds (`value >= limit`): min_token_agreement."""
    return key in LOWER_BOUND_KEYS


def limit_text(key: str, limit: float) -> str:
    """One SLA limit as people read it: `p99_ttft_ms <= 500`, `min_token_agreement >= 0.95`."""
    return f"{key} {'>=' if is_lower_bound(key) else '<='} {limit:g}"


def load_limits(sla: Mapping[str, float]) -> dict[str, float]:
    """The SLA limits a load run can judge by itself (every key but the LOWER_BOUND_KEYS,
    which need the quality probe)."""
    return {key: limit for key, limit in sla.items() if not is_lower_bound(key)}
