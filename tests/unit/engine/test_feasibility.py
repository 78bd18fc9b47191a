"""The memory model (framework.engine.memory_model) and the static rules of framework.engine.feasibility, the
shipped model facts, spaces and sweeps. Pure: no Ray, no vLLM server. Expected values are worked
by hand from vLLM 0.32's source (paths inside the installed `vllm` package)."""

from __future__ import annotations

import math

import pytest

from framework.engine import memory_model as mm
from framework.engine.feasibility import DEFAULT_GPU_MEMORY_UTILIZATION
from framework.engine.feasibility import GIB
from framework.engine.feasibility import GPUS
from framework.engine.feasibility import ModelFacts
from framework.engine.feasibility import batch_defaults
from framework.engine.feasibility import check
from framework.engine.feasibility import check_cpu
from framework.engine.feasibility import read_model_facts
from framework.engine.model_info import ModelInfo
from tests.paths import ROOT as REPO

R1_70B = read_model_facts(REPO / "model_configs" / "deepseek-r1-distill-llama-70b")


LLAMA_8B = read_model_facts(REPO / "model_configs" / "llama-3.1-8b-instruct")


A100 = GPUS["A100-80GB"]


H100 = GPUS["H100-80GB"]


# The 8B at vLLM's H100 defaults: T = 8192 tokens, S = 1024 sequences, bf16 (b = 2).
T8, S8 = 8192, 1024
LLAMA_8B_PARAMS = 8_030_261_248  # the published 8.03B
# Its budget on an H100 at utilization 0.92, each term of gpu_worker.determine_available_memory
# by hand: weights 2 B a parameter; sampler state 541,753,344, non-torch 0.25 GiB, activation
# 838,860,800 (forward), CUDA graphs 860 MiB (51 + 51 graphs); the KV cache gets the rest.
WEIGHTS_8B = 2 * LLAMA_8B_PARAMS
RESERVE_8B = 541_753_344 + 0.25 * GIB + 838_860_800 + 860 * mm.MIB
KV_8B = math.ceil(H100.memory_bytes * 0.92) - WEIGHTS_8B - RESERVE_8B


def _facts(layers: int, heads: int, kv_heads: int, hidden: int, inter: int = 4,
           vocab: int = 8, tied: bool = False) -> ModelFacts:
    info = ModelInfo(num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
                     hidden_size=hidden, max_position_embeddings=131072)
    return ModelFacts(info=info, intermediate_size=inter, vocab_size=vocab,
                      tie_word_embeddings=tied)


@pytest.mark.parametrize("m, shape", [(R1_70B, (80, 8192, 64, 8, 28672)),
                                      (LLAMA_8B, (32, 4096, 32, 8, 14336))])
def test_shipped_configs_are_the_real_architectures(m, shape):
    i = m.info
    assert (i.num_layers, i.hidden_size, i.num_heads, i.num_kv_heads, m.intermediate_size,
            m.vocab_size, m.dim, i.max_position_embeddings) == (*shape, 128256, 128, 131072)
    assert (m.dtype, m.tie_word_embeddings) == ("bfloat16", False)


@pytest.mark.parametrize("model, expected", [
    (LLAMA_8B, LLAMA_8B_PARAMS), (R1_70B, 70_553_706_496),  # the published 8.03B and 70.6B
    # embed 8x4 + 1 layer (q 4x4, k, v 4x2 each, o 4x4, mlp 3x4x4, norms 2x4) + norm 4 + head
    (_facts(layers=1, heads=2, kv_heads=1, hidden=4), 32 + (16 + 8 + 8 + 16 + 48 + 8) + 4 + 32),
    (_facts(layers=1, heads=2, kv_heads=1, hidden=4, tied=True), 32 + 104 + 4),
])
def test_param_count(model, expected):
    assert mm.param_count(model) == expected


@pytest.mark.parametrize("tp, pp, quant, dtype, expected_gb", [
    (1, 1, None, "auto", 141.11), (1, 1, None, "float32", 282.21),  # 70.55e9 x 2 B, x 4 B
    (8, 1, None, "auto", 17.64), (2, 1, None, "auto", 70.55), (4, 2, None, "auto", 17.64),
    # 68.45e9 linear params at 1 B (fp8) or 0.5 B (awq); 2.10e9 in embeddings, lm_head and
    # norms stay at 2 B
    (8, 1, "fp8", "auto", 9.08), (8, 1, "awq", "auto", 4.80),
])
def test_weight_bytes_per_gpu(tp, pp, quant, dtype, expected_gb):
    assert mm.weight_bytes_per_gpu(R1_70B, tp, pp, quant, dtype) / 1e9 == pytest.approx(
        expected_gb, abs=0.01)


@pytest.mark.parametrize("layers, pp, expected", [
    (32, 1, (32,)), (80, 2, (40, 40)), (80, 3, (27, 27, 26)),
    (5, 4, (1, 1, 2, 1)), (7, 4, (2, 2, 2, 1)),  # the remainder skips the last stage
])
def test_stage_layers_are_vllms_split(layers, pp, expected):
    assert mm.stage_layers(layers, pp) == expected


# A 4-layer toy (H 4, 2 heads of 2, 1 KV head, I 4, V 8, bf16): per layer 96 linear params
# (q, o 4x4, k, v 4x2, gate, up, down 4x4) + 8 norm params; embedding and lm_head 8x4 = 32
# each; final norm 4.
@pytest.mark.parametrize("tied, tp, pp, params", [
    (False, 1, 1, 32 + 4 * 104 + 4 + 32),   # 484: the whole model
    (True, 1, 1, 32 + 4 * 104 + 4),         # 452: one embedding serves as lm_head
    (False, 2, 1, (32 + 4 * 104 + 4 + 32) / 2),
    # PP 2: the last stage holds 2 layers, the final norm and its own V x H lm_head; tied, it
    # is a second copy of the embedding (the first stage holds one too): 244, not 452 / 2
    (False, 1, 2, 2 * 104 + 4 + 32), (True, 1, 2, 2 * 104 + 4 + 32),
    (True, 2, 2, (2 * 104 + 4 + 32) / 2),
    (True, 1, 3, 1 * 104 + 4 + 32),         # stages of 2, 1, 1 layers
])
def test_the_last_stage_holds_its_layers_and_an_lm_head_tied_or_not(tied, tp, pp, params):
    toy = _facts(layers=4, heads=2, kv_heads=1, hidden=4, tied=tied)
    assert mm.weight_bytes_per_gpu(toy, tp, pp) == 2 * params


@pytest.mark.parametrize("model, kv_dtype, tp, pp, expected", [
    (LLAMA_8B, "auto", 1, 1, 131_072),          # 2 x 32 x 8 x 128 x 2
    (LLAMA_8B, "fp8", 1, 1, 65_536), (LLAMA_8B, "fp8_e5m2", 1, 1, 65_536),
    (R1_70B, "auto", 1, 1, 327_680),            # 2 x 80 x 8 x 128 x 2 = 320 KiB
    (R1_70B, "auto", 8, 1, 40_960),             # one KV head per GPU
    (R1_70B, "auto", 4, 2, 40_960),             # 2 heads, 40 layers
    (R1_70B, "auto", 16, 1, 40_960),            # TP > KV heads: heads are replicated
    (R1_70B, "auto", 8, 3, 2 * 27 * 1 * 128 * 2),  # uneven PP: the 27-layer stage binds
])
def test_kv_bytes_per_token(model, kv_dtype, tp, pp, expected):
    assert mm.kv_bytes_per_token(model, kv_dtype, tp, pp) == expected


@pytest.mark.parametrize("model, tp, tokens, expected", [
    # llama.py LlamaMLP.forward: residual + MLP input (2H) + gate_up (2I/TP) + act (I/TP) =
    # 8192 + 43008 = 51200 values a token > attention's 8192 + (2x32 + 2x8) x 128 = 18432
    (LLAMA_8B, 1, T8, T8 * 51_200 * 2),
    # 70B at TP 8: MLP 16384 + 3 x 28672 / 8 = 27136 > attention 16384 + (16 + 2) x 128
    (R1_70B, 8, 2048, 2048 * 27_136 * 2),
    # 4 heads of d 2, 4 KV heads, H 8, I 1: attention 16 + (8 + 8) x 2 = 48 > MLP 16 + 3 = 19
    (_facts(layers=1, heads=4, kv_heads=4, hidden=8, inter=1), 1, 10, 10 * 48 * 2),
])
def test_forward_activation(model, tp, tokens, expected):
    assert mm.forward_activation_bytes(model, tp, tokens, 2.0) == expected


@pytest.mark.parametrize("tp, tokens, seqs, expected", [
    # gpu/model_runner.py profile_run -> _dummy_sampler_run: hidden states T x H, their last
    # rows S x H, logits S x V, all at 2 B
    (1, T8, S8, (T8 * 4096 + S8 * 4096 + S8 * 128_256) * 2),
    # TP 2: the lm_head's S x V/2 shard is alive during the all-gather
    (2, T8, S8, (T8 * 4096 + S8 * 4096 + S8 * 128_256 + S8 * 64_128) * 2),
    # _dummy_run: min(T, S) = 100 dummy requests when S > T
    (1, 100, 256, (100 * 4096 + 100 * 4096 + 100 * 128_256) * 2),
])
def test_sampler_activation(tp, tokens, seqs, expected):
    assert mm.sampler_activation_bytes(LLAMA_8B, tp, tokens, seqs, 2.0) == expected


def test_profile_activation_is_the_larger_of_forward_and_sampler():
    """8B at H100 defaults: forward 838,860,800 B > sampler 338,165,760 B; with 4096 sequences
    and 512 tokens the logits (512 x 128256 x 2 = 131 MB) beat the forward (52 MB)."""
    assert mm.profile_activation_bytes(LLAMA_8B, 1, T8, S8, 2.0) == 838_860_800
    assert mm.profile_activation_bytes(LLAMA_8B, 1, 512, 4096, 2.0) == \
        (512 * 4096 * 2 + 512 * 128_256) * 2


@pytest.mark.parametrize("seqs, vocab, expected", [
    # gpu/sample/penalties.py PenaltiesState: int32 S x V counts + int32 S x ceil(V/32) mask
    (S8, 128_256, S8 * 128_256 * 4 + S8 * 4008 * 4),   # 541,753,344 B = 0.50 GiB
    (256, 128_256, 256 * 128_256 * 4 + 256 * 4008 * 4),
    (10, 33, 10 * 33 * 4 + 10 * 2 * 4),
])
def test_sampler_state(seqs, vocab, expected):
    assert mm.sampler_state_bytes(_facts(1, 1, 1, 4, vocab=vocab), seqs) == expected


EIGHTS = tuple(range(8, 256, 8))       # 31 sizes


SIXTEENS = tuple(range(256, 513, 16))  # 17 sizes, 256..512


@pytest.mark.parametrize("kwargs, expected", [
    # config/vllm.py _set_cudagraph_sizes: cap = min(T, min(2S, 512)) = 512
    (dict(max_num_seqs=1024, max_num_batched_tokens=8192), (1, 2, 4) + EIGHTS + SIXTEENS),
    (dict(max_num_seqs=256, max_num_batched_tokens=2048), (1, 2, 4) + EIGHTS + SIXTEENS),
    # cap 256: 256 itself, S = 128 already on the grid
    (dict(max_num_seqs=128, max_num_batched_tokens=2048), (1, 2, 4) + EIGHTS + (256,)),
    # cap 20: S = 10 is added as the uniform decode size
    (dict(max_num_seqs=10, max_num_batched_tokens=2048), (1, 2, 4, 8, 10, 16)),
    # cap = T = 100: T is added; S = 256 > T is not
    (dict(max_num_seqs=256, max_num_batched_tokens=100),
     (1, 2, 4) + tuple(range(8, 97, 8)) + (100,)),
    (dict(max_num_seqs=256, max_num_batched_tokens=8192, max_capture_size=64),
     (1, 2, 4) + tuple(range(8, 65, 8))),
    (dict(max_num_seqs=256, max_num_batched_tokens=8192, sizes=(9000, 3, 1, 3)), (1, 3)),
    # interactivity: 1..min(cap, 32) with cap 16
    (dict(max_num_seqs=8, max_num_batched_tokens=2048, interactivity=True),
     tuple(range(1, 17))),
])
def test_cudagraph_capture_sizes(kwargs, expected):
    assert mm.cudagraph_capture_sizes(**kwargs) == expected


@pytest.mark.parametrize("seqs, mode, expected", [
    # gpu/cudagraph_utils.py _init_candidates: PIECEWISE per size, FULL per size <= S
    (1024, "FULL_AND_PIECEWISE", (51, 51)),
    (256, "FULL_AND_PIECEWISE", (51, 35)),   # 1, 2, 4, 8..248 (31) and 256
    (256, "PIECEWISE", (51, 0)), (256, "FULL", (0, 51)),
    (256, "FULL_DECODE_ONLY", (0, 35)), (256, "NONE", (0, 0)),
])
def test_cudagraph_counts(seqs, mode, expected):
    assert mm.cudagraph_counts((1, 2, 4) + EIGHTS + SIXTEENS, seqs, mode) == expected


@pytest.mark.parametrize("graphs, expected_mib", [
    # gpu/cudagraph_utils.py profile_cudagraph_memory: first capture + per-graph x the rest
    ((51, 51), 260 + 6 * 100),   # 860 MiB, the 0.84 GiB vLLM logs for the 8B on an H100
    ((51, 35), 260 + 6 * 84),
    ((51, 0), 260 + 6 * 50),
    ((1, 0), 260),
    ((0, 0), 0),
])
def test_cudagraph_bytes(graphs, expected_mib):
    assert mm.cudagraph_bytes(*graphs) == expected_mib * mm.MIB


def test_kv_budget_and_block_rounding():
    # worker/utils.py request_memory: ceil(total x utilization)
    assert mm.requested_bytes(1001, 0.5) == 501
    assert mm.kv_budget_bytes(100.0, 0.9, 50.0, 10.0) == pytest.approx(30.0)
    assert mm.kv_budget_bytes(100.0, 0.5, 50.0, 10.0) == pytest.approx(-10.0)
    # kv_cache_utils.py: whole 16-token blocks (32 B at 2 B a token), one is the null block
    assert mm.kv_capacity_tokens(320, 2.0) == (10 - 1) * 16
    assert mm.kv_capacity_tokens(351, 2.0) == (10 - 1) * 16
    assert (mm.kv_capacity_tokens(32, 2.0), mm.kv_capacity_tokens(-5, 2.0)) == (0, 0)
    assert (mm.blocks_for(1), mm.blocks_for(16), mm.blocks_for(17)) == (1, 1, 2)


def test_gpu_budget_of_the_8b_on_an_h100_at_defaults():
    """Each term of gpu_worker.determine_available_memory, by hand (WEIGHTS_8B, RESERVE_8B,
    KV_8B above)."""
    use = mm.gpu_budget(LLAMA_8B, H100.memory_bytes, 0.92, 1, 1, T8, S8, (51, 51))
    assert use.requested == math.ceil(H100.memory_bytes * 0.92)
    assert use.weights == WEIGHTS_8B
    assert use.reserve == RESERVE_8B
    assert use.kv == KV_8B
    assert 55.4 < use.kv / GIB < 55.5
    assert (mm.non_torch_bytes(2), mm.non_torch_bytes(8)) == (2.1 * GIB, 2.1 * GIB)


def test_batch_defaults_follow_vllm():
    """arg_utils.py get_batch_defaults: (8192, 1024) from 70 GiB unless an A100, else
    (2048, 256); (16384, 1024) from 160 GiB, which no GPU of the table has."""
    assert {n: batch_defaults(g) for n, g in GPUS.items()} == {
        "A100-80GB": (2048, 256), "A100-40GB": (2048, 256), "H100-80GB": (8192, 1024),
        "H200-141GB": (8192, 1024), "L40S-48GB": (2048, 256), "A10G-24GB": (2048, 256),
        "L4-24GB": (2048, 256)}


@pytest.mark.parametrize("tokens, seqs, max_len, chunked, throughput, expected", [
    (None, None, 8192, True, False, (8192, 1024)),      # the GPU's defaults
    (None, None, 8192, True, True, (16384, 2048)),      # throughput mode doubles both
    (None, None, 32768, False, False, (32768, 1024)),   # unchunked: raised to max-model-len
    (None, None, 1024, False, False, (8192, 1024)),     # ... never lowered below the default
    (None, 4, 1024, True, False, (4096, 4)),            # capped at max-num-seqs x max-model-len
    (None, None, 4, True, False, (4096, 1024)),         # 1024 x 4 = 4096 < 8192
    (512, None, 8192, True, False, (512, 512)),         # unset seqs capped at the tokens
    (512, 4, 32768, False, True, (512, 4)),             # both set: as given
])
def test_batch_limits_resolve_as_vllm_resolves_them(tokens, seqs, max_len, chunked, throughput,
                                                     expected):
    """vllm/engine/arg_utils.py, EngineArgs._set_default_max_num_seqs_and_batched_tokens_args,
    with H100's defaults (8192, 1024); the one rule feasibility, predictions and the simulated
    engine share."""
    assert mm.resolve_batch_limits((8192, 1024), tokens, seqs, max_len, chunked,
                                   throughput) == expected


@pytest.mark.parametrize("flags, tokens, seqs, graphs, graph_mib", [
    ({}, 8192, 1024, (51, 51), 260 + 6 * 100),
    # arg_utils.py: throughput mode doubles both defaults; cap = min(T, 512) still
    ({"performance-mode": "throughput"}, 16384, 2048, (51, 51), 260 + 6 * 100),
    # chunked prefill off: T = max(max-model-len, 8192), as vLLM raises it
    ({"enable-chunked-prefill": False, "max-model-len": 32768}, 32768, 1024, (51, 51), 860),
    ({"enforce-eager": True}, 8192, 1024, (0, 0), 0),
    ({"optimization-level": 0}, 8192, 1024, (0, 0), 0),
    ({"optimization-level": 1}, 8192, 1024, (51, 0), 260 + 6 * 50),  # PIECEWISE only
    ({"compilation-config": '{"cudagraph_mode": "NONE"}'}, 8192, 1024, (0, 0), 0),
    # cap min(2 x 64, 512) = 128: 1, 2, 4, 8..128 (16); FULL for the 11 sizes <= 64
    ({"max-num-seqs": 64}, 8192, 64, (19, 11), 260 + 6 * 28),
    ({"max-cudagraph-capture-size": 16}, 8192, 1024, (5, 5), 260 + 6 * 8),  # 1 2 4 8 16
])
def test_flags_that_set_batch_and_graphs(flags, tokens, seqs, graphs, graph_mib):
    n = check(LLAMA_8B, H100, {"max-model-len": 8192, **flags}).numbers
    assert (n["max_num_batched_tokens"], n["max_num_seqs"], n["cudagraphs"]) == (
        tokens, seqs, sum(graphs))
    assert n["cudagraph_gib_per_gpu"] == graph_mib * mm.MIB / GIB


@pytest.mark.parametrize("gpu, util, fails", [
    # worker/utils.py request_memory: total - ceil(total x util) must hold the 0.51 GiB context
    ("L4-24GB", 0.99, True),     # 22.03 GiB x 0.01 = 0.22 GiB
    ("L4-24GB", 0.98, True),     # 0.44 GiB
    ("L4-24GB", 0.97, False),    # 0.66 GiB
    ("A100-80GB", 0.99, False),  # 0.79 GiB
])
def test_startup_check_needs_room_for_the_cuda_context(gpu, util, fails):
    result = check(LLAMA_8B, GPUS[gpu], {"gpu-memory-utilization": util, "max-model-len": 4096,
                                         "max-num-seqs": 16})
    assert any("CUDA context" in r for r in result.reasons) == fails


def test_70b_tp8_on_a100_fits_with_a_million_kv_tokens():
    n = check(R1_70B, A100, {"tensor-parallel-size": 8}).numbers
    assert (n["weights_gib_per_gpu"], n["kv_bytes_per_token_per_gpu"]) == pytest.approx(
        (16.43, 40_960), abs=0.01)
    assert 50 < n["kv_budget_gib_per_gpu"] < 56 and 1.3e6 < n["kv_tokens_capacity"] < 1.5e6
    assert (n["max_model_len"], n["max_num_seqs"], n["max_num_batched_tokens"],
            n["max_resident_seqs"]) == (131072, 256, 2048, 10)
    warned = check(R1_70B, A100, {"tensor-parallel-size": 8, "max-num-seqs": 64})
    assert warned.ok and len(warned.warnings) == 1
    assert "only 10 sequences" in warned.warnings[0] and "max-num-seqs 64" in warned.warnings[0]
    short = check(R1_70B, A100, {"tensor-parallel-size": 8, "max-num-seqs": 64,
                                 "max-model-len": 16384})
    assert short.ok and short.warnings == () and short.numbers["max_resident_seqs"] >= 64


@pytest.mark.parametrize("tp, util", [(1, None), (2, 0.80)])
def test_70b_weights_that_do_not_fit_name_the_numbers(tp, util):
    result = check(R1_70B, A100, {"tensor-parallel-size": tp, "gpu-memory-utilization": util})
    (reason,) = result.reasons
    weights = f"{mm.weight_bytes_per_gpu(R1_70B, tp, 1) / GIB:.2f} GiB"
    usable = f"{A100.memory_bytes * (util or DEFAULT_GPU_MEMORY_UTILIZATION) / GIB:.2f} GiB"
    assert reason.startswith(f"weights need {weights} per GPU (70.55B params over TP {tp}")
    assert usable in reason and "A100-80GB" in reason


def test_70b_tp2_fits_its_weights_but_not_a_128k_sequence():
    """ceil(0.92 x 79.15 GiB) = 72.82 GiB less 65.71 GiB of weights (70.55e9 x 2 B / 2) and a
    3.20 GiB reserve: sampler state 0.13 (256 x 128256 x 4 + 256 x 4008 x 4 B), non-torch 2.1,
    activation 0.23 (forward: 2048 x (16384 + 3 x 28672 / 2) x 2 B), graphs 0.75 (260 + 6 x
    (50 + 34) MiB) leaves 3.91 GiB: 1601 blocks of 16 x 160 KiB, less the null block, is
    1600 x 16 = 25600 tokens, less than one 131072-token sequence."""
    result = check(R1_70B, A100, {"tensor-parallel-size": 2})
    (reason,) = result.reasons
    assert reason.startswith("one 131072-token sequence needs 20.00 GiB of KV cache per GPU")
    assert "65.71 GiB of weights and a 3.20 GiB reserve" in reason
    assert result.numbers["kv_tokens_capacity"] == 25_600
    assert reason.endswith("fits is 25600")
    assert check(R1_70B, A100, {"tensor-parallel-size": 2, "max-model-len": 16384}).ok
    auto = check(R1_70B, A100, {"tensor-parallel-size": 2, "max-model-len": -1})
    assert auto.ok and auto.numbers["max_model_len"] == 25_600


@pytest.mark.parametrize("flags, fragment", [
    ({"tensor-parallel-size": 3}, "does not divide the model's 64 attention heads"),
    ({"enable-chunked-prefill": False, "max-num-batched-tokens": 16384, "max-model-len": 32768},
     "with chunked prefill off, max-num-batched-tokens 16384 must be >= max-model-len 32768"),
    ({"max-model-len": 262144}, "max-model-len 262144 exceeds the model's "
                                "max_position_embeddings 131072"),
    ({"max-num-batched-tokens": 2048, "max-num-seqs": 4096}, "must be >= max-num-seqs 4096"),
    ({"pipeline-parallel-size": 81}, "pipeline parallel size 81 is outside 1..80"),
    ({"pipeline-parallel-size": 2}, "TP 8 x PP 2 = 16 workers, but only 8 devices are available"),
])
def test_static_rules_reject(flags, fragment):
    result = check(R1_70B, A100, {"tensor-parallel-size": 8, **flags}, num_gpus=8)
    assert not result.ok
    assert any(fragment in r for r in result.reasons), result.reasons


@pytest.mark.parametrize("flags, violation", [
    ({"tensor-parallel-size": 8}, 0.0),                                    # fits
    ({"tensor-parallel-size": 8, "max-model-len": 262144}, 1.0),           # one rule broken
    ({"tensor-parallel-size": 3, "max-model-len": 262144}, 2.0),           # two rules
    ({"tensor-parallel-size": 1, "max-model-len": 262144}, None),          # rule + memory
    # weights 131.41 GiB vs 0.92 x 79.15 = 72.82 usable: 131.41 / 72.82 - 1
    ({"tensor-parallel-size": 1}, 131.41 / 72.82 - 1),
    ({"tensor-parallel-size": 1, "gpu-memory-utilization": 0.01}, 10.0),  # capped
])
def test_violation_grades_how_far_outside_the_feasible_region(flags, violation):
    result = check(R1_70B, A100, flags)
    if violation is None:
        assert result.violation > 1.0
    else:
        assert result.violation == pytest.approx(violation, rel=0.01)
    assert (result.violation == 0) == result.ok


def test_fp8_kv_cache_doubles_capacity_at_the_same_budget():
    """Twice the blocks at half the bytes a token, give or take the null block and the last
    partial block (16 tokens each)."""
    base = check(R1_70B, A100, {"tensor-parallel-size": 8}).numbers
    fp8 = check(R1_70B, A100, {"tensor-parallel-size": 8, "kv-cache-dtype": "fp8"}).numbers
    assert fp8["kv_bytes_per_token"] == base["kv_bytes_per_token"] / 2
    assert fp8["kv_tokens_capacity"] == pytest.approx(2 * base["kv_tokens_capacity"], abs=32)


def test_unknown_kv_dtype_is_a_warning():
    result = check(LLAMA_8B, H100, {"kv-cache-dtype": "turboquant_k8v4", "max-model-len": 8192})
    assert result.ok and "'turboquant_k8v4' is unknown" in result.warnings[0]


def test_8b_on_one_h100_at_vllm_defaults():
    """The budget of test_gpu_budget_of_the_8b_on_an_h100_at_defaults, 59,536,870,986 B, in
    2 MiB blocks (16 tokens x 128 KiB: K and V x 32 layers x 8 KV heads x 128 x 2 B): 28389
    blocks less the null block, 28388 x 16 = 454208 tokens, 3 sequences of 131072 tokens."""
    n = check(LLAMA_8B, H100, {}).numbers
    assert n["weights_gib_per_gpu"] == pytest.approx(WEIGHTS_8B / GIB, abs=0.01)  # 14.96
    assert (n["max_num_batched_tokens"], n["max_num_seqs"], n["cudagraphs"]) == (8192, 1024, 102)
    assert n["kv_budget_gib_per_gpu"] == pytest.approx(KV_8B / GIB, abs=0.01)  # 55.45
    block = 16 * 2 * 32 * 8 * 128 * 2
    tokens = (int(KV_8B // block) - 1) * 16
    assert n["kv_tokens_capacity"] == tokens
    assert n["max_resident_seqs"] == tokens // 131072


@pytest.mark.parametrize("tp, pp, weights_gib, kv_per_gpu", [
    (4, 1, 32.85, 81_920), (8, 1, 16.43, 40_960), (4, 2, 16.43, 40_960), (8, 2, 8.21, 20_480),
    # uneven stages (27, 27, 26 layers) are allowed; the last binds: 26 layers + lm_head
    (8, 3, 5.42, 13_824),
])
def test_70b_on_h100_nodes_every_shape_fits(tp, pp, weights_gib, kv_per_gpu):
    result = check(R1_70B, H100, {"tensor-parallel-size": tp, "pipeline-parallel-size": pp},
                   num_gpus=24)
    assert result.ok, result.reasons
    assert result.numbers["weights_gib_per_gpu"] == pytest.approx(weights_gib, abs=0.01)
    assert result.numbers["kv_bytes_per_token_per_gpu"] == kv_per_gpu
    assert result.numbers["max_resident_seqs"] >= 3


def test_8b_does_not_hold_a_128k_sequence_on_an_l4():
    result = check(LLAMA_8B, GPUS["L4-24GB"], {})
    assert "one 131072-token sequence needs 16.00 GiB" in result.reasons[0]
    assert check(LLAMA_8B, GPUS["L4-24GB"], {"max-model-len": 8192}).ok


def test_cpu_engine_checks_the_kv_space_in_blocks():
    """1 GiB of VLLM_CPU_KVCACHE_SPACE over 16 x 320 KiB blocks of the 70B: 204 blocks, one
    the null block: 203 x 16 = 3248 tokens."""
    tiny = read_model_facts(REPO / "models" / "tiny-llama")
    quick = check_cpu(tiny, 1.0, {"max-model-len": 512, "enforce-eager": True}).numbers
    assert quick["kv_bytes_per_token"] == 2 * tiny.info.num_layers * tiny.info.num_kv_heads * \
        tiny.dim * 2
    assert (quick["kv_budget_gib_per_gpu"], quick["max_num_seqs"]) == (1.0, 128)
    result = check_cpu(R1_70B, 1.0, {"max-model-len": 8192})
    assert "1.00 GiB is set aside (VLLM_CPU_KVCACHE_SPACE=1 GiB)" in result.reasons[0]
    assert result.reasons[0].endswith("longest max-model-len that fits is 3248")
