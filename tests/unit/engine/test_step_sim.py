"""vLLM V1's continuous batching simulated (framework/engine/step_sim.py), with an analytic
step time: 5 ms + 0.01 ms per prefill token + 0.05 ms per decoding sequence. Expected values
are derived by hand from the rules of vllm/v1/core/sched/scheduler.py `Scheduler.schedule`."""

from __future__ import annotations

import random

import pytest

from framework.engine.sim_run import SimRequest
from framework.engine.sim_run import simulate
from framework.engine.step_sim import Limits
from framework.engine.step_sim import Scheduler
from framework.engine.step_sim import Step
from framework.engine.step_time import StepShape


def analytic(step: StepShape) -> float:
    return 5 + 0.01 * step.prefill_tokens + 0.05 * step.decode_seqs


def recorded(shapes: list[StepShape]):
    def step_time(step: StepShape) -> float:
        shapes.append(step)
        return analytic(step)
    return step_time


@pytest.mark.parametrize("requests, limits, ttft_ms, tpot_ms", [
    # one prompt of 100: a 5 + 1 ms prefill gives token 1, then 4 decodes of 5.05 ms
    ([SimRequest(0.0, 100, 5)], Limits(8, 2048), [6.0], [5.05]),
    # 5000 tokens over a 2048 budget: chunks 2048 + 2048 + 904 = 3 x 5 + 50 ms
    ([SimRequest(0.0, 5000, 3)], Limits(8, 2048), [65.0], [5.05]),
    # two at once, budget 2048: both prefilled in one step (5 + 2 ms), then decode together
    ([SimRequest(0.0, 100, 3), SimRequest(0.0, 100, 3)], Limits(8, 2048), [7.0, 7.0], [5.1, 5.1]),
    # the second arrives 1 ms into the first's 6 ms prefill: it joins step 2 (decode of the
    # first + its prefill, 5 + 1 + 0.05 ms), TTFT = 6 + 6.05 - 1; step 3 decodes both
    # (5.1 ms): TPOT (6.05 + 5.1) / 2 for the first, 5.1 for the second
    ([SimRequest(0.0, 100, 3), SimRequest(0.001, 100, 2)], Limits(8, 2048),
     [6.0, 11.05], [5.575, 5.1]),
    # max_num_seqs 1: the second waits for the first's 6 + 5.05 ms, then its own 6 ms prefill
    ([SimRequest(0.0, 100, 2), SimRequest(0.0, 100, 2)], Limits(1, 2048),
     [6.0, 17.05], [5.05, 5.05]),
])
def test_request_timings_follow_the_step_rules(requests, limits, ttft_ms, tpot_ms):
    result = simulate(requests, limits, analytic)
    assert [t * 1000 for t in result.ttft_s] == pytest.approx(ttft_ms)
    assert [t * 1000 for t in result.tpot_s] == pytest.approx(tpot_ms)


@pytest.mark.parametrize("chunked, shapes", [
    # chunked: the first prompt's 1500 tokens, then the second's first 548 fill the 2048
    # budget (prefill context: the prompts' length, 1500, a chunk's too); next step the
    # first decodes (1500 tokens in its KV) while the second's last 952 complete it
    (True, [StepShape(2048, 1500, 0, 0), StepShape(952, 1500, 1, 1500),
            StepShape(0, 0, 1, 1500)]),
    # unchunked: the second (1500 > 548 left) waits a step, then is prefilled whole
    (False, [StepShape(1500, 1500, 0, 0), StepShape(1500, 1500, 1, 1500),
             StepShape(0, 0, 1, 1500)]),
])
def test_chunked_prefill_splits_a_prompt_and_unchunked_waits(chunked, shapes):
    seen: list[StepShape] = []
    simulate([SimRequest(0.0, 1500, 2), SimRequest(0.0, 1500, 2)],
             Limits(8, 2048, chunked_prefill=chunked), recorded(seen))
    assert seen == shapes


def test_a_prompt_over_the_budget_takes_several_steps_chunked_and_is_refused_unchunked():
    """3000 tokens, budget 2048: chunks of 2048 and 952, the first token after the second;
    without chunked prefill vLLM could never schedule it (it refuses such a max_model_len)."""
    seen: list[StepShape] = []
    simulate([SimRequest(0.0, 3000, 2)], Limits(8, 2048), recorded(seen))
    assert seen == [StepShape(2048, 3000, 0, 0), StepShape(952, 3000, 0, 0),
                    StepShape(0, 0, 1, 3000)]
    with pytest.raises(ValueError, match="without chunked prefill"):
        Scheduler(Limits(8, 2048, chunked_prefill=False)).add("0", 3000, 2)


def run_steps(scheduler: Scheduler, check=lambda step: None) -> tuple[list[Step], dict[str, int]]:
    """Every step until none is left (`check` sees each); tokens emitted per request."""
    steps: list[Step] = []
    tokens: dict[str, int] = {}
    while (step := scheduler.next_step()) is not None:
        check(step)
        steps.append(step)
        for out in scheduler.finish_step(step):
            tokens[out.request_id] = tokens.get(out.request_id, 0) + out.tokens
    return steps, tokens


@pytest.mark.parametrize("chunked", [True, False])
def test_budget_seats_and_kv_are_never_exceeded_and_every_request_completes(chunked):
    limits = Limits(max_num_seqs=5, max_num_batched_tokens=512, chunked_prefill=chunked,
                    block_size=16, kv_blocks=120)
    rng = random.Random(7)
    wanted = {str(i): (rng.randint(1, 1500 if chunked else 512), rng.randint(1, 60))
              for i in range(40)}
    scheduler = Scheduler(limits)
    for request_id, (prompt, output) in wanted.items():
        scheduler.add(request_id, prompt, output)

    def check(step: Step) -> None:
        assert step.shape.prefill_tokens + step.shape.decode_seqs <= 512
        assert sum(n for _, n in step.prefill) == step.shape.prefill_tokens
        assert len(step.prefill) + len(step.decode) <= scheduler.num_running <= 5
        assert scheduler.kv_usage <= 1.0

    _, tokens = run_steps(scheduler, check)
    assert tokens == {request_id: output for request_id, (_, output) in wanted.items()}
    assert (scheduler.num_running, scheduler.num_waiting, scheduler.kv_usage) == (0, 0, 0.0)


def test_waiting_requests_are_admitted_first_come_first_served():
    """One seat: requests run one after another in arrival order (ties by their order)."""
    requests = [SimRequest(0.003, 50, 2), SimRequest(0.0, 400, 2), SimRequest(0.0, 10, 2),
                SimRequest(0.001, 200, 2)]
    result = simulate(requests, Limits(1, 2048), analytic)
    first_token = [r.chunk_s[0] for r in result.records]
    assert sorted(range(4), key=first_token.__getitem__) == [1, 2, 3, 0]


def test_kv_pressure_preempts_the_last_admitted_and_recomputes_it():
    """10 blocks of 16; four requests of 16 prompt + 64 output tokens (5 blocks each at the end).
    All four are admitted (1 block each) and decode in lockstep. At 33 tokens each needs a
    third block: requests 0 and 1 take blocks 9 and 10, request 2 finds none and the last
    admitted, 3, is preempted (17 tokens generated). At 49 tokens 0 takes block 10 and 1 preempts
    2 (33 generated). 0 and 1 then fit exactly (2 x 5 = 10 blocks) and finish; 2 and 3 come back,
    recomputing prompt + generated tokens (49 and 33) in one prefill, and fit (5 + 5 blocks)."""
    scheduler = Scheduler(Limits(8, 2048, block_size=16, kv_blocks=10))
    for i in range(4):
        scheduler.add(str(i), 16, 64)
    victims: list[str] = []
    last: set[str] = set()
    preemptions = 0

    def check(step: Step) -> None:
        nonlocal last, preemptions
        ids = {rid for rid, _ in step.prefill} | set(step.decode)
        if scheduler.preemptions > preemptions:
            victims.extend(sorted(last - ids))
            preemptions = scheduler.preemptions
        last = ids
        assert scheduler.kv_usage <= 1.0

    steps, tokens = run_steps(scheduler, check)
    assert victims == ["3", "2"] and scheduler.preemptions == 2
    assert tokens == {str(i): 64 for i in range(4)}
    recomputed = [p for step in steps for p in step.prefill if p[1] > 16]
    assert recomputed == [("2", 49), ("3", 33)]


def test_a_cancelled_request_is_dropped_even_while_its_step_runs():
    scheduler = Scheduler(Limits(8, 2048, kv_blocks=100))
    scheduler.add("a", 100, 5)
    scheduler.add("b", 100, 5)
    step = scheduler.next_step()
    assert step is not None and [rid for rid, _ in step.prefill] == ["a", "b"]
    scheduler.cancel("a")
    assert [out.request_id for out in scheduler.finish_step(step)] == ["b"]
    assert (scheduler.num_running, scheduler.kv_usage) == (1, 7 / 100)  # b: 101 tokens, 7 blocks
    with pytest.raises(RuntimeError):
        scheduler.finish_step(step)


@pytest.mark.parametrize("add, error", [
    (("a", 0, 5), "must be >= 1"),
    (("a", 100, 0), "must be >= 1"),
    (("b", 1000, 40), "exceed the KV cache"),  # 1040 tokens = 65 blocks of 16 > 64
])
def test_requests_that_could_never_run_are_refused(add, error):
    scheduler = Scheduler(Limits(8, 2048, kv_blocks=64))
    with pytest.raises(ValueError, match=error):
        scheduler.add(*add)


def test_one_step_in_flight_at_a_time():
    scheduler = Scheduler(Limits(8, 2048))
    scheduler.add("a", 10, 2)
    assert scheduler.next_step() is not None
    with pytest.raises(RuntimeError):
        scheduler.next_step()


def test_closed_loop_keeps_at_most_n_in_flight_and_sends_when_one_finishes():
    requests = [SimRequest(0.0, 64 * (1 + i % 3), 8 + i) for i in range(10)]
    result = simulate(requests, Limits(64, 2048), analytic, max_concurrency=3)
    assert result.metrics()["max_concurrent_requests"] == 3
    ends = {r.end_s for r in result.records}
    assert all(r.send_s == 0.0 for r in result.records[:3])
    assert all(r.send_s in ends for r in result.records[3:])


def test_littles_law_in_a_closed_loop():
    """L = sum of time in system / duration (Little: L = lambda W, lambda = completed / T,
    W = mean E2E). N in flight from 0 to the last send, fewer only while draining:
    N x last send / T <= L <= N."""
    n = 4
    result = simulate([SimRequest(0.0, 64, 32)] * 40, Limits(64, 2048), analytic, max_concurrency=n)
    in_flight = sum(result.e2e_s) / result.duration_s
    last_send = max(r.send_s for r in result.records)
    assert n * last_send / result.duration_s <= in_flight <= n + 1e-9
    assert in_flight == pytest.approx(len(result.records) / result.duration_s
                                      * sum(result.e2e_s) / len(result.records))


def test_decode_bound_throughput_rises_with_max_num_seqs():
    """64 requests of 32 prompt + 256 output tokens. A decode step of b sequences makes b tokens
    in 5 + 0.05 b ms, so more seats give more tokens per second. At one seat each request takes
    5.32 (prefill) + 255 x 5.05 ms = 1293.07 ms: 64 x 256 tokens / (64 x 1.29307 s)."""
    requests = [SimRequest(0.0, 32, 256)] * 64
    throughput = [simulate(requests, Limits(seqs, 2048), analytic).output_throughput
                  for seqs in (1, 4, 16, 64)]
    assert throughput == sorted(throughput) and len(set(throughput)) == 4
    assert throughput[0] == pytest.approx(256 / 1.29307)


def context_sensitive(step: StepShape) -> float:
    """A step time that also grows with the decode context, so that a fast-forward that got a
    step's context wrong would show."""
    return analytic(step) + 0.001 * step.decode_context * step.decode_seqs


@pytest.mark.parametrize("limits, cap, rate", [
    (Limits(8, 2048), 8, None),  # closed loop, admissions as slots free
    (Limits(4, 512, kv_blocks=60), None, 200.0),  # open loop, KV pressure and preemptions
    (Limits(16, 256, chunked_prefill=True), 12, 50.0),  # chunks beside decodes, arrivals mid-run
])
def test_fast_forward_of_decode_runs_gives_exactly_the_step_by_step_outcome(limits, cap, rate):
    rng = random.Random(3)
    requests = [SimRequest(0.0 if rate is None else i / rate, rng.randint(20, 300),
                           rng.randint(2, 80)) for i in range(40)]
    slow = simulate(requests, limits, context_sensitive, cap, fast_forward=False)
    fast = simulate(requests, limits, context_sensitive, cap)
    assert fast.records == slow.records  # every request's send and every token's time
    assert (fast.duration_s, fast.steps, fast.preemptions) == \
        (slow.duration_s, slow.steps, slow.preemptions)
    assert slow.preemptions > 0 or limits.kv_blocks is None
