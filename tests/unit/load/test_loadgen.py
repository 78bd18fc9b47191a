"""run_load against FakeSSEServer, a local aiohttp server standing in for vLLM's streaming
APIs; wait_ready against a raw asyncio server on 127.0.0.1.

FakeSSEServer only serves canned SSE streams so that parsing, failure handling,
timeouts and concurrency limits can be tested without a model server.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web

from framework.load.loadgen import LoadResult
from framework.load.loadgen import RequestRecord
from framework.load.loadgen import run_load
from framework.load.metrics import max_in_flight
from framework.load.workload import RequestSpec
from tests.streams import DONE
from tests.streams import content
from tests.streams import counter_clock
from tests.streams import serving
from tests.streams import sse
from tests.streams import usage

COMMON_PAYLOAD = {"model": "tiny", "ignore_eos": True, "stream": True,
                  "stream_options": {"include_usage": True}}  # no sampling field unless given
PROBE_LAG_S = 0.05  # test_a_trace_is_sent...: the probes wake this long after each due time


Leave = Callable[[], None]


def chat_delta(delta: dict[str, str]) -> bytes:
    return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})


class FakeSSEServer:
    """aiohttp server on 127.0.0.1 (free port) answering /v1/completions and
    /v1/chat/completions by prompt name (the first message's content for chat).

    Counts requests in flight and keeps every JSON body. A scenario may call ``leave``
    before its final write, so that the count never exceeds what the client has in flight.
    ``peak_to_reach``: a request that waits in ``held()`` goes on once that many requests have
    been in flight at once (an event, not a delay: the peak cannot be missed on a slow
    machine); ``hold_s``: how long the ``outlasts`` scenario holds its request.
    """

    def __init__(self, peak_to_reach: int = 1, hold_s: float = 0.0) -> None:
        self.payloads: list[dict[str, Any]] = []
        self.client_ports: list[int] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.peak_to_reach, self.hold_s = peak_to_reach, hold_s
        self._peak_reached = asyncio.Event()
        self.url = ""
        self._runner: web.AppRunner | None = None

    def enter(self) -> None:
        """Count one more request in flight (and the peak)."""
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.max_in_flight >= self.peak_to_reach:
            self._peak_reached.set()

    async def held(self) -> None:
        """Return once ``peak_to_reach`` requests have been in flight at once."""
        await self._peak_reached.wait()

    async def __aenter__(self) -> FakeSSEServer:
        app = web.Application()
        app[SERVER] = self
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock).start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.payloads.append(payload)
        self.client_ports.append(request.transport.get_extra_info("peername")[1])
        prompt = payload["prompt"] if "prompt" in payload else payload["messages"][0]["content"]
        scenario = SCENARIOS["normal" if isinstance(prompt, list) else prompt]  # token ids
        self.enter()
        left = False

        def leave() -> None:
            nonlocal left
            if not left:
                left = True
                self.in_flight -= 1

        try:
            return await scenario(request, leave)
        finally:
            leave()


SERVER = web.AppKey("server", FakeSSEServer)


async def start_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


async def normal(request: web.Request, leave: Leave) -> web.StreamResponse:
    """Three content chunks (the second split across two writes, carrying two tokens)."""
    resp = await start_stream(request)
    await resp.write(b": ping\n\n")
    await resp.write(content("a"))
    await asyncio.sleep(0.02)
    second = content("bc")
    await resp.write(second[:17])
    await asyncio.sleep(0.02)
    await resp.write(second[17:])
    await resp.write(content("d") + usage(7, 4))
    await asyncio.sleep(0.01)
    await resp.write(DONE)
    return resp


async def error_event(request: web.Request, leave: Leave) -> web.StreamResponse:
    resp = await start_stream(request)
    await resp.write(content("a"))
    error = {"message": "boom", "type": "InternalServerError", "code": 500}
    await resp.write(sse({"error": error}) + DONE)
    return resp


async def usage_only(request: web.Request, leave: Leave) -> web.StreamResponse:
    resp = await start_stream(request)
    await resp.write(usage(7, 0) + DONE)
    return resp


async def no_usage(request: web.Request, leave: Leave) -> web.StreamResponse:
    resp = await start_stream(request)
    await resp.write(content("a") + content("b") + DONE)
    return resp


async def http_500(request: web.Request, leave: Leave) -> web.Response:
    return web.Response(status=500, text="engine exploded")


async def stalls(request: web.Request, leave: Leave) -> web.StreamResponse:
    """One chunk, then nothing: only the client's timeout ends the request (the handler is
    cancelled when the client hangs up)."""
    resp = await start_stream(request)
    await resp.write(content("a"))
    await asyncio.Event().wait()
    return resp


async def held_ok(request: web.Request, leave: Leave) -> web.StreamResponse:
    """Holds the request until the server's ``peak_to_reach`` requests have been in flight at
    once, leaves the in-flight count, then writes [DONE]."""
    resp = await start_stream(request)
    await resp.write(content("a"))
    await request.app[SERVER].held()
    await resp.write(content("b") + usage(7, 2))
    leave()
    await resp.write(DONE)
    return resp


async def quick_ok(request: web.Request, leave: Leave) -> web.StreamResponse:
    """Two content chunks and usage at once."""
    resp = await start_stream(request)
    await resp.write(content("a") + content("b") + usage(7, 2) + DONE)
    return resp


async def outlasts(request: web.Request, leave: Leave) -> web.StreamResponse:
    """Holds the request for the server's ``hold_s`` after it arrived, then finishes it."""
    resp = await start_stream(request)
    await resp.write(content("a"))
    await asyncio.sleep(request.app[SERVER].hold_s)
    await resp.write(content("b") + usage(7, 2) + DONE)
    return resp


async def chat_normal(request: web.Request, leave: Leave) -> web.StreamResponse:
    """vLLM's chat stream: a role-only delta, content deltas (one carrying 2 tokens), usage."""
    resp = await start_stream(request)
    await resp.write(chat_delta({"role": "assistant", "content": ""}))
    await resp.write(chat_delta({"content": "a"}))
    await asyncio.sleep(0.01)
    await resp.write(chat_delta({"content": "bc"}) + usage(9, 3) + DONE)
    return resp


Scenario = Callable[[web.Request, Leave], Awaitable[web.StreamResponse]]


SCENARIOS: dict[str, Scenario] = {
    "normal": normal,
    "error_event": error_event,
    "usage_only": usage_only,
    "no_usage": no_usage,
    "http_500": http_500,
    "stalls": stalls,
    "held_ok": held_ok,
    "quick_ok": quick_ok,
    "outlasts": outlasts,
    "chat_normal": chat_normal,
}


def spec(prompt: str, output_len: int = 4) -> RequestSpec:
    return RequestSpec(prompt=prompt, prompt_len=7, output_len=output_len)


async def run_against_server(
    prompts: list[str], peak_to_reach: int = 1, hold_s: float = 0.0, **kwargs: Any
) -> tuple[LoadResult, FakeSSEServer]:
    async with FakeSSEServer(peak_to_reach, hold_s) as server:
        result = await run_load(server.url, "tiny", [spec(p) for p in prompts], **kwargs)
    return result, server


@pytest.mark.timeout(60)
def test_normal_stream_with_deterministic_clock() -> None:
    done: list[RequestRecord] = []
    result, server = asyncio.run(
        run_against_server(["normal"], clock=counter_clock(), on_done=done.append)
    )
    # clock calls: run start 0, send 1, chunks 2 3 4, run end 5
    assert result.records == (
        RequestRecord(
            index=0,
            send_s=1.0,
            ttft_s=1.0,
            chunk_s=(2.0, 3.0, 4.0),
            end_s=4.0,
            prompt_tokens=7,
            output_tokens=4,
            success=True,
        ),
    )
    record = result.records[0]
    assert record.e2el_s == 3.0
    assert record.tpot_s == pytest.approx(2.0 / 3.0)
    assert record.itl_s == (1.0, 1.0)
    assert (result.start_s, result.end_s, result.duration_s) == (0.0, 5.0, 5.0)
    assert done == list(result.records)
    assert server.payloads == [{**COMMON_PAYLOAD, "prompt": "normal", "max_tokens": 4}]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("prompt", "error_part"),
    [
        ("error_event", "boom"),
        ("usage_only", "no content chunk"),
        ("no_usage", "no usage in stream"),
        ("http_500", "HTTP 500"),
    ],
)
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_failures_are_records(prompt: str, error_part: str, endpoint: str) -> None:
    result, _ = asyncio.run(run_against_server(["normal", prompt, "normal"], endpoint=endpoint))
    first, failure, last = result.records
    assert first.success and last.success
    assert not failure.success
    assert error_part in failure.error
    assert failure.e2el_s is None and failure.tpot_s is None
    assert [r.index for r in result.records] == [0, 1, 2]


@pytest.mark.timeout(60)
def test_timeout_is_a_failure_and_the_run_completes() -> None:
    # The stalled request never ends by itself, so the run completing at all shows that the
    # timeout ended it (no bound on the run's wall time needed). 2 s is 40x what the normal
    # request's simulated pauses add up to, so a loaded machine does not time it out too.
    result, _ = asyncio.run(run_against_server(["stalls", "normal"], timeout_s=2.0))
    stalled, normal_record = result.records
    assert not stalled.success
    assert "timeout" in stalled.error
    assert stalled.ttft_s is not None  # the first chunk did arrive
    assert normal_record.success and normal_record.output_tokens == 4


@pytest.mark.timeout(60)
def test_connection_refused_is_a_failure() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    result = asyncio.run(run_load(f"http://127.0.0.1:{port}", "tiny", [spec("normal")]))
    (record,) = result.records
    assert not record.success and record.error


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("max_concurrency", "expected_peak"), [(1, 1), (3, 3), (None, 12)])
def test_max_concurrency_respected(max_concurrency: int | None, expected_peak: int) -> None:
    # the server holds every request until the expected peak was in flight at once: reached
    # however slow the machine, and exceeded only if the client broke its bound
    result, server = asyncio.run(
        run_against_server(["held_ok"] * 12, peak_to_reach=expected_peak,
                           max_concurrency=max_concurrency)
    )
    assert all(r.success for r in result.records)
    assert server.max_in_flight == expected_peak
    assert max_in_flight([(r.send_s, r.end_s) for r in result.records]) <= expected_peak


@pytest.mark.timeout(60)
def test_sequential_requests_reuse_one_connection() -> None:
    result, server = asyncio.run(run_against_server(["normal"] * 4, max_concurrency=1))
    assert all(r.success for r in result.records)
    assert len(server.client_ports) == 4
    assert len(set(server.client_ports)) == 1


@pytest.mark.timeout(60)
def test_arrival_offsets_delay_sends() -> None:
    result, _ = asyncio.run(run_against_server(["normal", "normal"], arrivals=[0.0, 0.3]))
    first, second = result.records
    # Offsets count from the run's start, not from the previous send: a first send that a
    # loaded machine delays shortens the gap between the two, so only the start is a fixed
    # reference (and lower bounds hold however slow the machine is).
    assert result.start_s <= first.send_s < second.send_s
    assert second.send_s - result.start_s >= 0.29


@pytest.mark.timeout(60)
def test_a_trace_is_sent_as_token_ids_on_its_schedule() -> None:
    """The Mooncake sample's first 40 rows at 8x (~1 s): each body's prompt is the request's
    token ids, and every request leaves on its due time (vllm bench's self-timed schedule,
    trace.send_offsets): never before it, and never after a probe task in the same event loop
    that sleeps until PROBE_LAG_S past it. The bound is measured in this run (about
    PROBE_LAG_S on an idle machine, as late as the loop runs on a loaded one): each request's
    timer is armed for its due time (loadgen.sleep_until), so it comes due before its probe's
    and the request is sent before the probe wakes, however slow the machine is."""
    from framework.config.trace_spec import TimedTraceSpec
    from framework.load.prompts import load_tokenizer
    from framework.load.trace import read_trace
    from framework.load.trace import send_offsets
    from framework.load.trace_prompts import trace_requests
    from tests.paths import ROOT

    rows = read_trace(ROOT / "datasets" / "mooncake_sample.jsonl",
                      TimedTraceSpec(sec_multiplier=0.001 / 8), 40)
    requests = trace_requests(load_tokenizer(ROOT / "models" / "tiny-llama"), rows, 16, 0)
    due = send_offsets(rows)
    woke = [math.nan] * len(due)  # when each probe woke (time.perf_counter)

    async def replay() -> tuple[LoadResult, FakeSSEServer]:
        loop = asyncio.get_running_loop()
        start: list[float] = []  # the loop's time at the run's start
        probes: list[asyncio.Task[None]] = []

        async def probe(i: int) -> None:
            # at least one step later than its creation: after run_load's first steps
            await asyncio.sleep(max(0.0, start[0] + due[i] + PROBE_LAG_S - loop.time()))
            woke[i] = time.perf_counter()

        def clock() -> float:
            # run_load calls this first right before it reads the loop's time for its start:
            # the probes start from (nearly) the same instant, their first steps run just
            # before those of run_load's tasks
            if not probes:
                probes.extend(asyncio.create_task(probe(i)) for i in range(len(due)))
                start.append(loop.time())
            return time.perf_counter()

        async with FakeSSEServer() as server:
            result = await run_load(server.url, "tiny", requests, arrivals=due, clock=clock)
            await asyncio.gather(*probes)
            return result, server

    result, server = asyncio.run(replay())
    assert sorted(len(p["prompt"]) for p in server.payloads) == sorted(
        r.prompt_len for r in requests)
    assert {tuple(p["prompt"]) for p in server.payloads} == {r.token_ids for r in requests}
    late = [r.send_s - result.start_s - due[r.index] for r in result.records]
    probe_late = [woke[r.index] - result.start_s - due[r.index] for r in result.records]
    assert len(late) == 40 and all(x > -0.005 for x in late), late
    assert all(x <= bound for x, bound in zip(late, probe_late)), list(zip(late, probe_late))


@pytest.mark.timeout(60)
def test_arrivals_must_match_requests() -> None:
    with pytest.raises(ValueError):
        asyncio.run(run_load("http://127.0.0.1:1", "tiny", [spec("normal")], arrivals=[0.0, 1.0]))


@pytest.mark.timeout(60)
def test_chat_stream_with_deterministic_clock() -> None:
    result, server = asyncio.run(
        run_against_server(["chat_normal"], clock=counter_clock(), endpoint="chat")
    )
    # clock calls: run start 0, send 1, role chunk 2, content chunks 3 4, run end 5.
    # The role-only first delta counts as a chunk, as vllm bench's openai-chat client counts it.
    (record,) = result.records
    assert record.success, record.error
    assert (record.ttft_s, record.chunk_s, record.end_s) == (1.0, (2.0, 3.0, 4.0), 4.0)
    assert (record.prompt_tokens, record.output_tokens) == (9, 3)
    assert server.payloads == [{
        **COMMON_PAYLOAD,
        "messages": [{"role": "user", "content": "chat_normal"}],
        "max_completion_tokens": 4,
    }]


@pytest.mark.timeout(60)
def test_unknown_endpoint_is_rejected() -> None:
    with pytest.raises(ValueError, match="endpoint"):
        asyncio.run(run_load("http://127.0.0.1:1", "tiny", [spec("normal")], endpoint="embeddings"))


@pytest.mark.timeout(60)
def test_duration_bound_stops_sending_and_lets_in_flight_finish() -> None:
    # One slot: two quick requests, then one the server holds for the whole bound after it
    # arrived (so past the bound, however fast or slow the machine is); the 17 after it are
    # not sent. The 1 s bound is far longer than the first three sends take, even on a loaded
    # machine.
    duration_s = 1.0
    done: list[RequestRecord] = []
    result, server = asyncio.run(
        run_against_server(["quick_ok", "quick_ok", "outlasts"] + ["quick_ok"] * 17,
                           hold_s=duration_s, max_concurrency=1, duration_s=duration_s,
                           on_done=done.append)
    )
    assert [r.index for r in result.records] == [0, 1, 2]
    assert result.not_sent == 17 == 20 - len(server.payloads)
    assert all(r.success for r in result.records)  # the last one started in time and finished
    assert result.records[-1].end_s - result.start_s >= duration_s  # ... after the bound
    assert done == list(result.records)
    assert result.duration_s >= duration_s


@pytest.mark.timeout(60)
def test_duration_bound_skips_late_arrivals() -> None:
    # an arrival an hour away: a run that waited for it would run into the test's timeout
    result, server = asyncio.run(
        run_against_server(["normal"] * 3, arrivals=[0.0, 0.1, 3600.0], duration_s=0.5)
    )
    assert [r.index for r in result.records] == [0, 1]
    assert result.not_sent == 1 and len(server.payloads) == 2


@pytest.mark.timeout(60)
def test_rejects_non_positive_duration() -> None:
    with pytest.raises(ValueError, match="duration_s"):
        asyncio.run(run_load("http://127.0.0.1:1", "tiny", [spec("normal")], duration_s=0.0))


def _chunked(*parts: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n")


async def _idle_closing_server(drop: set[tuple[int, int]], seen: list[tuple[int, int]],
                               use: Callable[[str], Awaitable[LoadResult]]) -> LoadResult:
    """A server that answers request r of connection c, unless (c, r) is in `drop`: then it
    closes that connection without a byte, as uvicorn does when its keep-alive timer fires
    while the request is on its way (the request is never read)."""
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        conn = connections
        try:
            for number in range(1, 100):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                seen.append((conn, number))
                if (conn, number) in drop:
                    return
                writer.write(_chunked(content(" a"), usage(7, 1), DONE))
                await writer.drain()
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()

    result = await serving(handle, use)
    assert isinstance(result, LoadResult)
    return result


def _two_in_a_row(drop: set[tuple[int, int]]) -> tuple[LoadResult, list[tuple[int, int]]]:
    seen: list[tuple[int, int]] = []
    result = asyncio.run(_idle_closing_server(drop, seen, lambda url: run_load(
        url, "tiny", [spec("a", 1), spec("b", 1)], max_concurrency=1, timeout_s=30)))
    return result, seen


@pytest.mark.timeout(60)
def test_a_reused_connection_closed_for_idleness_sends_the_request_again_once() -> None:
    """Found under CPU contention (a 3-burner run of test_bench): vLLM's uvicorn closed kept-
    alive connections as the next request went out, and requests failed 'connection closed
    before the response head' although the server never read them."""
    result, seen = _two_in_a_row(drop={(1, 2)})
    assert [r.success for r in result.records] == [True, True], result.records
    assert seen == [(1, 1), (1, 2), (2, 1)]  # request 2 again, on a new connection


@pytest.mark.timeout(60)
def test_a_new_connection_closed_without_an_answer_is_a_failure_not_sent_again() -> None:
    result, seen = _two_in_a_row(drop={(1, 2), (2, 1)})
    assert [r.success for r in result.records] == [True, False]
    assert "connection closed before the response head" in result.records[1].error
    assert seen == [(1, 1), (1, 2), (2, 1)]  # once again only
