"""The predictor seam (framework/engine/predictor.py): one contract suite run over every
registered predictor (as Optuna runs one storage suite over every storage), then the registry.

The deployment is Llama-3.1-70B (AIConfigurator's shipped config.json, copied into a model
folder) on H100-80GB. Bounds are worked from the model's shape and the H100 SXM datasheet
(aiconfigurator_core/systems/h100_sxm.yaml carries the same figures): 3.35 TB/s HBM3, 989
TFLOP/s dense BF16. Parameters: 70.55e9 (memory_model.param_count: V x H x 2 + 80 layers of
2 x H x 64 x 128 + 2 x H x 8 x 128 + 3 x H x 28672, H = 8192, V = 128256), 2 bytes each.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from importlib.util import find_spec
from pathlib import Path

import pytest

from framework.engine import memory_model as mm
from framework.engine.predictor import PREDICTORS
from framework.engine.predictor import Deployment
from framework.engine.predictor import Predictor
from framework.engine.predictor import off_reason
from framework.engine.predictor import predictor
from framework.engine.step_time import StepShape
from tests.paths import ROOT

LLAMA_70B_JSON = "meta-llama--Meta-Llama-3.1-70B_config.json"
HBM_BYTES_PER_S = 3.35e12
BF16_FLOP_PER_S = 989e12
# Room for kernels below peak (the SDK's own h100_sxm.yaml derates HBM to 0.8) and for what a
# bound leaves out (attention, all-reduces, launches): a step beyond 4x its bound is a
# predictor off by a large factor, not an inefficient kernel.
ROOFLINE_SLACK = 4.0


def _copy_llama_70b(folder: Path) -> Path:
    spec = find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("aiconfigurator-core (the `predict` extra) is not installed")
    source = Path(next(iter(spec.submodule_search_locations))) / "model_configs" / LLAMA_70B_JSON
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, folder / "config.json")
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _copy_llama_70b(tmp_path_factory.mktemp("models") / "llama-3.1-70b")


@pytest.fixture(scope="module", params=sorted(PREDICTORS))
def pred(request: pytest.FixtureRequest) -> Predictor:
    p = predictor(request.param)
    off = p.unavailable()
    if off is not None:
        pytest.skip(off)
    return p


@pytest.fixture(scope="module")
def tp8(model_dir: Path) -> Deployment:
    return Deployment(model_dir, "H100-80GB", tensor_parallel=8)


def _facts(d: Deployment) -> mm.ModelFacts:
    return mm.read_model_facts(d.model)


# -- step time ------------------------------------------------------------------------------

def test_a_step_takes_positive_finite_time_and_an_empty_one_none(pred, tp8):
    assert pred.supports(tp8) is None
    step_time = pred.step_time(tp8)
    for shape in (StepShape(0, 0, 1, 1), StepShape(0, 0, 32, 1024), StepShape(2048, 2048, 0, 0),
                  StepShape(512, 4096, 32, 1024),  # a chunk of a longer prompt, with decodes
                  StepShape(1, 1, 0, 0)):
        ms = step_time(shape)
        assert math.isfinite(ms) and ms > 0, shape
    assert step_time(StepShape(0, 0, 0, 0)) == 0.0


def test_decode_steps_do_not_get_cheaper_with_more_sequences_or_longer_contexts(pred, tp8):
    """More sequences: more GEMM rows and KV to read; longer contexts: more KV to read."""
    step_time = pred.step_time(tp8)
    by_seqs = [step_time(StepShape(0, 0, n, 1024)) for n in (1, 8, 32, 128, 512, 1024)]
    by_context = [step_time(StepShape(0, 0, 32, c)) for c in (1, 128, 1024, 4096, 16384)]
    assert by_seqs == sorted(by_seqs)
    assert by_context == sorted(by_context)
    assert by_seqs[-1] > by_seqs[0] and by_context[-1] > by_context[0]


def test_a_prefill_of_2048_tokens_costs_more_than_one_of_256(pred, tp8):
    step_time = pred.step_time(tp8)
    assert step_time(StepShape(2048, 2048, 0, 0)) > step_time(StepShape(256, 256, 0, 0))


def test_steps_sit_above_their_roofline_and_within_its_slack(pred, tp8):
    """Decode of 32 x 1024 tokens: each GPU reads its weights once (params x 2 B / 8) and the
    batch's KV (32 x 1024 x 2 x 80 layers x 1 KV head x 128 x 2 B): 17.6 GB + 1.3 GB over
    3.35 TB/s = 5.7 ms. Prefill of 2048 tokens: 2 x params x 2048 / 8 FLOP per GPU (36.1
    TFLOP; attention adds more) over 989 TFLOP/s = 36.5 ms."""
    m, step_time = _facts(tp8), pred.step_time(tp8)
    weights = mm.weight_bytes_per_gpu(m, 8, 1)
    kv = 32 * 1024 * mm.kv_bytes_per_token(m, "auto", 8, 1)
    decode_bound_ms = (weights + kv) / HBM_BYTES_PER_S * 1e3
    prefill_bound_ms = 2 * mm.param_count(m) * 2048 / 8 / BF16_FLOP_PER_S * 1e3
    assert decode_bound_ms == pytest.approx(5.66, abs=0.01)
    assert prefill_bound_ms == pytest.approx(36.5, abs=0.1)
    decode_ms = step_time(StepShape(0, 0, 32, 1024))
    prefill_ms = step_time(StepShape(2048, 2048, 0, 0))
    assert decode_bound_ms <= decode_ms <= ROOFLINE_SLACK * decode_bound_ms
    assert prefill_bound_ms <= prefill_ms <= ROOFLINE_SLACK * prefill_bound_ms


def test_tp8_steps_are_faster_than_tp4(pred, tp8):
    """Each GPU holds and reads half the weights and computes half the FLOPs; NVLink
    all-reduces cost less than that saves."""
    fast, slow = pred.step_time(tp8), pred.step_time(replace(tp8, tensor_parallel=4))
    for shape in (StepShape(0, 0, 32, 1024), StepShape(2048, 2048, 0, 0),
                  StepShape(512, 2048, 64, 2048)):
        assert fast(shape) < slow(shape), shape


# -- memory ---------------------------------------------------------------------------------

def test_weights_per_gpu_fall_with_tp_as_params_x_2_bytes_over_tp(pred, tp8):
    """70.55e9 x 2 B / TP: 32.85 GiB at TP 4, 16.43 GiB at TP 8."""
    m = _facts(tp8)
    for tp, gib in ((4, 32.85), (8, 16.43)):
        estimate = pred.memory(replace(tp8, tensor_parallel=tp))
        assert estimate is not None
        assert mm.weight_bytes_per_gpu(m, tp, 1) / mm.GIB == pytest.approx(gib, abs=0.01)
        assert estimate.weights_gib == pytest.approx(gib, rel=0.02)


def test_fp8_kv_holds_twice_the_blocks_of_auto(pred, tp8):
    """The budget does not depend on the KV dtype; a block of fp8 takes 1 byte a value where
    bf16 (`auto` for this checkpoint) takes 2: twice the blocks, to a block. Each estimate's
    blocks fill its KV GiB: 16 tokens x 2 x 80 layers x 1 KV head x 128 x bytes each."""
    m = _facts(tp8)
    auto = pred.memory(tp8)
    fp8 = pred.memory(replace(tp8, kv_cache_dtype="fp8"))
    assert auto is not None and fp8 is not None and auto.kv_gib > 0
    assert fp8.kv_blocks == pytest.approx(2 * auto.kv_blocks, abs=2)
    for estimate, dtype in ((auto, "auto"), (fp8, "fp8")):
        block_bytes = 16 * mm.kv_bytes_per_token(m, dtype, 8, 1)
        assert estimate.kv_blocks == int(estimate.kv_gib * mm.GIB // block_bytes)


def test_a_pipeline_stage_caches_its_own_layers_only(pred, tp8):
    """At PP 2 each GPU holds half the layers: half the weights (a larger budget) and half the
    KV bytes per token (vLLM allocates KV for a stage's own layers), so more than twice the
    blocks of PP 1."""
    one = pred.memory(replace(tp8, tensor_parallel=4))
    two = pred.memory(replace(tp8, tensor_parallel=4, pipeline_parallel=2))
    assert one is not None and two is not None and one.kv_blocks > 0
    assert two.weights_gib == pytest.approx(one.weights_gib / 2, rel=0.02)
    assert two.kv_blocks > 2 * one.kv_blocks


def test_what_does_not_fit_has_negative_kv_and_no_blocks(pred, tp8):
    """TP 1: 131.4 GiB of weights on a 79.1 GiB GPU."""
    estimate = pred.memory(replace(tp8, tensor_parallel=1))
    assert estimate is not None
    assert estimate.kv_gib < 0 and estimate.kv_blocks == 0


# -- refusals -------------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "named"), [
    ({"gpu": "A10G-24GB"}, "A10G-24GB"),  # in GPUS, without AIConfigurator tables
    ({"tensor_parallel": 3}, "3"),  # does not divide 64 heads
    ({"model": Path("/nonexistent/model")}, "config.json"),
])
def test_what_it_cannot_predict_is_refused_with_one_line(pred, tp8, change, named):
    d = replace(tp8, **change)
    reason = pred.supports(d)
    assert reason is not None and named in reason and "\n" not in reason
    assert pred.memory(d) is None
    with pytest.raises(ValueError, match="."):
        pred.step_time(d)


# -- the registry ---------------------------------------------------------------------------

def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as caught:
        predictor("no-such-predictor")
    assert all(name in str(caught.value) for name in PREDICTORS)
    with pytest.raises(ValueError, match="no-such-predictor"):
        off_reason("no-such-predictor")


def test_without_the_extra_aiconfigurator_is_off_in_one_line(monkeypatch, tmp_path):
    """`None` in sys.modules makes `import aiconfigurator_core` fail as if not installed."""
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)
    p = predictor("aiconfigurator")
    reason = p.unavailable()
    assert reason is not None and "\n" not in reason
    assert "pip install 'vllm-sweep[predict]'" in reason and "off" in reason
    assert off_reason("aiconfigurator") == reason
    d = Deployment(tmp_path, "H100-80GB")
    assert p.supports(d) == reason
    assert p.memory(d) is None
    with pytest.raises(ValueError, match="predict"):
        p.step_time(d)


def test_the_registry_imports_no_sdk_and_the_sdk_prints_nothing(tmp_path):
    """A fresh interpreter: importing the seam and its implementation loads no
    aiconfigurator_core; a first compile (which logs "Loading low-fidelity fallback rows"
    warnings on H100 tables) and a memory estimate leave stdout and stderr empty."""
    model = _copy_llama_70b(tmp_path / "llama")
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from framework.engine import predict_aiconfigurator, predictor
        assert "aiconfigurator_core" not in sys.modules
        p = predictor.predictor("aiconfigurator")
        d = predictor.Deployment(Path({str(model)!r}), "H100-80GB", tensor_parallel=8)
        from framework.engine.step_time import StepShape
        assert p.step_time(d)(StepShape(0, 0, 8, 512)) > 0
        assert p.memory(d) is not None
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""


def test_an_unset_max_model_len_is_the_models_own_as_in_vllm(model_dir, tmp_path):
    """Deployment.model_max_len: the flag, else config.json's max_position_embeddings (the
    70B's 131072), else 2048 (no config.json); unchunked, the unset budget follows it."""
    assert Deployment(model_dir, "H100-80GB").model_max_len() == 131072
    assert Deployment(model_dir, "H100-80GB", max_model_len=8192).model_max_len() == 8192
    assert Deployment(tmp_path, "H100-80GB").model_max_len() == 2048
    unchunked = Deployment(model_dir, "H100-80GB", enable_chunked_prefill=False)
    assert unchunked.batch_limits() == (131072, 1024)
    assert replace(unchunked, enable_chunked_prefill=True).batch_limits() == (8192, 1024)
