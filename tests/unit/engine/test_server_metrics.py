"""/metrics parsing and the pure run summary against hand-built Prometheus text; the sampler
with a fake fetch, and fetch_text and the sampler's own fetch against a real server on
127.0.0.1. (The sampler against a live vLLM server is in tests/unit/load/test_bench.py and
tests/e2e/test_bench.py.)"""

from __future__ import annotations

import http.server
import itertools
import threading
import time
from collections.abc import Iterator
from datetime import UTC
from datetime import datetime

import pytest

from framework.config.search_space import load_search_space
from framework.engine import server_metrics
from framework.engine.server_metrics import KV_TRANSFERRED
from framework.engine.server_metrics import SERVER_METRIC_COLUMNS
from framework.engine.server_metrics import MetricsSampler
from framework.engine.server_metrics import Sample
from framework.engine.server_metrics import engine_shares
from framework.engine.server_metrics import fetch_text
from framework.engine.server_metrics import parse_metrics
from framework.engine.server_metrics import summarize
from framework.results.rows import TrialContext
from framework.results.rows import trial_columns
from framework.results.rows import trial_row
from framework.trial.run import TrialOutcome
from tests.paths import ROOT

LABELS = 'engine="0",model_name="m"'
ANSWER_S = 30.0  # timeout of a scrape the server answers at once: no loaded machine reaches it


def page(kv: float = 0.0, running: float = 0, waiting: float = 0, preempt: float = 0,
         queries: float = 0, hits: float = 0, qsum: float = 0.0, qcount: float = 0,
         engine1: bool = False) -> str:
    """A /metrics page shaped like vLLM 0.32's, with the watched values and some noise."""
    text = f"""# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{LABELS}}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{LABELS}}} {waiting}
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{{{LABELS},reason="capacity"}} 99.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{LABELS}}} {kv}
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{{LABELS}}} {queries}
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{{{LABELS}}} 1.7e+09
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{{LABELS}}} {hits}
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{{LABELS}}} {preempt}
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_sum{{{LABELS}}} {qsum}
vllm:request_queue_time_seconds_bucket{{{LABELS},le="0.3"}} {qcount}
vllm:request_queue_time_seconds_bucket{{{LABELS},le="+Inf"}} {qcount}
vllm:request_queue_time_seconds_count{{{LABELS}}} {qcount}
"""
    if engine1:
        text += ('vllm:num_requests_running{engine="1",model_name="m"} 3.0\n'
                 'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.9\n'
                 'vllm:num_preemptions_total{engine="1",model_name="m"} 100.0\n')
    return text


def test_parse_keeps_watched_values_only() -> None:
    values = parse_metrics(page(kv=0.25, running=4, waiting=2, preempt=1, queries=640,
                                hits=320, qsum=1.5, qcount=10))
    assert values == {
        "vllm:kv_cache_usage_perc": 0.25, "vllm:num_requests_running": 4.0,
        "vllm:num_requests_waiting": 2.0, "vllm:num_preemptions_total": 1.0,
        "vllm:prefix_cache_queries_total": 640.0, "vllm:prefix_cache_hits_total": 320.0,
        "vllm:request_queue_time_seconds_sum": 1.5,
        "vllm:request_queue_time_seconds_count": 10.0,
    }


def test_parse_aggregates_engines() -> None:
    values = parse_metrics(page(kv=0.25, running=4, preempt=1, engine1=True))
    assert values["vllm:kv_cache_usage_perc"] == 0.9  # max over engines
    assert values["vllm:num_requests_running"] == 7.0  # sum over engines
    assert values["vllm:num_preemptions_total"] == 101.0


def test_parse_of_an_unrelated_page_is_empty() -> None:
    assert parse_metrics("# TYPE up gauge\nup 1\n") == {}
    assert parse_metrics("") == {}


def samples(*pages: str) -> list[Sample]:
    return [Sample(t_s=float(i), values=parse_metrics(text)) for i, text in enumerate(pages)]


@pytest.mark.parametrize(("pages", "expected"), [
    pytest.param(
        [page(kv=0.0, preempt=5, queries=1000, hits=100, qsum=2.0, qcount=20),
         page(kv=0.5, running=8, waiting=3, preempt=6, queries=1400, hits=400, qsum=2.5,
              qcount=24),
         page(kv=0.25, running=2, waiting=0, preempt=8, queries=1800, hits=500, qsum=3.0,
              qcount=30)],
        {"kv_cache_usage_max": 0.5, "kv_cache_usage_mean": 0.25, "preemptions": 3,
         "prefix_cache_hit_rate": 400 / 800, "waiting_requests_max": 3,
         "running_requests_max": 8, "queue_time_mean_s": 1.0 / 10},
        id="deltas-over-the-run"),
    pytest.param(
        [page(queries=50, hits=10), page(kv=0.1, running=1, queries=50, hits=10)],
        {"kv_cache_usage_max": 0.1, "kv_cache_usage_mean": 0.05, "preemptions": 0,
         "prefix_cache_hit_rate": None, "waiting_requests_max": 0, "running_requests_max": 1,
         "queue_time_mean_s": None},
        id="no-queries-no-queue"),
    pytest.param(
        [page(kv=0.3, running=2, preempt=4)],
        {"kv_cache_usage_max": 0.3, "kv_cache_usage_mean": 0.3, "preemptions": None,
         "prefix_cache_hit_rate": None, "waiting_requests_max": 0, "running_requests_max": 2,
         "queue_time_mean_s": None},
        id="one-sample-no-deltas"),
    pytest.param(
        [page(preempt=9, queries=100, hits=50), page(preempt=2, queries=10, hits=0)],
        {"preemptions": 0, "prefix_cache_hit_rate": None},
        id="counter-reset-counts-zero"),
    pytest.param(
        [], {**{key: None for key, _ in SERVER_METRIC_COLUMNS}, "metrics_samples": 0},
        id="no-samples"),
])
def test_summarize(pages: list[str], expected: dict) -> None:
    result = summarize(samples(*pages))
    assert list(result) == [key for key, _ in SERVER_METRIC_COLUMNS]
    for key, value in expected.items():
        assert result[key] == (pytest.approx(value) if value is not None else None), key


def test_summarize_skips_samples_missing_a_name() -> None:
    # a scrape that lacked the counters does not break the deltas of the others
    partial = Sample(t_s=1.0, values={"vllm:kv_cache_usage_perc": 0.7})
    result = summarize([*samples(page(preempt=1)), partial, *samples(page(preempt=4))])
    assert result["preemptions"] == 3
    assert result["kv_cache_usage_max"] == 0.7


class FakeFetch:
    """Serves the given pages in order (then repeats the last); raises for None entries. Every
    fetch after the first waits until `go` is set (events: no fetch can come early or be
    missed, however the machine schedules the sampler's thread)."""

    def __init__(self, pages: list[str | None]) -> None:
        self.pages, self.urls = pages, []
        self.go = threading.Event()
        self._fetched = threading.Condition()

    def __call__(self, url: str, timeout_s: float) -> str:
        if self.urls:
            assert self.go.wait(ANSWER_S)
        with self._fetched:
            self.urls.append(url)
            text = self.pages[min(len(self.urls) - 1, len(self.pages) - 1)]
            self._fetched.notify_all()
        if text is None:
            raise ConnectionError("refused")
        return text

    def until(self, n: int) -> None:
        """Return once `n` fetches were made."""
        with self._fetched:
            assert self._fetched.wait_for(lambda: len(self.urls) >= n, ANSWER_S), self.urls


@pytest.mark.timeout(30)
def test_sampler_brackets_the_run_and_counts_failures() -> None:
    fetch = FakeFetch([page(preempt=1), None, page(kv=0.5, preempt=2), page(preempt=3)])
    ticks = itertools.count()
    sampler = MetricsSampler("http://host:1/", interval_s=0.01, clock=lambda: float(next(ticks)),
                             fetch=fetch).start()
    assert len(sampler.result.samples) == 1  # the baseline is taken before start() returns
    fetch.go.set()
    fetch.until(4)
    result = sampler.stop()
    assert fetch.urls[0] == "http://host:1/metrics"
    assert result.errors == 1 and "refused" in result.last_error
    assert len(result.samples) == len(fetch.urls) - 1
    assert [s.t_s for s in result.samples] == sorted(s.t_s for s in result.samples)
    assert result.cpu_s >= 0
    summary = summarize(result.samples)
    assert summary["preemptions"] == 2 and summary["kv_cache_usage_max"] == 0.5


@pytest.mark.timeout(30)
def test_sampler_against_nothing_is_empty_not_an_error() -> None:
    with MetricsSampler("http://127.0.0.1:9", interval_s=0.01, timeout_s=0.2) as sampler:
        pass
    assert sampler.result.samples == [] and sampler.result.errors >= 2
    assert summarize(sampler.result.samples)["kv_cache_usage_max"] is None


class MetricsPages(http.server.BaseHTTPRequestHandler):
    """GET /metrics: page() with the preemption counter one higher per scrape; else 404."""

    scrapes = 0

    def do_GET(self) -> None:
        if self.path == "/metrics":
            type(self).scrapes += 1
            body, status = page(kv=0.25, preempt=type(self).scrapes).encode(), 200
        else:
            body, status = b"not found", 404
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[str]:
    """Base URL of a threaded HTTP server on 127.0.0.1 serving MetricsPages."""
    MetricsPages.scrapes = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MetricsPages)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.timeout(30)
def test_fetch_text_gets_a_200_body_and_raises_for_other_statuses(metrics_server: str) -> None:
    assert fetch_text(f"{metrics_server}/metrics", ANSWER_S) == page(kv=0.25, preempt=1)
    with pytest.raises(OSError, match="HTTP 404"):
        fetch_text(f"{metrics_server}/nowhere", ANSWER_S)


@pytest.mark.timeout(30)
def test_sampler_scrapes_a_real_server_with_its_own_fetch(metrics_server: str) -> None:
    sampler = MetricsSampler(metrics_server + "/", interval_s=0.05, timeout_s=ANSWER_S).start()
    # the baseline is the first scrape (how many the thread took by the time start() has
    # returned depends on the machine's speed; see the brackets test for that with events)
    while MetricsPages.scrapes < 4:
        time.sleep(0.01)
    result = sampler.stop()
    assert result.errors == 0 and len(result.samples) == MetricsPages.scrapes >= 5
    assert [s.bracket for s in result.samples] == [True] + [False] * (len(result.samples) - 2) + [True]
    assert [s.values["vllm:num_preemptions_total"] for s in result.samples] == [
        float(n) for n in range(1, len(result.samples) + 1)]
    summary = summarize(result.samples)
    assert summary["preemptions"] == len(result.samples) - 1
    assert summary["kv_cache_usage_max"] == 0.25


def test_summarize_counts_the_samples_taken_during_the_load() -> None:
    before, after = (Sample(t_s=t, values=parse_metrics(page()), bracket=True) for t in (0, 9))
    during = samples(page(running=5), page(running=7))
    assert summarize([before, *during, after])["metrics_samples"] == 2
    assert summarize([before, after])["metrics_samples"] == 0
    assert summarize([before, after])["running_requests_max"] == 0  # idle gauges only


@pytest.mark.parametrize(("interval_s", "first"), [
    (0.5, [0.1, 0.2, 0.3, 0.5, 1.0, 1.5]),
    (0.25, [0.1, 0.2, 0.25, 0.5, 0.75]),
    (0.1, [0.1, 0.2, 0.3]),  # no ramp offset below the interval
    (0.01, [0.01, 0.02]),
])
def test_sampler_ramps_up_then_keeps_the_interval(interval_s, first) -> None:
    offsets = MetricsSampler("http://x", interval_s=interval_s).offsets()
    assert [round(next(offsets), 6) for _ in first] == first


class VirtualTime:
    """server_metrics' `time` and a sampler's stop event on one virtual clock: a wait on the
    event moves the clock on by its timeout, and the event counts as set once the clock
    reaches `stop_at` (the load's end). `set()` does nothing: the sampler's thread runs to
    `stop_at` by itself, so its schedule never races the thread that stops it."""

    thread_time = staticmethod(time.thread_time)

    def __init__(self, stop_at: float) -> None:
        self.now, self.stop_at = 0.0, stop_at

    def monotonic(self) -> float:
        return self.now

    def wait(self, timeout: float) -> bool:
        if self.now + timeout >= self.stop_at:
            self.now = self.stop_at
            return True
        self.now += timeout
        return False

    def set(self) -> None:
        pass

    def is_set(self) -> bool:
        return self.now >= self.stop_at


@pytest.mark.timeout(30)
def test_a_short_load_is_scraped_while_it_runs(metrics_server: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """0.8 s between start and stop (a load stopped early) at the default 0.5 s interval: the
    ramp's scrapes at 0.1, 0.2, 0.3 s and the one at 0.5 s, between the two brackets (a scrape
    every 0.5 s alone would have taken one). The schedule runs on a virtual clock, so how fast
    the machine runs the sampler's thread cannot change it; the scrapes are real ones, of a
    real server."""
    virtual = VirtualTime(stop_at=0.8)
    monkeypatch.setattr(server_metrics, "time", virtual)
    sampler = MetricsSampler(metrics_server, timeout_s=ANSWER_S, clock=virtual.monotonic)
    sampler._stop = virtual  # type: ignore[assignment]
    result = sampler.start().stop()
    assert result.errors == 0, result.last_error
    assert [s.t_s for s in result.samples] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.5, 0.8])
    assert [s.bracket for s in result.samples] == [True, False, False, False, False, True]
    assert summarize(result.samples)["metrics_samples"] == 4
    assert MetricsPages.scrapes == 6


def test_sampler_rejects_bad_interval() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        MetricsSampler("http://x", interval_s=0)


def test_server_metrics_reach_the_trial_row() -> None:
    space = load_search_space(ROOT / "search_spaces" / "tiny_cpu.yaml")
    columns = trial_columns(space, (50, 99))
    names = [name for name, _ in columns]
    server = [name for name, _ in SERVER_METRIC_COLUMNS]
    start = names.index(server[0])
    assert names[start:start + len(server)] == server
    assert names.index("p99_e2el_ms") < start  # after the request metrics
    ctx = TrialContext(number=0, params={}, is_baseline=True, serve_command="", vllm_version="x",
                       server_log="")
    values = {"kv_cache_usage_max": 0.5, "kv_cache_usage_mean": 0.2, "preemptions": 3,
              "prefix_cache_hit_rate": None, "waiting_requests_max": 1,
              "running_requests_max": 8, "queue_time_mean_s": 0.01, "metrics_samples": 4,
              "engines_served": 2, "engine_share_min": 0.48, "kv_transfer_tokens": 384}
    outcome = TrialOutcome(started_at=datetime.now(UTC), argv=(),
                           server_metrics=values)
    row = trial_row(ctx, outcome, None, columns)
    assert {k: row[k] for k in server} == values
    failed = trial_row(ctx, TrialOutcome(started_at=datetime.now(UTC), argv=()), None,
                       columns)
    assert all(failed[k] is None for k in server)


TWO_ENGINES = """# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} %d
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} %d
vllm:request_success_total{engine="1",finished_reason="length",model_name="m"} %d
"""


def test_a_data_parallel_servers_engines_are_counted_apart() -> None:
    before = parse_metrics(TWO_ENGINES % (1, 2, 0))
    after = parse_metrics(TWO_ENGINES % (1, 50, 52))
    assert before["vllm:request_success_total"] == 3  # the total over engines, as before
    samples = [Sample(0.0, before, bracket=True), Sample(1.0, after, bracket=True)]
    assert engine_shares(samples) == {"0": 48.0, "1": 52.0}
    summary = summarize(samples)
    assert summary["engines_served"] == 2
    assert summary["engine_share_min"] == 48 / 100


def test_an_idle_engine_is_not_counted_as_serving() -> None:
    samples = [Sample(0.0, parse_metrics(TWO_ENGINES % (0, 0, 5)), bracket=True),
               Sample(1.0, parse_metrics(TWO_ENGINES % (0, 10, 5)), bracket=True)]
    summary = summarize(samples)
    assert (summary["engines_served"], summary["engine_share_min"]) == (1, 0.0)


def test_no_engine_label_no_engine_columns() -> None:
    samples = [Sample(0.0, {"vllm:num_requests_running": 1.0}),
               Sample(1.0, {"vllm:num_requests_running": 2.0})]
    summary = summarize(samples)
    assert summary["engines_served"] is None and summary["engine_share_min"] is None


# vLLM 0.32's prompt-token sources (vllm/v1/metrics/loggers.py), as a decode server of a
# prefill/decode pair reports them after loading KV through its connector
SOURCES = """# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} %d
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 7
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} %d
"""


def test_the_kv_loaded_through_a_connector_is_its_source_alone() -> None:
    """Guards kv_transfer_tokens: only the external_kv_transfer source's growth in the run
    counts (not the locally computed or cached prompt tokens); no such series, None."""
    before = parse_metrics(SOURCES % (100, 0))
    after = parse_metrics(SOURCES % (130, 384))
    assert after[KV_TRANSFERRED] == 384
    samples = [Sample(0.0, before, bracket=True), Sample(1.0, after, bracket=True)]
    assert summarize(samples)["kv_transfer_tokens"] == 384
    plain = [Sample(0.0, parse_metrics(TWO_ENGINES % (0, 0, 5))),
             Sample(1.0, parse_metrics(TWO_ENGINES % (0, 10, 5)))]
    assert summarize(plain)["kv_transfer_tokens"] is None
