"""`vllm-sweep bench`: real runs against the session's shared vLLM server (tests/e2e/conftest.py,
`vllm_server`; its API key sent as vllm bench sends it, OPENAI_API_KEY): prompts, totals, chat,
and the /metrics sampler. The command runs in this process (tests.cli.cli_in_process)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from framework.engine.server_metrics import KV_USAGE
from framework.engine.server_metrics import RUNNING
from framework.engine.server_metrics import MetricsSampler
from framework.engine.server_metrics import summarize
from framework.load.loadgen import run_load
from framework.load.workload import Dataset
from framework.load.workload import load_tokenizer
from tests.cli import cli_in_process
from tests.engines import SharedServer
from tests.paths import ROOT
from tests.sweeps import DETAIL_KEYS
from tests.sweeps import SAMPLE
from tests.sweeps import VLLM_KEYS


@pytest.fixture
def server(vllm_server: SharedServer) -> SharedServer:
    return vllm_server


def bench_json(server: SharedServer, out: Path, *args: str) -> dict:
    """`vllm-sweep bench` in this process (cli_in_process: no interpreter importing the
    framework per run; the command-line entry is tests/unit/test_cli.py's), its JSON read."""
    res = cli_in_process("bench", "--base-url", server.base_url,
                         "--model", str(ROOT / "models" / "tiny-llama"),
                         "--result-json", str(out), "--save-detailed", *args,
                         env=dict(os.environ, OPENAI_API_KEY=server.api_key))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Serving Benchmark Result" in res.stdout
    return json.loads(out.read_text())


@pytest.mark.server
@pytest.mark.timeout(540)  # also pays for the shared server's start when this test comes first
def test_same_workload_twice_same_prompts_and_totals_from_requests(server, tmp_path: Path):
    args = ("--dataset-name", "sharegpt", "--dataset-path", str(SAMPLE), "--num-prompts", "24",
            "--max-prompt-tokens", "400", "--sharegpt-output-len", "12", "--seed", "7",
            "--max-concurrency", "8")
    first = bench_json(server, tmp_path / "a.json", *args)
    second = bench_json(server, tmp_path / "b.json", *args)
    planned = Dataset("sharegpt", path=SAMPLE, max_prompt_tokens=400, output_len_override=12
                      ).requests(load_tokenizer(ROOT / "models" / "tiny-llama"), 24, 7)
    # the server counted exactly the prompts we planned, both times
    assert first["input_lens"] == second["input_lens"] == [r.prompt_len for r in planned]
    assert len(set(first["input_lens"])) > 5  # varied lengths
    for result in (first, second):
        assert (result["completed"], result["failed"]) == (24, 0)
        assert result["total_input_tokens"] == sum(result["input_lens"])
        assert result["total_output_tokens"] == sum(result["output_lens"])
        assert all(n <= 12 for n in result["output_lens"])
        assert len(result["ttfts"]) == len(result["itls"]) == 24
        assert list(result)[:19 + len(DETAIL_KEYS)] == VLLM_KEYS[:19] + DETAIL_KEYS


@pytest.mark.server
@pytest.mark.timeout(300)
def test_chat_endpoint_and_ignore_eos(server, tmp_path: Path):
    result = bench_json(server, tmp_path / "chat.json", "--endpoint", "chat", "--num-prompts",
                        "16", "--random-input-len", "64", "--random-output-len", "16",
                        "--max-concurrency", "4", "--percentile-metrics", "ttft,tpot,itl,e2el",
                        "--metric-percentiles", "25,50,99", "--goodput", "ttft:60000")
    assert (result["backend"], result["completed"], result["failed"]) == ("openai-chat", 16, 0)
    assert result["output_lens"] == [16] * 16 and result["total_output_tokens"] == 256
    assert result["total_input_tokens"] == sum(result["input_lens"])
    assert result["input_lens"][0] > 64  # the chat template wraps the prompt
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])
    assert {"p25_itl_ms", "p50_e2el_ms", "p99_tpot_ms"} <= set(result)


@pytest.mark.server
@pytest.mark.timeout(300)
def test_metrics_sampler_on_a_live_server(server):
    tokenizer = load_tokenizer(ROOT / "models" / "tiny-llama")
    # ~5 s a round here: vLLM publishes its gauges between engine steps
    requests = Dataset("prefix-shared", input_len=320, output_len=160, prefix_len=256,
                       prefix_groups=2).requests(tokenizer, 64, seed=11)
    # a scrape of a busy server on a loaded 2-core machine took over the product's 2 s (CI,
    # f697007: two TimeoutErrors); this test is about what is read, not how fast, so a scrape
    # may take as long as the server needs (a failed scrape is counted: see the unit tests)
    sampler = MetricsSampler(server.base_url, interval_s=0.2, timeout_s=120).start()
    # The gauges (KV usage, running requests) say something only in a scrape that lands while
    # requests run; on a loaded machine every scrape of a round can miss it (s23b: three lanes,
    # load 34: KV usage 0.0 in every sample). So the load is sent again, the sampler still
    # running, until a scrape saw requests running: an event, not a long-enough load.
    rounds = 0
    while True:
        result = asyncio.run(run_load(server.base_url, str(ROOT / "models" / "tiny-llama"),
                                      requests, max_concurrency=8, api_key=server.api_key))
        rounds += 1
        assert all(r.success for r in result.records), [
            (r.index, r.error, r.output_tokens) for r in result.records if not r.success]
        if any(sample.values.get(RUNNING, 0) > 0 for sample in sampler.snapshot()):
            break
    sampled = sampler.stop()
    assert sampled.errors == 0 and len(sampled.samples) >= 3, rounds
    # one scheduler record sets both gauges (vllm/v1/metrics/loggers.py,
    # PrometheusStatLogger.record): a request running holds KV blocks
    busy = [sample.values for sample in sampled.samples if sample.values.get(RUNNING, 0) > 0]
    assert busy and all(values[KV_USAGE] > 0 for values in busy), busy
    summary = summarize(sampled.samples)
    assert summary["kv_cache_usage_max"] > 0
    assert 0 < summary["kv_cache_usage_mean"] <= summary["kv_cache_usage_max"] <= 1
    assert summary["preemptions"] >= 0
    assert summary["prefix_cache_hit_rate"] > 0.3  # 62 of 64 prompts reuse a 256-token prefix
    assert 1 <= summary["running_requests_max"] <= 8
    assert summary["waiting_requests_max"] >= 0
    assert summary["queue_time_mean_s"] >= 0


MOONCAKE = ROOT / "datasets" / "mooncake_sample.jsonl"


def published(server: SharedServer, queries: float, timeout_s: float = 120) -> tuple[float, float]:
    """prefix_hits once the server has published at least `queries` looked-up tokens (vLLM
    publishes a request's counters from its output loop, a moment after the response)."""
    deadline = time.monotonic() + timeout_s
    while (now := prefix_hits(server))[1] < queries and time.monotonic() < deadline:
        time.sleep(0.2)
    return now


def prefix_hits(server: SharedServer) -> tuple[float, float]:
    from framework.engine.server_metrics import PREFIX_HITS
    from framework.engine.server_metrics import PREFIX_QUERIES
    from framework.engine.server_metrics import fetch_text
    from framework.engine.server_metrics import parse_metrics

    values = parse_metrics(fetch_text(f"{server.base_url}/metrics", 10.0))
    return values[PREFIX_HITS], values[PREFIX_QUERIES]


@pytest.mark.server
@pytest.mark.timeout(180)
def test_equal_hash_ids_hit_the_prefix_cache_and_distinct_ones_do_not(server, tmp_path: Path):
    """12 requests 0.2 s apart, 320 tokens each (20 hash ids of 16): in `shared` every row
    starts with the same 16 ids (256 tokens: two of the CPU backend's 128-token KV blocks), in
    `distinct` no id repeats. The server's prefix-cache hits rise by 256 tokens per request
    after the first with the shared trace, and not at all with the distinct one."""
    common = list(range(1000, 1016))
    traces = {"distinct": [list(range(2000 + 20 * i, 2020 + 20 * i)) for i in range(12)],
              "shared": [common + list(range(3000 + 4 * i, 3004 + 4 * i)) for i in range(12)]}
    from framework.engine.control import send

    assert send(server.control_socket, "reset_prefix_cache") == "ok"  # the server is shared
    hits = {}
    for name, ids in traces.items():  # distinct first: nothing of it is cached yet
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"timestamp": 200 * i, "input_length": 320,
                                            "output_length": 4, "hash_ids": h}) + "\n"
                                for i, h in enumerate(ids)))
        before = prefix_hits(server)
        result = bench_json(server, tmp_path / f"{name}.json", "--dataset-name", "timed_trace",
                            "--dataset-path", str(path), "--timed-trace-sec-multiplier", "0.001")
        after = published(server, before[1] + 12 * 320)
        assert (result["completed"], result["total_input_tokens"]) == (12, 12 * 320)
        assert after[1] - before[1] == 12 * 320  # every prompt token was looked up
        hits[name] = after[0] - before[0]
    assert hits["distinct"] == 0
    assert hits["shared"] == 11 * 256, hits


@pytest.mark.server
@pytest.mark.timeout(240)
def test_trace_replay_sends_what_vllm_bench_sends(server, tmp_path: Path):
    """The first 40 rows of the Mooncake sample as recorded (ms timestamps x 0.001): vllm bench
    serve --dataset-name timed_trace and vllm-sweep bench send the same requests with the same
    input lengths, so the same total input and output tokens, and ours are sent on the
    trace's schedule."""
    import os
    import subprocess
    import sys

    from benchmarks.loadgen_parity import SERVER_ENV
    from framework.config.trace_spec import TimedTraceSpec
    from framework.load.trace import read_trace
    from framework.load.trace import send_offsets

    args = ["--dataset-name", "timed_trace", "--dataset-path", str(MOONCAKE),
            "--timed-trace-sec-multiplier", "0.001", "--num-prompts", "40",
            "--temperature", "0", "--save-detailed"]
    ours = bench_json(server, tmp_path / "ours.json", *args)
    vllm = Path(sys.executable).parent / "vllm"
    done = subprocess.run([str(vllm), "bench", "serve", "--backend", "openai", "--base-url",
                           server.base_url, "--model", str(ROOT / "models" / "tiny-llama"),
                           *args, "--save-result", "--result-dir", str(tmp_path),
                           "--result-filename", "vllm.json", "--disable-tqdm"],
                          capture_output=True, text=True, timeout=200, cwd=tmp_path,
                          env={**os.environ, **SERVER_ENV, "OPENAI_API_KEY": server.api_key})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    theirs = json.loads((tmp_path / "vllm.json").read_text())
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens",
                "input_lens", "output_lens"):
        assert ours[key] == theirs[key], key
    assert (ours["completed"], ours["failed"]) == (40, 0)
    rows = read_trace(MOONCAKE, TimedTraceSpec(sec_multiplier=0.001), 40)
    assert ours["output_lens"] == [r.output_length for r in rows]  # ignore_eos, as vllm bench
    due = send_offsets(rows)
    sent = ours["start_times"]
    late = [(s - sent[0]) - (d - due[0]) for s, d in zip(sent, due)]
    # on the trace's schedule, with no bound in seconds that a slower machine could break:
    # never sent early (a wrong multiplier that speeds it up) ... Anchored at the first send
    # (the JSON holds no schedule), a descheduled request 0 makes later on-time sends read
    # as early by its delay: the bound leaves it 0.2 s, while a schedule sped up k times puts
    # the last of these 40 sends (1 - 1/k) x 3.8 s early (k = 1.06: 0.2 s; a 10x slip: 3.4 s)
    assert min(late) > -0.2, late
    # ... never waiting for replies (rows 3 and 4 are due at the same instant, so some request
    # left while one sent before it was still in flight) ...
    ends = [s + e for s, e in zip(sent, ours["latencies"])]
    assert any(sent[i] < max(ends[:i]) for i in range(1, len(sent))), (sent, ends)
    # ... and not slowed down: ours spread its sends over at most twice the time vLLM's took
    # in this run (a multiplier off by 10x is 10x; jitter of a busy machine delays both)
    theirs_sent = theirs["start_times"]
    assert max(sent) - min(sent) < 2 * (max(theirs_sent) - min(theirs_sent)), (sent, theirs_sent)
