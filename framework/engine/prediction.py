"""A deployment's predicted metrics at a sweep's load: the predictor's step times
(engine/predictor.py) run through vLLM V1's scheduler in virtual time (engine/sim_run.py),
and measured with the load generator's own formulas (load/metrics.py), so that a predicted
`p99_ttft_ms` means exactly what a measured one does.

The load: `num_prompts` requests of `input_len` prompt and `output_len` output tokens, sent
at `request_rate` (evenly spaced: the mean of vllm bench serve's Poisson arrivals; inf: all at
once) with at most `max_concurrency` in flight. A deployment of `engines` identical engines
(data parallel, replicas) is predicted as one engine given 1/engines of the requests and of the
concurrency, its throughputs times `engines` (a router that spreads requests evenly).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from framework.base.vocabulary import DEFAULT_PERCENTILES
from framework.engine.predictor import Deployment
from framework.engine.predictor import MemoryEstimate
from framework.engine.predictor import Predictor
from framework.engine.sim_run import SimRequest
from framework.engine.sim_run import simulate
from framework.engine.step_sim import Limits

# The metrics a prediction gives each row beside the measured ones (`predicted_<metric>`).
PREDICTED_METRICS = ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
                     "output_throughput", "request_throughput")
PREDICTION_COLUMNS: list[tuple[str, str]] = [
    *((f"predicted_{m}", "float") for m in PREDICTED_METRICS),
    # its memory model beside ours (results/rows.py est_weights_gib_per_gpu, est_kv_budget_...)
    ("predicted_weights_gib_per_gpu", "float"), ("predicted_kv_gib_per_gpu", "float"),
    ("predicted_kv_blocks", "int"), ("predictor", "str"),
]
THROUGHPUTS = ("output_throughput", "request_throughput", "total_token_throughput")
MAX_PREDICTED_PROMPTS = 256  # a longer run of one fixed-length load predicts the same means


@dataclass(frozen=True)
class PredictedLoad:
    input_len: int
    output_len: int
    num_prompts: int
    max_concurrency: int | None
    request_rate: float = math.inf
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES


@dataclass(frozen=True)
class Prediction:
    """What `predictor` says of one deployment at one load: vllm bench serve's metric names
    (`metrics`), one GPU's memory (None: not predicted)."""

    predictor: str
    metrics: Mapping[str, float]
    memory: MemoryEstimate | None

    def columns(self) -> dict[str, object]:
        m = self.memory
        return {**{f"predicted_{k}": self.metrics.get(k) for k in PREDICTED_METRICS},
                "predicted_weights_gib_per_gpu": m.weights_gib if m else None,
                "predicted_kv_gib_per_gpu": m.kv_gib if m else None,
                "predicted_kv_blocks": m.kv_blocks if m else None, "predictor": self.predictor}


def requests_of(load: PredictedLoad, engines: int = 1) -> tuple[list[SimRequest], int | None]:
    """One engine's share of `load`: its requests (evenly spaced at rate / engines) and its
    concurrency cap (ceil(max_concurrency / engines))."""
    n = max(1, min(MAX_PREDICTED_PROMPTS, math.ceil(load.num_prompts / engines)))
    rate = load.request_rate / engines
    gap = 0.0 if math.isinf(rate) else 1.0 / rate
    cap = None if load.max_concurrency is None else max(1, math.ceil(load.max_concurrency / engines))
    return [SimRequest(i * gap, load.input_len, load.output_len) for i in range(n)], cap


def limits_of(d: Deployment, kv_blocks: int | None) -> Limits:
    """The scheduler's limits for `d`: its flags, vLLM's defaults where unset."""
    tokens, seqs = d.batch_limits()
    return Limits(max_num_seqs=seqs, max_num_batched_tokens=tokens,
                  chunked_prefill=d.enable_chunked_prefill, block_size=d.kv_block_size,
                  kv_blocks=kv_blocks)


def predict(predictor: Predictor, d: Deployment, load: PredictedLoad, engines: int = 1) -> Prediction:
    """The prediction of `d` (x `engines`) at `load` (see the module's docstring); no metrics
    when it would not serve the load: its KV cache cannot hold one request, or a prompt is
    over its token budget without chunked prefill (which vLLM refuses)."""
    memory = predictor.memory(d)
    kv_blocks = memory.kv_blocks if memory is not None and memory.kv_blocks > 0 else None
    limits = limits_of(d, kv_blocks)
    if (kv_blocks is not None and kv_blocks * d.kv_block_size < load.input_len + load.output_len) \
            or (not limits.chunked_prefill and limits.max_num_batched_tokens < load.input_len):
        return Prediction(predictor=predictor.name, metrics={}, memory=memory)  # never served
    requests, cap = requests_of(load, engines)
    result = simulate(requests, limits, predictor.step_time(d), cap)
    metrics = {k: float(v) for k, v in result.metrics(load.percentiles).items()}
    for key in THROUGHPUTS:
        if key in metrics:
            metrics[key] *= engines
    return Prediction(predictor=predictor.name, metrics=metrics, memory=memory)
