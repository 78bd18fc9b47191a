"""A client that disconnects cancels its request, as vLLM's routes are cancelled
(vllm/entrypoints/serve/utils/api_utils.py `with_cancellation`; the engine then aborts the
request): FakeEngine drops it from its queue or its slot at once, and the router passes the
disconnect on to its backend. Guards what a load cut short leaves behind (found in s23d: a
capacity step stopped as over-saturated left ~100 requests queued in FakeEngine, and the next
step was judged on that queue draining): nothing, on the fake as on vLLM, direct or routed.

Every wait ends on an event (the server's own gauges); GUARD_S is a failure guard only."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from framework.cluster.ports import pick_port
from framework.engine import control
from framework.engine.server_metrics import RUNNING
from framework.engine.server_metrics import WAITING
from framework.engine.server_metrics import parse_metrics
from framework.load.loadgen import wait_ready
from framework.trial.replicas import start_router
from framework.trial.replicas import stop_router
from tests.engines import start_engine
from tests.engines import stop_engine

GUARD_S = 60.0


def held_engine(tmp_path: Path, hold: Path) -> tuple[subprocess.Popen, str]:
    """A FakeEngine of one slot whose tokens wait while `hold` exists; (process, URL) once up."""
    env = dict(os.environ, FAKE_ENGINE_STARTUP_S="0", FAKE_ENGINE_TTFT_MS="1",
               FAKE_ENGINE_TPOT_MS="1", FAKE_ENGINE_HOLD_TOKENS=str(hold))
    env.pop(control.SOCKET_VAR, None)
    env.pop("VLLM_API_KEY", None)
    port = pick_port("127.0.0.1", [])
    proc = start_engine("framework.engine.fake_engine",
                        ["--model", "fake", "--host", "127.0.0.1", "--port", str(port),
                         "--max-num-seqs", "1"], env, tmp_path / "engine.log")
    url = f"http://127.0.0.1:{port}"
    assert asyncio.run(wait_ready(url, GUARD_S, is_alive=lambda: proc.poll() is None))
    return proc, url


def gauges(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=GUARD_S) as r:
        return parse_metrics(r.read().decode())


def wait_for(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GUARD_S
    while not check():
        assert time.monotonic() < deadline, f"not within the guard: {what}"
        time.sleep(0.05)


def streaming_request(url: str) -> socket.socket:
    """A streaming completion sent on a socket of its own, left open (nothing read)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": "fake", "prompt": "a b c", "max_tokens": 4,
                       "stream": True}).encode()
    sock = socket.create_connection((host, int(port)), timeout=GUARD_S)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json"
                 b"\r\nContent-Length: %d\r\n\r\n%s" % (host.encode(), len(body), body))
    return sock


@pytest.mark.timeout(120)
def test_fake_engine_drops_a_disconnected_request_from_its_queue_and_its_slot(tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    proc, url = held_engine(tmp_path, hold)
    try:
        running = streaming_request(url)
        wait_for("the first request runs", lambda: gauges(url)[RUNNING] == 1)
        queued = streaming_request(url)
        wait_for("the second one queues", lambda: gauges(url)[WAITING] == 1)
        queued.close()
        wait_for("the queued one is dropped", lambda: gauges(url)[WAITING] == 0)
        assert gauges(url)[RUNNING] == 1
        running.close()  # its tokens still held: only the disconnect frees the slot
        wait_for("the running one is dropped", lambda: gauges(url)[RUNNING] == 0)
        hold.unlink()
        with urllib.request.urlopen(urllib.request.Request(
                f"{url}/v1/completions", data=json.dumps({"prompt": "x", "max_tokens": 2}).encode(),
                headers={"Content-Type": "application/json"}), timeout=GUARD_S) as r:
            assert r.status == 200 and b"[DONE]" in r.read()  # the slot serves again
    finally:
        stop_engine(proc)


@pytest.mark.timeout(120)
def test_the_router_passes_a_client_disconnect_on_to_its_backend(tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    proc, backend = held_engine(tmp_path, hold)
    router = None
    try:
        router, url = start_router("127.0.0.1", [backend], "round_robin", tmp_path / "router.log")
        client = streaming_request(url)
        wait_for("the request runs on the backend", lambda: gauges(backend)[RUNNING] == 1)
        client.close()
        wait_for("the backend dropped it", lambda: gauges(backend)[RUNNING] == 0)
    finally:
        if router is not None:
            stop_router(router)
        stop_engine(proc)
