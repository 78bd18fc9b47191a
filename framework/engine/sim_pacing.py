"""FakeEngine's simulated-GPU pacing: tokens paced by vLLM V1's scheduler (engine/step_sim.py)
run in real time, each step lasting a performance model's step time made "true" and noisy
(engine/sim_truth.py). Chosen by FAKE_ENGINE_SIM, a JSON object:

    {"predictor": name, "gpu": "H200-141GB", "error": 0.3, "seed": 0, "noise_cv": 0.02,
     "step_cv": 0.01}

predictor and gpu (a GPU type of engine/memory_model.py, as a sweep's `gpu:`) are required; the
rest default as shown (error: sim_truth's error size; seed: the error field's; noise_cv /
step_cv: sim_truth.noisy's run-to-run and per-step CVs). The scheduler's limits come from the
server's flags, absent ones at vLLM 0.32's defaults for the GPU (`sim_limits`); its KV blocks
from --num-gpu-blocks-override, else from the predictor's memory model for the deployment, as a
real server sizes its KV cache at start-up (and, as one, it does not start without room).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import fields
from dataclasses import replace
from pathlib import Path

from framework.engine.memory_model import BLOCK_SIZE
from framework.engine.memory_model import GPUS
from framework.engine.memory_model import batch_defaults
from framework.engine.memory_model import resolve_batch_limits
from framework.engine.predictor import Deployment
from framework.engine.predictor import Predictor
from framework.engine.sim_truth import RUN_CV
from framework.engine.sim_truth import STEP_CV
from framework.engine.sim_truth import noisy
from framework.engine.sim_truth import truth_config
from framework.engine.sim_truth import truth_step_time
from framework.engine.step_sim import Limits
from framework.engine.step_sim import Scheduler
from framework.engine.step_time import StepTime

MAX_MODEL_LEN = 2048  # FakeEngine's --max-model-len when absent (fake_engine.serve)


@dataclass(frozen=True)
class SimSpec:
    """FAKE_ENGINE_SIM, parsed (module docstring)."""

    predictor: str
    gpu: str
    error: float = 0.3
    seed: int = 0
    noise_cv: float = RUN_CV
    step_cv: float = STEP_CV


def parse_spec(text: str) -> SimSpec:
    """FAKE_ENGINE_SIM's JSON object -> SimSpec; unknown keys and an unknown GPU are errors."""
    raw = json.loads(text)
    known = {f.name for f in fields(SimSpec)}
    if not isinstance(raw, dict) or set(raw) - known or {"predictor", "gpu"} - set(raw):
        raise ValueError("FAKE_ENGINE_SIM must be a JSON object with predictor, gpu and "
                         f"keys among {sorted(known)}: {text}")
    spec = SimSpec(**raw)
    if spec.gpu not in GPUS:
        raise ValueError(f"FAKE_ENGINE_SIM gpu {spec.gpu!r} unknown; known: {sorted(GPUS)}")
    return spec


def sim_limits(args: argparse.Namespace, gpu: str) -> Limits:
    """The server's flags as scheduler limits. Absent: max-num-batched-tokens and max-num-seqs
    are vLLM 0.32's `vllm serve` defaults for the GPU (memory_model.batch_defaults:
    vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults), resolved as vLLM does
    (memory_model.resolve_batch_limits: the tokens raised to max-model-len without chunked
    prefill);
    chunked prefill on (vllm/config/scheduler.py, enable_chunked_prefill = True); block size
    16 (vllm/config/cache.py, CacheConfig.DEFAULT_BLOCK_SIZE); KV blocks from
    --num-gpu-blocks-override, else unlimited."""
    chunked = args.enable_chunked_prefill is not False
    tokens, seqs = resolve_batch_limits(batch_defaults(GPUS[gpu]), args.max_num_batched_tokens,
                                        args.max_num_seqs, args.max_model_len or MAX_MODEL_LEN,
                                        chunked)
    return Limits(max_num_seqs=seqs, max_num_batched_tokens=tokens,
                  chunked_prefill=chunked, block_size=args.block_size or BLOCK_SIZE,
                  kv_blocks=args.num_gpu_blocks_override)


def sim_config(args: argparse.Namespace, limits: Limits) -> dict[str, object]:
    """The server's configuration as the truth's error field reads it (sim_truth.truth_config)."""
    return truth_config(args.tensor_parallel_size or 1, args.pipeline_parallel_size or 1, limits,
                        args.kv_cache_dtype or "auto")


# (spec, the server's flags, its limits) -> the performance model's StepTime for the deployment,
# and its KV blocks per GPU (None: unlimited).
StepTimeFactory = Callable[[SimSpec, argparse.Namespace, Limits], StepTime]
KvBlocksFactory = Callable[[SimSpec, argparse.Namespace, Limits], "int | None"]


def _deployment(spec: SimSpec, args: argparse.Namespace, limits: Limits
                ) -> tuple[Predictor, Deployment]:
    """The predictor named spec.predictor and the Deployment of the model folder (--model) on
    the spec's GPU with the server's flags; ValueError with its reason where it cannot."""
    from framework.engine.predictor import predictor

    deployment = Deployment(
        model=Path(args.model), gpu=spec.gpu,
        tensor_parallel=args.tensor_parallel_size or 1,
        pipeline_parallel=args.pipeline_parallel_size or 1,
        kv_cache_dtype=args.kv_cache_dtype or "auto", block_size=limits.block_size,
        max_num_seqs=limits.max_num_seqs, max_num_batched_tokens=limits.max_num_batched_tokens,
        enable_chunked_prefill=limits.chunked_prefill,
        max_model_len=args.max_model_len or MAX_MODEL_LEN)
    chosen = predictor(spec.predictor)
    reason = chosen.supports(deployment)
    if reason is not None:
        raise ValueError(f"FAKE_ENGINE_SIM predictor {spec.predictor!r}: {reason}")
    return chosen, deployment


def predictor_step_time(spec: SimSpec, args: argparse.Namespace, limits: Limits) -> StepTime:
    """THE PLUG, the one place the predictor registry enters: the predictor's step time for
    the deployment (_deployment)."""
    chosen, deployment = _deployment(spec, args, limits)
    return chosen.step_time(deployment)


def predictor_kv_blocks(spec: SimSpec, args: argparse.Namespace, limits: Limits) -> int | None:
    """One GPU's KV blocks by the predictor's memory model (None: it has none). RuntimeError,
    in vLLM's words (vllm/v1/core/kv_cache_utils.py), when nothing is left for the KV cache."""
    chosen, deployment = _deployment(spec, args, limits)
    memory = chosen.memory(deployment)
    if memory is None:
        return None
    if memory.kv_blocks <= 0:
        raise RuntimeError("No available memory for the cache blocks. Try increasing "
                           "`gpu_memory_utilization` when initializing the engine.")
    return memory.kv_blocks


def count_words(prompt: str) -> int:
    """FakeEngine's prompt length without a tokenizer: whitespace words, at least 1."""
    return max(1, len(prompt.split()))


def token_counter(model: str) -> Callable[[str], int]:
    """Prompt tokens with the model folder's tokenizer.json (special tokens added, as vLLM's
    completions do), else count_words."""
    path = Path(model) / "tokenizer.json"
    if not path.is_file():
        return count_words
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    return lambda prompt: max(1, len(tokenizer.encode(prompt).ids))


class SimStream:
    """One request's tokens, as the step loop emits them; `aclose` before the end cancels it."""

    def __init__(self, cancel: Callable[[], None]) -> None:
        self._queue: asyncio.Queue[tuple[int, bool] | Exception] = asyncio.Queue()
        self._cancel = cancel
        self._ready = 0
        self._done = False

    def put(self, tokens: int, finished: bool) -> None:
        self._queue.put_nowait((tokens, finished))

    def fail(self, error: Exception) -> None:
        self._queue.put_nowait(error)

    def __aiter__(self) -> SimStream:
        return self

    async def __anext__(self) -> None:
        while self._ready == 0:
            if self._done:
                raise StopAsyncIteration
            item = await self._queue.get()
            if isinstance(item, Exception):
                raise item
            self._ready, self._done = self._ready + item[0], item[1]
        self._ready -= 1

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._cancel()


class SimPacing:
    """FakeEngine's pacing by a Scheduler run in real time: one asyncio task loops
    next_step -> sleep until the step's end -> finish_step -> tokens to the streams. Deadline-
    based: each step ends step_time(shape) ms after the previous one ended (a late wake-up is
    caught up by the next step), or after the idle loop woke for new work. While `paused()`,
    no step starts (it is looked at every `poll_s`)."""

    def __init__(self, scheduler: Scheduler, step_time: StepTime, count: Callable[[str], int],
                 paused: Callable[[], bool] = lambda: False, poll_s: float = 0.05) -> None:
        self.scheduler = scheduler
        self.step_time = step_time
        self._count = count
        self._paused = paused
        self._poll_s = poll_s
        self._streams: dict[str, SimStream] = {}
        self._ids = itertools.count()
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def prompt_tokens(self, prompt: str) -> int:
        return self._count(prompt)

    def admit(self, prompt_tokens: int, output_tokens: int) -> SimStream:
        """Queue a request now (ValueError if it can never run: Scheduler.add); its stream.
        RuntimeError once the step loop has stopped (closed, or failed: its streams got why)."""
        if self._task is not None and self._task.done():
            raise RuntimeError("the simulated engine's step loop has stopped")
        request_id = str(next(self._ids))
        self.scheduler.add(request_id, prompt_tokens, output_tokens)
        stream = SimStream(lambda: self._cancel(request_id))
        self._streams[request_id] = stream
        self._work.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return stream

    def gauges(self) -> dict[str, float]:
        return {"vllm:num_requests_running": self.scheduler.num_running,
                "vllm:num_requests_waiting": self.scheduler.num_waiting,
                "vllm:kv_cache_usage_perc": self.scheduler.kv_usage,
                "vllm:num_preemptions_total": self.scheduler.preemptions}

    async def close(self) -> None:
        """Stop the step loop (a failure of it was already given to its streams)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _cancel(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self.scheduler.cancel(request_id)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        clock = loop.time()
        try:
            while True:
                if self._paused():
                    await asyncio.sleep(self._poll_s)
                    clock = loop.time()
                    continue
                step = self.scheduler.next_step()
                if step is None:
                    self._work.clear()
                    await self._work.wait()
                    clock = loop.time()
                    continue
                clock += self.step_time(step.shape) / 1000
                await asyncio.sleep(max(0.0, clock - loop.time()))
                for out in self.scheduler.finish_step(step):
                    stream = self._streams.get(out.request_id)
                    if stream is not None:
                        stream.put(out.tokens, out.finished)
                    if out.finished:
                        self._streams.pop(out.request_id, None)
        except Exception as error:
            for stream in self._streams.values():
                stream.fail(error)
            raise


def sim_pacing(text: str, args: argparse.Namespace, paused: Callable[[], bool],
               factory: StepTimeFactory = predictor_step_time,
               rng: random.Random | None = None,
               kv_blocks: KvBlocksFactory | None = None) -> SimPacing:
    """FakeEngine's pacing for FAKE_ENGINE_SIM = `text`: the factory's model for the server's
    configuration, made true (sim_truth.truth_step_time with the spec's error and seed) and
    noisy (sim_truth.noisy with its CVs, drawn from `rng`: a fresh one per server run). KV
    blocks without --num-gpu-blocks-override: `kv_blocks` (default: with the default factory,
    the predictor's memory model, predictor_kv_blocks; else unlimited)."""
    spec = parse_spec(text)
    limits = sim_limits(args, spec.gpu)
    if kv_blocks is None and factory is predictor_step_time:
        kv_blocks = predictor_kv_blocks
    if limits.kv_blocks is None and kv_blocks is not None:
        limits = replace(limits, kv_blocks=kv_blocks(spec, args, limits))
    config = sim_config(args, limits)
    truth = truth_step_time(factory(spec, args, limits), config, spec.error, spec.seed)
    step_time = noisy(truth, spec.noise_cv, rng or random.Random(), spec.step_cv)
    return SimPacing(Scheduler(limits), step_time, token_counter(args.model), paused)
