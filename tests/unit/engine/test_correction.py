"""The per-cluster correction of a predictor (framework/engine/correction.py)."""

from __future__ import annotations

import math

import pytest

from framework.engine.correction import fit
from framework.engine.correction import mape


@pytest.mark.parametrize(("params", "expected"), [
    ({"max-num-seqs": 64}, {"max-num-seqs": 6.0}),  # log2(64)
    ({"enable-chunked-prefill": True}, {"enable-chunked-prefill": 1.0}),
    ({"kv-cache-dtype": "fp8"}, {"kv-cache-dtype=fp8": 1.0}),
    ({"gpu-memory-utilization": 0.5}, {"gpu-memory-utilization": -1.0}),  # log2(1/2)
    ({"replicas": None}, {}),  # left out by a `when`: no feature
])
def test_features(params, expected):
    from framework.engine.correction import features
    assert features(params) == expected


def test_mape_leaves_out_what_has_no_percentage():
    # |90 - 100| / 100 = 0.1 and |30 - 20| / 20 = 0.5: mean 0.3; m = 0 and NaN left out
    assert mape([(90, 100), (30, 20), (5, 0), (math.nan, 3)]) == pytest.approx(0.3)
    assert mape([(1, 0)]) is None


def _law(params):
    """A planted cluster: 30% slower than the model overall, and by a further 2^0.2 per doubling
    of max-num-seqs, fp8 KV 10% faster than the model says."""
    fp8 = params["kv-cache-dtype"] == "fp8"
    return math.exp(0.3) * params["max-num-seqs"] ** 0.2 * (0.9 if fp8 else 1.0)


def _space():
    return [{"max-num-seqs": m, "kv-cache-dtype": k} for m in (8, 16, 32, 64, 128, 256)
            for k in ("auto", "fp8")]


def test_the_correction_learns_a_planted_law_and_corrects_untried_configurations():
    configs = _space()
    predicted = {i: 100.0 + 10 * i for i in range(len(configs))}  # any model's numbers
    tried = [i for i in range(len(configs)) if i % 3 != 1]  # two in three measured
    trials = [(configs[i], predicted[i], predicted[i] * _law(configs[i])) for i in tried]
    c = fit("output_throughput", trials)
    assert c is not None and c.n == len(trials)
    untried = [i for i in range(len(configs)) if i not in tried]
    raw = mape([(predicted[i], predicted[i] * _law(configs[i])) for i in untried])
    corrected = mape([(c.apply(configs[i], predicted[i]), predicted[i] * _law(configs[i]))
                      for i in untried])
    assert raw is not None and corrected is not None
    assert corrected < raw / 3  # the ridge shrinks, so not exact: but most of the error is gone
    # the law's sign per flag: more max-num-seqs -> a larger factor; fp8 -> a smaller one
    assert c.weights["max-num-seqs"] > 0
    assert c.weights["kv-cache-dtype=fp8"] < 0


def test_one_trial_gives_the_mean_bias_and_bad_values_are_left_out():
    c = fit("p99_ttft_ms", [({"max-num-seqs": 8}, 10.0, 20.0), ({"max-num-seqs": 16}, 0.0, 5.0),
                            ({"max-num-seqs": 32}, 10.0, math.inf)])
    assert c is not None and c.n == 1
    assert c.factor({"max-num-seqs": 512}) == pytest.approx(2.0)  # one trial: only its bias
    assert fit("p99_ttft_ms", [({"max-num-seqs": 8}, 10.0, -1.0)]) is None
