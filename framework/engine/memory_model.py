"""GPU memory of one vLLM 0.32 worker, as vLLM accounts it before sizing the KV cache. Pure.

vLLM's accounting (vllm/v1/worker/gpu_worker.py, Worker.determine_available_memory, with
vllm/utils/mem_utils.py, memory_profiling, and vllm/v1/worker/utils.py, request_memory):
  KV budget = ceil(total x gpu-memory-utilization) - weights - the sampler's persistent
              state - non-torch memory allocated after the start-up snapshot - peak
              activation of the profile run - the CUDA-graph memory estimate
              (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default in 0.32).
On GPU vLLM 0.32 runs Model Runner V2 (vllm/config/vllm.py, VllmConfig.use_v2_model_runner:
on unless VLLM_USE_V2_MODEL_RUNNER=0 or an unsupported feature), whose profile run and graph
capture live in vllm/v1/worker/gpu/.
The CUDA context and, at TP x PP > 1, NCCL's and the custom all-reduce's buffers
(comm_init_bytes) come before the start-up snapshot: they are not charged to the budget, but
must fit in the (1 - utilization) share left over (request_memory).

Symbols: V vocab, H hidden, L layers, nh / kv attention / KV heads, d head dim, I intermediate
size, b bytes per value of the running dtype, T max-num-batched-tokens, S max-num-seqs.
Modelled exactly from the source: parameter and KV shapes, KV block rounding, the CUDA-graph
capture sizes and graph counts. Approximated: the activation peak (tensor shapes alive at the
peak, not the allocator's rounding) and three measured magnitudes vLLM itself only measures at
start-up (CUDA context, non-torch memory, bytes per captured graph); each says so below.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from framework.base.errors import ConfigError
from framework.engine.model_info import ModelInfo
from framework.engine.model_info import read_model_info

GIB = 2**30
MIB = 2**20
BLOCK_SIZE = 16  # vllm/config/cache.py, CacheConfig.DEFAULT_BLOCK_SIZE

# Measured, not derivable from vLLM's source: published vLLM 0.19 start-up logs of
# Llama-3.1-8B on H100s. CUDA context at the start-up snapshot ("worker init memory snapshot
# ... cuda_memory=0.51GiB"); non-torch memory allocated during profiling ("non-torch forward
# increase memory": 0.25 GiB at TP 1, ~2.1 GiB at TP 2 and 4, the all-reduce buffers; other
# interconnects may need less); the CUDA-graph pool of the V1 runner, whose estimate has the
# V2 runner's shape ("Estimated PIECEWISE/FULL CUDA graph memory: 138 / 260 MiB first-capture
# + (51-1) x 6 MiB per-graph").
CUDA_CONTEXT_BYTES = 0.51 * GIB
# Communication buffers allocated before the start-up snapshot at TP x PP > 1: vLLM sets up its
# process groups first (vllm/v1/worker/gpu_worker.py, Worker.init_device: "Initialize the
# distributed environment BEFORE taking memory snapshot"), and each group's PyNcclCommunicator
# runs a warm-up all-reduce (vllm/distributed/device_communicators/pynccl.py), which connects
# NCCL's channels. NCCL: 10 MiB per channel and connection, its Simple FIFO (NCCL_BUFFSIZE,
# documented default 4 MiB) + LL128 (~4.7 MiB) + LL (0.5 MiB) in 2 MiB granules (the
# 10485760-byte allocations of NCCL_DEBUG_SUBSYS=ALLOC, NVIDIA/nccl#1685), x 32 channels
# (NCCL's maximum, reached over H100 NVLink: same issue) x 2 connections (ring, tree) = 640 MiB,
# an upper end: PCIe GPUs open fewer channels. The TP group adds vLLM's custom all-reduce
# (vllm/distributed/device_communicators/custom_all_reduce.py, CustomAllreduce.__init__):
# meta + 8 MiB max_size, an 8 MiB buffer (max of 8 MiB all-reduce, 2 MiB all-gather, 16 MiB
# reduce-scatter sizes: 16 MiB), and 8 MiB rank_data: 32 MiB.
NCCL_CHANNEL_BYTES = 10 * MIB
NCCL_CHANNELS = 32
NCCL_INIT_BYTES = NCCL_CHANNELS * 2 * NCCL_CHANNEL_BYTES
CUSTOM_ALL_REDUCE_BYTES = (8 + 16 + 8) * MIB
NON_TORCH_BYTES_TP1 = 0.25 * GIB
NON_TORCH_BYTES_TP = 2.1 * GIB
CUDAGRAPH_FIRST_BYTES = 260 * MIB
CUDAGRAPH_PER_GRAPH_BYTES = 6 * MIB


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int


def _gpu(name: str, gib: float) -> GpuSpec:
    return GpuSpec(name=name, memory_bytes=round(gib * GIB))


# Total memory as the CUDA driver reports it (cudaMemGetInfo's total: torch's OOM message
# "GPU 0 has a total capacity of X GiB", vLLM's MemorySnapshot.total_memory), not the marketed
# size; it varies by ~0.1 GiB with the driver. A100-40GB is the SXM4 part.
GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    _gpu("A100-80GB", 79.15), _gpu("A100-40GB", 39.39), _gpu("H100-80GB", 79.11),
    _gpu("H200-141GB", 139.81), _gpu("L40S-48GB", 44.52), _gpu("A10G-24GB", 21.99),
    _gpu("L4-24GB", 22.03),
)}

DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "half": 2.0, "float32": 4.0, "float": 4.0}
KV_BYTES = {"float16": 2.0, "bfloat16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0,
            "fp8_inc": 1.0, "fp8_per_token_head": 1.0, "int8_per_token_head": 1.0,
            "int4_per_token_head": 0.5, "nvfp4": 0.5, "nvfp4_4over6": 0.5}
QUANT_BYTES = {
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


def _layer_linear_params(m: ModelFacts) -> int:
    """One decoder layer's linear params: q, o (H x nh x d each), k, v (H x kv x d), gate, up,
    down (H x I)."""
    i, h, d = m.info, m.info.hidden_size, m.dim
    return 2 * h * i.num_heads * d + 2 * h * i.num_kv_heads * d + 3 * h * m.intermediate_size


def _linear_params(m: ModelFacts) -> int:
    return m.info.num_layers * _layer_linear_params(m)


def stage_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers of each pipeline stage as vLLM splits them (vllm/distributed/utils.py,
    get_pp_indices, VLLM_PP_LAYER_PARTITION unset): L // PP each, the remainder one apiece to
    the stages before the last, from the second-to-last backwards."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return tuple(parts)


def param_count(m: ModelFacts) -> int:
    """V*H (embeddings) + L * (2*H*nh*d + 2*H*kv*d (q, o, k, v) + 3*H*I (gate, up, down)
    + 2*H (norms)) + H (final norm) + V*H (lm_head, unless tied). Llama has no biases."""
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
    return DTYPE_BYTES.get(dtype, 2.0)


def weight_bytes_per_gpu(m: ModelFacts, tp: int, pp: int, quantization: str | None = None,
                         dtype: str = "auto") -> float:
    """One GPU's weights on the last pipeline stage (the worker `gpu_budget` models): (linear
    params x weight bytes + other params x b) / TP. Weight bytes: the `quantization` flag's,
    else the config's quantization_config bits, else b.
    PP 1: the whole model (`param_count`; a tied lm_head is the embedding, counted once).
    PP > 1: the last stage's decoder layers (`stage_layers`), the final norm and a whole
    V x H lm_head, tied or not. vLLM gives each stage only its own modules, PPMissingLayer for
    the rest (vllm/model_executor/models/llama.py): embed_tokens on the first rank, and on the
    last rank too when tied (LlamaModel.__init__: `is_first_rank or (tie_word_embeddings and
    is_last_rank)`), the lm_head on the last rank only, tied to that rank's own embed_tokens
    (LlamaForCausalLM.__init__, `tie_weights`). So a tied model's V x H is held twice across
    stages, once on the last: counted once, as at PP 1, it would be missing there. vLLM's
    vocab padding (to a multiple of 64) is not modelled."""
    value_bytes = dtype_bytes(value_dtype(m, dtype))
    method = quantization or m.quantization
    linear_bytes = QUANT_BYTES.get(method or "", value_bytes)
    if method is not None and method == m.quantization and m.quant_bits:
        linear_bytes = m.quant_bits / 8
    if pp <= 1:
        linear = _linear_params(m)
        other = param_count(m) - linear
    else:
        h, layers = m.info.hidden_size, stage_layers(m.info.num_layers, pp)[-1]
        linear = layers * _layer_linear_params(m)
        other = layers * 2 * h + h + m.vocab_size * h  # layer norms, final norm, lm_head
    return (linear * linear_bytes + other * value_bytes) / tp


def kv_dtype_bytes(m: ModelFacts, kv_cache_dtype: str = "auto", dtype: str = "auto") -> float:
    """Bytes per KV value: `auto` = b, fp8* = 1 (unknown: b)."""
    value_bytes = dtype_bytes(value_dtype(m, dtype))
    return value_bytes if kv_cache_dtype == "auto" else KV_BYTES.get(kv_cache_dtype, value_bytes)


def kv_bytes_per_token(m: ModelFacts, kv_cache_dtype: str = "auto", tp: int = 1, pp: int = 1,
                       dtype: str = "auto") -> float:
    """2 (K, V) x ceil(L / PP) layers x max(1, kv / TP) heads x d x KV bytes: one GPU's share
    (the largest pipeline stage binds; KV heads are replicated when TP > kv)."""
    layers = math.ceil(m.info.num_layers / pp)
    heads = max(1, m.info.num_kv_heads // tp)
    return 2 * layers * heads * m.dim * kv_dtype_bytes(m, kv_cache_dtype, dtype)


def forward_activation_bytes(m: ModelFacts, tp: int, tokens: int, value_bytes: float) -> float:
    """The forward pass's transient peak over T tokens: the larger half of one decoder layer
    (vllm/model_executor/models/llama.py, LlamaDecoderLayer.forward, LlamaMLP.forward).
    MLP: T x (2H + 3I/TP) x b (residual, MLP input, gate_up 2I/TP, activation I/TP).
    Attention: T x (2H + (2nh/TP + 2kv')d) x b (residual, input, qkv (nh/TP + 2kv')d, output
    (nh/TP)d), kv' = max(1, kv/TP). Buffers of the compiled graph are not modelled: published
    vLLM 0.19 logs of the 8B's forward-only pipeline stages (T = 8192) show 1.05-1.10 GiB
    where this gives 0.78 GiB."""
    i, h, d = m.info, m.info.hidden_size, m.dim
    kv_heads = max(1, i.num_kv_heads // tp)
    attention = 2 * h + (2 * i.num_heads // tp + 2 * kv_heads) * d
    mlp = 2 * h + 3 * m.intermediate_size / tp
    return tokens * max(attention, mlp) * value_bytes


def sampler_activation_bytes(m: ModelFacts, tp: int, tokens: int, seqs: int,
                             value_bytes: float) -> float:
    """The dummy sampler run's peak on the last pipeline stage (vllm/v1/worker/gpu/
    model_runner.py, GPUModelRunner.profile_run, _dummy_run and _dummy_sampler_run), with
    S' = min(S, T) dummy requests: T x H x b (the forward's hidden states, still held)
    + S' x H x b (their last rows) + S' x V x b (compute_logits: full V on every TP rank)
    + S' x V x b / TP (the lm_head's shard, alive during the all-gather; TP > 1 only). The dummy
    requests use no top-k/top-p or penalties, so no float32 copy is made
    (vllm/v1/worker/gpu/sample/sampler.py, Sampler.apply_sampling_params)."""
    rows = min(seqs, tokens)
    h = m.info.hidden_size
    gather = rows * m.vocab_size / tp if tp > 1 else 0.0
    return (tokens * h + rows * h + rows * m.vocab_size + gather) * value_bytes


def profile_activation_bytes(m: ModelFacts, tp: int, tokens: int, seqs: int,
                             value_bytes: float) -> float:
    """Peak activation of vLLM's profile run (memory_profiling's transient_peak_headroom):
    max(forward, sampler); the last pipeline stage, which runs both, binds."""
    return max(forward_activation_bytes(m, tp, tokens, value_bytes),
               sampler_activation_bytes(m, tp, tokens, seqs, value_bytes))


def sampler_state_bytes(m: ModelFacts, seqs: int) -> float:
    """The sampler's persistent penalty state on the last pipeline stage, allocated whether or
    not a request uses penalties (vllm/v1/worker/gpu/sample/penalties.py,
    PenaltiesState.__init__): S x V x 4 (int32 output_bin_counts)
    + S x ceil(V / 32) x 4 (prompt_bin_mask)."""
    return seqs * m.vocab_size * 4 + seqs * -(-m.vocab_size // 32) * 4


def comm_init_bytes(tp: int, pp: int) -> float:
    """Communication buffers allocated before vLLM's start-up snapshot (see the constants):
    NCCL's when TP x PP > 1, plus the custom all-reduce's when TP > 1; 0 on one GPU."""
    if tp * pp <= 1:
        return 0.0
    return NCCL_INIT_BYTES + (CUSTOM_ALL_REDUCE_BYTES if tp > 1 else 0.0)


def non_torch_bytes(tp: int) -> float:
    """Memory outside torch's allocator taken during profiling (cuBLAS workspaces, NCCL's
    buffers once all-reduce runs): measured 0.25 GiB at TP 1, 2.1 GiB at TP > 1 (see the
    constants; vLLM measures it, its source does not fix it)."""
    return NON_TORCH_BYTES_TP1 if tp <= 1 else NON_TORCH_BYTES_TP


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int,
                            max_capture_size: int | None = None,
                            sizes: tuple[int, ...] | None = None,
                            interactivity: bool = False) -> tuple[int, ...]:
    """vLLM's capture sizes without speculative decoding (vllm/config/vllm.py,
    VllmConfig._set_cudagraph_sizes): explicit `sizes` <= T; else with
    cap = min(T, max-cudagraph-capture-size or min(2S, 512)): 1, 2, 4 (interactivity mode:
    1..min(cap, 32)), multiples of 8 below 256, multiples of 16 from 256, all <= cap, plus T
    if T <= cap, plus S if the default cap min(2S, 512) holds it and S <= T."""
    if sizes is not None:
        return tuple(sorted({s for s in sizes if s <= max_num_batched_tokens}))
    decode: list[int] = []
    if max_capture_size is None:
        max_capture_size = min(max_num_seqs * 2, 512)
        if max_num_seqs <= max_capture_size:
            decode = [max_num_seqs]
    cap = min(max_num_batched_tokens, max_capture_size)
    found = list(range(1, min(cap, 32) + 1)) if interactivity else [i for i in (1, 2, 4)
                                                                    if i <= cap]
    if cap >= 8:
        found += range(8, min(cap + 1, 256), 8)
    if cap >= 256:
        found += range(256, cap + 1, 16)
    if max_num_batched_tokens <= cap:
        found.append(max_num_batched_tokens)
    found += [s for s in decode if s <= max_num_batched_tokens]
    return tuple(sorted(set(found)))


def cudagraph_counts(sizes: tuple[int, ...], max_num_seqs: int,
                     mode: str = "FULL_AND_PIECEWISE") -> tuple[int, int]:
    """(PIECEWISE graphs, FULL graphs) for a cudagraph_mode without speculative decoding
    (vllm/v1/worker/gpu/cudagraph_utils.py, ModelCudaGraphManager._init_candidates):
    FULL_AND_PIECEWISE (vLLM's default at -O2 and -O3) n and n<=S, PIECEWISE (-O1) n and 0,
    FULL 0 and n, FULL_DECODE_ONLY 0 and n<=S, NONE (-O0, enforce-eager) 0 and 0; n = the
    capture sizes, n<=S those <= max-num-seqs (uniform decode graphs)."""
    n, decode = len(sizes), sum(1 for s in sizes if s <= max_num_seqs)
    return {"FULL_AND_PIECEWISE": (n, decode), "PIECEWISE": (n, 0), "FULL": (0, n),
            "FULL_DECODE_ONLY": (0, decode)}.get(mode.upper(), (0, 0))


def cudagraph_bytes(piecewise: int, full: int) -> float:
    """vLLM's CUDA-graph estimate, taken from the KV budget (vllm/v1/worker/gpu/
    cudagraph_utils.py, profile_cudagraph_memory, _extrapolate_full_graph_memory): the graphs
    share one pool, the first (largest) capture sets its baseline and each further graph adds
    a per-graph cost. vLLM measures both; modelled as 260 MiB + 6 MiB x (piecewise - 1
    + max(full - 1, 0)); 0 without graphs."""
    if piecewise + full == 0:
        return 0.0
    further = max(piecewise - 1, 0) + max(full - 1, 0)
    return CUDAGRAPH_FIRST_BYTES + CUDAGRAPH_PER_GRAPH_BYTES * further


def requested_bytes(memory_bytes: float, utilization: float) -> float:
    """ceil(total x utilization) (vllm/v1/worker/utils.py, request_memory)."""
    return float(math.ceil(memory_bytes * utilization))


def kv_budget_bytes(memory_bytes: float, utilization: float, weight_bytes: float,
                    reserve_bytes: float) -> float:
    """ceil(memory x utilization) - weights - reserve (negative when nothing is left)."""
    return requested_bytes(memory_bytes, utilization) - weight_bytes - reserve_bytes


@dataclass(frozen=True)
class GpuBudget:
    """One GPU's share as vLLM accounts it before sizing the KV cache (bytes)."""

    requested: float
    weights: float
    sampler_state: float
    non_torch: float
    activation: float
    cudagraph: float

    @property
    def reserve(self) -> float:
        return self.sampler_state + self.non_torch + self.activation + self.cudagraph

    @property
    def kv(self) -> float:
        return self.requested - self.weights - self.reserve


def gpu_budget(m: ModelFacts, memory_bytes: float, utilization: float, tp: int, pp: int,
               tokens: int, seqs: int, graphs: tuple[int, int], dtype: str = "auto",
               quantization: str | None = None) -> GpuBudget:
    """The worker of the last pipeline stage (it holds the sampler and binds): the module
    docstring's KV budget with each term from its function; graphs = (PIECEWISE, FULL)."""
    value_bytes = dtype_bytes(value_dtype(m, dtype))
    return GpuBudget(
        requested=requested_bytes(memory_bytes, utilization),
        weights=weight_bytes_per_gpu(m, tp, pp, quantization, dtype),
        sampler_state=sampler_state_bytes(m, seqs),
        non_torch=non_torch_bytes(tp),
        activation=profile_activation_bytes(m, tp, tokens, seqs, value_bytes),
        cudagraph=cudagraph_bytes(*graphs))


def kv_capacity_tokens(budget_bytes: float, bytes_per_token: float,
                       block_size: int = BLOCK_SIZE) -> int:
    """Usable KV tokens: (floor(budget / block bytes) - 1) x block size; vLLM cuts the budget
    into whole blocks and the block pool keeps one as its null block
    (vllm/v1/core/kv_cache_utils.py, get_kv_cache_configs, _pool_bytes_per_block)."""
    blocks = int(budget_bytes // (bytes_per_token * block_size)) if budget_bytes > 0 else 0
    return max(0, blocks - 1) * block_size


def blocks_for(tokens: int, block_size: int = BLOCK_SIZE) -> int:
    """ceil(tokens / block size): one sequence's blocks (kv_cache_interface.py,
    FullAttentionSpec.max_memory_usage_bytes)."""
    return -(-tokens // block_size)


def batch_defaults(gpu: GpuSpec) -> tuple[int, int]:
    """vLLM 0.32's `vllm serve` defaults (max-num-batched-tokens, max-num-seqs) for a GPU
    (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults): >= 160 GiB: (16384, 1024);
    >= 70 GiB except A100: (8192, 1024); else (2048, 256)."""
    if gpu.memory_bytes >= 160 * GIB:
        return 16384, 1024
    if gpu.memory_bytes >= 70 * GIB and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256


# vLLM's max-model-len for a model whose config.json names no length (vllm/config/model.py,
# `default_max_len = 2048` in _get_and_verify_max_len)
FALLBACK_MAX_MODEL_LEN = 2048


def resolve_batch_limits(defaults: tuple[int, int], max_num_batched_tokens: int | None,
                         max_num_seqs: int | None, max_model_len: int, chunked_prefill: bool,
                         throughput: bool = False) -> tuple[int, int]:
    """(max-num-batched-tokens, max-num-seqs) as vLLM 0.32 resolves them from the flags (None:
    unset) and `defaults` (batch_defaults) in EngineArgs._set_default_max_num_seqs_and_batched_
    tokens_args (vllm/engine/arg_utils.py): an unset limit takes its default (x 2 in
    throughput mode); unset tokens are then raised to max-model-len without chunked prefill and
    capped at max-num-seqs x max-model-len; unset seqs are capped at the tokens."""
    scale = 2 if throughput else 1
    seqs = max_num_seqs if max_num_seqs is not None else defaults[1] * scale
    if max_num_batched_tokens is not None:
        tokens = max_num_batched_tokens
    else:
        tokens = defaults[0] * scale if chunked_prefill else max(max_model_len, defaults[0] * scale)
        tokens = min(seqs * max_model_len, tokens)
    if max_num_seqs is None:
        seqs = min(seqs, tokens)
    return tokens, seqs
