"""A whole benchmark run in virtual time (pure): requests sent as `vllm bench serve` sends them
(all at once, at arrival times, or a closed loop of `max_concurrency`), scheduled by vLLM V1's
continuous batching (engine/step_sim.py `Scheduler`), each step lasting a `StepTime`; recorded
as the load generator records real runs (load/loadgen.py RequestRecord), so that its metrics are
load/metrics.py's, with vllm bench serve's names and formulas.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from framework.base.vocabulary import DEFAULT_PERCENTILES
from framework.engine.step_sim import Limits
from framework.engine.step_sim import Scheduler
from framework.engine.step_time import StepShape
from framework.engine.step_time import StepTime
from framework.load.loadgen import RequestRecord
from framework.load.metrics import compute_metrics


@dataclass(frozen=True)
class SimRequest:
    """One request of a simulated run: when it may be sent (s from the run's start), its
    prompt and output lengths (tokens; the output is exactly `output_tokens`, ignore_eos)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class SimResult:
    """A simulated run, as `vllm bench serve` would have recorded it: one RequestRecord per
    request (index = its place in the input; every token its own content chunk), the run's
    duration (s, from 0 to the last token), steps run and preemptions."""

    records: tuple[RequestRecord, ...]
    duration_s: float
    steps: int
    preemptions: int

    @property
    def ttft_s(self) -> tuple[float, ...]:
        return tuple(r.ttft_s or 0.0 for r in self.records)

    @property
    def tpot_s(self) -> tuple[float | None, ...]:
        """(e2e - ttft) / (output - 1); None for a one-token output."""
        return tuple(r.tpot_s for r in self.records)

    @property
    def e2e_s(self) -> tuple[float, ...]:
        return tuple(r.e2el_s or 0.0 for r in self.records)

    @property
    def output_throughput(self) -> float:
        """Output tokens / duration (tok/s)."""
        return sum(r.output_tokens for r in self.records) / self.duration_s

    def metrics(self, percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, float | int]:
        """vllm bench serve's metrics of the run (framework.load.metrics.compute_metrics)."""
        return compute_metrics(self.records, self.duration_s, percentiles)


def _run_stretch(scheduler: Scheduler, stretch: int, cached: int, step_time: StepTime,
                 now: float, chunks: dict[int, list[float]], requests: Sequence[SimRequest],
                 pending: deque[int], free_slots: list[float] | None, steps: int
                 ) -> tuple[float, int]:
    """Up to `stretch` pure-decode steps in one go (Scheduler.decode_stretch), each its own
    step time at its own decode_context, ended early after a step by which a request waiting
    to be sent has arrived (it joins the next step, as step by step). Returns (now, steps)."""
    times: list[float] = []
    seqs = scheduler.num_running
    for j in range(stretch):
        shape = StepShape(0, 0, seqs, round((cached + j * seqs) / seqs))
        ms = step_time(shape)
        if not ms > 0:
            raise ValueError(f"step time must be > 0 ms, got {ms} for {shape}")
        now += ms / 1000
        times.append(now)
        if pending and requests[pending[0]].arrival_s <= now and \
                (free_slots is None or free_slots):
            break
    ids, finished = scheduler.advance_decode(len(times))
    for request_id in ids:
        chunks[int(request_id)].extend(times)
    if free_slots is not None:
        for _ in finished:
            heapq.heappush(free_slots, now)
    return now, steps + len(times)


def simulate(requests: Sequence[SimRequest], limits: Limits, step_time: StepTime,
             max_concurrency: int | None = None, fast_forward: bool = True) -> SimResult:
    """Run `requests` through the Scheduler in virtual time: each step lasts step_time(shape)
    ms and its tokens appear at its end; a request sent during a step joins the next one.

    Send time: arrival_s, or with `max_concurrency` = N (vllm bench serve --max-concurrency,
    a closed loop) max(arrival_s, the time the slot it takes was freed by a finished request),
    at most N in flight, in arrival order. TTFT = first token - send; E2E = last token - send.
    `fast_forward`: runs of pure-decode steps in one go (Scheduler.decode_stretch), the same
    outcome as step by step (tests/unit/engine/test_step_sim.py), 2-5x faster (benchmarks/
    prediction_speed.py).
    """
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    scheduler = Scheduler(limits)
    pending = deque(sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i)))
    free_slots = [0.0] * max_concurrency if max_concurrency is not None else None  # a heap
    send: dict[int, float] = {}
    chunks: dict[int, list[float]] = {i: [] for i in range(len(requests))}
    now = 0.0
    steps = 0
    while True:
        while pending and requests[pending[0]].arrival_s <= now and \
                (free_slots is None or free_slots):
            i = pending.popleft()
            freed = heapq.heappop(free_slots) if free_slots is not None else 0.0
            send[i] = max(requests[i].arrival_s, freed)
            scheduler.add(str(i), requests[i].prompt_tokens, requests[i].output_tokens)
        stretch, cached = scheduler.decode_stretch() if fast_forward else (0, 0)
        if stretch > 1:
            now, steps = _run_stretch(scheduler, stretch, cached, step_time, now, chunks,
                                      requests, pending, free_slots, steps)
            continue
        step = scheduler.next_step()
        if step is None:
            if not pending:
                break
            now = max(now, requests[pending[0]].arrival_s)
            continue
        ms = step_time(step.shape)
        if not ms > 0:
            raise ValueError(f"step time must be > 0 ms, got {ms} for {step.shape}")
        now += ms / 1000
        steps += 1
        for out in scheduler.finish_step(step):
            i = int(out.request_id)
            chunks[i].extend([now] * out.tokens)
            if out.finished and free_slots is not None:
                heapq.heappush(free_slots, now)
    records = tuple(
        RequestRecord(index=i, send_s=send[i], ttft_s=chunks[i][0] - send[i],
                      chunk_s=tuple(chunks[i]), end_s=chunks[i][-1],
                      prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens, success=True)
        for i, r in enumerate(requests))
    duration = max((rec.end_s or 0.0 for rec in records), default=0.0)
    return SimResult(records, duration, steps, scheduler.preemptions)
