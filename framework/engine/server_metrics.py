"""vLLM's Prometheus ``/metrics`` during a measured run: a sampler thread and a pure summary.

The sampler fetches ``GET {base_url}/metrics`` once before the load, at RAMP_S (0.1, 0.2 and
0.3 s into it) and then every ``interval_s`` (0.5 s, 1.0 s, ...) on the clock, and once after
it, so a load stopped early (its SLA surely broken, often under a second) is still seen while
its requests are in flight. Measured on the project's shared 2-core machine (load average ~7,
20 loads each, a 60 KiB page): loads of 0.5 s got 3-4 scrapes during the load, loads of 0.7 s
a median of 4 (range 1-4, fewer than 3 in 1 of 20); a scrape every 0.5 s alone got 0-1.
It scrapes from its own thread with framework.load.http_client (``get_sync``), keeps only the
lines of WATCHED, and parses them with ``prometheus_client.parser.text_string_to_metric_families``.
Its cost on the project's 2-core machine: ~0.7 ms of client CPU per sample (fetch of the
~58 KB page ~0.5 ms, its event loop included + filtered parse ~0.22 ms; parsing the whole text
would be ~7 ms) and ~4 ms of the vLLM API server's CPU to render the page, i.e. ~0.15% and
~0.8% of one core at 2 Hz (the ramp adds 3 scrapes per load: ~12 ms of server CPU, once).
The thread's own CPU time is reported (``SamplerResult.cpu_s``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field

from framework.engine.kv_transfer import EXTERNAL_SOURCE
from framework.load.http_client import get_sync

KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
QUEUE_SUM = "vllm:request_queue_time_seconds_sum"
QUEUE_COUNT = "vllm:request_queue_time_seconds_count"
SUCCESS = "vllm:request_success_total"  # per engine (label `engine`) and finished_reason
PROMPT_SOURCES = "vllm:prompt_tokens_by_source_total"  # label `source`
KV_TRANSFERRED = f"{PROMPT_SOURCES}@source={EXTERNAL_SOURCE}"
"""The prompt tokens whose KV a server loaded through its KV connector (prefill/decode)."""
WATCHED: tuple[str, ...] = (
    KV_USAGE, RUNNING, WAITING, PREEMPTIONS, PREFIX_QUERIES, PREFIX_HITS, QUEUE_SUM, QUEUE_COUNT,
    SUCCESS, PROMPT_SOURCES,
)
ENGINE_SEP = "@engine="
"""Per-engine keys of a sample: `vllm:request_success_total@engine=1` (vLLM labels every
metric of each data-parallel engine with `engine`, vllm/v1/metrics/loggers.py)."""

# The summary's keys and their column kinds (framework.results.store), in row order.
SERVER_METRIC_COLUMNS: tuple[tuple[str, str], ...] = (
    ("kv_cache_usage_max", "float"),
    ("kv_cache_usage_mean", "float"),
    ("preemptions", "int"),
    ("prefix_cache_hit_rate", "float"),
    ("waiting_requests_max", "int"),
    ("running_requests_max", "int"),
    ("queue_time_mean_s", "float"),
    ("metrics_samples", "int"),
    ("engines_served", "int"),
    ("engine_share_min", "float"),
    ("kv_transfer_tokens", "int"),
)

DEFAULT_INTERVAL_S = 0.5
RAMP_S: tuple[float, ...] = (0.1, 0.2, 0.3)
"""Seconds into the load of the first scrapes, those below the interval (then every interval)."""


@dataclass(frozen=True)
class Sample:
    """One scrape: the clock at the scrape and the WATCHED values found in it; `bracket`: the
    scrape just before or just after the load (its gauges show the idle server)."""

    t_s: float
    values: Mapping[str, float]
    bracket: bool = False


def parse_metrics(text: str) -> dict[str, float]:
    """WATCHED values in Prometheus exposition ``text``, each aggregated over its label sets.

    ``vllm:kv_cache_usage_perc`` (a fraction 0..1 per engine) takes the max over label sets;
    every other value is summed (requests and counters of several engines add up). Names
    absent from the text are absent from the result. Lines of other metrics (and histogram
    buckets) are dropped before parsing, which keeps a scrape cheap.
    """
    from prometheus_client.parser import text_string_to_metric_families

    kept = "\n".join(line for line in text.splitlines() if line.startswith(WATCHED))
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(kept + "\n"):
        for sample in family.samples:
            if sample.name not in WATCHED:
                continue
            if sample.name == KV_USAGE:
                values[KV_USAGE] = max(values.get(KV_USAGE, sample.value), sample.value)
            else:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
            if sample.name == SUCCESS and "engine" in sample.labels:
                key = f"{SUCCESS}{ENGINE_SEP}{sample.labels['engine']}"
                values[key] = values.get(key, 0.0) + sample.value
            if sample.name == PROMPT_SOURCES and sample.labels.get("source") == EXTERNAL_SOURCE:
                values[KV_TRANSFERRED] = values.get(KV_TRANSFERRED, 0.0) + sample.value
    return values


def engine_shares(samples: Sequence[Sample]) -> dict[str, float]:
    """Each engine's requests finished during the samples (delta of its
    vllm:request_success_total), keyed by its `engine` label; engines absent from both ends
    left out. Pure."""
    names = {k for s in samples for k in s.values if k.startswith(SUCCESS + ENGINE_SEP)}
    out = {}
    for name in sorted(names):
        if (d := _delta(samples, name)) is not None:
            out[name.split(ENGINE_SEP, 1)[1]] = d
    return out


def _delta(samples: Sequence[Sample], name: str) -> float | None:
    """Last minus first value of a counter over the samples holding it (>= 0); None if < 2."""
    seen = [s.values[name] for s in samples if name in s.values]
    if len(seen) < 2:
        return None
    return max(0.0, seen[-1] - seen[0])


def summarize(samples: Sequence[Sample]) -> dict[str, float | None]:
    """The run's server-side summary from its samples (the first taken before the load starts,
    the last after it ends). Keys are those of SERVER_METRIC_COLUMNS; None where undefined.

    - kv_cache_usage_max / _mean: max / mean of vllm:kv_cache_usage_perc over the samples
    - preemptions: delta of vllm:num_preemptions_total (last - first)
    - prefix_cache_hit_rate: delta hits / delta queries (None if no query in the run)
    - waiting_requests_max / running_requests_max: max of vllm:num_requests_waiting / _running
    - queue_time_mean_s: delta sum / delta count of vllm:request_queue_time_seconds
      (None if no request left the queue in the run)
    - metrics_samples: the samples taken during the load (not `bracket`): the gauges' peaks
      rest on these alone
    - engines_served: engines whose finished requests grew in the run (a data-parallel
      server's engines that served; 1 for a single engine); engine_share_min: the smallest
      engine's share of the finished requests (1/DP when balanced; None if none finished)
    - kv_transfer_tokens: delta of the prompt tokens loaded through a KV connector
      (vllm:prompt_tokens_by_source_total, source external_kv_transfer; prefill/decode);
      None where the server does not report it
    Counter deltas need two samples; a counter that went down (server restart) counts 0.
    """

    def gauge(name: str) -> list[float]:
        return [s.values[name] for s in samples if name in s.values]

    kv = gauge(KV_USAGE)
    waiting = gauge(WAITING)
    running = gauge(RUNNING)
    preemptions = _delta(samples, PREEMPTIONS)
    queries = _delta(samples, PREFIX_QUERIES)
    hits = _delta(samples, PREFIX_HITS)
    queue_sum = _delta(samples, QUEUE_SUM)
    queue_count = _delta(samples, QUEUE_COUNT)
    shares = engine_shares(samples)
    finished = sum(shares.values())
    transferred = _delta(samples, KV_TRANSFERRED)
    return {
        "kv_cache_usage_max": max(kv) if kv else None,
        "kv_cache_usage_mean": sum(kv) / len(kv) if kv else None,
        "preemptions": None if preemptions is None else int(preemptions),
        "prefix_cache_hit_rate": hits / queries if queries and hits is not None else None,
        "waiting_requests_max": int(max(waiting)) if waiting else None,
        "running_requests_max": int(max(running)) if running else None,
        "queue_time_mean_s": (queue_sum / queue_count
                              if queue_count and queue_sum is not None else None),
        "metrics_samples": sum(1 for s in samples if not s.bracket),
        "engines_served": sum(1 for d in shares.values() if d > 0) if shares else None,
        "engine_share_min": min(shares.values()) / finished if finished else None,
        "kv_transfer_tokens": None if transferred is None else int(transferred),
    }


def fetch_text(url: str, timeout_s: float) -> str:
    """Body of a 200 to ``GET url`` as text (http_client.get_sync); raises OSError for any other
    status, a connection failure or ``timeout_s`` passed."""
    response = get_sync(url, timeout_s)
    if response.status != 200:
        raise OSError(f"HTTP {response.status} {response.reason} from GET {url}")
    return response.text()


@dataclass
class SamplerResult:
    """What a sampler collected: its samples, failed scrapes (text of the last) and its CPU."""

    samples: list[Sample] = field(default_factory=list)
    errors: int = 0
    last_error: str = ""
    cpu_s: float = 0.0


class MetricsSampler:
    """Samples ``{base_url}/metrics`` from a daemon thread between ``start()`` and ``stop()``.

    ``start()`` scrapes once before returning (the baseline for counter deltas), ``stop()``
    once more after the thread ends, so the samples bracket the run (both marked `bracket`);
    the thread scrapes at the RAMP_S offsets below ``interval_s``, then every ``interval_s``.
    A failed scrape is counted, never raised. ``fetch`` and ``clock`` can be replaced (tests).
    """

    def __init__(self, base_url: str, interval_s: float = DEFAULT_INTERVAL_S,
                 timeout_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 fetch: Callable[[str, float], str] = fetch_text) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.url = f"{base_url.rstrip('/')}/metrics"
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self._clock, self._fetch = clock, fetch
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._t0 = 0.0
        self.result = SamplerResult()

    def _scrape(self, bracket: bool = False) -> None:
        cpu0 = time.thread_time()
        try:
            t_s = self._clock()
            sample = Sample(t_s=t_s, values=parse_metrics(self._fetch(self.url, self.timeout_s)),
                            bracket=bracket)
            with self._lock:
                self.result.samples.append(sample)
        except Exception as exc:  # noqa: BLE001 - a failed scrape is data: counted, never raised
            with self._lock:
                self.result.errors += 1
                self.result.last_error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self.result.cpu_s += time.thread_time() - cpu0

    def offsets(self) -> Iterator[float]:
        """When the thread scrapes, in seconds after start(): RAMP_S's offsets below the
        interval, then every interval (0.1, 0.2, 0.3, 0.5, 1.0, 1.5, ...)."""
        yield from (t for t in RAMP_S if t < self.interval_s)
        k = 1
        while True:
            yield k * self.interval_s
            k += 1

    def _run(self) -> None:
        """Scrape at each offset from start(), on the clock (a slow scrape does not push the
        later ones back); of offsets already passed, only the latest is kept."""
        offsets = self.offsets()
        offset = next(offsets)
        while True:
            upcoming = next(offsets)
            now = time.monotonic() - self._t0
            while upcoming <= now:
                offset, upcoming = upcoming, next(offsets)
            if self._stop.wait(max(0.0, offset - now)):
                return
            self._scrape()
            offset = upcoming

    def snapshot(self) -> list[Sample]:
        """The samples so far (a copy; safe while the thread scrapes)."""
        with self._lock:
            return list(self.result.samples)

    def start(self) -> MetricsSampler:
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self._scrape(bracket=True)
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> SamplerResult:
        """Stop the thread, take the final sample and return everything collected."""
        if self._thread is None:
            raise RuntimeError("sampler not started")
        self._stop.set()
        self._thread.join()
        self._scrape(bracket=True)
        return self.result

    def __enter__(self) -> MetricsSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None and not self._stop.is_set():
            self.stop()
