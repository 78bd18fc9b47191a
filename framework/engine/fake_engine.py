"""FakeEngine: a named stand-in for vLLM's OpenAI server, for scheduling tests at a scale this
machine cannot run for real (e.g. 4 nodes x 8 fake GPUs). It is NOT a model server.

It honours the same contract as `engine.serve` (tests/{unit,e2e}/test_engine_contract.py runs one suite
against both): `serve(argv)` blocks the calling thread while serving `GET /health`,
`GET /metrics` and streaming `POST /v1/completions` with `usage`; unknown or malformed flags
raise TrialError(invalid_args) before anything listens; it stops when its process is killed.

Latency is configurable through the environment (milliseconds unless named _S):
FAKE_ENGINE_STARTUP_S (default 1), FAKE_ENGINE_TTFT_MS (20), FAKE_ENGINE_TPOT_MS (5).
Holds, for tests that must act while a server starts or decodes (an event, not a window of
seconds): with FAKE_ENGINE_STARTUP_PASSES naming a folder, a server finishes starting only by
taking (removing) one file from it, waiting while it is empty (so a test lets exactly N servers
start); while the file FAKE_ENGINE_HOLD_TOKENS names exists, no request gets its next token;
with FAKE_ENGINE_READY_TOGETHER = FOLDER:N, a ready server (after `on_ready`) listens only once
N servers are ready (a barrier: `ready_together`), so N servers' ready spans surely overlap.
At most --max-num-seqs requests are decoded at once; the rest queue (their TTFT grows); a
request whose client disconnects leaves the queue or its slot at once, as vLLM aborts it.
Token pacing is a strategy (`Pacing`): that one (`FixedPacing`) by default; with
FAKE_ENGINE_SIM set, a simulated GPU (engine/sim_pacing.py: vLLM V1's scheduler run in real
time, each step's time from a performance model; prompts counted with the model's
tokenizer.json; running, waiting, KV usage and preemptions in /metrics from its scheduler).
With `--kv-transfer-config` naming vLLM's ExampleConnector, it fakes that connector's
observable contract (`kv_exchange`: a max_tokens-1 request saves the prompt's KV in
the shared folder, a later request of the same prompt loads them, counted in
`vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`), so a prefill/decode
deployment of FakeEngines reports its transfer as vLLM's servers do.
With VLLM_API_KEY set, /v1 routes answer 401 without `Authorization: Bearer <key>`, as vLLM.
Prefix caching (unless --no-enable-prefix-caching) is whole-prompt: a prompt seen before
counts its tokens as hits in vllm:prefix_cache_hits_total; the command `reset_prefix_cache` on
the control socket (framework.engine.control) empties it, as `engine.serve` resets vLLM's.
Like vLLM, it dies at start-up when --num-gpu-blocks-override x --block-size (16) cannot hold
one --max-model-len (2048) sequence.
`on_ready(args)` is called once the server listens (the cluster module uses it to start one
placeholder worker per placement-group bundle, as vLLM's Ray executor would).

The fake-GPU contract (#32): besides its server, FakeEngine fakes vLLM 0.32's device mechanics,
so that tests on fake GPUs fail where real GPUs would. Its placeholder processes pick their
device exactly as vLLM's do and record what they picked (`device`, a physical GPU id) in the
occupancy log (cluster.actors.OCCUPANCY_LOG_ENV), not the id Ray shows in CUDA_VISIBLE_DEVICES:
- world size 1: the server process computes at local rank 0 on entry 0 of its
  CUDA_VISIBLE_DEVICES, which Ray sets to the bundle's GPU (the server actor holds it);
- Ray executor (world size > 1): one worker per bundle, started with
  RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1 (Ray leaves its CUDA_VISIBLE_DEVICES unset);
  its rank follows vLLM's bundle order (driver node first, then node id), its local rank is
  its place among its node's workers in rank order, and it computes on
  `sorted(GPU ids Ray gave the group's bundles on its node)[local rank]`;
- mp executor: local ranks 0..N-1 on the server's node with no assigned ids, on GPUs 0..N-1
  when CUDA_VISIBLE_DEVICES is unset.
The rules, with the vLLM source they come from, are framework/cluster/devices.py (pure; the
engine room cannot import it, the cluster room applies them); tests/unit/cluster/test_devices.py
checks them against vLLM's own code, tests/e2e/test_gpu_devices.py checks the recorded devices.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import io
import json
import os
import tempfile
import time
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Protocol

from framework.base.errors import TrialError
from framework.engine.control import serve_from_env

if TYPE_CHECKING:
    from aiohttp import web

_FLAGS_WITH_VALUE = ("max-num-seqs", "max-num-batched-tokens", "tensor-parallel-size",
                     "pipeline-parallel-size", "max-model-len", "distributed-executor-backend",
                     "block-size", "gpu-memory-utilization", "kv-cache-dtype", "dtype",
                     "load-format", "num-gpu-blocks-override", "kv-transfer-config")
_BOOL_FLAGS = ("enable-chunked-prefill", "enable-prefix-caching", "enforce-eager")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fake-engine", exit_on_error=False)
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    for flag in _FLAGS_WITH_VALUE:
        kind = int if flag.endswith(("size", "seqs", "tokens", "len", "override")) and \
            flag != "kv-transfer-config" else str
        p.add_argument(f"--{flag}", type=kind, default=None)
    for flag in _BOOL_FLAGS:
        p.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=None)
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser().parse_args(list(argv))
    except (SystemExit, argparse.ArgumentError) as exc:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()] or [str(exc)]
        raise TrialError("invalid_args", lines[-1]) from None


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


HOLD_POLL_S = 0.05  # how often a hold's file is looked at


def held(name: str) -> bool:
    """Whether the hold `name` (an environment variable naming a file) is on: the file exists."""
    path = os.environ.get(name)
    return path is not None and path != "" and os.path.exists(path)


def take_pass(folder: str) -> bool:
    """Take one pass: remove one file of `folder` (True), or False while it has none. Two
    servers never take the same file: only one unlink of it succeeds."""
    for name in sorted(os.listdir(folder)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, name))
            return True
    return False


def ready_together(spec: str) -> None:
    """FAKE_ENGINE_READY_TOGETHER = FOLDER:N: record this server in FOLDER (a new file) and
    return once FOLDER holds N files (at once when it already does): no server of the N returns
    before all N were recorded."""
    folder, _, count = spec.rpartition(":")
    os.close(tempfile.mkstemp(dir=folder, prefix="ready-")[0])
    while len(os.listdir(folder)) < int(count):
        time.sleep(HOLD_POLL_S)


KV_BLOCK = 16  # FakeEngine's block size without --block-size (vLLM's CPU engine: 128)


def kv_folder(config: str | None) -> str | None:
    """The shared folder of an `ExampleConnector` --kv-transfer-config (None for no config or
    another connector, whose transfer FakeEngine does not fake)."""
    if not config:
        return None
    parsed = json.loads(config)
    if parsed.get("kv_connector") != "ExampleConnector":
        return None
    return str(parsed.get("kv_connector_extra_config", {}).get("shared_storage_path") or "") or None


def kv_exchange(folder: str, prompt: str, prompt_tokens: int, max_tokens: int,
                block: int = KV_BLOCK) -> int:
    """FakeEngine's stand-in for ExampleConnector (vllm/distributed/kv_transfer/kv_connector/
    v1/example_connector.py), its observable contract only: a prefill request (max_tokens 1)
    saves the prompt's KV in `folder`, named by the prompt's hash; any other request whose
    prompt is saved there loads it. Like vLLM's, it moves whole blocks of the prompt but its
    last token, `align_to_block_size(len - 1)` = (len - 2) // block x block tokens (nothing for
    a prompt of at most one block + 1). Returns the tokens loaded (0 for a save or a miss)."""
    path = os.path.join(folder, hashlib.sha256(prompt.encode()).hexdigest()[:32])
    blocks = max(0, (prompt_tokens - 2) // block * block)
    if max_tokens == 1:
        with open(path, "w") as f:
            f.write(str(blocks))
        return 0
    try:
        with open(path) as f:
            return int(f.read() or 0)
    except FileNotFoundError:
        return 0


class TokenStream(Protocol):
    """One request's tokens: each `__anext__` returns when its next token may be sent;
    `aclose` ends it early (a client gone)."""

    def __aiter__(self) -> AsyncIterator[None]: ...

    def __anext__(self) -> Awaitable[None]: ...

    def aclose(self) -> Awaitable[None]: ...


class Pacing(Protocol):
    """How FakeEngine counts a prompt's tokens and paces each request's tokens; its gauges by
    vLLM's metric names (running, waiting, KV cache usage, preemptions)."""

    def prompt_tokens(self, prompt: str) -> int: ...

    def admit(self, prompt_tokens: int, output_tokens: int) -> TokenStream: ...

    def gauges(self) -> Mapping[str, float]: ...

    async def close(self) -> None: ...


class FixedPacing:
    """The default: a request waits for one of `max_num_seqs` slots, then its first token
    comes `ttft_s` later and each next one `tpot_s` after the previous."""

    def __init__(self, ttft_s: float, tpot_s: float, max_num_seqs: int) -> None:
        self._ttft_s, self._tpot_s = ttft_s, tpot_s
        self._slots = asyncio.Semaphore(max_num_seqs)
        self._running = self._waiting = 0

    def prompt_tokens(self, prompt: str) -> int:
        return max(1, len(prompt.split()))

    def admit(self, prompt_tokens: int, output_tokens: int) -> AsyncGenerator[None, None]:
        return self._tokens(output_tokens)

    async def _tokens(self, output_tokens: int) -> AsyncGenerator[None, None]:
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._running += 1
        try:
            await asyncio.sleep(self._ttft_s)
            for i in range(output_tokens):
                if i:
                    await asyncio.sleep(self._tpot_s)
                yield
        finally:
            self._running -= 1
            self._slots.release()

    def gauges(self) -> Mapping[str, float]:
        return {"vllm:num_requests_running": self._running,
                "vllm:num_requests_waiting": self._waiting,
                "vllm:kv_cache_usage_perc": 0.0, "vllm:num_preemptions_total": 0}

    async def close(self) -> None:
        return None


def pacing_from_env(args: argparse.Namespace) -> Pacing:
    """FAKE_ENGINE_SIM set: the simulated GPU (sim_pacing; the token hold pauses its steps);
    else FixedPacing from FAKE_ENGINE_TTFT_MS, FAKE_ENGINE_TPOT_MS and --max-num-seqs (128)."""
    spec = os.environ.get("FAKE_ENGINE_SIM")
    if spec:
        from framework.engine.sim_pacing import sim_pacing

        return sim_pacing(spec, args, paused=lambda: held("FAKE_ENGINE_HOLD_TOKENS"))
    return FixedPacing(_env_float("FAKE_ENGINE_TTFT_MS", 20.0) / 1000,
                       _env_float("FAKE_ENGINE_TPOT_MS", 5.0) / 1000, args.max_num_seqs or 128)


def serve(argv: Sequence[str], on_ready: Callable[[argparse.Namespace], None] = lambda _: None) -> None:
    """Parse, wait the configured start-up time, then serve until the process is killed."""
    args = parse_args(argv)
    time.sleep(_env_float("FAKE_ENGINE_STARTUP_S", 1.0))
    passes = os.environ.get("FAKE_ENGINE_STARTUP_PASSES")
    while passes and not take_pass(passes):
        time.sleep(HOLD_POLL_S)
    blocks, block = args.num_gpu_blocks_override, args.block_size or 16
    max_len = args.max_model_len or 2048
    if blocks is not None and blocks * block < max_len:
        raise RuntimeError(  # vLLM's own words (v1/core/kv_cache_utils.py)
            f"To serve at least one request with the model's max seq len ({max_len}), "
            f"({max_len * 1024} bytes KV cache is needed, which is larger than the available "
            f"KV cache memory ({blocks * block * 1024} bytes).")
    on_ready(args)
    together = os.environ.get("FAKE_ENGINE_READY_TOGETHER")
    if together:
        ready_together(together)
    asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    cached: set[str] = set()  # prompts seen: a whole-prompt prefix cache
    app = build_app(args, pacing_from_env(args), cached)
    loop = asyncio.get_running_loop()
    control = serve_from_env({"reset_prefix_cache":
                              lambda: bool(loop.call_soon_threadsafe(cached.clear))})
    # A client that disconnects cancels its request, queued or running, as vLLM's routes are
    # cancelled (vllm/entrypoints/serve/utils/api_utils.py `with_cancellation`, then the
    # engine aborts the request): a load cut short leaves nothing queued behind it.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    try:
        await asyncio.Event().wait()
    finally:
        if control is not None:
            control.close()


def build_app(args: argparse.Namespace, pacing: Pacing, cached: set[str]) -> web.Application:
    """FakeEngine's routes, tokens paced by `pacing`; `cached` is its whole-prompt prefix cache
    (the caller empties it on reset_prefix_cache). Closing the app closes the pacing."""
    from aiohttp import web

    counters = {"generated": 0, "queries": 0, "hits": 0, "finished": 0, "external": 0}
    caching = args.enable_prefix_caching is not False
    shared = kv_folder(args.kv_transfer_config)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_: web.Request) -> web.Response:
        gauges = pacing.gauges()
        text = (f"vllm:num_requests_running {gauges['vllm:num_requests_running']}\n"
                f"vllm:num_requests_waiting {gauges['vllm:num_requests_waiting']}\n"
                f"vllm:generation_tokens_total {counters['generated']}\n"
                f"vllm:prefix_cache_queries_total {counters['queries']}\n"
                f"vllm:prefix_cache_hits_total {counters['hits']}\n"
                f"vllm:kv_cache_usage_perc {gauges['vllm:kv_cache_usage_perc']}\n"
                f"vllm:num_preemptions_total {gauges['vllm:num_preemptions_total']}\n"
                # one engine, labelled as vLLM labels each (vllm/v1/metrics/loggers.py)
                'vllm:request_success_total{engine="0",finished_reason="length"} '
                f"{counters['finished']}\n"
                'vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"} '
                f"{counters['external']}\n")
        return web.Response(text=text, content_type="text/plain")

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n_out = int(body.get("max_tokens") or 16)
        prompt = str(body.get("prompt", ""))
        prompt_tokens = pacing.prompt_tokens(prompt)
        try:
            stream = pacing.admit(prompt_tokens, n_out)
        except ValueError as exc:  # a request the engine can never run, refused as vLLM does
            return web.json_response({"error": {"message": str(exc), "type": "BadRequestError",
                                                "param": None, "code": 400}}, status=400)
        if caching:
            counters["queries"] += prompt_tokens
            counters["hits"] += prompt_tokens if prompt in cached else 0
            cached.add(prompt)
        if shared is not None:
            counters["external"] += kv_exchange(shared, prompt, prompt_tokens, n_out,
                                                args.block_size or KV_BLOCK)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            await resp.prepare(request)
            async for _ in stream:
                while held("FAKE_ENGINE_HOLD_TOKENS"):
                    await asyncio.sleep(HOLD_POLL_S)
                chunk = {"choices": [{"index": 0, "text": " x", "finish_reason": None}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                counters["generated"] += 1
        finally:
            await stream.aclose()
        usage = {"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n_out,
                                          "total_tokens": prompt_tokens + n_out}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        counters["finished"] += 1
        return resp

    @web.middleware
    async def authenticate(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        """As vLLM: with VLLM_API_KEY set, /v1 routes need `Authorization: Bearer <key>`."""
        key = os.environ.get("VLLM_API_KEY")
        if key and request.path.startswith("/v1") and \
                request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def close_pacing(_: web.Application) -> None:
        await pacing.close()

    app = web.Application(middlewares=[authenticate])
    app.add_routes([web.get("/health", health), web.get("/metrics", metrics),
                    web.post("/v1/completions", completions)])
    app.on_cleanup.append(close_pacing)
    return app
