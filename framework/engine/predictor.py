"""The predictor seam: a deployment's step time and memory, predicted before it is measured
(issue "Predicted, then measured").

A predictor answers for one `Deployment` (model, GPU type, parallel shape, KV and batch flags):
- `step_time(d)`: a `StepTime` (engine/step_time.py), the milliseconds of one engine step of a
  given `StepShape`; the simulated GPU engine (engine/step_sim.py) composes steps into TTFT,
  TPOT and throughput;
- `memory(d)`: one GPU's weights and KV cache (`MemoryEstimate`), for the search prior and the
  predicted-vs-measured columns.
Predictors live in `PREDICTORS` by name. Each entry is a factory that imports its module only
when called, and no module imports its optional dependency (an extra) before a method needs it:
importing this module costs nothing and works without any extra. A predictor whose extra is
missing says so in one line (`unavailable`, `off_reason`): the feature is then off, not broken.

To add one: a module in this room with a class that satisfies `Predictor` (its optional imports
inside methods), one line in `PREDICTORS`; tests/unit/engine/test_predictor.py runs its contract
suite over every entry.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from framework.base.errors import ConfigError
from framework.engine.feasibility import DEFAULT_GPU_MEMORY_UTILIZATION
from framework.engine.memory_model import BLOCK_SIZE
from framework.engine.memory_model import FALLBACK_MAX_MODEL_LEN
from framework.engine.memory_model import GPUS
from framework.engine.memory_model import batch_defaults
from framework.engine.memory_model import resolve_batch_limits
from framework.engine.model_info import read_model_info
from framework.engine.step_time import StepTime

# Our GPU types (memory_model.GPUS) -> AIConfigurator's system names (aiconfigurator_core/systems/
# <name>.yaml, with vLLM kernel tables under systems/data/<name>/*/vllm/: vLLM 0.24.0, a100_sxm
# 0.14.0, systems/query_versions.yaml). A100-40GB, A10G-24GB and L4-24GB have none: unsupported.
AIC_SYSTEMS: dict[str, str] = {
    "H100-80GB": "h100_sxm",
    "H200-141GB": "h200_sxm",
    "A100-80GB": "a100_sxm",
    "L40S-48GB": "l40s",
}


@dataclass(frozen=True)
class Deployment:
    """One vLLM deployment as a predictor sees it. `model`: a folder with the HF config.json;
    `gpu`: a key of memory_model.GPUS; the rest are vLLM's flags of the same names. None takes
    vLLM's default: block size 16 (memory_model.BLOCK_SIZE), the batch limits of
    memory_model.batch_defaults for the GPU."""

    model: Path
    gpu: str
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    enable_chunked_prefill: bool = True  # vLLM V1's default; the scheduler's (step_sim), not a step's
    max_model_len: int | None = None  # None: the model's max_position_embeddings (config.json)

    @property
    def kv_block_size(self) -> int:
        return self.block_size or BLOCK_SIZE

    def batch_limits(self) -> tuple[int, int]:
        """(max-num-batched-tokens, max-num-seqs) as vLLM resolves them for this deployment
        (memory_model.resolve_batch_limits: the GPU's defaults where unset, the tokens raised
        to max-model-len without chunked prefill)."""
        if self.max_num_batched_tokens is not None and self.max_num_seqs is not None:
            return self.max_num_batched_tokens, self.max_num_seqs
        if self.gpu not in GPUS:
            raise ValueError(f"unknown GPU type {self.gpu!r}: give max_num_batched_tokens and "
                             "max_num_seqs, or one of " + ", ".join(GPUS))
        return resolve_batch_limits(batch_defaults(GPUS[self.gpu]), self.max_num_batched_tokens,
                                    self.max_num_seqs, self.model_max_len(),
                                    self.enable_chunked_prefill)

    def model_max_len(self) -> int:
        """max_model_len, else the model's max_position_embeddings (vLLM's default), else
        FALLBACK_MAX_MODEL_LEN when config.json names none or cannot be read."""
        if self.max_model_len is not None:
            return self.max_model_len
        return _declared_max_len(self.model) or FALLBACK_MAX_MODEL_LEN


@functools.lru_cache(maxsize=64)
def _declared_max_len(model: Path) -> int | None:
    """config.json's max_position_embeddings (None: none, or no readable config.json), read
    once per model folder: a prior predicts hundreds of deployments of one model."""
    try:
        declared = read_model_info(model).max_position_embeddings
    except ConfigError:
        return None
    return int(declared) if declared else None


@dataclass(frozen=True)
class MemoryEstimate:
    """One GPU's memory as predicted, on the worker that binds (the last pipeline stage).
    weights_gib: its share of the weights; kv_gib: what is left for the KV cache, i.e.
    total x gpu_memory_utilization - weights - activations - other overheads (negative when
    nothing is left: the deployment would not start); kv_blocks: KV blocks of block_size
    tokens in kv_gib (0 when kv_gib <= 0); source: which predictor and model said so."""

    weights_gib: float
    kv_gib: float
    kv_blocks: int
    source: str


class Predictor(Protocol):
    """A performance model of vLLM deployments. `unavailable()` is checked first, then
    `supports(d)`; `step_time` and `memory` may raise ValueError for a deployment that
    `supports` refuses. Every reason is one line, fit for `validate`'s output."""

    name: str

    def unavailable(self) -> str | None:
        """Why this predictor cannot run in this installation (its extra missing), else None."""
        ...

    def supports(self, d: Deployment) -> str | None:
        """Why it cannot predict `d` (GPU type without tables, model it cannot read, a TP the
        model cannot shard), else None. Includes `unavailable()`'s reason. Never raises."""
        ...

    def step_time(self, d: Deployment) -> StepTime:
        """Milliseconds per step for `d`: > 0 and finite for a non-empty StepShape, 0 for an
        empty one; non-decreasing in decode_seqs and in decode_context over a coarse grid
        (x4 steps). Measured kernel tables are not monotone at fine grain: AIConfigurator's
        dip by up to ~10% from one batch size to the next (e.g. 192 -> 193 sequences, a GEMM
        tile boundary)."""
        ...

    def memory(self, d: Deployment) -> MemoryEstimate | None:
        """One GPU's memory for `d`, or None where this predictor has no memory model for it."""
        ...


def _lazy(module: str, attr: str) -> Callable[[], Predictor]:
    """A factory that imports `framework.engine.<module>` when first called, not before."""

    def make() -> Predictor:
        factory: Callable[[], Predictor] = getattr(
            importlib.import_module(f"framework.engine.{module}"), attr)
        return factory()

    return make


PREDICTORS: dict[str, Callable[[], Predictor]] = {
    "aiconfigurator": _lazy("predict_aiconfigurator", "AIConfiguratorPredictor"),
}


def predictor(name: str) -> Predictor:
    """The predictor registered as `name`; ValueError naming the known ones otherwise."""
    if name not in PREDICTORS:
        raise ValueError(f"unknown predictor {name!r}: known predictors are "
                         + ", ".join(sorted(PREDICTORS)))
    return PREDICTORS[name]()


def off_reason(name: str) -> str | None:
    """Why predictor `name` is off in this installation (one line), None when it can run;
    ValueError for an unknown name (a typo is an error, not an off switch)."""
    return predictor(name).unavailable()


def aic_system(gpu: str) -> str | None:
    """AIConfigurator's system name for our GPU type `gpu`, None where it has no vLLM tables."""
    return AIC_SYSTEMS.get(gpu)
