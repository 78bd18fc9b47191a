"""A deployment's predicted metrics (framework/engine/prediction.py), with a stand-in predictor
whose step time is a constant: every expected value follows by hand."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from framework.engine.prediction import PREDICTION_COLUMNS
from framework.engine.prediction import PredictedLoad
from framework.engine.prediction import predict
from framework.engine.prediction import requests_of
from framework.engine.predictor import Deployment
from framework.engine.predictor import MemoryEstimate
from framework.engine.step_time import StepTime


class Constant:
    """Every step takes 10 ms; `blocks` KV blocks per GPU (a stand-in, not a real model)."""

    name = "constant"

    def __init__(self, blocks: int = 10_000) -> None:
        self.blocks = blocks

    def unavailable(self) -> str | None:
        return None

    def supports(self, d: Deployment) -> str | None:
        return None

    def step_time(self, d: Deployment) -> StepTime:
        return lambda s: 0.0 if s.empty else 10.0

    def memory(self, d: Deployment) -> MemoryEstimate | None:
        return MemoryEstimate(weights_gib=1.0, kv_gib=1.0, kv_blocks=self.blocks, source=self.name)


D = Deployment(model=Path("."), gpu="H100-80GB", max_num_seqs=8, max_num_batched_tokens=4096)


def test_one_engine_at_its_load():
    # 8 requests of 100 + 5 tokens, all at once, 8 seats: one prefill step (10 ms) gives every
    # first token, four decode steps the rest: TTFT 10 ms, TPOT 10 ms, 40 tokens in 50 ms
    p = predict(Constant(), D, PredictedLoad(100, 5, 8, None))
    assert p.metrics["mean_ttft_ms"] == pytest.approx(10.0)
    assert p.metrics["p99_tpot_ms"] == pytest.approx(10.0)
    assert p.metrics["output_throughput"] == pytest.approx(40 / 0.050)
    columns = p.columns()
    assert set(columns) == {name for name, _ in PREDICTION_COLUMNS}
    assert columns["predicted_kv_blocks"] == 10_000 and columns["predictor"] == "constant"


def test_two_engines_each_take_half_and_the_throughputs_add_up():
    one = predict(Constant(), D, PredictedLoad(100, 5, 16, 16))
    two = predict(Constant(), D, PredictedLoad(100, 5, 16, 16), engines=2)
    # one engine: 16 in flight on 8 seats, two rounds; two engines: 8 each, one round
    assert two.metrics["mean_ttft_ms"] == pytest.approx(10.0)
    assert one.metrics["mean_ttft_ms"] > two.metrics["mean_ttft_ms"]
    assert two.metrics["output_throughput"] == pytest.approx(2 * 40 / 0.050)


@pytest.mark.parametrize("predictor, deployment", [
    (Constant(blocks=5), D),  # 5 blocks of 16 tokens cannot hold 105 tokens
    (Constant(), Deployment(model=Path("."), gpu="H100-80GB", max_num_batched_tokens=64,
                            enable_chunked_prefill=False)),  # a 100-token prompt over 64
])
def test_a_deployment_that_would_not_serve_the_load_has_no_metrics(predictor, deployment):
    p = predict(predictor, deployment, PredictedLoad(100, 5, 8, None))
    assert p.metrics == {} and p.columns()["predicted_output_throughput"] is None


def test_an_unchunked_deployment_serves_prompts_up_to_its_max_model_len_as_vllm_does():
    """vLLM raises the unset token budget to max-model-len without chunked prefill
    (memory_model.resolve_batch_limits): a 12,000-token prompt is over H100's 8,192 default but
    fits a 16,384-token model length; an explicit budget of 8,192 stays and refuses it."""
    unchunked = Deployment(model=Path("."), gpu="H100-80GB", max_num_seqs=8,
                           enable_chunked_prefill=False, max_model_len=16384)
    assert unchunked.batch_limits() == (16384, 8)
    served = predict(Constant(), unchunked, PredictedLoad(12_000, 5, 8, None))
    assert served.metrics["mean_ttft_ms"] > 0
    capped = predict(Constant(), replace(unchunked, max_num_batched_tokens=8192),
                     PredictedLoad(12_000, 5, 8, None))
    assert capped.metrics == {}


def test_a_finite_rate_spaces_the_requests_and_engines_share_it():
    requests, cap = requests_of(PredictedLoad(10, 2, 9, 5, request_rate=4.0), engines=2)
    assert [r.arrival_s for r in requests] == [0.0, 0.5, 1.0, 1.5, 2.0]  # ceil(9 / 2), 2 req/s
    assert cap == 3  # ceil(5 / 2)
    requests, cap = requests_of(PredictedLoad(10, 2, 4, None, request_rate=math.inf))
    assert {r.arrival_s for r in requests} == {0.0} and cap is None
