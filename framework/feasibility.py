"""Will a vLLM configuration fit? Static rules and a memory model, checked before GPU time. Pure.

Memory model of a Llama-style decoder (bytes; GiB = 2**30; V vocab, H hidden, L layers,
nh / kv attention / KV heads, d head dim, I intermediate size):
- params = V*H (embeddings) + L * (H*nh*d + 2*H*kv*d + nh*d*H  (q, k, v, o)
  + 3*H*I  (gate, up, down) + 2*H  (norms)) + H (final norm) + V*H (lm_head, unless tied).
  No biases are counted (Llama has none).
- weights per GPU = (linear params x weight bytes + other params x dtype bytes) / (TP x PP).
  Weight bytes: bf16/fp16 2, fp32 4, fp8/int8 1, 4-bit (awq, gptq, mxfp4, ...) 0.5, from the
  `quantization` flag, else the config's quantization_config, else the dtype. Embeddings,
  lm_head and norms stay in the dtype. Approximation: they are split as if uniform over all
  TP x PP ranks (vLLM puts them on the first/last pipeline stage, which hold a little more).
- KV bytes per token = 2 (K, V) x L x kv x d x KV bytes (kv-cache-dtype auto = the dtype,
  fp8* = 1); per GPU: ceil(L / PP) layers (vLLM allows uneven stages; the largest one binds)
  and max(1, kv / TP) heads (KV heads are replicated when TP > kv).
- reserve per GPU = 1.5 GiB (CUDA context, NCCL buffers, CUDA graphs)
  + B x (4H + 3I / TP) x dtype bytes (activations of vLLM's profile run, B =
  max-num-batched-tokens) + S x V x 4 (fp32 logits, S = max-num-seqs). vLLM measures this
  for real; the estimate is meant to be within a GiB or two.
- KV budget per GPU = GPU memory x gpu-memory-utilization - weights per GPU - reserve.
- KV capacity (tokens) = KV budget / KV bytes per token per GPU (block rounding ignored);
  resident sequences = capacity // max-model-len.

GPU memory is the total the CUDA driver reports (torch's total_memory, which vLLM multiplies
by gpu-memory-utilization), not the marketed size: an A100-80GB reports 79.15 GiB, not 80 GB.
The table's figures are those printed by torch OOM messages and vLLM logs, rounded to 0.01 GiB;
H200 is estimated from nvidia-smi's 143771 MiB less the ~0.55 GiB an H100 loses the same way.

Absent flags take vLLM 0.32's defaults for `vllm serve`: TP = PP = 1, gpu-memory-utilization
0.92, max-model-len = max_position_embeddings, chunked prefill on (V1), kv-cache-dtype auto,
and max-num-batched-tokens / max-num-seqs from `batch_defaults` (EngineArgs.get_batch_defaults).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from framework.errors import ConfigError
from framework.model_info import ModelInfo, read_model_info

GIB = 2**30
RESERVE_FIXED_BYTES = 1.5 * GIB
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92

FlagValue = bool | int | float | str | None


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int


def _gpu(name: str, gib: float) -> GpuSpec:
    return GpuSpec(name=name, memory_bytes=round(gib * GIB))


GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    _gpu("A100-80GB", 79.15), _gpu("A100-40GB", 39.39), _gpu("H100-80GB", 79.11),
    _gpu("H200-141GB", 139.81), _gpu("L40S-48GB", 44.53), _gpu("A10G-24GB", 21.99),
    _gpu("L4-24GB", 22.03),
)}

_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "half": 2.0, "float32": 4.0, "float": 4.0}
_KV_BYTES = {"float16": 2.0, "bfloat16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0,
             "fp8_inc": 1.0, "fp8_per_token_head": 1.0, "int8_per_token_head": 1.0,
             "int4_per_token_head": 0.5, "nvfp4": 0.5, "nvfp4_4over6": 0.5}
_QUANT_BYTES = {
    **dict.fromkeys(("fp8", "fbgemm_fp8", "modelopt", "modelopt_mxfp8", "fp8_per_tensor",
                     "fp8_per_block", "fp8_per_channel", "mxfp8", "int8",
                     "int8_per_channel_weight_only", "experts_int8"), 1.0),
    **dict.fromkeys(("int4", "awq", "auto_awq", "awq_marlin", "gptq", "auto_gptq",
                     "gptq_marlin", "modelopt_fp4", "mxfp4", "gpt_oss_mxfp4",
                     "nvfp4_per_token", "moe_wna16", "bitsandbytes"), 0.5),
}


@dataclass(frozen=True)
class ModelFacts:
    """ModelInfo plus what the memory model needs from config.json."""

    info: ModelInfo
    intermediate_size: int
    vocab_size: int
    dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    head_dim: int = 0  # 0 = hidden_size / num_heads
    quantization: str | None = None  # quantization_config.quant_method
    quant_bits: int | None = None

    @property
    def dim(self) -> int:
        return self.head_dim or self.info.head_dim


def read_model_facts(model_dir: Path, source: str = "") -> ModelFacts:
    """ModelInfo and the extra fields of `model_dir/config.json`; problems are ConfigErrors."""
    info = read_model_info(model_dir, source)
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text())
    cfg = cfg.get("text_config", cfg)
    quant = cfg.get("quantization_config") or {}
    try:
        return ModelFacts(
            info=info, intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            head_dim=int(cfg.get("head_dim") or 0),
            quantization=quant.get("quant_method"),
            quant_bits=int(quant["bits"]) if quant.get("bits") else None)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(source or str(path), "model", str(model_dir),
                          f"config.json lacks {exc}") from None


def _linear_params(m: ModelFacts) -> int:
    i, h, d = m.info, m.info.hidden_size, m.dim
    attention = 2 * h * i.num_heads * d + 2 * h * i.num_kv_heads * d
    return i.num_layers * (attention + 3 * h * m.intermediate_size)


def param_count(m: ModelFacts) -> int:
    """All parameters: linear layers, embeddings, norms and (unless tied) lm_head."""
    h, v = m.info.hidden_size, m.vocab_size
    lm_head = 0 if m.tie_word_embeddings else v * h
    return v * h + _linear_params(m) + m.info.num_layers * 2 * h + h + lm_head


def value_dtype(m: ModelFacts, dtype: str = "auto") -> str:
    """The dtype vLLM runs in: the `dtype` flag, else the config's (float32 checkpoints are
    downcast to bfloat16 under `auto`)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if m.dtype in ("float32", "float") else m.dtype


def dtype_bytes(dtype: str) -> float:
    """Bytes per value of a torch dtype name (unknown names: 2)."""
    return _DTYPE_BYTES.get(dtype, 2.0)


def weight_bytes_per_gpu(m: ModelFacts, tp: int, pp: int, quantization: str | None = None,
                         dtype: str = "auto") -> float:
    """(linear params x weight bytes + other params x dtype bytes) / (TP x PP)."""
    value_bytes = dtype_bytes(value_dtype(m, dtype))
    method = quantization or m.quantization
    linear_bytes = _QUANT_BYTES.get(method or "", value_bytes)
    if method is not None and method == m.quantization and m.quant_bits:
        linear_bytes = m.quant_bits / 8
    linear = _linear_params(m)
    total = linear * linear_bytes + (param_count(m) - linear) * value_bytes
    return total / (tp * pp)


def kv_dtype_bytes(m: ModelFacts, kv_cache_dtype: str = "auto", dtype: str = "auto") -> float:
    """Bytes per KV value: `auto` = the model's running dtype, fp8* = 1 (unknown: the dtype)."""
    value_bytes = dtype_bytes(value_dtype(m, dtype))
    return value_bytes if kv_cache_dtype == "auto" else _KV_BYTES.get(kv_cache_dtype, value_bytes)


def kv_bytes_per_token(m: ModelFacts, kv_cache_dtype: str = "auto", tp: int = 1, pp: int = 1,
                       dtype: str = "auto") -> float:
    """2 x layers x KV heads x head dim x KV bytes, for one GPU's share: ceil(L / PP) layers,
    max(1, kv / TP) heads (TP = PP = 1: the whole model)."""
    layers = math.ceil(m.info.num_layers / pp)
    heads = max(1, m.info.num_kv_heads // tp)
    return 2 * layers * heads * m.dim * kv_dtype_bytes(m, kv_cache_dtype, dtype)


def activation_reserve_bytes(m: ModelFacts, tp: int, max_num_batched_tokens: int,
                             max_num_seqs: int, value_bytes: float) -> float:
    """1.5 GiB + B x (4H + 3I/TP) x value bytes + S x V x 4 (see the module docstring)."""
    per_token = 4 * m.info.hidden_size + 3 * m.intermediate_size / tp
    return (RESERVE_FIXED_BYTES + max_num_batched_tokens * per_token * value_bytes
            + max_num_seqs * m.vocab_size * 4)


def kv_budget_bytes(memory_bytes: float, utilization: float, weight_bytes: float,
                    reserve_bytes: float) -> float:
    """memory x utilization - weights - reserve (negative when nothing is left)."""
    return memory_bytes * utilization - weight_bytes - reserve_bytes


def batch_defaults(gpu: GpuSpec) -> tuple[int, int]:
    """vLLM 0.32's `vllm serve` defaults (max-num-batched-tokens, max-num-seqs) for a GPU:
    >= 160 GiB: (16384, 1024); >= 70 GiB except A100: (8192, 1024); else (2048, 256)."""
    if gpu.memory_bytes >= 160 * GIB:
        return 16384, 1024
    if gpu.memory_bytes >= 70 * GIB and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256


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


MAX_SHORTFALL = 10.0


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


def _normalized(flags: Mapping[str, FlagValue]) -> dict[str, FlagValue]:
    return {k.replace("_", "-"): v for k, v in flags.items() if v is not None}


def _parse_len(value: FlagValue) -> int | None:
    text = str(value).strip()
    if text in ("-1", "auto"):
        return None
    scale = {"k": 1000, "m": 10**6, "K": 1024, "M": 2**20}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _as_bool(value: FlagValue) -> bool:
    return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")


def _settings(m: ModelFacts, flags: Mapping[str, FlagValue],
              defaults: tuple[int, int]) -> _Settings:
    """The flags with vLLM's defaults filled in; `defaults` = (max-num-batched-tokens,
    max-num-seqs) before vLLM adjusts them to max-model-len and to each other."""
    f = _normalized(flags)
    model_max = m.info.max_position_embeddings or 2048
    max_len = _parse_len(f["max-model-len"]) if "max-model-len" in f else model_max
    chunked = (_as_bool(f.get("enable-chunked-prefill", True))
               and not _as_bool(f.get("no-enable-chunked-prefill", False)))
    seqs = int(f.get("max-num-seqs", defaults[1]))
    if "max-num-batched-tokens" in f:
        tokens = int(f["max-num-batched-tokens"])
    else:  # EngineArgs._set_default_max_num_seqs_and_batched_tokens_args
        length = max_len or model_max
        tokens = defaults[0] if chunked else max(length, defaults[0])
        tokens = min(seqs * length, tokens)
    if "max-num-seqs" not in f:
        seqs = min(seqs, tokens)
    quant = f.get("quantization")
    return _Settings(
        tp=int(f.get("tensor-parallel-size", 1)), pp=int(f.get("pipeline-parallel-size", 1)),
        utilization=float(f.get("gpu-memory-utilization", DEFAULT_GPU_MEMORY_UTILIZATION)),
        max_model_len=max_len, max_num_seqs=seqs, max_num_batched_tokens=tokens,
        chunked_prefill=chunked, dtype=str(f.get("dtype", "auto")),
        kv_cache_dtype=str(f.get("kv-cache-dtype", "auto")),
        quantization=str(quant) if quant is not None else None)


def _gib(x: float) -> str:
    return f"{x / GIB:.2f} GiB"


def _check(m: ModelFacts, s: _Settings, memory: tuple[float, float] | None, kv_space: float,
           where: str, num_devices: int | None) -> Feasibility:
    """memory = (device bytes, utilization) for a GPU, None for the CPU engine, whose KV
    cache gets exactly `kv_space` bytes per worker."""
    reasons: list[str] = []
    warnings: list[str] = []
    info, tp, pp = m.info, max(1, s.tp), max(1, s.pp)
    if problem := info.tp_problem(s.tp):
        reasons.append(problem)
    if not 1 <= s.pp <= info.num_layers:
        reasons.append(f"pipeline parallel size {s.pp} is outside 1..{info.num_layers} "
                       "(the model's layers)")
    if num_devices is not None and tp * pp > num_devices:
        reasons.append(f"TP {tp} x PP {pp} = {tp * pp} workers, but only {num_devices} "
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
    for name, known in ((value_dtype(m, s.dtype), _DTYPE_BYTES), (s.quantization, _QUANT_BYTES),
                        (s.kv_cache_dtype, {"auto": 0.0, **_KV_BYTES})):
        if name is not None and name not in known:
            warnings.append(f"{name!r} is unknown to the memory model: counted at the model "
                            "dtype's size")

    weights = weight_bytes_per_gpu(m, tp, pp, s.quantization, s.dtype)
    reserve = activation_reserve_bytes(m, tp, s.max_num_batched_tokens, s.max_num_seqs,
                                       dtype_bytes(value_dtype(m, s.dtype)))
    usable = memory[0] * memory[1] if memory else kv_space
    budget = kv_budget_bytes(memory[0], memory[1], weights, reserve) if memory else kv_space
    per_token = kv_bytes_per_token(m, s.kv_cache_dtype, tp, pp, s.dtype)
    capacity = max(0, int(budget // per_token))
    max_len = s.max_model_len or min(capacity, model_max or capacity) or model_max or 1
    resident = capacity // max_len
    rules = len(reasons)
    shortfall = 0.0
    if memory and weights > usable:
        shortfall = _shortfall(weights, usable)
        reasons.append(f"weights need {_gib(weights)} per GPU ({param_count(m) / 1e9:.2f}B "
                       f"params over TP {tp} x PP {pp}), more than the {_gib(usable)} usable "
                       f"({where})")
    elif resident < 1:
        shortfall = _shortfall(per_token * max_len, budget)
        left = (f"{_gib(max(budget, 0))} is left ({where} = {_gib(usable)}, less {_gib(weights)} "
                f"of weights and a {_gib(reserve)} reserve)") if memory else \
            f"{_gib(kv_space)} is set aside ({where})"
        reasons.append(f"one {max_len}-token sequence needs {_gib(per_token * max_len)} of KV "
                       f"cache per {'GPU' if memory else 'worker'}, but only {left}: the "
                       f"longest max-model-len that fits is {capacity}")
    elif resident < s.max_num_seqs:
        warnings.append(f"only {resident} sequences of max-model-len {max_len} fit in the KV "
                        f"cache at once ({capacity} tokens), fewer than max-num-seqs "
                        f"{s.max_num_seqs}: long requests will queue or be preempted")
    numbers = {
        "params": float(param_count(m)), "weights_gib_per_gpu": weights / GIB,
        "reserve_gib_per_gpu": reserve / GIB, "usable_gib_per_gpu": usable / GIB,
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
    s = _settings(model, flags, (2048 * world, 128 * world))
    return _check(model, s, None, kv_space_gib * GIB,
                  f"VLLM_CPU_KVCACHE_SPACE={kv_space_gib:g} GiB", num_workers)

