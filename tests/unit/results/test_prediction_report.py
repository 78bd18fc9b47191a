"""The report's "Predicted vs measured" numbers (framework/results/prediction_report.py), on
rows built here with a planted error: expected values derived from it."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from framework.results.prediction_report import corrected_loo
from framework.results.prediction_report import errors
from framework.results.prediction_report import flag_errors
from framework.results.prediction_report import memory_check
from framework.results.prediction_report import prediction_section


def _rows() -> pd.DataFrame:
    """8 measured trials: the model predicts 1000 tok/s; fp8 runs 20% faster than predicted and
    auto 20% slower, whatever max-num-seqs; one failed trial and one without a prediction."""
    rows = []
    for i, (kv, seqs) in enumerate((k, s) for k in ("auto", "fp8") for s in (8, 16, 32, 64)):
        rows.append({"trial_number": i, "state": "COMPLETE", "param_kv_cache_dtype": kv,
                     "param_max_num_seqs": seqs, "predicted_output_throughput": 1000.0,
                     "output_throughput": 1200.0 if kv == "fp8" else 800.0,
                     "predicted_p99_tpot_ms": 10.0, "p99_tpot_ms": 10.0, "predictor": "m"})
    rows.append({"trial_number": 8, "state": "FAIL", "predicted_output_throughput": 1000.0})
    rows.append({"trial_number": 9, "state": "COMPLETE", "output_throughput": 5.0,
                 "predicted_output_throughput": None})
    return pd.DataFrame(rows)


def test_mape_with_its_interval_and_the_bias():
    found = {e.metric: e for e in errors(_rows())}
    tput = found["output_throughput"]
    # |1000 - 800| / 800 = 0.25 (4 trials), |1000 - 1200| / 1200 = 1/6 (4): mean 0.2083
    assert tput.n == 8 and tput.mape == pytest.approx((0.25 + 1 / 6) / 2)
    assert tput.low <= tput.mape <= tput.high and tput.low >= 1 / 6 and tput.high <= 0.25
    assert tput.bias == pytest.approx(1.0)  # median of 0.8 x 4 and 1.2 x 4
    assert found["p99_tpot_ms"].mape == 0.0
    assert set(found) == {"output_throughput", "p99_tpot_ms"}  # no other metric predicted


def test_the_flag_the_model_got_wrong_comes_first():
    name, means = flag_errors(_rows(), "output_throughput")[0]
    assert name == "kv_cache_dtype"
    assert means == pytest.approx({"auto": math.log(0.8), "fp8": math.log(1.2)})


def test_the_correction_judged_leave_one_out_removes_a_flag_error():
    raw, loo = corrected_loo(_rows(), "output_throughput")
    assert raw == pytest.approx((0.25 + 1 / 6) / 2)
    assert loo < raw / 2  # fp8 vs auto is learned from the other seven


def test_the_section_says_when_there_is_nothing_to_show():
    assert "No predictions" in prediction_section(pd.DataFrame(), "output_throughput")
    html = prediction_section(_rows(), "output_throughput")
    assert "<td>output_throughput</td>" in html and "kv_cache_dtype" in html
    assert "leave-one-out" in html


def test_the_predictors_memory_is_set_beside_ours():
    rows = pd.DataFrame([
        {"predicted_weights_gib_per_gpu": 33.0, "est_weights_gib_per_gpu": 30.0,
         "predicted_kv_gib_per_gpu": 30.0, "est_kv_budget_gib_per_gpu": 40.0},
        {"predicted_weights_gib_per_gpu": 16.5, "est_weights_gib_per_gpu": 15.0,
         "predicted_kv_gib_per_gpu": -2.0, "est_kv_budget_gib_per_gpu": 10.0},  # no room: out
        {"predicted_weights_gib_per_gpu": None, "est_weights_gib_per_gpu": 15.0},
    ])
    # weights 33/30 = 16.5/15 = 1.1; KV only the first trial, 30/40
    assert memory_check(rows) == [("weights", 2, pytest.approx(1.1)),
                                  ("KV cache space", 1, pytest.approx(0.75))]
    assert memory_check(pd.DataFrame()) == []
