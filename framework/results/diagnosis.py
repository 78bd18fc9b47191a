"""Per-trial bottleneck diagnosis from one trial row. Pure.

The rules follow the bottleneck checklist of the vLLM tuning write-ups the project grew from
(KV usage > 95%, preemption rate > 1%, batch too small, TTFT over the SLA), applied to the
server signals sampled from `/metrics` during the load (framework.engine.server_metrics) and the
request metrics of the row. They are tried in this order; the first that holds is the verdict:

1. not_measured: the trial did not COMPLETE, or its row holds no request metrics or no
   server metric at all.
2. too_many_sequences: preemptions / completed requests > PREEMPTION_RATE_LIMIT.
3. too_few_samples: fewer than MIN_LOAD_SAMPLES scrapes of /metrics were taken during the load
   (`metrics_samples`; a load stopped early can last under a second): the peaks below would
   rest on an idle server, so no rule on them is stated. Rows without the column skip this.
4. kv_cache_exhausted: kv_cache_usage_max >= KV_EXHAUSTED_AT and waiting_requests_max > 0.
5. batch_too_small: running_requests_max < BATCH_FILL_LOW x max_concurrent_requests (the
   client's peak of requests in flight) and kv_cache_usage_max < KV_MOSTLY_FREE_BELOW: the
   server ran few of the requests it was offered while memory was free (raise max-num-seqs /
   max-num-batched-tokens).
6. prefill_too_slow: a TTFT limit of the SLA is exceeded while every TPOT and ITL limit holds
   (chunked prefill, prefix caching, a larger prefill budget).
7. near_optimal: none of the above.

A rule whose inputs are missing (null / NaN) does not fire. The trial row holds the peaks of
running and waiting requests, not their means (framework.engine.server_metrics), so the rules use peaks.
In a load stopped early (framework.results.early.cut_short) the client's peak of requests in
flight counts only the requests that finished (a handful), so the server's peaks, running +
waiting (at most the requests it held at once), stand in for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from framework.results.early import cut_short

PREEMPTION_RATE_LIMIT = 0.01
"""Preemptions per completed request above which the batch holds too many sequences (> 1%)."""
KV_EXHAUSTED_AT = 0.95
"""Peak KV cache usage (fraction) at or above which the cache counts as exhausted."""
BATCH_FILL_LOW = 0.5
"""Peak running / peak in-flight requests below which the batch counts as too small."""
KV_MOSTLY_FREE_BELOW = 0.5
"""Peak KV cache usage below which the cache counts as mostly free."""
MIN_LOAD_SAMPLES = 3
"""/metrics scrapes during the load below which its peaks cannot tell the batch or KV state."""

VERDICTS = ("batch_too_small", "kv_cache_exhausted", "too_many_sequences", "prefill_too_slow",
            "near_optimal", "too_few_samples", "not_measured")
_SERVER_KEYS = ("kv_cache_usage_max", "kv_cache_usage_mean", "preemptions",
                "waiting_requests_max", "running_requests_max", "queue_time_mean_s")


@dataclass(frozen=True)
class Diagnosis:
    """verdict: one of VERDICTS; text: one sentence naming the numbers the rule used."""

    verdict: str
    text: str


def _num(row: Mapping[str, object], key: str) -> float | None:
    value = row.get(key)
    if value is None or isinstance(value, (str, bytes)):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _f(value: float | None, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def _pct(fraction: float | None) -> str:
    """A fraction as a percentage to 3 digits: 0.4 -> 40%, 0.987 -> 98.7%; n/a for None."""
    return "n/a" if fraction is None else f"{fraction * 100:.3g}%"


def _sla_state(row: Mapping[str, object], sla: Mapping[str, float], metric: str
               ) -> tuple[list[str], list[str]]:
    """(exceeded, held) descriptions of the SLA limits on `metric` (ttft, tpot, itl)."""
    exceeded: list[str] = []
    held: list[str] = []
    for key, limit in sla.items():
        if f"_{metric}_" not in key:
            continue
        value = _num(row, key)
        if value is None:
            continue
        text = f"{key.removesuffix('_ms').replace('_', ' ')} {value:.3g} ms"
        (exceeded if value > limit else held).append(f"{text} (limit {limit:g} ms)")
    return exceeded, held


def diagnose(row: Mapping[str, object], sla: Mapping[str, float] | None = None) -> Diagnosis:
    """The bottleneck of one trial row (see the module docstring for the rules); `sla` is the
    sweep's SLA (upper bounds by metric key), needed by the prefill rule only."""
    if row.get("state") != "COMPLETE":
        reason = row.get("fail_reason") or "unknown"
        return Diagnosis("not_measured", f"The trial failed ({reason}), so nothing was measured.")
    completed = _num(row, "completed")
    if not completed or all(_num(row, k) is None for k in _SERVER_KEYS):
        return Diagnosis("not_measured", "The row holds no request or no server metrics "
                         f"(completed requests: {_f(completed)}).")
    preemptions = _num(row, "preemptions")
    kv_max = _num(row, "kv_cache_usage_max")
    waiting = _num(row, "waiting_requests_max")
    running = _num(row, "running_requests_max")
    in_flight = _num(row, "max_concurrent_requests")
    if cut_short(row) and running is not None and waiting is not None:
        in_flight = max(in_flight or 0.0, running + waiting)

    if preemptions is not None and preemptions / completed > PREEMPTION_RATE_LIMIT:
        return Diagnosis("too_many_sequences", (
            f"{preemptions:.0f} preemptions for {completed:.0f} completed requests "
            f"({preemptions / completed:.1%}, limit {PREEMPTION_RATE_LIMIT:.0%}): the batch "
            "holds more sequences than the KV cache can keep."))
    scrapes = _num(row, "metrics_samples")
    if scrapes is not None and scrapes < MIN_LOAD_SAMPLES:
        load = _num(row, "bench_s")
        during = f" during the {load:.2g} s load" if load is not None else " during the load"
        return Diagnosis("too_few_samples", (
            f"Too few /metrics samples ({scrapes:.0f}, at least {MIN_LOAD_SAMPLES} needed){during} "
            f"to tell the batch or KV cache state; {_f(preemptions)} preemptions for "
            f"{completed:.0f} completed requests."))
    if kv_max is not None and waiting is not None and kv_max >= KV_EXHAUSTED_AT and waiting > 0:
        return Diagnosis("kv_cache_exhausted", (
            f"KV cache usage peaked at {_pct(kv_max)} (limit {_pct(KV_EXHAUSTED_AT)}) with up "
            f"to {waiting:.0f} requests waiting."))
    if (running is not None and in_flight and kv_max is not None
            and running < BATCH_FILL_LOW * in_flight and kv_max < KV_MOSTLY_FREE_BELOW):
        seqs = _num(row, "param_max_num_seqs")
        cap = f"; max-num-seqs {seqs:.0f}" if seqs is not None else ""
        return Diagnosis("batch_too_small", (
            f"At most {running:.0f} of {in_flight:.0f} in-flight requests ran at once "
            f"({running / in_flight:.0%}, below {BATCH_FILL_LOW:.0%}{cap}) while KV cache usage "
            f"peaked at {_pct(kv_max)}."))
    limits = sla or {}
    ttft_over, _ = _sla_state(row, limits, "ttft")
    tpot_over, tpot_held = _sla_state(row, limits, "tpot")
    itl_over, _ = _sla_state(row, limits, "itl")
    if ttft_over and not tpot_over and not itl_over:
        queue = _num(row, "queue_time_mean_s")
        mean_ttft = _num(row, "mean_ttft_ms")
        share = (f"; mean queue time {queue * 1000:.3g} ms of mean TTFT {mean_ttft:.3g} ms"
                 if queue is not None and mean_ttft is not None else "")
        decode_text = f" while {', '.join(tpot_held)} is within it" if tpot_held else ""
        return Diagnosis("prefill_too_slow", (
            f"{', '.join(ttft_over)} exceeds the SLA{decode_text}{share}."))
    return Diagnosis("near_optimal", (
        f"No bottleneck signal: KV cache usage peaked at {_pct(kv_max)}, "
        f"{_f(preemptions)} preemptions, up to {_f(running)} of {_f(in_flight)} in-flight "
        f"requests running and {_f(waiting)} waiting."))
