"""Open-loop load generator for vLLM's OpenAI completions endpoint (streaming, SSE).

Measures what `vllm bench serve --backend openai` measures: send time, the time of
every SSE message carrying non-empty ``choices`` ("content chunks"), and token counts
from the final ``usage`` message. Failures are returned as records, never raised.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from framework.workload import RequestSpec

Clock = Callable[[], float]

READ_BUFSIZE = 2**20
ERROR_BODY_CHARS = 500
HEALTH_POLL_S = 0.5


@dataclass(frozen=True)
class RequestRecord:
    """Outcome of one request; all times are absolute values of the run's clock.

    ``ttft_s`` = first content chunk - ``send_s``; ``end_s`` = last content chunk for a
    success (vLLM's latency end), the clock when the failure was seen otherwise.
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


@dataclass(frozen=True)
class LoadResult:
    """All records of one run, in request order, and the run's clock span."""

    records: tuple[RequestRecord, ...]
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        """end_s - start_s: from before the first send to after the last record."""
        return self.end_s - self.start_s


def completion_payload(model: str, spec: RequestSpec, ignore_eos: bool) -> dict[str, Any]:
    """JSON body of one streaming completion request."""
    return {
        "model": model,
        "prompt": spec.prompt,
        "max_tokens": spec.output_len,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }


def sse_data(line: bytes) -> str | None:
    """Payload of an SSE ``data:`` line, or None for blank, comment and other field lines."""
    text = line.decode("utf-8", errors="replace").strip()
    if not text.startswith("data:"):
        return None
    return text[len("data:") :].strip()


def error_text(error: Any) -> str:
    """Readable text of an ``error`` object from an SSE event."""
    if isinstance(error, dict):
        message = error.get("message") or json.dumps(error)
        kind = error.get("type") or error.get("code")
        if kind:
            return f"server error in stream ({kind}): {message}"
        return f"server error in stream: {message}"
    return f"server error in stream: {error}"


async def stream_one(
    session: aiohttp.ClientSession,
    url: str,
    index: int,
    payload: dict[str, Any],
    timeout_s: float,
    clock: Clock,
) -> RequestRecord:
    """Send one streaming request and read its SSE stream into a record.

    Clock calls: one at send, one per content chunk, one more if the request fails.
    """
    chunks: list[float] = []
    prompt_tokens = 0
    output_tokens = 0
    usage_seen = False
    error = ""
    send_s = clock()
    try:
        async with session.post(url, json=payload) as resp:
            if resp.status != 200:
                body = (await resp.text(errors="replace"))[:ERROR_BODY_CHARS]
                error = f"HTTP {resp.status} {resp.reason or ''}: {body}".strip()
            else:
                async for line in resp.content:
                    data = sse_data(line)
                    if not data:
                        continue
                    if data == "[DONE]":
                        await resp.content.read()
                        break
                    message = json.loads(data)
                    if not isinstance(message, dict):
                        continue
                    if message.get("error"):
                        error = error_text(message["error"])
                        break
                    if message.get("choices"):
                        chunks.append(clock())
                    usage = message.get("usage")
                    if usage:
                        usage_seen = True
                        prompt_tokens = int(usage.get("prompt_tokens") or 0)
                        output_tokens = int(usage.get("completion_tokens") or 0)
    except TimeoutError:
        error = f"timeout after {timeout_s} s"
    except Exception as exc:  # any failure of one request is data, not a crash of the run
        error = f"{type(exc).__name__}: {exc}"

    if not error and not chunks:
        error = "no content chunk in stream"
    if not error and not usage_seen:
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
    )


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
) -> LoadResult:
    """Send ``requests`` to ``{base_url}/v1/completions`` and record each one.

    Request i becomes ready at ``arrivals[i]`` seconds after the start (all at once if
    None; pacing uses the event loop's clock, measurement uses ``clock``), then waits for
    one of ``max_concurrency`` slots (unbounded if None) before it is sent. One session
    is shared; ``timeout_s`` bounds each request. ``on_done`` gets every record as it
    finishes. Records are returned in request order.
    """
    if arrivals is not None and len(arrivals) != len(requests):
        raise ValueError(f"{len(arrivals)} arrivals for {len(requests)} requests")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    url = f"{base_url.rstrip('/')}/v1/completions"
    offsets = list(arrivals) if arrivals is not None else [0.0] * len(requests)
    limit = max_concurrency or 0
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    loop = asyncio.get_running_loop()

    async def one(
        session: aiohttp.ClientSession, index: int, spec: RequestSpec, loop_start: float
    ) -> RequestRecord:
        delay = loop_start + offsets[index] - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        payload = completion_payload(model, spec, ignore_eos)
        if semaphore is None:
            record = await stream_one(session, url, index, payload, timeout_s, clock)
        else:
            async with semaphore:
                record = await stream_one(session, url, index, payload, timeout_s, clock)
        if on_done is not None:
            on_done(record)
        return record

    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        read_bufsize=READ_BUFSIZE,
    ) as session:
        start_s = clock()
        loop_start = loop.time()
        tasks = [
            asyncio.create_task(one(session, i, spec, loop_start))
            for i, spec in enumerate(requests)
        ]
        records = await asyncio.gather(*tasks)
        end_s = clock()
    return LoadResult(records=tuple(records), start_s=start_s, end_s=end_s)


def run_load_sync(
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
) -> LoadResult:
    """``asyncio.run(run_load(...))`` with the same arguments."""
    return asyncio.run(
        run_load(
            base_url,
            model,
            requests,
            arrivals=arrivals,
            max_concurrency=max_concurrency,
            ignore_eos=ignore_eos,
            timeout_s=timeout_s,
            clock=clock,
            on_done=on_done,
        )
    )


async def wait_ready(
    base_url: str,
    timeout_s: float,
    is_alive: Callable[[], bool] | None = None,
    clock: Clock = time.monotonic,
) -> bool:
    """Poll ``GET {base_url}/health`` every 0.5 s.

    True on the first 200; False once ``is_alive()`` returns False or ``timeout_s``
    (measured with ``clock``) has passed.
    """
    url = f"{base_url.rstrip('/')}/health"
    deadline = clock() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            if is_alive is not None and not is_alive():
                return False
            remaining = deadline - clock()
            if remaining <= 0:
                return False
            try:
                poll_timeout = aiohttp.ClientTimeout(total=max(0.1, min(remaining, 5.0)))
                async with session.get(url, timeout=poll_timeout) as resp:
                    if resp.status == 200:
                        return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(min(HEALTH_POLL_S, max(0.0, deadline - clock())))
