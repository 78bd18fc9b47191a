"""One contract, two engines: vLLM's real OpenAI server (framework.engine.vllm_server) and FakeEngine, the
named stand-in used for scheduling tests at scale. Both must reject bad flags as invalid_args
before listening, serve /health and streaming completions with usage (and /v1 only with the
API key when VLLM_API_KEY is set), count prefix-cache hits on a repeated prompt and forget them
after the in-process reset (the control socket, framework.engine.control) while vLLM's dev routes stay
closed (no VLLM_SERVER_DEV_MODE), and leave no process once their process group is killed."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request

import pytest

from framework.cluster.ports import pick_port
from framework.engine import control
from framework.engine.server_metrics import PREFIX_HITS
from framework.engine.server_metrics import PREFIX_QUERIES
from framework.engine.server_metrics import fetch_text
from framework.engine.server_metrics import parse_metrics
from framework.load.loadgen import run_load
from framework.load.loadgen import wait_ready
from framework.load.workload import RequestSpec
from framework.trial.run import reset_prefix_cache
from tests.engines import ENGINES
from tests.engines import VLLM_ENGINE
from tests.engines import kill_engine
from tests.engines import start_engine


class ControlledServer:
    """The one part of trial.ServerHandle the reset needs: the control command, sent to the
    socket directly (cluster.RayServer sends it through a task on the server's node)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def command(self, name: str, timeout_s: float = 60.0) -> str:
        return control.send(self.path, name, timeout_s)


API_KEY = "contract-test-key"


@pytest.fixture(params=ENGINES)
def running_engine(request, tiny_model, tmp_path):
    """(module, base URL, is_alive, control socket, API key): vLLM is the session's shared
    server (tests/e2e/conftest.py, `vllm_server`: its teardown asserts that killing its process
    group leaves no process); FakeEngine starts here with the same kind of argv, environment
    and check."""
    if request.param == VLLM_ENGINE:
        shared = request.getfixturevalue("vllm_server")
        yield request.param, shared.base_url, shared.is_alive, shared.control_socket, shared.api_key
        return
    port = pick_port("127.0.0.1", [])
    argv = ["--model", str(tiny_model), "--host", "127.0.0.1", "--port", str(port),
            "--max-num-seqs", "8", "--max-model-len", "512", "--enforce-eager"]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", FAKE_ENGINE_STARTUP_S="0.2",
               VLLM_API_KEY=API_KEY)
    env.pop("VLLM_SERVER_DEV_MODE", None)
    env[control.SOCKET_VAR] = str(tmp_path / "ctl.sock")
    proc = start_engine(request.param, argv, env, tmp_path / "server.log")
    try:
        yield (request.param, f"http://127.0.0.1:{port}", lambda: proc.poll() is None,
               env[control.SOCKET_VAR], API_KEY)
    finally:
        assert kill_engine(proc) == []


@pytest.mark.server
@pytest.mark.timeout(300)
def test_engine_serves_streaming_completions_with_usage(running_engine, tiny_model):
    import asyncio

    module, base_url, is_alive, socket_path, api_key = running_engine
    ready = asyncio.run(wait_ready(base_url, 240, is_alive=is_alive))
    assert ready, f"{module} not ready"
    requests = [RequestSpec(prompt="def main():", prompt_len=4, output_len=12) for _ in range(6)]
    refused = asyncio.run(run_load(base_url, str(tiny_model), requests[:1], api_key=""))
    assert not refused.records[0].success and "401" in refused.records[0].error, refused.records
    result = asyncio.run(run_load(base_url, str(tiny_model), requests, max_concurrency=3,
                                  api_key=api_key))
    assert [r.success for r in result.records] == [True] * 6, [r.error for r in result.records]
    assert all(r.output_tokens == 12 and r.prompt_tokens > 0 for r in result.records)
    assert all(r.ttft_s is not None and r.ttft_s > 0 and len(r.chunk_s) >= 1 for r in result.records)

    def counters() -> tuple[float, float]:
        values = parse_metrics(fetch_text(f"{base_url}/metrics", 10))
        return values.get(PREFIX_QUERIES, 0.0), values.get(PREFIX_HITS, 0.0)

    long = [RequestSpec(prompt="the quick brown fox " * 45, prompt_len=290, output_len=4)]

    def send_after(before: tuple[float, float]) -> tuple[float, float]:
        """Send the long prompt, then wait for vLLM to publish its lookup (from its output
        loop, a moment after the response): the queries counter passes `before`'s. Returns
        the counters then: the hits that lookup found are in them."""
        done = asyncio.run(run_load(base_url, str(tiny_model), long, api_key=api_key))
        assert done.records[0].success, done.records[0].error
        deadline = time.monotonic() + 120
        while (now := counters())[0] <= before[0] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert now[0] > before[0], "the server never counted the prompt's cache lookup"
        return now

    first = send_after(counters())
    second = send_after(first)
    assert second[1] > first[1], "a repeated prompt must hit the prefix cache"
    dev_route = urllib.request.Request(f"{base_url}/reset_prefix_cache", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(dev_route, timeout=10)
    reset_prefix_cache(ControlledServer(socket_path))
    before = counters()
    assert send_after(before)[1] == before[1], "after the reset the same prompt must miss"
