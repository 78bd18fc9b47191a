"""search.prior (framework/sweep/prior.py) with a named stand-in predictor whose step time is a
formula (no extra needed): ranking, the SLA and fit filters, the refit cadence, and the
reasons a prior is off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from framework.engine.predictor import Deployment
from framework.engine.predictor import MemoryEstimate
from framework.engine.step_time import StepShape
from framework.engine.step_time import StepTime
from framework.sweep import prior as prior_module
from framework.sweep.loader import load
from framework.sweep.prior import Prior
from framework.sweep.prior import off_reason

LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
            "vocab_size": 128256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
            "model_type": "llama"}


class Formula:
    """A stand-in predictor (not AIConfigurator): a step takes 2 ms + 0.01 ms per prefill token
    + 0.1 ms per decoding sequence, divided by TP; 1000 KV blocks per GPU."""

    name = "formula"

    def unavailable(self) -> str | None:
        return None

    def supports(self, d: Deployment) -> str | None:
        return None

    def step_time(self, d: Deployment) -> StepTime:
        return lambda s: (2 + 0.01 * s.prefill_tokens + 0.1 * s.decode_seqs) / d.tensor_parallel \
            if not s.empty else 0.0

    def memory(self, d: Deployment) -> MemoryEstimate | None:
        return MemoryEstimate(weights_gib=15.0 / d.tensor_parallel, kv_gib=10.0, kv_blocks=1000,
                              source=self.name)


def _sweep(tmp: Path, sla: dict, extra: dict | None = None, space: dict | None = None) -> Path:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(LLAMA_8B))
    (tmp / "space.yaml").write_text(yaml.safe_dump({"parameters": space or {
        "max-num-seqs": {"type": "int", "low": 2, "high": 64, "log": True, "default": 64},
        "tensor-parallel-size": {"type": "categorical", "choices": [1, 2], "default": 1},
    }}))
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump({
        "name": "p", "model": str(model), "search_space": str(tmp / "space.yaml"),
        "engine": "fake", "gpu": "H100-80GB",
        "workload": {"dataset": "random", "num_prompts": 32, "input_len": 100, "output_len": 20,
                     "max_concurrency": 16},
        "objective": {"metric": "output_throughput_per_gpu", "direction": "maximize"},
        "sla": sla, "search": {"prior": "aiconfigurator", "prior_refit_every": 2},
        "results_dir": str(tmp / "results"), **(extra or {})}))
    return path


def test_the_prior_ranks_by_predicted_objective_within_the_sla(tmp_path):
    prior = Prior(load(_sweep(tmp_path, {"p99_tpot_ms": 2.5}), check_flags=False), Formula())
    cands = prior.candidates()
    # coarse values of a log int range 2..64: its powers of 2; x TP {1, 2}
    assert sorted({c["max-num-seqs"] for c in cands}) == [2, 4, 8, 16, 32, 64] and len(cands) == 12
    ranked = prior.ranked(cands)
    for params in ranked:  # each holds the SLA by its own prediction
        prediction = prior.of(params)
        assert prediction is not None and prediction.metrics["p99_tpot_ms"] <= 2.5
    # TPOT at TP 1 with 16 decoding: (2 + 1.6) ms > 2.5: more than 8 seqs at TP 1 are left out
    assert {(p["tensor-parallel-size"], p["max-num-seqs"]) for p in ranked if
            p["tensor-parallel-size"] == 1} <= {(1, 2), (1, 4), (1, 8)}
    values = [prior.value(p, prior.of(p)) for p in ranked]
    assert values == sorted(values, reverse=True)  # best first
    assert prior.first(2) == ranked[:2]


def test_prediction_columns_follow_the_trials_own_flags(tmp_path):
    prior = Prior(load(_sweep(tmp_path, {}), check_flags=False), Formula())
    small = prior.columns({"max-num-seqs": 2, "tensor-parallel-size": 1}, False)
    large = prior.columns({"max-num-seqs": 64, "tensor-parallel-size": 1}, False)
    assert small is not None and large is not None
    assert small["predictor"] == "formula" and small["predicted_kv_blocks"] == 1000
    # 2 seats for 16 in flight: the rest queue; 64 seats serve all 16 at once
    assert small["predicted_p99_ttft_ms"] > large["predicted_p99_ttft_ms"]
    assert small["predicted_output_throughput"] < large["predicted_output_throughput"]


def test_the_refit_comes_every_n_measured_trials_and_skips_what_was_tried(tmp_path):
    prior = Prior(load(_sweep(tmp_path, {}), check_flags=False), Formula())
    tried: list[dict] = []
    picks = []
    for params in prior.ranked(prior.candidates())[:4]:
        tried.append(params)
        measured = dict(prior.of(params).metrics)  # type: ignore[union-attr]
        measured["output_throughput"] *= 0.5 if params["tensor-parallel-size"] == 2 else 1.5
        prior.observe(params, {"state": "COMPLETE", **measured})
        picks.append(prior.corrected_next(tried))
    assert picks[0] is None and picks[2] is None  # every 2 measured trials
    assert picks[1] is not None and picks[1] not in tried[:2]
    # this cluster runs TP 1 faster and TP 2 slower than the formula: the correction says so
    assert picks[3] is not None and picks[3]["tensor-parallel-size"] == 1


def test_the_memory_model_judges_each_configuration_once_across_refits(tmp_path, monkeypatch):
    """Prior.fits caches feasibility's verdict by trial flags: a refit's ranking of the whole
    space (every prior_refit_every measured trials) runs the memory model for none again."""
    judged: list[dict] = []
    real = prior_module.feasibility

    def counted(sweep, flags, *rest):
        judged.append(dict(flags))
        return real(sweep, flags, *rest)

    monkeypatch.setattr(prior_module, "feasibility", counted)
    prior = Prior(load(_sweep(tmp_path, {}), check_flags=False), Formula())
    first = prior.ranked(prior.candidates())
    once = len(judged)
    assert 0 < once <= len(prior.candidates())
    assert prior.ranked(prior.candidates()) == first and len(judged) == once


@pytest.mark.parametrize("change, says", [
    ({"engine": "cpu", "gpu": None}, "set `gpu:`"),
    ({"workload": {"dataset": "prefix-shared"}}, "not dataset prefix-shared"),
])
def test_off_reasons_are_one_line(tmp_path, change, says):
    sweep = load(_sweep(tmp_path, {}, change), check_flags=False)
    reason = off_reason(sweep)
    assert reason is not None and says in reason and "\n" not in reason


def test_an_unknown_predictor_is_a_config_error(tmp_path):
    from framework.base.errors import ConfigError
    path = _sweep(tmp_path, {})
    path.write_text(path.read_text().replace("prior: aiconfigurator", "prior: aiconfigurater"))
    with pytest.raises(ConfigError, match="search.prior.*aiconfigurater.*unknown predictor"):
        load(path, check_flags=False)


def test_a_step_shape_is_what_the_formula_is_given():
    assert Formula().step_time(Deployment(model=Path("."), gpu="H100-80GB"))(
        StepShape(100, 100, 4, 50)) == pytest.approx(2 + 1 + 0.4)
