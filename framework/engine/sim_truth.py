"""The simulated GPU's "truth" (pure): a performance model's step time, wrong by a smooth,
seeded, per-configuration amount, and noisy from run to run, so that a predictor can be judged
against a truth that is not itself.

Size of the error, from published comparisons of AIConfigurator with vLLM: ~45% TTFT MAPE on
4 x A100 (github.com/ai-dynamo/aiconfigurator issues 95 and 1205); mixed prefill+decode steps
over-estimated 1.5-3x on H200 with decode-only steps accurate (issue 1150). So the truth has
separate factors for prefill-dominated and decode-dominated work; `error_size` ~0.3-0.45
reproduces the published magnitudes. The field is per configuration, not per step shape: within
one deployment the model's shape dependence is kept, except through the prefill/decode blend.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

from framework.engine.step_sim import Limits
from framework.engine.step_time import StepShape
from framework.engine.step_time import StepTime

# A configuration's numeric features: (flag, value when absent, transform to a unit-ish span).
# log2 spans: TP 1-8 (3), PP 1-4 (2), max-num-seqs 8-1024 (7), max-num-batched-tokens 512-16384
# (5); chunked prefill and a non-"auto" kv-cache-dtype are 0/1. Absent flags take vLLM 0.32's
# defaults on an H100/H200 (tensor/pipeline 1, 1024 seqs, 8192 tokens, chunked on, auto).
_SPANS = {"tensor-parallel-size": 3.0, "pipeline-parallel-size": 2.0, "max-num-seqs": 7.0,
          "max-num-batched-tokens": 5.0}
_DEFAULTS: dict[str, object] = {"tensor-parallel-size": 1, "pipeline-parallel-size": 1,
                                "max-num-seqs": 1024, "max-num-batched-tokens": 8192,
                                "enable-chunked-prefill": True, "kv-cache-dtype": "auto"}
FOURIER_FEATURES = 16
LENGTHSCALE = 1.0  # in feature units: the field turns over about once across a flag's range

# The configurations the error's size is normalised over (2 x 2 x 4 x 3 x 2 x 4 = 384).
TYPICAL: tuple[dict[str, object], ...] = tuple(
    {"tensor-parallel-size": tp, "pipeline-parallel-size": pp, "max-num-seqs": seqs,
     "max-num-batched-tokens": tokens, "enable-chunked-prefill": chunked, "kv-cache-dtype": kv}
    for tp, pp, seqs, tokens, chunked, kv in itertools.product(
        (1, 2, 4, 8), (1, 2), (16, 64, 256, 1024), (2048, 8192, 16384), (True, False),
        ("auto", "fp8")))


def features(config: Mapping[str, object]) -> tuple[float, ...]:
    """log2(value) / span for the four sizes (_SPANS), then chunked prefill (1 = on) and
    kv-cache-dtype (0 = "auto", 1 = anything else). Absent keys take _DEFAULTS."""
    def get(key: str) -> object:
        value = config.get(key)
        return _DEFAULTS[key] if value is None else value
    sizes = tuple(math.log2(float(str(get(k)))) / span for k, span in _SPANS.items())
    chunked = 0.0 if str(get("enable-chunked-prefill")).lower() in ("false", "0") else 1.0
    quantized = 0.0 if get("kv-cache-dtype") == "auto" else 1.0
    return (*sizes, chunked, quantized)


@functools.lru_cache(maxsize=64)
def _fourier(seed: int, kind: str) -> tuple[tuple[tuple[float, ...], float], ...]:
    """K random Fourier features (w ~ N(0, 1/LENGTHSCALE^2) per feature, b ~ U(0, 2 pi)),
    seeded by (seed, kind) (random.Random of a str seed is the same in every process)."""
    rng = random.Random(f"sim_truth:{seed}:{kind}")
    n = len(features({}))
    return tuple((tuple(rng.gauss(0.0, 1.0 / LENGTHSCALE) for _ in range(n)),
                  rng.uniform(0.0, 2 * math.pi)) for _ in range(FOURIER_FEATURES))


def field(config: Mapping[str, object], seed: int, kind: str) -> float:
    """g(x) = sqrt(2 / K) sum_k cos(w_k . x + b_k): a smooth random function of the features,
    ~N(0, 1) over configurations (an RBF-kernel Gaussian process, approximately)."""
    x = features(config)
    return math.sqrt(2 / FOURIER_FEATURES) * sum(
        math.cos(sum(wi * xi for wi, xi in zip(w, x)) + b) for w, b in _fourier(seed, kind))


@functools.lru_cache(maxsize=256)
def _scale(error_size: float, seed: int, kind: str) -> float:
    """s such that mean over TYPICAL of |exp(s g) - 1| = error_size (bisection; monotone in s)."""
    values = [field(c, seed, kind) for c in TYPICAL]

    def mean_error(s: float) -> float:
        return sum(abs(math.exp(s * g) - 1) for g in values) / len(values)
    low, high = 0.0, 1.0
    while mean_error(high) < error_size:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if mean_error(mid) < error_size else (low, mid)
    return (low + high) / 2


def error_factor(config: Mapping[str, object], error_size: float, seed: int, kind: str) -> float:
    """exp(s x g(config)), s from _scale: mean |factor - 1| over TYPICAL = error_size.
    `kind` ("prefill", "decode") names an independent field. Deterministic."""
    if error_size < 0:
        raise ValueError(f"error_size must be >= 0, got {error_size}")
    if error_size == 0:
        return 1.0
    return math.exp(_scale(error_size, seed, kind) * field(config, seed, kind))


def truth_config(tensor_parallel: int, pipeline_parallel: int, limits: Limits,
                 kv_cache_dtype: str) -> dict[str, object]:
    """A deployment as the error field reads it (`features`): its flags by name, the batch
    limits and chunked prefill as its scheduler runs them."""
    return {"tensor-parallel-size": tensor_parallel, "pipeline-parallel-size": pipeline_parallel,
            "max-num-seqs": limits.max_num_seqs,
            "max-num-batched-tokens": limits.max_num_batched_tokens,
            "enable-chunked-prefill": limits.chunked_prefill, "kv-cache-dtype": kv_cache_dtype}


@dataclass(frozen=True)
class TruthStepTime:
    """model(step) x prefill_factor^w x decode_factor^(1 - w), w = the prefill part's share
    of the model's time, t_p / (t_p + t_d), t_p = model(prefill part alone), t_d = model(decode
    part alone): a prefill-only step takes the prefill factor, a decode-only one the decode
    factor, a mixed step a geometric blend."""

    model: StepTime
    prefill_factor: float
    decode_factor: float

    def __call__(self, step: StepShape) -> float:
        total = self.model(step)
        t_p = self.model(StepShape(step.prefill_tokens, step.prefill_context, 0, 0)) \
            if step.prefill_tokens else 0.0
        t_d = self.model(StepShape(0, 0, step.decode_seqs, step.decode_context)) \
            if step.decode_seqs else 0.0
        w = t_p / (t_p + t_d) if t_p + t_d > 0 else 0.0
        return total * self.prefill_factor ** w * self.decode_factor ** (1 - w)


def truth_step_time(model: StepTime, config: Mapping[str, object], error_size: float,
                    seed: int) -> TruthStepTime:
    """The simulated truth of `model` for one configuration (flag names as keys, e.g.
    "max-num-seqs"): its prefill and decode factors error_factor(config, error_size, seed, kind)."""
    return TruthStepTime(model, error_factor(config, error_size, seed, "prefill"),
                         error_factor(config, error_size, seed, "decode"))


# Run-to-run CV of a server's speed: an assumption. Repeated vLLM runs on one host vary by less
# than 0.7% at concurrency >= 8 (vllm-project/vllm issue 53436, without speculative decoding);
# different servers of one fleet (clocks, thermals, placement) vary more, so 2%.
RUN_CV = 0.02
# Step-to-step jitter within a run: an assumption (CUDA-graph steps repeat closely). It averages
# out over a run's thousands of steps (CV / sqrt(n)), so it shapes the ITL spread, not the mean.
STEP_CV = 0.01


def lognormal_factor(cv: float, rng: random.Random) -> float:
    """A lognormal draw of mean 1 and coefficient of variation `cv`:
    sigma^2 = ln(1 + cv^2), mu = -sigma^2 / 2."""
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log1p(cv * cv))
    return rng.lognormvariate(-sigma * sigma / 2, sigma)


@dataclass(frozen=True)
class NoisyStepTime:
    """step_time(step) x run_factor x a fresh lognormal_factor(step_cv) per step."""

    step_time: StepTime
    run_factor: float
    step_cv: float
    rng: random.Random

    def __call__(self, step: StepShape) -> float:
        return self.step_time(step) * self.run_factor * lognormal_factor(self.step_cv, self.rng)


def noisy(step_time: StepTime, cv: float = RUN_CV, rng: random.Random | None = None,
          step_cv: float = STEP_CV) -> NoisyStepTime:
    """One server run's step time: one lognormal factor for the run (mean 1, CV `cv`, default
    RUN_CV = 2%) and per-step jitter (CV `step_cv`, default STEP_CV = 1%), both drawn from
    `rng` (a fresh unseeded one if None)."""
    rng = rng if rng is not None else random.Random()
    return NoisyStepTime(step_time, lognormal_factor(cv, rng), step_cv, rng)
