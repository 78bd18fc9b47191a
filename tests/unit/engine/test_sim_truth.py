"""The simulated truth (framework/engine/sim_truth.py): a seeded, smooth, per-configuration error
field of the stated size; the prefill/decode blend; run-to-run and per-step noise."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from framework.engine.sim_truth import TYPICAL
from framework.engine.sim_truth import TruthStepTime
from framework.engine.sim_truth import error_factor
from framework.engine.sim_truth import features
from framework.engine.sim_truth import lognormal_factor
from framework.engine.sim_truth import noisy
from framework.engine.sim_truth import truth_step_time
from framework.engine.step_time import StepShape


def analytic(step: StepShape) -> float:
    return 5 + 0.01 * step.prefill_tokens + 0.05 * step.decode_seqs


def off_grid(seed: int, n: int = 200) -> list[dict[str, object]]:
    """Typical configurations that are not TYPICAL's grid points."""
    rng = random.Random(seed)
    return [{"tensor-parallel-size": rng.choice([1, 2, 4, 8]),
             "pipeline-parallel-size": rng.choice([1, 2, 4]),
             "max-num-seqs": rng.choice([8, 24, 48, 96, 128, 192, 384, 512, 768]),
             "max-num-batched-tokens": rng.choice([1024, 4096, 6144, 12288]),
             "enable-chunked-prefill": rng.random() < 0.5,
             "kv-cache-dtype": rng.choice(["auto", "fp8"])} for _ in range(n)]


@pytest.mark.parametrize("config, expected", [
    # absent keys: TP 1, PP 1, 1024 seqs, 8192 tokens, chunked on, kv auto
    ({}, (0.0, 0.0, 10 / 7, 13 / 5, 1.0, 0.0)),
    ({"tensor-parallel-size": 8, "pipeline-parallel-size": "4", "max-num-seqs": 128,
      "max-num-batched-tokens": 512, "enable-chunked-prefill": "false", "kv-cache-dtype": "fp8"},
     (1.0, 1.0, 1.0, 9 / 5, 0.0, 1.0)),
])
def test_features_are_log2_sizes_over_their_span_and_two_switches(config, expected):
    assert features(config) == pytest.approx(expected)


@pytest.mark.parametrize("error_size", [0.1, 0.3, 0.45])
@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_the_error_has_the_stated_size(error_size, kind):
    """Normalised on TYPICAL: mean |factor - 1| = error_size there. On other typical
    configurations, the same order (a 200-point sample of a smooth field: within 0.6-1.5x)."""
    on_grid = [abs(error_factor(c, error_size, 3, kind) - 1) for c in TYPICAL]
    assert statistics.fmean(on_grid) == pytest.approx(error_size, rel=1e-6)
    elsewhere = [abs(error_factor(c, error_size, 3, kind) - 1) for c in off_grid(11)]
    assert 0.6 * error_size < statistics.fmean(elsewhere) < 1.5 * error_size


def test_the_field_is_smooth_nearby_configurations_are_close():
    """The field's lengthscale is a flag's whole range, so a 1/16-octave step of max-num-seqs
    moves log(factor) by at most a tenth of the error size, while across configurations the
    factors spread by about the error size."""
    error_size = 0.3
    for config in off_grid(5, 60):
        near = dict(config, **{"max-num-seqs": float(str(config["max-num-seqs"])) * 2 ** (1 / 16)})
        step = math.log(error_factor(near, error_size, 0, "decode") /
                        error_factor(config, error_size, 0, "decode"))
        assert abs(step) < 0.1 * error_size
    spread = [error_factor(c, error_size, 0, "decode") for c in TYPICAL]
    assert max(spread) / min(spread) > 1 + 2 * error_size


def test_the_field_is_deterministic_by_seed_and_independent_per_kind():
    config = {"tensor-parallel-size": 2, "max-num-seqs": 64}
    assert error_factor(config, 0.3, 4, "prefill") == error_factor(dict(config), 0.3, 4, "prefill")
    others = {error_factor(config, 0.3, seed, "prefill") for seed in range(5)}
    assert len(others) == 5
    assert error_factor(config, 0.3, 4, "prefill") != error_factor(config, 0.3, 4, "decode")
    assert error_factor(config, 0.0, 4, "prefill") == 1.0


@pytest.mark.parametrize("step, expected", [
    # prefill alone: x prefill factor 2.0 (5 + 5 ms)
    (StepShape(500, 500, 0, 0), 10 * 2.0),
    # decode alone: x decode factor 0.5 (5 + 5 ms)
    (StepShape(0, 0, 100, 300), 10 * 0.5),
    # mixed, t_p = 5 + 5 = t_d = 5 + 5: w = 1/2, 2^0.5 x 0.5^0.5 = 1, so the model's 15 ms
    (StepShape(500, 500, 100, 300), 15.0),
    # mixed, t_p = 5 + 15 = 20, t_d = 5 + 5 = 10: w = 2/3, factor 2^(2/3) x 0.5^(1/3) = 2^(1/3)
    (StepShape(1500, 1500, 100, 300), 25 * 2 ** (1 / 3)),
])
def test_truth_blends_its_prefill_and_decode_factors_by_the_models_time_shares(step, expected):
    assert TruthStepTime(analytic, 2.0, 0.5)(step) == pytest.approx(expected)


def test_truth_without_error_is_the_model():
    truth = truth_step_time(analytic, {"max-num-seqs": 16}, 0.0, 1)
    step = StepShape(300, 300, 7, 1000)
    assert truth(step) == analytic(step)


def test_lognormal_factor_has_mean_one_and_the_stated_cv():
    """5000 draws: the sample mean within 4 standard errors (4 x 0.02 / sqrt(5000)) of 1, the
    sample CV within 10% of 0.02 (its standard error is ~1% of it)."""
    rng = random.Random(0)
    draws = [lognormal_factor(0.02, rng) for _ in range(5000)]
    assert abs(statistics.fmean(draws) - 1) < 4 * 0.02 / math.sqrt(5000)
    assert statistics.pstdev(draws) / statistics.fmean(draws) == pytest.approx(0.02, rel=0.1)
    assert lognormal_factor(0.0, rng) == 1.0


def test_noisy_draws_one_factor_per_run_and_jitters_each_step():
    step = StepShape(0, 0, 20, 500)  # 6 ms
    quiet = noisy(analytic, 0.0, random.Random(1), step_cv=0.0)
    assert quiet(step) == analytic(step)
    runs = [noisy(analytic, 0.02, random.Random(seed), step_cv=0.0) for seed in range(3)]
    assert len({run(step) for run in runs}) == 3  # each server run its own speed
    assert all(run(step) == run(step) for run in runs)  # constant within a run
    jittery = noisy(analytic, 0.0, random.Random(2), step_cv=0.01)
    times = [jittery(step) for _ in range(2000)]
    assert statistics.pstdev(times) / statistics.fmean(times) == pytest.approx(0.01, rel=0.1)
