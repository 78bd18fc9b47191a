"""The memory model and static rules of framework.feasibility, the shipped model facts, spaces
and sweeps. Pure: no Ray, no vLLM server."""

from __future__ import annotations

from pathlib import Path

import pytest

from framework import sweep
from framework.feasibility import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    GIB,
    GPUS,
    ModelFacts,
    activation_reserve_bytes,
    batch_defaults,
    check,
    check_cpu,
    kv_budget_bytes,
    kv_bytes_per_token,
    param_count,
    read_model_facts,
    weight_bytes_per_gpu,
)
from framework.model_info import ModelInfo
from framework.search_space import load_search_space

REPO = Path(__file__).resolve().parents[1]
R1_70B = read_model_facts(REPO / "model_configs" / "deepseek-r1-distill-llama-70b")
LLAMA_8B = read_model_facts(REPO / "model_configs" / "llama-3.1-8b-instruct")
A100 = GPUS["A100-80GB"]
H100 = GPUS["H100-80GB"]


def _facts(layers: int, heads: int, kv_heads: int, hidden: int, inter: int = 4,
           vocab: int = 8, tied: bool = False) -> ModelFacts:
    info = ModelInfo(num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
                     hidden_size=hidden, max_position_embeddings=131072)
    return ModelFacts(info=info, intermediate_size=inter, vocab_size=vocab,
                      tie_word_embeddings=tied)


def test_shipped_configs_are_the_real_architectures():
    i70, i8 = R1_70B.info, LLAMA_8B.info
    assert (i70.num_layers, i70.hidden_size, i70.num_heads, i70.num_kv_heads) == (80, 8192, 64, 8)
    assert (i8.num_layers, i8.hidden_size, i8.num_heads, i8.num_kv_heads) == (32, 4096, 32, 8)
    assert (R1_70B.intermediate_size, LLAMA_8B.intermediate_size) == (28672, 14336)
    for m in (R1_70B, LLAMA_8B):
        assert (m.vocab_size, m.dtype, m.dim, m.tie_word_embeddings) == (128256, "bfloat16", 128,
                                                                         False)
        assert m.info.max_position_embeddings == 131072


@pytest.mark.parametrize("model, expected", [(LLAMA_8B, 8.03e9), (R1_70B, 70.55e9)])
def test_param_count_of_the_shipped_configs(model, expected):
    assert param_count(model) == pytest.approx(expected, rel=0.01)


def test_param_count_exact_for_the_llama_formulas():
    assert param_count(LLAMA_8B) == 8_030_261_248
    assert param_count(R1_70B) == 70_553_706_496


@pytest.mark.parametrize("tied, expected", [
    # embed 8x4 + 1 layer (q 4x4, k, v 4x2 each, o 4x4, mlp 3x4x4, norms 2x4) + norm 4 + head
    (False, 32 + (16 + 8 + 8 + 16 + 48 + 8) + 4 + 32),
    (True, 32 + (16 + 8 + 8 + 16 + 48 + 8) + 4),
])
def test_param_count_small_model_by_hand(tied, expected):
    assert param_count(_facts(layers=1, heads=2, kv_heads=1, hidden=4, tied=tied)) == expected


@pytest.mark.parametrize("tp, pp, quant, expected_gb", [
    (1, 1, None, 141.11),   # the seeds' "70.6B x 2 B ~ 140 GB"
    (8, 1, None, 17.64),
    (2, 1, None, 70.55),
    (4, 2, None, 17.64),
    # 68.45e9 linear params at 1 B (fp8) or 0.5 B (awq); 2.10e9 in embeddings, lm_head and
    # norms stay at 2 B
    (8, 1, "fp8", 9.08),
    (8, 1, "awq", 4.80),
])
def test_weight_bytes_per_gpu(tp, pp, quant, expected_gb):
    assert weight_bytes_per_gpu(R1_70B, tp, pp, quant) / 1e9 == pytest.approx(expected_gb,
                                                                              abs=0.01)


def test_weight_bytes_follow_the_dtype_flag():
    bf16 = weight_bytes_per_gpu(LLAMA_8B, 1, 1)
    assert bf16 == 2 * param_count(LLAMA_8B)
    assert weight_bytes_per_gpu(LLAMA_8B, 1, 1, dtype="float32") == 2 * bf16


def test_seeds_kv_arithmetic_full_hidden_then_gqa():
    """The seeds: 2 x 2 B x 8192 (hidden) x 80 layers x 131072 tokens ~ "312.5 GB", which is
    0.3125 TiB = 320 GiB = 343.6e9 bytes; with 8 KV heads of 64 it is 8x less."""
    no_gqa = _facts(layers=80, heads=64, kv_heads=64, hidden=8192)
    full = kv_bytes_per_token(no_gqa) * 131072
    assert full == 2 * 2 * 8192 * 80 * 131072 == 343_597_383_680
    assert full / 2**40 * 1000 == pytest.approx(312.5)
    assert full / GIB == 320
    assert kv_bytes_per_token(R1_70B) * 131072 == full / 8
    assert kv_bytes_per_token(R1_70B) == 327_680  # 2 x 80 x 8 x 128 x 2 B = 320 KiB


@pytest.mark.parametrize("model, kv_dtype, tp, pp, expected", [
    (LLAMA_8B, "auto", 1, 1, 131_072),          # 2 x 32 x 8 x 128 x 2
    (LLAMA_8B, "fp8", 1, 1, 65_536),
    (LLAMA_8B, "fp8_e5m2", 1, 1, 65_536),
    (R1_70B, "auto", 8, 1, 40_960),             # one KV head per GPU
    (R1_70B, "auto", 4, 2, 40_960),             # 2 heads, 40 layers
    (R1_70B, "auto", 8, 2, 20_480),
    (R1_70B, "auto", 16, 1, 40_960),            # TP > KV heads: heads are replicated
    (R1_70B, "auto", 8, 3, 2 * 27 * 1 * 128 * 2),  # uneven PP: the 27-layer stage binds
])
def test_kv_bytes_per_token(model, kv_dtype, tp, pp, expected):
    assert kv_bytes_per_token(model, kv_dtype, tp, pp) == expected


def test_kv_budget_and_reserve_formulas():
    assert kv_budget_bytes(100.0, 0.9, 50.0, 10.0) == pytest.approx(30.0)
    assert kv_budget_bytes(100.0, 0.5, 50.0, 10.0) == pytest.approx(-10.0)
    m = _facts(layers=1, heads=2, kv_heads=1, hidden=4, inter=8, vocab=10)
    assert activation_reserve_bytes(m, 2, 100, 3, 2.0) == 1.5 * GIB + 100 * (16 + 12) * 2 + 120


def test_gpu_table_uses_the_driver_reported_totals():
    assert set(GPUS) == {"A100-80GB", "A100-40GB", "H100-80GB", "H200-141GB", "L40S-48GB",
                         "A10G-24GB", "L4-24GB"}
    assert A100.memory_bytes / GIB == pytest.approx(79.15, abs=0.005)
    for gpu in GPUS.values():
        marketed = int(gpu.name.split("-")[1].removesuffix("GB"))  # read as GiB: an upper bound
        assert 0.9 * marketed * GIB < gpu.memory_bytes < marketed * GIB


@pytest.mark.parametrize("name, expected", [
    ("A100-80GB", (2048, 256)), ("A100-40GB", (2048, 256)), ("H100-80GB", (8192, 1024)),
    ("H200-141GB", (8192, 1024)), ("L4-24GB", (2048, 256)),
])
def test_batch_defaults_follow_vllm(name, expected):
    assert batch_defaults(GPUS[name]) == expected


def test_70b_tp8_on_a100_fits_with_a_million_kv_tokens():
    result = check(R1_70B, A100, {"tensor-parallel-size": 8})
    n = result.numbers
    assert result.ok, result.reasons
    assert n["weights_gib_per_gpu"] == pytest.approx(16.43, abs=0.01)
    assert n["kv_bytes_per_token_per_gpu"] == 40_960
    assert n["kv_bytes_per_token"] == 327_680
    assert 50 < n["kv_budget_gib_per_gpu"] < 56
    assert 1.3e6 < n["kv_tokens_capacity"] < 1.5e6
    assert (n["max_model_len"], n["max_num_seqs"], n["max_num_batched_tokens"]) == (
        131072, 256, 2048)
    assert n["max_resident_seqs"] == 10


def test_too_many_resident_sequences_is_a_warning_with_the_count():
    result = check(R1_70B, A100, {"tensor-parallel-size": 8, "max-num-seqs": 64})
    assert result.ok
    assert len(result.warnings) == 1
    assert "only 10 sequences" in result.warnings[0] and "max-num-seqs 64" in result.warnings[0]
    short = check(R1_70B, A100, {"tensor-parallel-size": 8, "max-num-seqs": 64,
                                 "max-model-len": 16384})
    assert short.ok and short.warnings == () and short.numbers["max_resident_seqs"] >= 64


@pytest.mark.parametrize("tp, util", [(1, None), (2, 0.80)])
def test_70b_weights_that_do_not_fit_name_the_numbers(tp, util):
    flags = {"tensor-parallel-size": tp, "gpu-memory-utilization": util}
    result = check(R1_70B, A100, flags)
    assert not result.ok
    (reason,) = result.reasons
    weights = f"{weight_bytes_per_gpu(R1_70B, tp, 1) / GIB:.2f} GiB"
    usable = f"{A100.memory_bytes * (util or DEFAULT_GPU_MEMORY_UTILIZATION) / GIB:.2f} GiB"
    assert reason.startswith(f"weights need {weights} per GPU (70.55B params over TP {tp}")
    assert usable in reason and "A100-80GB" in reason


def test_70b_tp2_fits_its_weights_but_not_a_128k_sequence():
    """70.55e9 x 2 B / 2 = 65.71 GiB of weights fit in 0.92 x 79.15 GiB, leaving ~5 GiB of KV
    cache: 34K tokens at 160 KiB per token per GPU, less than one 131072-token sequence."""
    result = check(R1_70B, A100, {"tensor-parallel-size": 2})
    assert not result.ok
    (reason,) = result.reasons
    assert reason.startswith("one 131072-token sequence needs 20.00 GiB of KV cache per GPU")
    assert "65.71 GiB of weights" in reason
    assert 30_000 < result.numbers["kv_tokens_capacity"] < 40_000
    assert f"fits is {int(result.numbers['kv_tokens_capacity'])}" in reason
    assert check(R1_70B, A100, {"tensor-parallel-size": 2, "max-model-len": 16384}).ok


def test_tp_must_divide_the_heads():
    result = check(R1_70B, A100, {"tensor-parallel-size": 3})
    assert not result.ok
    assert result.reasons[0] == R1_70B.info.tp_problem(3)
    assert "64 attention heads" in result.reasons[0]


@pytest.mark.parametrize("flags, fragment", [
    ({"enable-chunked-prefill": False, "max-num-batched-tokens": 16384, "max-model-len": 32768},
     "with chunked prefill off, max-num-batched-tokens 16384 must be >= max-model-len 32768"),
    ({"max-model-len": 262144}, "max-model-len 262144 exceeds the model's "
                                "max_position_embeddings 131072"),
    ({"max-num-batched-tokens": 2048, "max-num-seqs": 4096}, "must be >= max-num-seqs 4096"),
    ({"pipeline-parallel-size": 81}, "pipeline parallel size 81 is outside 1..80"),
])
def test_static_rules_reject(flags, fragment):
    result = check(R1_70B, A100, {"tensor-parallel-size": 8, **flags})
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


def test_chunked_prefill_off_with_defaults_raises_the_token_budget_like_vllm():
    result = check(R1_70B, A100, {"tensor-parallel-size": 8, "enable-chunked-prefill": False,
                                  "max-model-len": 32768})
    assert result.ok
    assert result.numbers["max_num_batched_tokens"] == 32768


def test_uneven_pipeline_stages_are_allowed():
    assert check(R1_70B, H100, {"tensor-parallel-size": 8, "pipeline-parallel-size": 3}).ok


def test_world_size_bounded_by_the_gpus_at_hand():
    result = check(R1_70B, H100, {"tensor-parallel-size": 8, "pipeline-parallel-size": 2},
                   num_gpus=8)
    assert result.reasons == ("TP 8 x PP 2 = 16 workers, but only 8 devices are available",)


def test_fp8_kv_cache_doubles_capacity_at_the_same_budget():
    base = check(R1_70B, A100, {"tensor-parallel-size": 8}).numbers
    fp8 = check(R1_70B, A100, {"tensor-parallel-size": 8, "kv-cache-dtype": "fp8"}).numbers
    assert fp8["kv_bytes_per_token"] == base["kv_bytes_per_token"] / 2
    assert fp8["kv_tokens_capacity"] == pytest.approx(2 * base["kv_tokens_capacity"], abs=2)


def test_auto_max_model_len_fits_to_memory():
    result = check(R1_70B, A100, {"tensor-parallel-size": 2, "max-model-len": -1})
    assert result.ok
    assert result.numbers["max_model_len"] == result.numbers["kv_tokens_capacity"]


def test_unknown_kv_dtype_is_a_warning():
    result = check(LLAMA_8B, H100, {"kv-cache-dtype": "turboquant_k8v4", "max-model-len": 8192,
                                    "max-num-seqs": 64})
    assert result.ok
    assert any("'turboquant_k8v4' is unknown" in w for w in result.warnings)


def test_8b_on_one_h100_at_vllm_defaults():
    result = check(LLAMA_8B, H100, {})
    n = result.numbers
    assert result.ok
    assert n["weights_gib_per_gpu"] == pytest.approx(14.96, abs=0.01)
    assert n["kv_bytes_per_token_per_gpu"] == 131_072
    assert (n["max_num_batched_tokens"], n["max_num_seqs"]) == (8192, 1024)
    assert 50 < n["kv_budget_gib_per_gpu"] < 57
    assert 4.0e5 < n["kv_tokens_capacity"] < 4.7e5
    assert n["max_resident_seqs"] == 3


@pytest.mark.parametrize("tp, pp, weights_gib, kv_per_gpu", [
    (4, 1, 32.85, 81_920), (8, 1, 16.43, 40_960), (4, 2, 16.43, 40_960), (8, 2, 8.21, 20_480),
])
def test_70b_on_h100_nodes_every_shape_fits(tp, pp, weights_gib, kv_per_gpu):
    result = check(R1_70B, H100, {"tensor-parallel-size": tp, "pipeline-parallel-size": pp},
                   num_gpus=16)
    assert result.ok, result.reasons
    assert result.numbers["weights_gib_per_gpu"] == pytest.approx(weights_gib, abs=0.01)
    assert result.numbers["kv_bytes_per_token_per_gpu"] == kv_per_gpu
    assert result.numbers["max_resident_seqs"] >= 3


def test_8b_does_not_hold_a_128k_sequence_on_an_l4():
    result = check(LLAMA_8B, GPUS["L4-24GB"], {})
    assert not result.ok
    assert "one 131072-token sequence needs 16.00 GiB" in result.reasons[0]
    assert check(LLAMA_8B, GPUS["L4-24GB"], {"max-model-len": 8192}).ok


def test_cpu_engine_quickstart_fits_in_one_gib():
    tiny = read_model_facts(REPO / "models" / "tiny-llama")
    result = check_cpu(tiny, 1.0, {"max-model-len": 512, "enforce-eager": True})
    assert result.ok
    assert result.numbers["kv_bytes_per_token"] == 2 * tiny.info.num_layers * \
        tiny.info.num_kv_heads * tiny.dim * 2
    assert result.numbers["kv_budget_gib_per_gpu"] == 1.0
    assert result.numbers["max_num_seqs"] == 128


def test_cpu_engine_rejects_a_sequence_larger_than_the_kv_space():
    result = check_cpu(R1_70B, 1.0, {"max-model-len": 8192})
    assert not result.ok
    assert "1.00 GiB is set aside (VLLM_CPU_KVCACHE_SPACE=1 GiB)" in result.reasons[0]
    assert "longest max-model-len that fits is 3276" in result.reasons[0]


SPACES = sorted((REPO / "search_spaces").glob("*.yaml"))
SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))
GPU_OF_SPACE = {"llama70b_8xa100": A100, "llama8b_1xh100": H100, "llama70b_2x8_multinode": H100}


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_every_shipped_search_space_loads(path):
    assert load_search_space(path).parameters


@pytest.mark.parametrize("stem", sorted(GPU_OF_SPACE))
def test_gpu_space_defaults_are_vllms(stem):
    defaults = load_search_space(REPO / "search_spaces" / f"{stem}.yaml").defaults()
    tokens, seqs = batch_defaults(GPU_OF_SPACE[stem])
    assert defaults["max-num-batched-tokens"] == tokens
    assert defaults["max-num-seqs"] == seqs
    assert defaults["gpu-memory-utilization"] == DEFAULT_GPU_MEMORY_UTILIZATION
    assert defaults["max-model-len"] == 131072
    assert (defaults["enable-chunked-prefill"], defaults["enable-prefix-caching"]) == (True, True)
    assert defaults["kv-cache-dtype"] == "auto"


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_shipped_sweep_loads(path, monkeypatch):
    monkeypatch.chdir(REPO)
    loaded = sweep.load(path.relative_to(REPO), check_flags=False)
    assert loaded.spec.name


@pytest.mark.parametrize("stem", sorted(GPU_OF_SPACE))
def test_gpu_sweeps_name_their_gpu(stem, monkeypatch):
    monkeypatch.chdir(REPO)
    assert sweep.load(Path("sweeps") / f"{stem}.yaml", check_flags=False).spec.gpu == \
        GPU_OF_SPACE[stem].name


@pytest.mark.parametrize("stem", sorted(GPU_OF_SPACE))
def test_gpu_sweeps_at_space_defaults_are_feasible_for_some_tp(stem):
    space = load_search_space(REPO / "search_spaces" / f"{stem}.yaml")
    tp_param = space.parameters.get("tensor-parallel-size")
    tps = list(getattr(tp_param, "choices", (1,)))
    model = R1_70B if "70b" in stem else LLAMA_8B
    results = [check(model, GPU_OF_SPACE[stem], {**space.defaults(), "tensor-parallel-size": tp})
               for tp in tps]
    assert any(r.ok for r in results)
