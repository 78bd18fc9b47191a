"""Bytes of an OpenAI-compatible server's SSE stream, for fake servers in unit tests, a raw
asyncio server to send them from (`serving`), and a deterministic clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any


def sse(payload: dict[str, Any] | str) -> bytes:
    body = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {body}\n\n".encode()


def content(text: str) -> bytes:
    return sse({"id": "cmpl-1", "choices": [{"index": 0, "text": text}]})


def usage(prompt_tokens: int, completion_tokens: int) -> bytes:
    return sse(
        {
            "id": "cmpl-1",
            "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
        }
    )


DONE = sse("[DONE]")


def counter_clock() -> Callable[[], float]:
    """Deterministic clock: 0.0, 1.0, 2.0, ... one step per call."""
    ticks: Iterator[int] = iter(range(1_000_000))
    return lambda: float(next(ticks))


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def serving(handle: Handler, use: Callable[[str], Awaitable[object]]) -> object:
    """Run ``use(base_url)`` against an asyncio server on 127.0.0.1 answering with ``handle``."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        return await use(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    finally:
        server.close()
        await server.wait_closed()
