"""The session driver: multi-turn sessions (load.conversations) sent over the streaming client
of load.loadgen, each turn's prompt holding the answers the server actually gave.

Session i starts at ``arrivals[i]`` (the workload's arrival process, in sessions), waits for
one of ``max_active_sessions`` open-session slots if bounded (vLLM's multi-turn benchmark's
``--max-active-conversations``), then sends its turns one after another: turn k+1 is sent
``think_s[k]`` after turn k's answer ended, and each turn waits for one of
``max_concurrency`` request slots (requests in flight, as for single requests). A failed turn
ends its session (as in vLLM's multi-turn benchmark): its later turns are not sent. With
``duration_s``, no turn is sent after ``duration_s`` from the start. Records are returned in
index order: session by session, turn by turn (index = turns of earlier sessions + turn).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from framework.load.conversations import Session
from framework.load.conversations import chat_messages
from framework.load.conversations import transcript
from framework.load.conversations import turn_count
from framework.load.http_client import ConnectionPool
from framework.load.loadgen import ENDPOINTS
from framework.load.loadgen import Endpoint
from framework.load.loadgen import LoadResult
from framework.load.loadgen import RequestRecord
from framework.load.loadgen import check_run_args
from framework.load.loadgen import sleep_until
from framework.load.loadgen import stream_one
from framework.load.sse import Clock


def turn_payload(endpoint: Endpoint, model: str, session: Session, turn: int,
                 answers: Sequence[str], ignore_eos: bool,
                 fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of turn `turn`: loadgen's payload for the turn's user message, with the
    conversation so far in place of the single prompt (chat: `messages` from chat_messages;
    completions: `prompt` from transcript). Pure."""
    spec = session.turns[turn]
    payload = ENDPOINTS[endpoint][1](model, spec, ignore_eos, fields)
    if endpoint == "chat":
        payload["messages"] = chat_messages(session, turn, answers)
    else:
        payload["prompt"] = transcript(session, turn, answers)
    return payload


async def run_sessions(
    base_url: str,
    model: str,
    sessions: Sequence[Session],
    *,
    arrivals: Sequence[float] | None = None,
    max_concurrency: int | None = None,
    max_active_sessions: int | None = None,
    ignore_eos: bool = True,
    timeout_s: float = 300.0,
    clock: Clock = time.perf_counter,
    on_done: Callable[[RequestRecord], None] | None = None,
    endpoint: Endpoint = "completions",
    duration_s: float | None = None,
    api_key: str | None = None,
    fields: Mapping[str, Any] | None = None,
) -> LoadResult:
    """Hold `sessions` against `base_url` (see the module docstring); the other arguments mean
    what they mean for loadgen.run_load. `not_sent` counts the turns never sent (sessions
    ended by a failure or by `duration_s`)."""
    check_run_args(len(sessions), "sessions", arrivals,
                   {"max_concurrency": max_concurrency, "max_active_sessions": max_active_sessions},
                   timeout_s, duration_s, endpoint)
    path = ENDPOINTS[endpoint][0]
    pool = ConnectionPool(base_url, api_key)
    offsets = list(arrivals) if arrivals is not None else [0.0] * len(sessions)
    first_index = [0]
    for s in sessions:
        first_index.append(first_index[-1] + len(s.turns))
    requests = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    open_sessions = asyncio.Semaphore(max_active_sessions) if max_active_sessions else None
    loop = asyncio.get_running_loop()
    deadline = math.inf if duration_s is None else duration_s

    async def send(index: int, payload: dict[str, Any], loop_start: float) -> RequestRecord | None:
        if requests is None:
            return await stream_one(pool, path, index, payload, timeout_s, clock, keep_text=True)
        async with requests:
            if loop.time() - loop_start >= deadline:
                return None
            return await stream_one(pool, path, index, payload, timeout_s, clock, keep_text=True)

    async def hold(i: int, session: Session, loop_start: float) -> list[RequestRecord]:
        records: list[RequestRecord] = []
        answers: list[str] = []
        for k in range(len(session.turns)):
            if k == 0:
                await sleep_until(loop_start + offsets[i])
            elif session.think_s[k - 1] > 0:
                await asyncio.sleep(session.think_s[k - 1])
            if loop.time() - loop_start >= deadline:
                break
            payload = turn_payload(endpoint, model, session, k, answers, ignore_eos, fields)
            record = await send(first_index[i] + k, payload, loop_start)
            if record is None:
                break
            record = replace(record, session_id=i, turn=k)
            records.append(record)
            if on_done is not None:
                on_done(record)
            if not record.success:
                break
            answers.append(record.text)
        return records

    async def one(i: int, session: Session, loop_start: float) -> list[RequestRecord]:
        if offsets[i] >= deadline:
            return []
        if open_sessions is None:
            return await hold(i, session, loop_start)
        await sleep_until(loop_start + offsets[i])
        async with open_sessions:
            return await hold(i, session, loop_start)

    try:
        start_s = clock()
        loop_start = loop.time()
        tasks = [asyncio.create_task(one(i, s, loop_start)) for i, s in enumerate(sessions)]
        outcomes = await asyncio.gather(*tasks)
        end_s = clock()
    finally:
        pool.close()
    records = tuple(r for session_records in outcomes for r in session_records)
    return LoadResult(records=records, start_s=start_s, end_s=end_s,
                      not_sent=turn_count(sessions) - len(records))
