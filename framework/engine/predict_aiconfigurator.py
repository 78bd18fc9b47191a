"""NVIDIA AIConfigurator as a predictor (engine/predictor.py): aiconfigurator-core 0.12, the
`predict` extra. Kernel timings measured offline per GPU and vLLM version (its
systems/data/<system>/*/vllm/ tables), summed op by op over the model's layers by a compiled
Rust engine. aiconfigurator_core is imported inside functions only: without the extra this
module imports, and `unavailable()` says predictions are off.

Step time (aiconfigurator_core/sdk/engine.py, EngineHandle; the composition is the Rust
Engine's, aic-core/rust/aiconfigurator-core/src/engine/runtime.rs in ai-dynamo/aiconfigurator).
A StepShape (P prefill tokens of prompts of mean length p; D decoding sequences with a mean of
c cached tokens) maps onto it as:
- decode only: `decode_step_latency(gen_tokens=D, isl=c, osl=1)`: the whole generation op list
  once, at KV length s = isl + osl // 2 + 1 = c + 1 (each new token attends to its c cached
  tokens and itself).
- with prefill: `mixed_step_breakdown(ctx_tokens=P, gen_tokens=D, isl=p, osl=o)` =
  (total, shared, context attention, decode attention), three passes: the non-attention ops
  (GEMMs, norms, all-reduces) over P + D tokens as one batch; the context attention of
  ceil(P / p) prompts of p tokens divided by ceil(p / P) (a chunk P < p is priced as the mean
  chunk of its prompt); the decode attention of D sequences at s = p + o // 2 + 1. With
  o = 2 (c - p) + 1 that is c + 1, the decoders' own length, so where c >= p one call is the
  step. Where c < p no o reaches it: the decode attention then comes from a second call,
  `mixed_step_breakdown(0, D, c, 1)[3]` (s = c + 1), replacing the first call's.
- pipeline parallel: the SDK's op lists count every layer plus PP - 1 P2P hops
  (sdk/models/llama.py), so the time is one batch through all stages; how stages overlap
  across batches is the scheduler's to model.
An engine is compiled once per process per (model, system, TP, PP, KV mode, block size):
~1 s the first time (the tables load), milliseconds after; a step then costs one or two
SDK calls of ~3-8 us (a KV length of 1 token hits a slow path of ~1 ms in the SDK).

Memory (sdk/memory.py): the native path of `estimate_kv_cache`, `KVCacheEstimator.from_request`
(BaseBackend._get_memory_usage: weights, activations at max-num-batched-tokens, runtime and
NCCL overheads), then vLLM's budget, `kv_cache_budget_bytes(of_free=False)`: total x
gpu_memory_utilization - non-KV (vLLM takes its fraction of total memory:
memory.py `_BACKEND_FRACTION_KIND`). Total is our GPUS figure, the driver's total that vLLM
multiplies (memory_model.py), not the system file's nominal 80 GiB. Blocks: KV tokens (the
model's `get_kvcache_max_tokens`, for one pipeline stage's layers) // block size, as
`estimate_num_gpu_blocks`. Not `estimate_kv_cache` itself: it raises where nothing is left for
KV; this reports kv_gib < 0.

The SDK's log records ("Loading low-fidelity fallback rows ...") and warnings go to this
module's logger at debug, never to the CLI's stdout or stderr.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from framework.base.errors import ConfigError
from framework.engine.memory_model import GIB
from framework.engine.memory_model import GPUS
from framework.engine.model_info import read_model_info
from framework.engine.predictor import AIC_SYSTEMS
from framework.engine.predictor import Deployment
from framework.engine.predictor import MemoryEstimate
from framework.engine.predictor import aic_system
from framework.engine.step_time import StepShape
from framework.engine.step_time import StepTime

OFF_REASON = ("the `predict` extra is not installed (pip install 'vllm-sweep[predict]'): "
              "predictions are off")
BACKEND = "vllm"
# The newest tables the SDK has for (system, vLLM): its `current` slot
# (aiconfigurator_core/systems/query_versions.yaml: 0.24.0; a100_sxm 0.14.0).
BACKEND_VERSION = "current"
# vLLM's --kv-cache-dtype -> the SDK's KVCacheQuantMode name (sdk/common.py: bfloat16, int8,
# fp8). `auto` leaves it to the SDK, which takes the checkpoint's dtype (sdk/models get_model).
# float16 has bfloat16's bytes and kernels' shape; vLLM's other modes have no tables.
KV_QUANT: dict[str, str | None] = {
    "auto": None, "bfloat16": "bfloat16", "float16": "bfloat16",
    "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
}

_log = logging.getLogger(__name__)


class _ToDebug(logging.Handler):
    """The SDK's log records, re-logged at debug on this module's logger."""

    def emit(self, record: logging.LogRecord) -> None:
        _log.debug("aiconfigurator: %s", record.getMessage())


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Runs SDK code with its logger routed to `_ToDebug` (for good: its later records too)
    and its warnings caught and logged at debug."""
    sdk_log = logging.getLogger("aiconfigurator_core")
    if not any(isinstance(h, _ToDebug) for h in sdk_log.handlers):
        sdk_log.addHandler(_ToDebug())
        sdk_log.propagate = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        _log.debug("aiconfigurator warning: %s", w.message)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"AIConfigurator cannot model it: {type(exc).__name__}: {text[0] if text else ''}"[:300]


@dataclass(frozen=True)
class _Key:
    """What an engine is compiled for."""

    model: str
    system: str
    tp: int
    pp: int
    kv_quant: str | None
    block_size: int | None


@dataclass(frozen=True)
class _Refused:
    reason: str


_HANDLES: dict[_Key, Any] = {}  # an EngineHandle, or _Refused: why it would not compile


def _handle(key: _Key) -> Any:
    """The compiled engine for `key` (once per process), or _Refused."""
    if key not in _HANDLES:
        try:
            with _quiet():
                from aiconfigurator_core.sdk import EngineHandle

                _HANDLES[key] = EngineHandle.compile(
                    key.model, key.system, BACKEND, backend_version=BACKEND_VERSION,
                    tp_size=key.tp, pp_size=key.pp, kvcache_quant_mode=key.kv_quant,
                    kv_block_size=key.block_size)
        except Exception as exc:  # noqa: BLE001 - the SDK fails in many types; kept as a reason
            _log.debug("aiconfigurator: compile %s failed", key, exc_info=True)
            _HANDLES[key] = _Refused(_one_line(exc))
    return _HANDLES[key]


def _key(d: Deployment) -> _Key:
    system = aic_system(d.gpu)
    assert system is not None and d.kv_cache_dtype in KV_QUANT  # supports() checked both
    return _Key(str(d.model.resolve()), system, d.tensor_parallel, d.pipeline_parallel,
                KV_QUANT[d.kv_cache_dtype], d.block_size)


def step_ms(handle: Any, step: StepShape) -> float:
    """One step's milliseconds on a compiled engine (the module docstring's mapping)."""
    if step.empty:
        return 0.0
    c = max(step.decode_context, 1)
    if step.prefill_tokens == 0:
        return float(handle.decode_step_latency(step.decode_seqs, c, 1))
    p = max(step.prefill_context or step.prefill_tokens, 1)
    osl = 2 * (c - p) + 1 if c >= p else 1
    _, shared, context_attention, decode_attention = handle.mixed_step_breakdown(
        step.prefill_tokens, step.decode_seqs, p, osl)
    if step.decode_seqs and c < p:
        decode_attention = handle.mixed_step_breakdown(0, step.decode_seqs, c, 1)[3]
    return float(shared + context_attention + decode_attention)


class AIConfiguratorPredictor:
    """The `aiconfigurator` entry of PREDICTORS."""

    name = "aiconfigurator"

    def unavailable(self) -> str | None:
        try:
            importlib.import_module("aiconfigurator_core")
        except ImportError:
            return OFF_REASON
        return None

    def supports(self, d: Deployment) -> str | None:
        off = self.unavailable()
        if off is not None:
            return off
        if aic_system(d.gpu) is None:
            return (f"AIConfigurator has no vLLM kernel tables for GPU type {d.gpu!r} "
                    f"(it predicts {', '.join(AIC_SYSTEMS)})")
        if d.kv_cache_dtype not in KV_QUANT:
            return (f"AIConfigurator has no KV mode for kv-cache-dtype {d.kv_cache_dtype!r} "
                    f"(it takes {', '.join(KV_QUANT)})")
        try:
            info = read_model_info(d.model)
        except ConfigError as exc:
            return str(exc)
        problem = info.tp_problem(d.tensor_parallel)
        if problem is None and not 1 <= d.pipeline_parallel <= info.num_layers:
            problem = (f"pipeline parallel size {d.pipeline_parallel} is not between 1 and the "
                       f"model's {info.num_layers} layers")
        if problem is not None:
            return problem
        handle = _handle(_key(d))
        return handle.reason if isinstance(handle, _Refused) else None

    def step_time(self, d: Deployment) -> StepTime:
        """ValueError where `supports(d)` refuses."""
        reason = self.supports(d)
        if reason is not None:
            raise ValueError(reason)
        handle = _handle(_key(d))

        def step_time(step: StepShape) -> float:
            return step_ms(handle, step)

        return step_time

    def memory(self, d: Deployment) -> MemoryEstimate | None:
        """None where `supports(d)` refuses or the SDK has no memory model for the model."""
        if self.supports(d) is not None:
            return None
        try:
            return _memory(d)
        except Exception:  # noqa: BLE001 - the SDK fails in many types; no estimate then
            _log.debug("aiconfigurator: memory of %s failed", d, exc_info=True)
            return None


_MEMORY: dict[Deployment, MemoryEstimate] = {}


def _memory(d: Deployment) -> MemoryEstimate:
    """The module docstring's memory estimate, once per process per deployment."""
    if d not in _MEMORY:
        key = _key(d)
        tokens, seqs = d.batch_limits()
        with _quiet():
            from aiconfigurator_core.sdk.memory import KVCacheEstimator
            from aiconfigurator_core.sdk.memory import kv_cache_budget_bytes

            parts = KVCacheEstimator.from_request(
                key.model, key.system, BACKEND, BACKEND_VERSION, max_num_tokens=tokens,
                max_batch_size=seqs, tp_size=key.tp, pp_size=key.pp,
                kvcache_quant_mode=key.kv_quant).breakdown
        kv_bytes = kv_cache_budget_bytes(capacity=float(GPUS[d.gpu].memory_bytes),
                                         non_kv=float(parts["non_kv_bytes"]),
                                         fraction=d.gpu_memory_utilization, of_free=False)
        # The SDK sizes a GPU's KV for all L layers at any PP (base_backend.py,
        # _get_memory_usage: "should not be divided by pp_size", TRT-LLM's view); a vLLM stage
        # caches its own ceil(L / PP) layers only, so its budget holds L / ceil(L / PP) times
        # the tokens: the SDK's curve read at that multiple of the budget.
        layers = read_model_info(d.model).num_layers
        stage_share = layers / math.ceil(layers / key.pp)
        kv_tokens = int(parts["tokens_from_kv_bytes"](kv_bytes * stage_share)) if kv_bytes > 0 else 0
        _MEMORY[d] = MemoryEstimate(weights_gib=float(parts["weights_bytes"]) / GIB,
                                    kv_gib=kv_bytes / GIB, kv_blocks=kv_tokens // d.kv_block_size,
                                    source="aiconfigurator")
    return _MEMORY[d]
