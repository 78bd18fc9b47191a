"""`loadgen.wait_ready`: /health polled through the one HTTP client, against raw asyncio servers on
127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from framework.load import loadgen
from framework.load.loadgen import HEALTH_POLL_S
from framework.load.loadgen import wait_ready


async def health_server(statuses: list[int], polls: list[float]) -> asyncio.Server:
    """An asyncio server on 127.0.0.1 answering GET /health with ``statuses`` in turn (then
    the last again; 0: accept and never answer, until the client hangs up); each poll's time
    goes to ``polls``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[0]
        assert line == b"GET /health HTTP/1.1"
        status = statuses[min(len(polls), len(statuses) - 1)]
        polls.append(time.monotonic())
        if status == 0:
            await reader.read()
        else:
            writer.write(b"HTTP/1.1 %d X\r\nContent-Length: 0\r\n\r\n" % status)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


class Pauses:
    """loadgen's `asyncio`, recording the pause of every `sleep` wait_ready asks for."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float) -> None:
        self.asked.append(delay)
        await asyncio.sleep(delay)


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> Pauses:
    recorder = Pauses()
    monkeypatch.setattr(loadgen, "asyncio", recorder)
    return recorder


def per_poll(polls: list[float], step_s: float) -> Callable[[], float]:
    """A clock that moves on `step_s` with every poll the server saw: the deadline then passes
    after a set number of polls, however long the machine takes over each."""
    return lambda: step_s * len(polls)


P = HEALTH_POLL_S


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("statuses", "timeout_s", "step_s", "ready", "n_polls", "asked"), [
    # the real clock: the third poll answers 200, long before the deadline
    pytest.param([503, 500, 200], 10.0, None, True, 3, [P, P], id="polls-every-0.5s-until-200"),
    # 10 s per poll: polls at 0, 10 and 20 s before the 25-s deadline; the pause after the
    # last is cut to the time left (none)
    pytest.param([404], 25.0, 10.0, False, 3, [P, P, 0.0], id="never-200-until-the-deadline"),
    # the real clock: the one poll is bounded by the deadline, and nothing is left after it
    pytest.param([0], 0.8, None, False, 1, [0.0], id="silent-server-bounded-by-the-deadline"),
])
def test_wait_ready_polls_until_200_or_deadline(pauses: Pauses, statuses: list[int],
                                                timeout_s: float, step_s: float | None,
                                                ready: bool, n_polls: int,
                                                asked: list[float]) -> None:
    """Upper bounds on the time taken would depend on the machine's speed: the pauses
    wait_ready asks for show the interval and the deadline's cut instead, and the time between
    polls at least the pause (a silent server that was not cut off would hang the test)."""
    polls: list[float] = []

    async def scenario() -> tuple[bool, float]:
        server = await health_server(statuses, polls)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        clock = time.monotonic if step_s is None else per_poll(polls, step_s)
        started = time.monotonic()
        try:
            return await wait_ready(url, timeout_s, clock=clock), time.monotonic() - started
        finally:
            server.close()

    got, took = asyncio.run(scenario())
    assert got is ready and len(polls) == n_polls
    assert pauses.asked == pytest.approx(asked, abs=1e-3)
    assert took >= sum(pauses.asked)
    if step_s is None and not ready:
        assert took >= timeout_s
    gaps = [b - a for a, b in zip(polls, polls[1:])]
    assert all(gap >= 0.9 * pause for gap, pause in zip(gaps, pauses.asked)), gaps


@pytest.mark.timeout(60)
def test_wait_ready_stops_when_the_server_dies_or_refuses_and_rejects_bad_urls(
        pauses: Pauses) -> None:
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
    pauses.asked.clear()
    started = time.monotonic()
    assert asyncio.run(wait_ready(refused, 1.0)) is False
    # refused polls go on until the deadline, and no pause reaches past it (no upper bound on
    # the time taken: that depends on the machine's speed)
    assert time.monotonic() - started >= 1.0
    assert pauses.asked and sum(pauses.asked) <= 1.0
    with pytest.raises(ValueError, match="base URL"):
        asyncio.run(wait_ready("localhost:8000", 5.0))
