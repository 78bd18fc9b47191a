"""Will a vLLM configuration fit? Static rules and the memory model, checked before GPU time. Pure.

The memory model (one GPU as vLLM 0.32 accounts it: weights, sampler state, non-torch memory,
profile-run activations, CUDA graphs, KV blocks) is framework.engine.memory_model; this module fills
in vLLM's defaults for absent flags, applies the rules and grades how far a configuration is
from fitting. Absent flags take vLLM 0.32's defaults for `vllm serve`: TP = PP = 1,
gpu-memory-utilization 0.92, max-model-len = max_position_embeddings, chunked prefill on,
kv-cache-dtype auto, block size 16, -O2 (cudagraph_mode FULL_AND_PIECEWISE), and
max-num-batched-tokens / max-num-seqs from `batch_defaults`, doubled under
--performance-mode throughput (vllm/engine/arg_utils.py,
EngineArgs._set_default_max_num_seqs_and_batched_tokens_args).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from framework.engine.memory_model import BLOCK_SIZE
from framework.engine.memory_model import CUDA_CONTEXT_BYTES
from framework.engine.memory_model import DTYPE_BYTES
from framework.engine.memory_model import FALLBACK_MAX_MODEL_LEN
from framework.engine.memory_model import GIB
from framework.engine.memory_model import GPUS
from framework.engine.memory_model import KV_BYTES
from framework.engine.memory_model import QUANT_BYTES
from framework.engine.memory_model import GpuBudget
from framework.engine.memory_model import GpuSpec
from framework.engine.memory_model import ModelFacts
from framework.engine.memory_model import batch_defaults
from framework.engine.memory_model import blocks_for
from framework.engine.memory_model import comm_init_bytes
from framework.engine.memory_model import cudagraph_capture_sizes
from framework.engine.memory_model import cudagraph_counts
from framework.engine.memory_model import gpu_budget
from framework.engine.memory_model import kv_budget_bytes
from framework.engine.memory_model import kv_bytes_per_token
from framework.engine.memory_model import kv_capacity_tokens
from framework.engine.memory_model import param_count
from framework.engine.memory_model import read_model_facts
from framework.engine.memory_model import requested_bytes
from framework.engine.memory_model import resolve_batch_limits
from framework.engine.memory_model import value_dtype
from framework.engine.memory_model import weight_bytes_per_gpu

__all__ = ["DEFAULT_GPU_MEMORY_UTILIZATION", "GIB", "GPUS", "Feasibility", "GpuSpec",
           "ModelFacts", "batch_defaults", "check", "check_cpu", "kv_budget_bytes",
           "kv_bytes_per_token", "param_count", "read_model_facts", "weight_bytes_per_gpu"]

DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
MAX_SHORTFALL = 10.0

FlagValue = bool | int | float | str | None


@dataclass(frozen=True)
class Feasibility:
    """`violation` (0 when ok): 1 per broken static rule plus, for memory, the relative
    shortfall (needed / available - 1, at most MAX_SHORTFALL): how far outside the feasible
    region the configuration is, told to Optuna as a constraint value."""

    ok: bool
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    numbers: dict[str, float] = field(default_factory=dict)
    violation: float = 0.0


def _shortfall(needed: float, available: float) -> float:
    return MAX_SHORTFALL if available <= 0 else min(MAX_SHORTFALL, needed / available - 1.0)


@dataclass(frozen=True)
class _Settings:
    tp: int
    pp: int
    utilization: float
    max_model_len: int | None  # None: -1/auto, vLLM fits it to memory
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    dtype: str
    kv_cache_dtype: str
    quantization: str | None
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    capture_sizes: tuple[int, ...] = ()
    block_size: int = BLOCK_SIZE
    dp: int = 1  # data-parallel engines, each with TP x PP workers of its own memory


def _normalized(flags: Mapping[str, FlagValue]) -> dict[str, bool | int | float | str]:
    return {k.replace("_", "-"): v for k, v in flags.items() if v is not None}


def parse_len(value: FlagValue) -> int | None:
    """A --max-model-len value as vLLM reads it: "8192", "8k" (x 1000), "8K" (x 1024), "1m",
    "1M"; None for "auto" or -1 (the model's own)."""
    text = str(value).strip()
    if text in ("-1", "auto"):
        return None
    scale = {"k": 1000, "m": 10**6, "K": 1024, "M": 2**20}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _as_bool(value: FlagValue) -> bool:
    return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")


def _ints(value: object) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(value)))


def _compilation_config(f: Mapping[str, FlagValue]) -> dict[str, Any]:
    """--compilation-config as JSON (other forms are left to vLLM: {})."""
    try:
        found = json.loads(str(f.get("compilation-config", "{}")))
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _graph_settings(f: Mapping[str, FlagValue], seqs: int,
                    tokens: int) -> tuple[str, tuple[int, ...]]:
    """(cudagraph_mode, capture sizes): enforce-eager and -O0 capture none, -O1 PIECEWISE,
    else --compilation-config's cudagraph_mode or FULL_AND_PIECEWISE (vllm/config/vllm.py,
    OPTIMIZATION_LEVEL_00..03 and VllmConfig.__post_init__); sizes from
    --cudagraph-capture-sizes / --max-cudagraph-capture-size (or the compilation config's
    keys) and --performance-mode."""
    cc = _compilation_config(f)
    level = _ints(f.get("optimization-level", f.get("O", 2))) or (2,)
    mode = str(cc.get("cudagraph_mode") or {0: "NONE", 1: "PIECEWISE"}.get(level[0],
                                                                         "FULL_AND_PIECEWISE"))
    if _as_bool(f.get("enforce-eager", False)) and not _as_bool(f.get("no-enforce-eager", False)):
        mode = "NONE"
    explicit = f.get("cudagraph-capture-sizes", cc.get("cudagraph_capture_sizes"))
    cap = f.get("max-cudagraph-capture-size", cc.get("max_cudagraph_capture_size"))
    sizes = cudagraph_capture_sizes(
        seqs, tokens, max_capture_size=int(cap) if cap is not None else None,
        sizes=_ints(explicit) if explicit is not None else None,
        interactivity=str(f.get("performance-mode", "")) == "interactivity")
    return mode.upper(), (sizes if mode.upper() != "NONE" else ())


def _settings(m: ModelFacts, flags: Mapping[str, FlagValue],
              defaults: tuple[int, int]) -> _Settings:
    """The flags with vLLM's defaults filled in; `defaults` = (max-num-batched-tokens,
    max-num-seqs) before vLLM adjusts them to max-model-len and to each other."""
    f = _normalized(flags)
    model_max = m.info.max_position_embeddings or FALLBACK_MAX_MODEL_LEN
    max_len = parse_len(f["max-model-len"]) if "max-model-len" in f else model_max
    chunked = (_as_bool(f.get("enable-chunked-prefill", True))
               and not _as_bool(f.get("no-enable-chunked-prefill", False)))
    tokens, seqs = resolve_batch_limits(
        defaults, int(f["max-num-batched-tokens"]) if "max-num-batched-tokens" in f else None,
        int(f["max-num-seqs"]) if "max-num-seqs" in f else None, max_len or model_max, chunked,
        throughput=str(f.get("performance-mode", "")) == "throughput")
    quant = f.get("quantization")
    mode, sizes = _graph_settings(f, seqs, tokens)
    return _Settings(
        tp=int(f.get("tensor-parallel-size", 1)), pp=int(f.get("pipeline-parallel-size", 1)),
        utilization=float(f.get("gpu-memory-utilization", DEFAULT_GPU_MEMORY_UTILIZATION)),
        max_model_len=max_len, max_num_seqs=seqs, max_num_batched_tokens=tokens,
        chunked_prefill=chunked, dtype=str(f.get("dtype", "auto")),
        kv_cache_dtype=str(f.get("kv-cache-dtype", "auto")),
        quantization=str(quant) if quant is not None else None, cudagraph_mode=mode,
        capture_sizes=sizes, block_size=int(f.get("block-size", BLOCK_SIZE)),
        dp=int(f.get("data-parallel-size", 1)))


def _gib(x: float) -> str:
    return f"{x / GIB:.2f} GiB"


def _static_rules(m: ModelFacts, s: _Settings, num_devices: int | None) -> list[str]:
    info, tp, pp = m.info, max(1, s.tp), max(1, s.pp)
    reasons: list[str] = []
    if problem := info.tp_problem(s.tp):
        reasons.append(problem)
    if not 1 <= s.pp <= info.num_layers:
        reasons.append(f"pipeline parallel size {s.pp} is outside 1..{info.num_layers} "
                       "(the model's layers)")
    dp = max(1, s.dp)
    if num_devices is not None and tp * pp * dp > num_devices:
        shape = f"TP {tp} x PP {pp}" + (f" x DP {dp}" if dp > 1 else "")
        reasons.append(f"{shape} = {tp * pp * dp} workers, but only {num_devices} "
                       "devices are available")
    model_max = info.max_position_embeddings
    if s.max_model_len is not None and model_max and s.max_model_len > model_max:
        reasons.append(f"max-model-len {s.max_model_len} exceeds the model's "
                       f"max_position_embeddings {model_max}")
    if not s.chunked_prefill and s.max_model_len and s.max_num_batched_tokens < s.max_model_len:
        reasons.append(f"with chunked prefill off, max-num-batched-tokens "
                       f"{s.max_num_batched_tokens} must be >= max-model-len {s.max_model_len}")
    if s.max_num_batched_tokens < s.max_num_seqs:
        reasons.append(f"max-num-batched-tokens {s.max_num_batched_tokens} must be >= "
                       f"max-num-seqs {s.max_num_seqs}")
    return reasons


def _startup_headroom(memory: float, utilization: float, tp: int, pp: int) -> str | None:
    """vLLM refuses to start unless the free memory at its start-up snapshot, total less the
    CUDA context and (TP x PP > 1) the communication buffers, covers ceil(total x
    utilization) (vllm/v1/worker/utils.py, request_memory)."""
    left = memory - requested_bytes(memory, utilization)
    comm = comm_init_bytes(tp, pp)
    if left >= CUDA_CONTEXT_BYTES + comm:
        return None
    held = f"~{_gib(CUDA_CONTEXT_BYTES)} CUDA context"
    if comm:
        held += (f" and ~{_gib(comm)} of NCCL and all-reduce buffers at TP {tp} x PP {pp} "
                 f"(~{_gib(CUDA_CONTEXT_BYTES + comm)})")
    return (f"gpu-memory-utilization {utilization:g} leaves {_gib(max(left, 0))} of the "
            f"{_gib(memory)} outside vLLM's share, less than the {held}: vLLM's start-up "
            "check fails (free memory less than desired GPU memory utilization)")


def _check(m: ModelFacts, s: _Settings, memory: tuple[float, float] | None, kv_space: float,
           where: str, num_devices: int | None) -> Feasibility:
    """memory = (device bytes, utilization) for a GPU, None for the CPU engine, whose KV
    cache gets exactly `kv_space` bytes per worker."""
    reasons = _static_rules(m, s, num_devices)
    warnings: list[str] = []
    info, tp, pp = m.info, max(1, s.tp), max(1, s.pp)
    for name, known in ((value_dtype(m, s.dtype), DTYPE_BYTES), (s.quantization, QUANT_BYTES),
                        (s.kv_cache_dtype, {"auto": 0.0, **KV_BYTES})):
        if name is not None and name not in known:
            warnings.append(f"{name!r} is unknown to the memory model: counted at the model "
                            "dtype's size")
    if memory and (problem := _startup_headroom(memory[0], memory[1], tp, pp)):
        reasons.append(problem)
    graphs = cudagraph_counts(s.capture_sizes, s.max_num_seqs, s.cudagraph_mode)
    if memory:
        use = gpu_budget(m, memory[0], memory[1], tp, pp, s.max_num_batched_tokens,
                         s.max_num_seqs, graphs, s.dtype, s.quantization)
    else:
        use = GpuBudget(requested=kv_space, weights=weight_bytes_per_gpu(m, tp, pp,
                        s.quantization, s.dtype), sampler_state=0.0, non_torch=0.0,
                        activation=0.0, cudagraph=0.0)
    usable, budget = use.requested, (use.kv if memory else kv_space)
    per_token = kv_bytes_per_token(m, s.kv_cache_dtype, tp, pp, s.dtype)
    capacity = kv_capacity_tokens(budget, per_token, s.block_size)
    model_max = info.max_position_embeddings
    max_len = s.max_model_len or min(capacity, model_max or capacity) or model_max or 1
    resident = (capacity // s.block_size) // blocks_for(max_len, s.block_size)
    rules = len(reasons)
    shortfall = 0.0
    if memory and use.weights > usable:
        shortfall = _shortfall(use.weights, usable)
        reasons.append(f"weights need {_gib(use.weights)} per GPU ({param_count(m) / 1e9:.2f}B "
                       f"params over TP {tp} x PP {pp}), more than the {_gib(usable)} usable "
                       f"({where})")
    elif resident < 1:
        needed = (blocks_for(max_len, s.block_size) + 1) * s.block_size * per_token
        shortfall = _shortfall(needed, budget)
        left = (f"{_gib(max(budget, 0))} is left ({where} = {_gib(usable)}, less "
                f"{_gib(use.weights)} of weights and a {_gib(use.reserve)} reserve)") \
            if memory else f"{_gib(kv_space)} is set aside ({where})"
        reasons.append(f"one {max_len}-token sequence needs {_gib(per_token * max_len)} of KV "
                       f"cache per {'GPU' if memory else 'worker'}, but only {left}: the "
                       f"longest max-model-len that fits is {capacity}")
    elif resident < s.max_num_seqs:
        warnings.append(f"only {resident} sequences of max-model-len {max_len} fit in the KV "
                        f"cache at once ({capacity} tokens), fewer than max-num-seqs "
                        f"{s.max_num_seqs}: long requests will queue or be preempted")
    numbers = {
        "params": float(param_count(m)), "weights_gib_per_gpu": use.weights / GIB,
        "reserve_gib_per_gpu": use.reserve / GIB, "usable_gib_per_gpu": usable / GIB,
        "sampler_state_gib_per_gpu": use.sampler_state / GIB,
        "non_torch_gib_per_gpu": use.non_torch / GIB,
        "activation_gib_per_gpu": use.activation / GIB,
        "cudagraph_gib_per_gpu": use.cudagraph / GIB, "cudagraphs": float(sum(graphs)),
        "kv_bytes_per_token": kv_bytes_per_token(m, s.kv_cache_dtype, dtype=s.dtype),
        "kv_bytes_per_token_per_gpu": per_token, "kv_budget_gib_per_gpu": budget / GIB,
        "kv_tokens_capacity": float(capacity), "max_model_len": float(max_len),
        "max_num_seqs": float(s.max_num_seqs),
        "max_num_batched_tokens": float(s.max_num_batched_tokens),
        "max_resident_seqs": float(resident),
    }
    return Feasibility(ok=not reasons, reasons=tuple(reasons), warnings=tuple(warnings),
                       numbers=numbers, violation=rules + shortfall if reasons else 0.0)


def check(model: ModelFacts, gpu: GpuSpec, flags: Mapping[str, FlagValue],
          num_gpus: int | None = None) -> Feasibility:
    """Static rules and the memory model for `vllm serve` with `flags` (vLLM flag names, absent
    = vLLM's default) on GPUs of type `gpu`; `num_gpus`, if given, bounds TP x PP."""
    s = _settings(model, flags, batch_defaults(gpu))
    where = f"{s.utilization:g} x {gpu.name}'s {_gib(gpu.memory_bytes)}"
    return _check(model, s, (gpu.memory_bytes, s.utilization), 0.0, where, num_gpus)


def check_cpu(model: ModelFacts, kv_space_gib: float, flags: Mapping[str, FlagValue],
              num_workers: int | None = None) -> Feasibility:
    """The same rules for vLLM's CPU engine: its KV cache is VLLM_CPU_KVCACHE_SPACE GiB per
    worker (weights and activations live outside it, in RAM, and are not checked); batch
    defaults 2048 x and 128 x the world size."""
    f = _normalized(flags)
    world = int(f.get("tensor-parallel-size", 1)) * int(f.get("pipeline-parallel-size", 1))
    s = _settings(model, {**flags, "enforce-eager": True}, (2048 * world, 128 * world))
    return _check(model, s, None, kv_space_gib * GIB,
                  f"VLLM_CPU_KVCACHE_SPACE={kv_space_gib:g} GiB", num_workers)
