"""vLLM V1's continuous batching, step by step (pure): which requests one engine step computes
(a whole benchmark run in virtual time is engine/sim_run.py).

The scheduling rules are those of `Scheduler.schedule` in
.venv/lib/python3.11/site-packages/vllm/v1/core/sched/scheduler.py (vLLM 0.32), FCFS policy,
no prefix caching, no speculative decoding, one step in flight (no async scheduling):
- a token budget of `max_num_batched_tokens` per step; RUNNING requests first, in admission
  order, each its remaining tokens (`num_tokens - num_computed_tokens`: 1 for a decode, the
  rest of its prompt for a prefill) capped by the budget left;
- a running request that needs a KV block when none is free preempts the last admitted
  running request (`self.running.pop()`), RECOMPUTE: its blocks freed, its computed tokens
  reset to 0, back at the head of the waiting queue; if it is itself the last, it is preempted
  and the loop over running requests stops (`_preempt_request`);
- then, only if nothing was preempted this step, WAITING requests in FCFS order while
  `len(running) < max_num_seqs` and budget is left: without chunked prefill a request whose
  tokens exceed the budget left waits (and stops admission); admission needs free blocks for
  the request's whole sequence so far (`scheduler_reserve_full_isl`, default True,
  vllm/config/scheduler.py; vllm/v1/core/kv_cache_manager.py `allocate_slots`, watermark 0);
- blocks are allocated at schedule time for `num_computed_tokens + new tokens`
  (ceil(tokens / block_size) per request); a request's computed tokens advance when it is
  scheduled (`_update_after_schedule`);
- a step that completes a request's (re)computation samples one token for it: a prefill's
  last chunk gives its first token, a decode its next; a finished request frees its blocks.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from framework.engine.memory_model import blocks_for
from framework.engine.step_time import StepShape


@dataclass(frozen=True)
class Limits:
    """The scheduler's limits: --max-num-seqs, --max-num-batched-tokens, chunked prefill,
    --block-size and the KV cache's blocks (None: unlimited)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool = True
    block_size: int = 16
    kv_blocks: int | None = None

    def __post_init__(self) -> None:
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.block_size) < 1:
            raise ValueError(f"limits must be >= 1: {self}")
        if self.kv_blocks is not None and self.kv_blocks < 1:
            raise ValueError(f"kv_blocks must be >= 1 or None: {self}")


@dataclass(frozen=True)
class Step:
    """One scheduled step: its shape, the requests that get a prefill chunk (id, tokens) and
    those that decode one token, in scheduling order."""

    shape: StepShape
    prefill: tuple[tuple[str, int], ...]
    decode: tuple[str, ...]


@dataclass(frozen=True)
class Emitted:
    """What a finished step gave one request: tokens emitted (0 for a partial prefill chunk,
    else 1) and whether it is now finished."""

    request_id: str
    tokens: int
    finished: bool


@dataclass
class _Request:
    request_id: str
    prompt: int
    output: int
    generated: int = 0
    computed: int = 0
    blocks: int = 0

    @property
    def tokens(self) -> int:
        """vLLM's `num_tokens`: prompt + tokens generated so far."""
        return self.prompt + self.generated


class Scheduler:
    """vLLM V1's scheduler for one engine, incremental: `add` and `cancel` requests,
    `next_step` schedules one step, `finish_step` applies it once it has run. Exactly one step
    may be in flight."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._running: list[_Request] = []
        self._waiting: deque[_Request] = deque()
        self._requests: dict[str, _Request] = {}
        self._used_blocks = 0
        self._in_flight: Step | None = None
        self.preemptions = 0

    @property
    def num_running(self) -> int:
        """vllm:num_requests_running."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """vllm:num_requests_waiting (preempted requests included)."""
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        """vllm:kv_cache_usage_perc, a fraction: used blocks / kv_blocks (0.0 when unlimited)."""
        total = self.limits.kv_blocks
        return self._used_blocks / total if total else 0.0

    def add(self, request_id: str, prompt_tokens: int, output_tokens: int) -> None:
        """Queue a request (waiting, FCFS). A request that could never run is refused, as vLLM
        refuses it at its door (max_model_len): a prompt over the budget without chunked
        prefill, or a sequence over the whole KV cache."""
        lim = self.limits
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} already added")
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError(f"prompt and output tokens must be >= 1: {prompt_tokens}, {output_tokens}")
        if not lim.chunked_prefill and prompt_tokens > lim.max_num_batched_tokens:
            raise ValueError(f"prompt of {prompt_tokens} tokens > max_num_batched_tokens "
                             f"{lim.max_num_batched_tokens} without chunked prefill")
        if lim.kv_blocks is not None and \
                blocks_for(prompt_tokens + output_tokens, lim.block_size) > lim.kv_blocks:
            raise ValueError(f"{prompt_tokens} + {output_tokens} tokens exceed the KV cache "
                             f"({lim.kv_blocks} blocks of {lim.block_size})")
        request = _Request(request_id, prompt_tokens, output_tokens)
        self._requests[request_id] = request
        self._waiting.append(request)

    def cancel(self, request_id: str) -> None:
        """Drop a request wherever it is (its blocks freed); an unknown id is ignored."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        if request in self._running:
            self._running.remove(request)
        else:
            self._waiting.remove(request)
        self._free(request)

    def next_step(self) -> Step | None:
        """Schedule one step (module docstring); None when there is nothing to run."""
        if self._in_flight is not None:
            raise RuntimeError("next_step before finish_step of the step in flight")
        scheduled = self._schedule()
        if not scheduled:
            # `add` refuses what could never run, so only an empty scheduler schedules nothing
            assert not self._requests, "requests left that no step can schedule"
            return None
        step = self._step_of(scheduled)
        self._in_flight = step
        return step

    def finish_step(self, step: Step) -> list[Emitted]:
        """Apply a step that has run: each scheduled request that completed its computation
        samples one token; finished requests leave, freeing their blocks. Requests cancelled
        meanwhile are skipped."""
        if step is not self._in_flight:
            raise RuntimeError("finish_step of a step that is not in flight")
        self._in_flight = None
        emitted: list[Emitted] = []
        for request_id in [rid for rid, _ in step.prefill] + list(step.decode):
            request = self._requests.get(request_id)
            if request is None:
                continue
            if request.computed < request.tokens:
                emitted.append(Emitted(request_id, 0, False))
                continue
            request.generated += 1
            finished = request.generated >= request.output
            if finished:
                del self._requests[request_id]
                self._running.remove(request)
                self._free(request)
            emitted.append(Emitted(request_id, 1, finished))
        return emitted

    def decode_stretch(self) -> tuple[int, int]:
        """How many steps from now are pure decodes of the same running requests, each one
        token, without an admission, a finish before the last of them, or a preemption (0 when
        the next step is not such a step), and the tokens in the KV cache of those requests
        now (each step's decode_context is their mean, _step_of's rounding, one more per
        request and step). What lets `simulate` run them in one go (advance_decode) with the
        same outcome as step by step."""
        lim, running = self.limits, self._running
        if self._in_flight is not None or not running or len(running) > lim.max_num_batched_tokens \
                or (self._waiting and len(running) < lim.max_num_seqs) \
                or any(r.generated == 0 or r.tokens - r.computed != 1 for r in running):
            return 0, 0
        k = min(r.output - r.generated for r in running)
        if lim.kv_blocks is not None:
            def need(steps: int) -> int:
                return sum(max(0, blocks_for(r.computed + steps, lim.block_size) - r.blocks)
                           for r in running)
            while k > 0 and need(k) > self._free_blocks():
                k //= 2
        return k, sum(r.computed for r in running)

    def advance_decode(self, steps: int) -> tuple[list[str], list[str]]:
        """Run `steps` pure-decode steps at once (no more than decode_stretch allows): every
        running request computes and samples `steps` tokens. Returns (the running requests'
        ids, those finished at the last step)."""
        ids, finished = [], []
        for request in list(self._running):
            request.computed += steps
            request.generated += steps
            self._allocate(request, request.computed)
            ids.append(request.request_id)
            if request.generated >= request.output:
                finished.append(request.request_id)
                del self._requests[request.request_id]
                self._running.remove(request)
                self._free(request)
        return ids, finished

    def _free(self, request: _Request) -> None:
        self._used_blocks -= request.blocks
        request.blocks = 0

    def _free_blocks(self) -> float:
        total = self.limits.kv_blocks
        return math.inf if total is None else total - self._used_blocks

    def _allocate(self, request: _Request, tokens: int) -> bool:
        """Blocks for `tokens` of `request`'s sequence, if free (allocate_slots)."""
        need = max(0, blocks_for(tokens, self.limits.block_size) - request.blocks)
        if need > self._free_blocks():
            return False
        request.blocks += need
        self._used_blocks += need
        return True

    def _preempt(self, request: _Request) -> None:
        """RECOMPUTE preemption (`_preempt_request`): blocks freed, computed tokens reset, back at
        the head of the waiting queue. Its generated tokens stay: recomputing them is a prefill
        of prompt + generated tokens whose last step samples its next token."""
        self._free(request)
        request.computed = 0
        self._waiting.appendleft(request)
        self.preemptions += 1

    def _schedule(self) -> list[tuple[_Request, int, bool]]:
        """(request, new tokens, is decode) for one step, computed tokens advanced."""
        lim = self.limits
        budget = lim.max_num_batched_tokens
        scheduled: list[tuple[_Request, int, bool]] = []
        preempted = False
        index = 0
        while index < len(self._running) and budget > 0:
            request = self._running[index]
            new = min(request.tokens - request.computed, budget)
            allocated = self._allocate(request, request.computed + new)
            while not allocated:
                victim = self._running.pop()
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
                allocated = self._allocate(request, request.computed + new)
            if not allocated:
                break
            # a decode: a request that has generated tokens computing its last one alone
            scheduled.append((request, new, request.generated > 0 and new == 1 and
                              request.tokens - request.computed == 1))
            budget -= new
            index += 1
        while not preempted and budget > 0 and self._waiting and \
                len(self._running) < lim.max_num_seqs:
            request = self._waiting[0]
            new = request.tokens - request.computed
            if not lim.chunked_prefill and new > budget:
                break
            new = min(new, budget)
            if blocks_for(request.tokens, lim.block_size) > self._free_blocks():
                break  # the full-sequence admission gate
            self._allocate(request, new)
            self._waiting.popleft()
            self._running.append(request)
            scheduled.append((request, new, False))
            budget -= new
        for request, new, _ in scheduled:
            request.computed += new
        return scheduled

    @staticmethod
    def _step_of(scheduled: list[tuple[_Request, int, bool]]) -> Step:
        """The step's shape: prefill_context = mean length of the sequences being prefilled
        (num_tokens: the prompt, plus generated tokens when recomputing; a chunk counts its
        whole sequence's length), decode_context = mean tokens in the KV cache (computed
        before the step) over decodes."""
        prefill = [(r, n) for r, n, decode in scheduled if not decode]
        decode = [r for r, _, is_decode in scheduled if is_decode]
        shape = StepShape(
            prefill_tokens=sum(n for _, n in prefill),
            prefill_context=round(sum(r.tokens for r, _ in prefill) / len(prefill)) if prefill else 0,
            decode_seqs=len(decode),
            decode_context=round(sum(r.computed - 1 for r in decode) / len(decode)) if decode else 0)
        return Step(shape, tuple((r.request_id, n) for r, n in prefill),
                    tuple(r.request_id for r in decode))
