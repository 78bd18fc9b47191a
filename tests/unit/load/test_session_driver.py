"""load.sessions.run_sessions against EchoChatServer, a local aiohttp server streaming a fresh
answer to every request, and SSEState's answer text. What the driver must do: put the
server's own answers into the next turn, wait the think time, end a session on a failure,
bound open sessions and requests in flight, stop at the duration."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC
from datetime import datetime
from typing import Any

import duckdb
import pytest
from aiohttp import web

from framework.load.conversations import Session
from framework.load.prompts import RequestSpec
from framework.load.sessions import run_sessions
from framework.load.sse import SSEState
from framework.results.rows import REQUEST_COLUMNS
from framework.results.rows import request_rows
from framework.results.store import ResultStore
from framework.trial.measure import Deadline
from framework.trial.measure import LoadPlan
from framework.trial.measure import Measurement
from framework.trial.measure import measure_fixed
from framework.trial.run import TrialOutcome
from tests.streams import DONE
from tests.streams import content
from tests.streams import counter_clock
from tests.streams import sse
from tests.streams import usage
from tests.unit.load.test_loadgen import FakeSSEServer


class EchoChatServer(FakeSSEServer):
    """test_loadgen's FakeSSEServer answering every request with the streamed answer
    `answer-<n>` (n counts requests), in two content chunks after `delay_s`; HTTP 500 when the
    newest user message is "FAIL". Keeps each body with its arrival and end times. Each answer
    first waits in `held()` (FakeSSEServer's `peak_to_reach`)."""

    def __init__(self, delay_s: float = 0.02, peak_to_reach: int = 1) -> None:
        super().__init__(peak_to_reach)
        self.delay_s = delay_s
        self.seen: list[dict[str, Any]] = []  # body, answer, start, end (time.perf_counter)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.answer(request)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        entry: dict[str, Any] = {"body": body, "start": time.perf_counter()}
        self.seen.append(entry)
        chat = "messages" in body
        newest = body["messages"][-1]["content"] if chat else body["prompt"].split(" ")[-1]
        if newest == "FAIL":
            return web.Response(status=500, text="no")
        self.enter()
        text = f"answer-{len(self.seen) - 1}"
        entry["answer"] = text
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await self.held()
        await asyncio.sleep(self.delay_s)
        chunks = [text[:3], text[3:]]
        if chat:
            await response.write(sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
            for part in chunks:
                await response.write(sse({"choices": [{"index": 0, "delta": {"content": part}}]}))
        else:
            for part in chunks:
                await response.write(content(part))
        await response.write(usage(5, 2) + DONE)
        entry["end"] = time.perf_counter()
        self.in_flight -= 1
        await response.write_eof()
        return response


def session(*users: str, think_s: float = 0.0) -> Session:
    return Session(turns=tuple(RequestSpec(u, 1, 2) for u in users),
                   think_s=(think_s,) * (len(users) - 1))


def run(sessions: list[Session], endpoint: str = "chat", delay_s: float = 0.02,
        peak_to_reach: int = 1, **kwargs: Any):
    async def go():
        async with EchoChatServer(delay_s, peak_to_reach) as server:
            result = await run_sessions(server.url, "m", sessions, endpoint=endpoint, **kwargs)
            return server, result
    return asyncio.run(go())


def test_each_turn_resends_the_conversation_with_the_servers_answers() -> None:
    sessions = [session("a0", "a1", "a2"), session("b0", "b1")]
    server, result = run(sessions)
    assert result.not_sent == 0 and all(r.success for r in result.records)
    assert [(r.index, r.session_id, r.turn) for r in result.records] == [
        (0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 1, 0), (4, 1, 1)]
    answer_of = {e["body"]["messages"][-1]["content"]: e["answer"] for e in server.seen}
    for r in result.records:
        user = sessions[r.session_id].turns[r.turn].prompt
        assert r.text == answer_of[user]  # the record keeps the streamed answer
    for s_id, s in enumerate(sessions):
        records = [r for r in result.records if r.session_id == s_id]
        expected: list[dict[str, str]] = []
        for k, turn in enumerate(s.turns):
            expected.append({"role": "user", "content": turn.prompt})
            body = next(e["body"] for e in server.seen
                        if e["body"]["messages"][-1]["content"] == turn.prompt)
            assert body["messages"] == expected
            assert body["max_completion_tokens"] == 2
            expected.append({"role": "assistant", "content": records[k].text})


def test_completions_turn_prompt_is_the_transcript() -> None:
    server, result = run([session("x0", "x1", "x2")], endpoint="completions")
    prompts = [e["body"]["prompt"] for e in server.seen]
    texts = [r.text for r in result.records]
    assert prompts == ["x0", f"x0 {texts[0]} x1", f"x0 {texts[0]} x1 {texts[1]} x2"]


def test_think_time_passes_between_an_answer_and_the_next_turn() -> None:
    server, _ = run([session("t0", "t1", "t2", think_s=0.25)])
    for before, after in zip(server.seen, server.seen[1:]):
        assert after["start"] - before["end"] >= 0.24


def test_a_failed_turn_ends_its_session_only() -> None:
    sessions = [session("ok0", "FAIL", "never"), session("c0", "c1")]
    server, result = run(sessions)
    by_session = {(r.session_id, r.turn): r for r in result.records}
    assert set(by_session) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert not by_session[0, 1].success and "HTTP 500" in by_session[0, 1].error
    assert result.not_sent == 1
    assert "never" not in json.dumps([e["body"] for e in server.seen])


def test_open_sessions_are_bounded() -> None:
    sessions = [session(f"s{i}-0", f"s{i}-1") for i in range(4)]
    _, result = run(sessions, max_active_sessions=1)
    spans = {}
    for r in result.records:
        first, last = spans.get(r.session_id, (r.send_s, r.end_s))
        spans[r.session_id] = (min(first, r.send_s), max(last, r.end_s))
    ordered = sorted(spans.values())
    assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:]))  # one session at a time


def test_requests_in_flight_are_bounded() -> None:
    # the server holds the answers until two requests were in flight at once (the first two
    # turns are sent together): the peak is reached however slow the machine is, and exceeded
    # only if the driver broke its bound
    sessions = [session(f"r{i}-0", f"r{i}-1") for i in range(6)]
    server, result = run(sessions, max_concurrency=2, peak_to_reach=2)
    assert server.max_in_flight == 2 and len(result.records) == 12


def test_sessions_start_at_their_arrivals_and_stop_at_the_duration() -> None:
    # d0-1 comes a whole bound's think time after d0-0's answer, so past the bound on any
    # machine; d1 arrives 0.8 s before it, far more than a loaded machine delays a send
    sessions = [session("d0-0", "d0-1", think_s=1.0), session("d1-0"), session("d2-0")]
    server, result = run(sessions, arrivals=[0.0, 0.2, 5.0], duration_s=1.0)
    firsts = {e["body"]["messages"][0]["content"]: e["start"] for e in server.seen}
    assert set(firsts) == {"d0-0", "d1-0"}  # d0-1 (1 s think) and d2 (5 s) after 1 s
    # arrivals count from the run's start (not from d0's send, which load may delay)
    assert firsts["d1-0"] - result.start_s >= 0.18
    assert result.not_sent == 2


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"arrivals": [0.0, 1.0]}, "2 arrivals for 1 sessions"),
    ({"max_active_sessions": 0}, "max_active_sessions"),
    ({"max_concurrency": 0}, "max_concurrency"),
    ({"duration_s": 0}, "duration_s"),
    ({"endpoint": "embeddings"}, "endpoint"),
])
def test_bad_arguments_are_refused(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        asyncio.run(run_sessions("http://127.0.0.1:9", "m", [session("z")], **kwargs))


@pytest.mark.parametrize(("keep_text", "stream", "text", "chunks"), [
    (True, [b'data: {"choices":[{"index":0,"text":"Hel"}]}\n',
            b'data: {"choices":[{"index":0,"text":"lo"}]}\n', usage(1, 2), DONE], "Hello", 2),
    (True, [b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n',
            b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n', DONE], "Hi", 2),
    (False, [b'data: {"choices":[{"index":0,"text":"Hel"}]}\n', DONE], "", 1),
])
def test_sse_keeps_the_answer_text_when_asked(keep_text, stream, text, chunks) -> None:
    state = SSEState(counter_clock(), keep_text)
    for block in stream:
        state.feed(block)
    state.end()
    assert state.text == text and len(state.chunks) == chunks


def test_a_trial_run_of_sessions_gives_session_metrics_and_rows(tmp_path) -> None:
    """measure_fixed on a plan holding sessions: the session driver runs (not run_load), the
    run's metrics include the session metrics and the request rows carry session and turn,
    written to Parquet by the store and read back with DuckDB."""
    sessions = [session("p0", "p1", "p2"), session("q0", "q1")]
    phases: list[str] = []

    async def serve_and_measure():
        async with EchoChatServer() as server:
            plan = LoadPlan(model="m", warmup=(), measured=sessions, arrivals=[0.0, 0.1],
                            max_concurrency=4, ignore_eos=True, request_timeout_s=30,
                            percentiles=(99,), goodput_slo_ms={}, startup_timeout_s=30,
                            endpoint="chat", max_active_sessions=2)
            m = Measurement()
            runs = await asyncio.to_thread(measure_fixed, server.url, plan,
                                           Deadline(None, time.monotonic), phases.append, m)
            return server, runs, m

    server, runs, m = asyncio.run(serve_and_measure())
    assert len(server.seen) == 5 and runs[0]["completed"] == 5
    assert runs[0]["sessions"] == runs[0]["sessions_completed"] == 2
    assert runs[0]["mean_turns_per_session"] == 2.5
    assert runs[0]["median_ttft_last_turn_ms"] > 0
    assert phases[0] == "under load: 0/5 requests"
    outcome = TrialOutcome(started_at=datetime.now(UTC), argv=(), steps=tuple(m.steps))
    rows = request_rows(7, outcome)
    assert [(r["session_id"], r["turn"]) for r in rows] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert all(set(r) == {name for name, _ in REQUEST_COLUMNS} for r in rows)
    store = ResultStore(tmp_path, "mt")
    store.write_requests(7, rows, REQUEST_COLUMNS)
    got = duckdb.sql(f"""
        SELECT session_id, count(*) AS turns, max(turn) AS last, min(prompt_tokens) AS p
        FROM read_parquet('{tmp_path}/mt/requests/**/*.parquet', hive_partitioning = true)
        GROUP BY session_id ORDER BY session_id""").fetchall()
    assert got == [(0, 3, 2, 5), (1, 2, 1, 5)]
