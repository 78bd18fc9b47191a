"""FakeEngine's simulated-GPU mode (framework/engine/sim_pacing.py) and its pacing seam in
framework/engine/fake_engine.py: FAKE_ENGINE_SIM parsed, the flags as scheduler limits at vLLM's
GPU defaults, prompts counted with the model's tokenizer, and FakeEngine served in-process on
127.0.0.1 whose streamed tokens arrive when `simulate` says they would."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from tokenizers import Tokenizer

from framework.cluster.ports import pick_port
from framework.engine import fake_engine
from framework.engine.sim_pacing import SimPacing
from framework.engine.sim_pacing import SimSpec
from framework.engine.sim_pacing import count_words
from framework.engine.sim_pacing import parse_spec
from framework.engine.sim_pacing import sim_config
from framework.engine.sim_pacing import sim_limits
from framework.engine.sim_pacing import sim_pacing
from framework.engine.sim_pacing import token_counter
from framework.engine.sim_run import SimRequest
from framework.engine.sim_run import simulate
from framework.engine.sim_truth import truth_step_time
from framework.engine.step_sim import Limits
from framework.engine.step_sim import Scheduler
from framework.engine.step_time import StepShape

GUARD_S = 60  # every in-process server's scenario is cancelled past this


def live_model(step: StepShape) -> float:
    """Steps of 40+ ms: far above the event loop's wake-up latency on a busy machine."""
    return 40 + 0.1 * step.prefill_tokens + 5 * step.decode_seqs


def args_of(*flags: str):
    return fake_engine.parse_args(["--model", "fake", "--port", "1", *flags])


def test_the_spec_takes_defaults_and_refuses_unknown_keys_and_gpus():
    assert parse_spec('{"predictor": "p", "gpu": "H200-141GB"}') == \
        SimSpec("p", "H200-141GB", error=0.3, seed=0, noise_cv=0.02, step_cv=0.01)
    assert parse_spec('{"predictor": "p", "gpu": "L40S-48GB", "error": 0.1, "seed": 3}').seed == 3
    with pytest.raises(ValueError, match="keys among"):
        parse_spec('{"predictor": "p", "gpu": "H200-141GB", "noise": 0.1}')
    with pytest.raises(ValueError, match="keys among"):
        parse_spec('{"gpu": "H200-141GB"}')
    with pytest.raises(ValueError, match="unknown"):
        parse_spec('{"predictor": "p", "gpu": "TPU-v9"}')


@pytest.mark.parametrize("gpu, flags, expected", [
    # vLLM 0.32's GPU defaults (EngineArgs.get_batch_defaults): H100/H200 8192 tokens and 1024
    # seqs; A100 and smaller 2048 and 256; chunked on, block size 16
    ("H200-141GB", [], Limits(1024, 8192, True, 16, None)),
    ("H100-80GB", [], Limits(1024, 8192, True, 16, None)),
    ("A100-80GB", [], Limits(256, 2048, True, 16, None)),
    # without chunked prefill the default budget is raised to max-model-len
    ("A100-80GB", ["--no-enable-chunked-prefill", "--max-model-len", "4096"],
     Limits(256, 4096, False, 16, None)),
    ("L40S-48GB", ["--no-enable-chunked-prefill"], Limits(256, 2048, False, 16, None)),
    ("H200-141GB", ["--max-num-seqs", "8", "--max-num-batched-tokens", "512", "--block-size", "32",
                  "--num-gpu-blocks-override", "100"], Limits(8, 512, True, 32, 100)),
])
def test_flags_become_scheduler_limits_at_vllms_gpu_defaults(gpu, flags, expected):
    assert sim_limits(args_of(*flags), gpu) == expected


def test_prompts_are_counted_with_the_models_tokenizer_else_by_words(tiny_model, tmp_path):
    prompt = "The quick brown fox jumps over the lazy dog"
    tokens = len(Tokenizer.from_file(str(tiny_model / "tokenizer.json")).encode(prompt).ids)
    assert token_counter(str(tiny_model))(prompt) == tokens != count_words(prompt) == 9
    assert token_counter(str(tmp_path))(prompt) == 9
    assert token_counter("fake")("") == 1


def test_the_pacing_is_built_from_the_spec_and_the_flags():
    args = args_of("--max-num-seqs", "4", "--tensor-parallel-size", "2")
    seen: list[tuple[SimSpec, object, Limits]] = []

    def factory(spec, flags, limits):
        seen.append((spec, flags, limits))
        return live_model

    pacing = sim_pacing('{"predictor": "p", "gpu": "A100-80GB"}', args, lambda: False, factory)
    assert pacing.scheduler.limits == Limits(4, 2048, True, 16, None)
    assert seen == [(parse_spec('{"predictor": "p", "gpu": "A100-80GB"}'), args,
                     pacing.scheduler.limits)]
    assert sim_config(args, pacing.scheduler.limits) == {
        "tensor-parallel-size": 2, "pipeline-parallel-size": 1, "max-num-seqs": 4,
        "max-num-batched-tokens": 2048, "enable-chunked-prefill": True, "kv-cache-dtype": "auto"}


def test_fake_engine_sim_looks_up_the_named_predictor(monkeypatch, tiny_model):
    """FAKE_ENGINE_SIM through fake_engine.pacing_from_env: the registry's predictor for the
    model folder and the spec's GPU (predictor_step_time); unset, the default pacing."""
    from framework.engine.predictor import off_reason

    args = fake_engine.parse_args(["--model", str(tiny_model), "--port", "1"])
    monkeypatch.delenv("FAKE_ENGINE_SIM", raising=False)
    assert isinstance(fake_engine.pacing_from_env(args), fake_engine.FixedPacing)
    monkeypatch.setenv("FAKE_ENGINE_SIM", '{"predictor": "nope", "gpu": "H200-141GB"}')
    with pytest.raises(ValueError, match="unknown predictor"):
        fake_engine.pacing_from_env(args)
    if (reason := off_reason("aiconfigurator")) is not None:
        pytest.skip(reason)
    monkeypatch.setenv("FAKE_ENGINE_SIM", '{"predictor": "aiconfigurator", "gpu": "H200-141GB"}')
    pacing = fake_engine.pacing_from_env(args)
    assert isinstance(pacing, SimPacing)
    # the KV cache one GPU holds by the predictor's memory model, as a real server sizes it
    from framework.engine.predictor import Deployment
    from framework.engine.predictor import predictor
    memory = predictor("aiconfigurator").memory(Deployment(model=tiny_model, gpu="H200-141GB"))
    assert memory is not None and memory.kv_blocks > 0
    assert pacing.scheduler.limits == Limits(1024, 8192, True, 16, memory.kv_blocks)
    assert pacing.step_time(StepShape(512, 512, 4, 600)) > 0


def test_a_stream_closed_early_cancels_its_request_and_a_failing_step_fails_the_streams():
    def broken(step: StepShape) -> float:
        raise ArithmeticError("no model")

    async def scenario() -> None:
        held = SimPacing(Scheduler(Limits(4, 64)), live_model, count_words, paused=lambda: True)
        gone, kept = held.admit(5, 3), held.admit(5, 3)
        await gone.aclose()
        assert held.gauges()["vllm:num_requests_waiting"] == 1
        await held.close()
        await kept.aclose()
        failing = SimPacing(Scheduler(Limits(4, 64)), broken, count_words)
        with pytest.raises(ArithmeticError):
            async for _ in failing.admit(5, 3):
                pass
        with pytest.raises(RuntimeError, match="stopped"):
            failing.admit(5, 3)
        await failing.close()

    asyncio.run(asyncio.wait_for(scenario(), GUARD_S))


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    """`app` on 127.0.0.1 (a free port) until the block ends; its URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = pick_port("127.0.0.1", [])
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def token_times(response: aiohttp.ClientResponse) -> tuple[list[float], dict]:
    """The loop's clock at each content chunk of an SSE stream, and its usage."""
    loop = asyncio.get_running_loop()
    times: list[float] = []
    usage: dict = {}
    async for raw in response.content:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        body = json.loads(line[len("data: "):])
        if body["choices"]:
            times.append(loop.time())
        else:
            usage = body["usage"]
    response.release()
    return times, usage


async def gauges(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(f"{url}/metrics") as response:
        lines = (await response.text()).splitlines()
    return {name: float(value) for name, value in (line.rsplit(" ", 1) for line in lines)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flags, prompts, outputs", [
    # two seats for three requests: the third waits for the first to finish
    (["--max-num-seqs", "2"], ["a b c d e f", "g h i j k l m n o p", "q r s"], [5, 4, 6]),
    # 6 blocks of 4 tokens for three 4 + 8 token requests: admitted with one block each, they
    # outgrow the cache and preempt (recompute) the last admitted
    (["--block-size", "4", "--num-gpu-blocks-override", "6"], ["a b c d"] * 3, [8, 8, 8]),
])
def test_streamed_tokens_arrive_when_simulate_says(flags, prompts, outputs):
    """The requests are queued while the steps are held (their response headers come after
    they are queued, so they queue in order), then released together: the live engine runs
    exactly the steps the simulation of the same requests, all arriving at 0, runs (the same
    shapes in the same order), each request gets its tokens, and the whole run lasts at least
    the steps' summed time (each step sleeps its time; a lower bound, which a slow machine
    cannot break: no wall-clock tolerance is asserted)."""
    args = args_of("--model", "fake", *flags)
    spec = '{"predictor": "analytic", "gpu": "H200-141GB", "error": 0.3, "seed": 2, ' \
           '"noise_cv": 0, "step_cv": 0}'
    limits = sim_limits(args, "H200-141GB")
    expected_shapes: list[StepShape] = []
    truth = truth_step_time(live_model, sim_config(args, limits), 0.3, 2)

    def recorded(step: StepShape) -> float:
        expected_shapes.append(step)
        return truth(step)

    expected = simulate([SimRequest(0.0, count_words(p), n) for p, n in zip(prompts, outputs)],
                        limits, recorded, fast_forward=False)
    live_shapes: list[StepShape] = []

    async def scenario() -> None:
        paused = [True]
        pacing = sim_pacing(spec, args, lambda: paused[0], lambda *_: live_model, random.Random(0))
        stepping = pacing.step_time

        def recording(step: StepShape) -> float:
            live_shapes.append(step)
            return stepping(step)

        pacing.step_time = recording
        async with served(fake_engine.build_app(args, pacing, set())) as url, \
                aiohttp.ClientSession() as session:
            responses = [await session.post(f"{url}/v1/completions",
                                            json={"prompt": p, "max_tokens": n, "stream": True})
                         for p, n in zip(prompts, outputs)]
            queued = await gauges(session, url)
            assert (queued["vllm:num_requests_waiting"], queued["vllm:num_requests_running"]) == \
                (len(prompts), 0)
            released = time.monotonic()
            paused[0] = False
            streams = await asyncio.gather(*(token_times(r) for r in responses))
            elapsed = time.monotonic() - released
            after = await gauges(session, url)
        assert [len(times) for times, _ in streams] == outputs
        assert [usage["prompt_tokens"] for _, usage in streams] == [count_words(p) for p in prompts]
        assert live_shapes == expected_shapes
        assert elapsed >= sum(truth(s) for s in expected_shapes) / 1000
        assert after["vllm:num_preemptions_total"] == expected.preemptions
        assert after["vllm:generation_tokens_total"] == sum(outputs)
        assert (after["vllm:num_requests_running"], after["vllm:num_requests_waiting"],
                after["vllm:kv_cache_usage_perc"]) == (0, 0, 0.0)

    asyncio.run(asyncio.wait_for(scenario(), GUARD_S))
    if "--num-gpu-blocks-override" in flags:
        assert expected.preemptions > 0


def test_the_default_pacing_keeps_fake_engines_contract():
    """FixedPacing through the same app: every token, words as prompt tokens, a refused
    request never (its pacing refuses none), zero KV usage and preemptions in /metrics."""
    args = args_of("--max-num-seqs", "2")

    async def scenario() -> None:
        pacing = fake_engine.FixedPacing(0.001, 0.001, 2)
        async with served(fake_engine.build_app(args, pacing, set())) as url, \
                aiohttp.ClientSession() as session:
            response = await session.post(f"{url}/v1/completions",
                                          json={"prompt": "one two three", "max_tokens": 3})
            times, usage = await token_times(response)
            async with session.get(f"{url}/metrics") as metrics:
                text = await metrics.text()
        assert len(times) == 3 and usage == {"prompt_tokens": 3, "completion_tokens": 3,
                                             "total_tokens": 6}
        assert {"vllm:num_requests_running 0", "vllm:num_requests_waiting 0",
                "vllm:kv_cache_usage_perc 0.0", "vllm:num_preemptions_total 0",
                "vllm:generation_tokens_total 3"} <= set(text.splitlines())

    asyncio.run(asyncio.wait_for(scenario(), GUARD_S))


def test_a_request_the_simulated_engine_can_never_run_is_refused_with_400():
    args = args_of("--block-size", "4", "--num-gpu-blocks-override", "2")  # 8 tokens

    async def scenario() -> None:
        pacing = sim_pacing('{"predictor": "p", "gpu": "H200-141GB"}', args, lambda: False,
                            lambda *_: live_model)
        async with served(fake_engine.build_app(args, pacing, set())) as url, \
                aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/completions",
                                    json={"prompt": "a b c d e", "max_tokens": 4}) as response:
                assert response.status == 400
                assert "KV cache" in (await response.json())["error"]["message"]

    asyncio.run(asyncio.wait_for(scenario(), GUARD_S))
