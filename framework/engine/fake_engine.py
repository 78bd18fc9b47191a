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
start); while the file FAKE_ENGINE_HOLD_TOKENS names exists, no request gets its next token.
At most --max-num-seqs requests are decoded at once; the rest queue (their TTFT grows).
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
import time
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Sequence

from framework.base.errors import TrialError
from framework.engine.control import serve_from_env

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
    asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    ttft = _env_float("FAKE_ENGINE_TTFT_MS", 20.0) / 1000
    tpot = _env_float("FAKE_ENGINE_TPOT_MS", 5.0) / 1000
    slots = asyncio.Semaphore(args.max_num_seqs or 128)
    counters = {"running": 0, "waiting": 0, "generated": 0, "queries": 0, "hits": 0,
                "finished": 0}
    cached: set[str] = set()  # prompts seen: a whole-prompt prefix cache
    caching = args.enable_prefix_caching is not False
    shared = kv_folder(args.kv_transfer_config)
    counters["external"] = 0

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_: web.Request) -> web.Response:
        text = (f"vllm:num_requests_running {counters['running']}\n"
                f"vllm:num_requests_waiting {counters['waiting']}\n"
                f"vllm:generation_tokens_total {counters['generated']}\n"
                f"vllm:prefix_cache_queries_total {counters['queries']}\n"
                f"vllm:prefix_cache_hits_total {counters['hits']}\n"
                "vllm:kv_cache_usage_perc 0.0\nvllm:num_preemptions_total 0\n"
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
        prompt_tokens = max(1, len(prompt.split()))
        if caching:
            counters["queries"] += prompt_tokens
            counters["hits"] += prompt_tokens if prompt in cached else 0
            cached.add(prompt)
        if shared is not None:
            counters["external"] += kv_exchange(shared, prompt, prompt_tokens, n_out,
                                                args.block_size or KV_BLOCK)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        counters["waiting"] += 1
        async with slots:
            counters["waiting"] -= 1
            counters["running"] += 1
            try:
                await asyncio.sleep(ttft)
                for i in range(n_out):
                    if i:
                        await asyncio.sleep(tpot)
                    while held("FAKE_ENGINE_HOLD_TOKENS"):
                        await asyncio.sleep(HOLD_POLL_S)
                    chunk = {"choices": [{"index": 0, "text": " x", "finish_reason": None}]}
                    await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    counters["generated"] += 1
            finally:
                counters["running"] -= 1
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

    loop = asyncio.get_running_loop()
    control = serve_from_env({"reset_prefix_cache":
                              lambda: bool(loop.call_soon_threadsafe(cached.clear))})
    app = web.Application(middlewares=[authenticate])
    app.add_routes([web.get("/health", health), web.get("/metrics", metrics),
                    web.post("/v1/completions", completions)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    try:
        await asyncio.Event().wait()
    finally:
        if control is not None:
            control.close()
