"""Open-loop load generator for vLLM's OpenAI completions and chat endpoints (streaming, SSE).

Measures what `vllm bench serve --backend openai` (``openai-chat`` for chat) measures: send
time, the time of every SSE message carrying non-empty ``choices`` ("content chunks"; for
chat this includes vLLM's first, role-only delta, as vLLM's client counts it), and token
counts from the final ``usage`` message. Failures are returned as records, never raised.

The streaming requests and the /health poll use framework.load.http_client (keep-alive
pool on asyncio protocols, parsing by httptools) instead of aiohttp's client: a streamed chunk
is parsed and timed inside ``data_received``, with no task wake-up, which halved the client's
CPU per output token (see that module).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from typing import Any
from typing import Literal

from framework.base.vocabulary import REPLICA_HEADER
from framework.load.http_client import Connection
from framework.load.http_client import ConnectionPool
from framework.load.http_client import get
from framework.load.sse import Clock
from framework.load.sse import SSEState
from framework.load.workload import RequestSpec

Endpoint = Literal["completions", "chat"]

ERROR_BODY_CHARS = 500
HEALTH_POLL_S = 0.5
HEALTH_POLL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RequestRecord:
    """Outcome of one request; all times are absolute values of the run's clock.

    ``ttft_s`` = first content chunk - ``send_s``; ``end_s`` = last content chunk for a
    success (vLLM's latency end), the clock when the failure was seen otherwise. A turn of a
    multi-turn session (load.sessions) also carries its ``session_id`` and ``turn`` (0 = the
    first) and the answer's ``text``; other requests leave them None and "".
    ``request_class``: the request's class in a mix (RequestSpec.request_class).
    ``replica``: the server that answered, from a router's REPLICA_HEADER (None without one).
    """

    index: int
    send_s: float
    ttft_s: float | None
    chunk_s: tuple[float, ...]
    end_s: float | None
    prompt_tokens: int
    output_tokens: int
    success: bool
    error: str = ""
    session_id: int | None = None
    turn: int | None = None
    text: str = ""
    request_class: str | None = None
    replica: int | None = None

    @property
    def e2el_s(self) -> float | None:
        """end_s - send_s; None for a failed request."""
        if not self.success or self.end_s is None:
            return None
        return self.end_s - self.send_s

    @property
    def tpot_s(self) -> float | None:
        """(e2el - ttft) / (output_tokens - 1); None if failed or output_tokens <= 1."""
        e2el = self.e2el_s
        if e2el is None or self.ttft_s is None or self.output_tokens <= 1:
            return None
        return (e2el - self.ttft_s) / (self.output_tokens - 1)

    @property
    def itl_s(self) -> tuple[float, ...]:
        """Gaps between consecutive content chunks (len(chunk_s) - 1 values)."""
        return tuple(b - a for a, b in zip(self.chunk_s, self.chunk_s[1:]))


@dataclass(frozen=True, repr=False)
class LoadResult:
    """The records of the requests sent in one run, in request order, and the run's clock span.

    ``not_sent`` counts requests skipped because the run's duration bound had passed.
    """

    records: tuple[RequestRecord, ...]
    start_s: float
    end_s: float
    not_sent: int = 0

    @property
    def duration_s(self) -> float:
        """end_s - start_s: from before the first send to after the last record."""
        return self.end_s - self.start_s

    def __repr__(self) -> str:
        # Short on purpose: asyncio.run() formats repr(main task) -- and so the repr of its
        # result -- twice while restoring the SIGINT handler; a full repr of 300 records
        # costs ~13 ms each time.
        ok = sum(r.success for r in self.records)
        return (f"LoadResult({len(self.records)} records, {ok} ok, not_sent={self.not_sent}, "
                f"start_s={self.start_s}, end_s={self.end_s})")


def completion_payload(model: str, spec: RequestSpec, ignore_eos: bool,
                       fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """JSON body of one streaming completion request, then ``fields`` (e.g. sampling) on top,
    as vllm bench merges its extra_body last. No sampling field unless ``fields`` has it.
    The prompt is ``spec.token_ids`` as a list of ids when set, else ``spec.prompt``."""
    return {
        "model": model,
        "prompt": spec.prompt if spec.token_ids is None else list(spec.token_ids),
        "max_tokens": spec.output_len,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(fields or {}),
    }


def chat_payload(model: str, spec: RequestSpec, ignore_eos: bool,
                 fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """JSON body of one streaming chat completion request: the prompt as one user message;
    ``fields`` on top, as in completion_payload. A token-id prompt cannot be a message:
    ValueError."""
    if spec.token_ids is not None:
        raise ValueError("token-id prompts (a timed trace) need the completions endpoint")
    return {
        "model": model,
        "messages": [{"role": "user", "content": spec.prompt}],
        "max_completion_tokens": spec.output_len,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(fields or {}),
    }


Payload = Callable[[str, RequestSpec, bool, Mapping[str, Any] | None], dict[str, Any]]
ENDPOINTS: dict[str, tuple[str, Payload]] = {
    "completions": ("/v1/completions", completion_payload),
    "chat": ("/v1/chat/completions", chat_payload),
}


def replica_of(headers: Mapping[str, str]) -> int | None:
    """The replica a router named in its REPLICA_HEADER (`headers` keys lower-case, as
    http_client.ResponseReader keeps them); None when absent or not a whole number."""
    value = headers.get(REPLICA_HEADER.lower())
    return int(value) if value is not None and value.isdigit() else None


async def stream_one(
    pool: ConnectionPool,
    path: str,
    index: int,
    payload: dict[str, Any],
    timeout_s: float,
    clock: Clock,
    keep_text: bool = False,
) -> RequestRecord:
    """Send one streaming request on a pooled connection and read its SSE stream into a record.

    Clock calls: one at send (before a connection is taken, as vllm bench times it), one per
    content chunk, one more if the request fails. The connection is reused only after a
    complete, successful keep-alive response. A reused connection the server closed for
    idleness before answering (``ClosedWhileIdle``: it never read the request) is replaced by
    a new one once, and the request sent again (``ConnectionPool.exchange``); its send time
    stays the first one, so the lost time counts in its TTFT, as a client of the server would
    see it. ``keep_text``: the
    record's ``text`` is the answer's text (every SSE message is then parsed; see SSEState).
    """
    state = SSEState(clock, keep_text)
    error = ""
    replica: int | None = None
    send_s = clock()
    conn: Connection | None = None
    reuse = False
    try:
        async with asyncio.timeout(timeout_s):
            request = pool.request(path, json.dumps(payload).encode())
            conn, reader = await pool.exchange(request, state.feed)
            replica = replica_of(reader.headers)
            if reader.status == 200:
                state.end()
                error = state.error
            else:
                body = reader.error_body.decode("utf-8", errors="replace")[:ERROR_BODY_CHARS]
                error = f"HTTP {reader.status} {reader.reason}: {body}".strip()
            reuse = reader.keep_alive and not error
    except TimeoutError:
        error = f"timeout after {timeout_s} s"
    except Exception as exc:  # noqa: BLE001 - any failure of one request is data, not a crash of the run
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if conn is not None:
            pool.put(conn, reuse)

    chunks = state.chunks
    prompt_tokens, output_tokens = state.prompt_tokens, state.output_tokens
    if not error and not chunks:
        error = "no content chunk in stream"
    if not error and not state.usage_seen:
        error = "no usage in stream"
    ttft_s = chunks[0] - send_s if chunks else None
    if error:
        return RequestRecord(
            index=index,
            send_s=send_s,
            ttft_s=ttft_s,
            chunk_s=tuple(chunks),
            end_s=clock(),
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            success=False,
            error=error,
            replica=replica,
        )
    return RequestRecord(
        index=index,
        send_s=send_s,
        ttft_s=ttft_s,
        chunk_s=tuple(chunks),
        end_s=chunks[-1],
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        success=True,
        text=state.text,
        replica=replica,
    )


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def sleep_until(when: float) -> None:
    """Sleep until the running loop's clock reads ``when``; return at once (without yielding)
    if it already has.

    One absolute timer: ``asyncio.sleep(when - loop.time())`` reads the clock twice, and a
    pause of the process between the two reads (a garbage collection, the CPU given to
    another process) would push the wake-up back by the pause's length."""
    loop = asyncio.get_running_loop()
    if when <= loop.time():
        return
    future: asyncio.Future[None] = loop.create_future()
    handle = loop.call_at(when, _wake, future)
    try:
        await future
    finally:
        handle.cancel()


def check_run_args(count: int, items: str, arrivals: Sequence[float] | None,
                   bounds: Mapping[str, int | None], timeout_s: float,
                   duration_s: float | None, endpoint: str) -> None:
    """ValueError unless a run's arguments make sense: one arrival per item, each bound >= 1
    or None, timeout_s > 0, duration_s > 0 or None, a known endpoint."""
    if arrivals is not None and len(arrivals) != count:
        raise ValueError(f"{len(arrivals)} arrivals for {count} {items}")
    for name, bound in bounds.items():
        if bound is not None and bound < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {bound}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"duration_s must be > 0 or None, got {duration_s}")
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {list(ENDPOINTS)}, got {endpoint!r}")


async def run_load(
    base_url: str,
    model: str,
    requests: Sequence[RequestSpec],
    *,
    arrivals: Sequence[float] | None = None,
    max_concurrency: int | None = None,
    ignore_eos: bool = True,
    timeout_s: float = 300.0,
    clock: Clock = time.perf_counter,
    on_done: Callable[[RequestRecord], None] | None = None,
    endpoint: Endpoint = "completions",
    duration_s: float | None = None,
    api_key: str | None = None,
    fields: Mapping[str, Any] | None = None,
) -> LoadResult:
    """Send ``requests`` to ``base_url`` + ENDPOINTS[endpoint] and record each one.

    Request i becomes ready at ``arrivals[i]`` seconds after the start (all at once if
    None; pacing uses the event loop's clock, measurement uses ``clock``), then waits for
    one of ``max_concurrency`` slots (unbounded if None) before it is sent. With
    ``duration_s``, a request not sent within ``duration_s`` of the start is skipped (no
    record, counted in ``not_sent``); requests in flight finish. Keep-alive connections are
    pooled (at most one per request in flight); ``timeout_s`` bounds each request.
    ``on_done`` gets every record as it finishes. ``api_key``: see ``ConnectionPool``.
    ``fields``: JSON body entries added to every request (framework.load.sampling's
    request_fields, or a caller's own, e.g. a greedy probe's temperature and logprobs); none
    by default, so the server's sampling defaults apply. Records are returned in request order.
    """
    check_run_args(len(requests), "requests", arrivals, {"max_concurrency": max_concurrency},
                   timeout_s, duration_s, endpoint)
    path, make_payload = ENDPOINTS[endpoint]
    pool = ConnectionPool(base_url, api_key)
    offsets = list(arrivals) if arrivals is not None else [0.0] * len(requests)
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    loop = asyncio.get_running_loop()
    deadline = math.inf if duration_s is None else duration_s

    async def one(index: int, spec: RequestSpec, loop_start: float) -> RequestRecord | None:
        if offsets[index] >= deadline:
            return None
        await sleep_until(loop_start + offsets[index])
        payload = make_payload(model, spec, ignore_eos, fields)
        if semaphore is None:
            record = await stream_one(pool, path, index, payload, timeout_s, clock)
        else:
            async with semaphore:
                if loop.time() - loop_start >= deadline:
                    return None
                record = await stream_one(pool, path, index, payload, timeout_s, clock)
        if spec.request_class is not None:
            record = replace(record, request_class=spec.request_class)
        if on_done is not None:
            on_done(record)
        return record

    try:
        start_s = clock()
        loop_start = loop.time()
        tasks = [asyncio.create_task(one(i, spec, loop_start)) for i, spec in enumerate(requests)]
        outcomes = await asyncio.gather(*tasks)
        end_s = clock()
    finally:
        pool.close()
    records = tuple(r for r in outcomes if r is not None)
    return LoadResult(
        records=records, start_s=start_s, end_s=end_s, not_sent=len(outcomes) - len(records)
    )


async def wait_ready(
    base_url: str,
    timeout_s: float,
    is_alive: Callable[[], bool] | None = None,
    clock: Clock = time.monotonic,
) -> bool:
    """Poll ``GET {base_url}/health`` every HEALTH_POLL_S (each poll bounded by the time left,
    at least 0.1 s, at most HEALTH_POLL_TIMEOUT_S).

    True on the first 200; False once ``is_alive()`` returns False or ``timeout_s``
    (measured with ``clock``) has passed. A refused, failed or timed-out poll is "not yet";
    a ``base_url`` that is not ``http(s)://host...`` raises ValueError.
    """
    url = f"{base_url.rstrip('/')}/health"
    deadline = clock() + timeout_s
    while True:
        if is_alive is not None and not is_alive():
            return False
        remaining = deadline - clock()
        if remaining <= 0:
            return False
        try:
            response = await get(url, max(0.1, min(remaining, HEALTH_POLL_TIMEOUT_S)))
            if response.status == 200:
                return True
        except OSError:
            pass
        await asyncio.sleep(min(HEALTH_POLL_S, max(0.0, deadline - clock())))
