"""The words every room shares, defined once: `Scalar` (a flag or parameter value), the metric
names and keys of `vllm bench serve` (vllm/benchmarks/serve.py, vLLM 0.32), and how an SLA or
objective key is read.

Keys: `{mean,median,std}_{metric}_ms` and `p{P}_{metric}_ms` for metric in LATENCY_METRICS,
with P written as an integer when whole (p99_ttft_ms, p99.9_itl_ms); `error_rate` for the SLA;
the THROUGHPUT_METRICS (maximized) for objectives. SLA keys are upper bounds (`value <=
limit`), except the LOWER_BOUND_KEYS (`min_token_agreement`: the quality probe's token
agreement with the baseline, framework.trial.quality, must be `>= limit`).

A request class of a mix (`workload.mix`) has its own copy of every load metric, its key
prefixed by the class name and a dot: `summarize.p99_ttft_ms`, `chat.error_rate`
(`class_key`, `split_class_key`); units and SLA rules are those of the unprefixed key.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Scalar = bool | int | float | str

# Start-up levers (framework.engine.startup_levers): names a sweep may enable and a row records.
StartupLever = Literal["cudagraph_sizes", "compile_cache", "page_cache", "load_format",
                       "fork_start", "warm_start"]

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
# Objectives of the deployment (framework.fleet), minimized: GPUs and cost per hour of the fleet
# that carries the sweep's `target:` (capacity mode), cost of a million output tokens.
FLEET_OBJECTIVES = ("gpus_for_target", "cost_per_hour_for_target", "cost_per_mtok_output")
ERROR_RATE = "error_rate"
# The response header by which the replicas shape's router (framework/engine/router.py) names
# the server that answered (0-based); the load generator records it (request rows: `replica`).
REPLICA_HEADER = "X-Vllm-Sweep-Replica"
MIN_TOKEN_AGREEMENT = "min_token_agreement"
LOWER_BOUND_KEYS = (MIN_TOKEN_AGREEMENT,)

_LATENCY_KEY = re.compile(r"^(mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


# A mix class's name: no dot, and not a percentile word (p99), so `p99.9_itl_ms` is no class key.
# Both patterns are used with fullmatch: with re.match, `$` matches before a trailing newline.
CLASS_NAME = re.compile(r"^(?!p\d+$)[A-Za-z][A-Za-z0-9_-]{0,31}$")


def class_key(request_class: str, key: str) -> str:
    """The key of metric `key` over one request class of a mix: `summarize.p99_ttft_ms`."""
    return f"{request_class}.{key}"


def split_class_key(key: str) -> tuple[str | None, str]:
    """`summarize.p99_ttft_ms` -> ("summarize", "p99_ttft_ms"); a key without a class prefix
    -> (None, key). A dot inside a percentile (p99.9_itl_ms) is no prefix."""
    head, dot, rest = key.partition(".")
    if dot and CLASS_NAME.fullmatch(head):
        return head, rest
    return None, key


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
    match = _LATENCY_KEY.fullmatch(key)
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


# Units of the row columns (docs/RESULTS.md), as shown to a user: `unit_of` and `with_unit`.
PERCENT = "%"
_UNITS: dict[str, str] = {
    **dict.fromkeys(("output_throughput", "total_token_throughput", "output_throughput_per_gpu",
                     "max_output_tokens_per_s"), "tok/s"),
    **dict.fromkeys(("request_throughput", "request_goodput", "request_goodput_per_gpu",
                     "capacity_rps", "rate", "target_rps"), "req/s"),
    **dict.fromkeys(("error_rate", "kv_cache_usage_max", "kv_cache_usage_mean",
                     "prefix_cache_hit_rate", "objective_cv", "precision_target",
                     "ci95_halfwidth", "ci95_halfwidth_within", "ci95_halfwidth_server",
                     "token_agreement", "quality_baseline_agreement", "quality_required",
                     "min_token_agreement", "engine_share_min"),
                    PERCENT),
    **dict.fromkeys(("total_input_tokens", "total_output_tokens", "est_kv_tokens_capacity",
                     "prompt_tokens", "output_tokens", "kv_transfer_tokens"), "tok"),
    **dict.fromkeys(("completed", "failed", "max_concurrent_requests", "running_requests_max",
                     "waiting_requests_max"), "req"),
    "duration": "s",
    "saturation_slope": "req/s",  # waiting requests gained per second (trial.saturation)
}


def unit_of(key: str) -> str:
    """The unit a metric's or column's values are shown in: `ms` for *_ms, `s` for other times
    (*_s, duration), `tok/s` for token throughputs, `req/s` for request throughputs, goodputs,
    capacity and rates, `%` for fractions (shown x 100: in_unit), `tok` / `req` for token and
    request counts, `GiB` for *_gib_*; a `<key>_ci95_high` / `_ci95_low` column has its key's
    unit; a class-prefixed key (`chat.output_throughput`) has its metric's unit. "": no unit
    (parameters, identifiers, other counts, `objective`, whose unit is its metric's)."""
    _, key = split_class_key(key)
    for suffix in ("_ci95_high", "_ci95_low"):
        if key.endswith(suffix) and key != "objective" + suffix:
            return unit_of(key.removesuffix(suffix))
    if key in _UNITS:
        return _UNITS[key]
    if key.endswith("_ms"):
        return "ms"
    if "_gib_" in key or key.endswith("_gib"):
        return "GiB"
    if key.endswith("_s"):
        return "s"
    return ""


def in_unit(key: str, value: float) -> float:
    """`value` expressed in unit_of(key): fractions x 100 for `%`, else unchanged."""
    return value * 100.0 if unit_of(key) == PERCENT else value


def with_unit(key: str, value: object, digits: int = 4) -> str:
    """`value` of `key` as shown to a user, with its unit: 612.3 ms, 40% (a fraction 0.4),
    5,272 tok/s, 200 req; `digits` significant digits below 1000, whole and with thousands
    separators above (never in exponent form); "-" for None or NaN; text and booleans as
    they are."""
    if value is None or isinstance(value, bool) or not isinstance(value, numbers.Real):
        return "-" if value is None else str(value)
    number = float(value)
    if math.isnan(number):
        return "-"
    number = in_unit(key, number)
    text = f"{number:,.0f}" if abs(number) >= 1000 else f"{number:.{digits}g}"
    unit = unit_of(key)
    if not unit:
        return text
    return f"{text}{unit}" if unit == PERCENT else f"{text} {unit}"


def label(key: str) -> str:
    """A column's name with its unit, for a table header or a plot axis: `output_throughput
    (tok/s)`; unchanged when it has no unit or its name already ends with it (`p99_ttft_ms`)."""
    unit = unit_of(key)
    if not unit or key.endswith(f"_{unit}"):
        return key
    return f"{key} ({unit})"


def limits_text(sla: Mapping[str, float]) -> str:
    """The SLA's limits with their units: `p99_ttft_ms <= 500 ms, error_rate <= 1%,
    min_token_agreement >= 0.95`; "none" for an empty SLA."""
    return ", ".join(limit_text(key, float(limit)) for key, limit in sla.items()) or "none"


def is_lower_bound(key: str) -> bool:
    """SLA keys that are lower bounds (`value >= limit`): min_token_agreement."""
    return key in LOWER_BOUND_KEYS


def limit_text(key: str, limit: float) -> str:
    """One SLA limit as people read it: `p99_ttft_ms <= 500 ms`, `min_token_agreement >= 0.95`."""
    return f"{key} {'>=' if is_lower_bound(key) else '<='} {with_unit(key, limit)}"


def load_limits(sla: Mapping[str, float]) -> dict[str, float]:
    """The SLA limits a load run can judge by itself (every key but the LOWER_BOUND_KEYS,
    which need the quality probe)."""
    return {key: limit for key, limit in sla.items() if not is_lower_bound(key)}
