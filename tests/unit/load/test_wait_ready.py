"""`loadgen.wait_ready`: /health polled through the one HTTP client, against raw asyncio servers on
127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from framework.load.loadgen import wait_ready


async def health_server(statuses: list[int], polls: list[float]) -> asyncio.Server:
    """An asyncio server on 127.0.0.1 answering GET /health with ``statuses`` in turn (then
    the last again; 0: accept and never answer); each poll's time goes to ``polls``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[0]
        assert line == b"GET /health HTTP/1.1"
        status = statuses[min(len(polls), len(statuses) - 1)]
        polls.append(time.monotonic())
        if status == 0:
            await asyncio.sleep(30)
        writer.write(b"HTTP/1.1 %d X\r\nContent-Length: 0\r\n\r\n" % status)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("statuses", "timeout_s", "ready", "n_polls", "elapsed"), [
    pytest.param([503, 500, 200], 10.0, True, 3, (1.0, 2.5), id="polls-every-0.5s-until-200"),
    pytest.param([404], 1.2, False, 3, (1.2, 2.0), id="never-200-until-the-deadline"),
    pytest.param([0], 0.8, False, 1, (0.8, 1.5), id="silent-server-bounded-by-the-deadline"),
])
def test_wait_ready_polls_until_200_or_deadline(statuses: list[int], timeout_s: float,
                                                ready: bool, n_polls: int,
                                                elapsed: tuple[float, float]) -> None:
    polls: list[float] = []

    async def scenario() -> tuple[bool, float]:
        server = await health_server(statuses, polls)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        started = time.monotonic()
        try:
            return await wait_ready(url, timeout_s), time.monotonic() - started
        finally:
            server.close()

    got, took = asyncio.run(scenario())
    assert got is ready and len(polls) == n_polls
    assert elapsed[0] <= took < elapsed[1]
    gaps = [b - a for a, b in zip(polls, polls[1:])]
    assert all(0.45 <= gap < 1.0 for gap in gaps), gaps


@pytest.mark.timeout(60)
def test_wait_ready_stops_when_the_server_dies_or_refuses_and_rejects_bad_urls() -> None:
    polls: list[float] = []
    alive = iter([True, True, False])

    async def scenario() -> bool:
        server = await health_server([503], polls)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            return await wait_ready(url, 30.0, is_alive=lambda: next(alive))
        finally:
            server.close()

    assert asyncio.run(scenario()) is False and len(polls) == 2
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    refused = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    started = time.monotonic()
    assert asyncio.run(wait_ready(refused, 1.0)) is False
    assert 1.0 <= time.monotonic() - started < 2.0
    with pytest.raises(ValueError, match="base URL"):
        asyncio.run(wait_ready("localhost:8000", 5.0))
