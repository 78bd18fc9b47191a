"""compute_metrics against hand-computed values (vLLM bench serve definitions)."""

from __future__ import annotations

import pytest

from framework.load.loadgen import RequestRecord
from framework.load.metrics import compute_metrics
from framework.load.metrics import max_in_flight
from framework.load.metrics import metric_names
from framework.load.metrics import percentile_key
from framework.trial.objective import goodput_slo_ms


def ok(
    send: float, chunks: tuple[float, ...], output_tokens: int, prompt_tokens: int = 10
) -> RequestRecord:
    return RequestRecord(
        index=0,
        send_s=send,
        ttft_s=chunks[0] - send,
        chunk_s=chunks,
        end_s=chunks[-1],
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        success=True,
    )


def failed(
    send: float, end: float, chunks: tuple[float, ...] = (), output_tokens: int = 0
) -> RequestRecord:
    return RequestRecord(
        index=0,
        send_s=send,
        ttft_s=chunks[0] - send if chunks else None,
        chunk_s=chunks,
        end_s=end,
        prompt_tokens=7,
        output_tokens=output_tokens,
        success=False,
        error="HTTP 500",
    )


@pytest.mark.parametrize(
    ("records", "duration", "expected"),
    [
        pytest.param(
            # two single-token outputs: TTFT 100 and 300 ms, no TPOT, no ITL
            [ok(0.0, (0.1,), 1), ok(0.0, (0.3,), 1)],
            2.0,
            {
                "completed": 2,
                "failed": 0,
                "duration": 2.0,
                "total_input_tokens": 20,
                "total_output_tokens": 2,
                "request_throughput": 1.0,
                "output_throughput": 1.0,
                "total_token_throughput": 11.0,
                "mean_ttft_ms": 200.0,
                "median_ttft_ms": 200.0,
                "std_ttft_ms": 100.0,
                "p25_ttft_ms": 150.0,
                "p99_ttft_ms": 298.0,
                "mean_tpot_ms": 0.0,
                "p99_tpot_ms": 0.0,
                "mean_itl_ms": 0.0,
                "std_itl_ms": 0.0,
                "mean_e2el_ms": 200.0,
                "max_output_tokens_per_s": 2.0,
                "max_concurrent_requests": 2,
            },
            id="single-token-outputs",
        ),
        pytest.param(
            # one success (3 chunks, 3 tokens) and two failures, one with a partial stream
            [
                ok(0.0, (0.5, 1.0, 1.5), 3, prompt_tokens=100),
                failed(0.0, 0.2),
                failed(0.0, 0.9, chunks=(0.05,), output_tokens=5),
            ],
            4.0,
            {
                "completed": 1,
                "failed": 2,
                "total_input_tokens": 100,
                "total_output_tokens": 3,
                "request_throughput": 0.25,
                "output_throughput": 0.75,
                "total_token_throughput": 25.75,
                "mean_ttft_ms": 500.0,
                "mean_tpot_ms": 500.0,
                "mean_itl_ms": 500.0,
                "std_itl_ms": 0.0,
                "mean_e2el_ms": 1500.0,
                "max_concurrent_requests": 1,
            },
            id="failed-excluded",
        ),
        pytest.param(
            # 3 chunks carrying 9 tokens: TPOT = (0.7 - 0.2) / 8, ITL = chunk gaps 0.1, 0.4
            [ok(10.0, (10.2, 10.3, 10.7), 9)],
            1.0,
            {
                "total_output_tokens": 9,
                "output_throughput": 9.0,
                "mean_ttft_ms": 200.0,
                "mean_tpot_ms": 62.5,
                "mean_itl_ms": 250.0,
                "median_itl_ms": 250.0,
                "std_itl_ms": 150.0,
                "p25_itl_ms": 175.0,
                "mean_e2el_ms": 700.0,
                # vLLM counts chunks per one-second bucket, not tokens
                "max_output_tokens_per_s": 3.0,
            },
            id="multi-token-chunks",
        ),
        pytest.param(
            # buckets from t0 = 0: [0,1) holds 0.2, 0.4, 0.6; [1,2) holds 1.1, 1.2, 1.3, 1.9
            [ok(0.0, (0.2, 0.4, 1.1), 3), ok(0.5, (0.6, 1.2, 1.3, 1.9), 5)],
            2.0,
            {
                "max_output_tokens_per_s": 4.0,
                "max_concurrent_requests": 2,
                # ITL pooled over gaps 0.2, 0.7 | 0.6, 0.1, 0.6: mean 2.2 / 5, median 0.6
                "mean_itl_ms": 440.0,
                "median_itl_ms": 600.0,
                # TPOT per request: 0.9 / 2 = 0.45 and 1.3 / 4 = 0.325
                "mean_tpot_ms": 387.5,
                "mean_ttft_ms": 150.0,
                "mean_e2el_ms": 1250.0,
            },
            id="pooled-itl-and-buckets",
        ),
        pytest.param(
            [],
            1.0,
            {
                "completed": 0,
                "failed": 0,
                "total_input_tokens": 0,
                "request_throughput": 0.0,
                "mean_ttft_ms": 0.0,
                "p99_e2el_ms": 0.0,
                "median_itl_ms": 0.0,
                "max_output_tokens_per_s": 0.0,
                "max_concurrent_requests": 0,
            },
            id="empty",
        ),
        pytest.param(
            [failed(0.0, 1.0), failed(0.5, 2.0)],
            2.0,
            {
                "completed": 0,
                "failed": 2,
                "total_input_tokens": 0,
                "total_output_tokens": 0,
                "mean_ttft_ms": 0.0,
                "std_e2el_ms": 0.0,
                "max_output_tokens_per_s": 0.0,
                "max_concurrent_requests": 0,
            },
            id="all-failed",
        ),
    ],
)
def test_compute_metrics(
    records: list[RequestRecord], duration: float, expected: dict[str, float]
) -> None:
    result = compute_metrics(records, duration)
    for key, value in expected.items():
        assert result[key] == pytest.approx(value), key
    assert set(result) == set(metric_names())
    assert "request_goodput" not in result


GOODPUT_RECORDS = [
    ok(0.0, (0.125,), 1),  # TTFT 0.125, TPOT counts as 0, E2EL 0.125
    ok(0.0, (0.125, 0.625), 5),  # TTFT 0.125, TPOT 0.5 / 4 = 0.125, E2EL 0.625
    ok(0.0, (0.25, 0.5), 2),  # TTFT 0.25, TPOT 0.25, E2EL 0.5
    failed(0.0, 0.1),  # never good
]


@pytest.mark.parametrize(
    ("slo_ms", "expected_goodput"),
    [
        ({"ttft": 125}, 2 / 2.0),  # equality is good
        ({"ttft": 124}, 0 / 2.0),
        ({"tpot": 125}, 2 / 2.0),
        ({"tpot": 0}, 1 / 2.0),  # single-token request has TPOT 0
        ({"ttft": 250, "e2el": 500}, 2 / 2.0),
        ({"ttft": 250, "tpot": 125, "e2el": 625}, 2 / 2.0),
        ({"e2el": 1000}, 3 / 2.0),
    ],
)
def test_goodput(slo_ms: dict[str, float], expected_goodput: float) -> None:
    result = compute_metrics(GOODPUT_RECORDS, 2.0, goodput_slo_ms=slo_ms)
    assert result["request_goodput"] == pytest.approx(expected_goodput)
    assert result["request_throughput"] == pytest.approx(1.5)


@pytest.mark.parametrize("slo_ms", [None, {}])
def test_goodput_absent_without_slo(slo_ms: dict[str, float] | None) -> None:
    assert "request_goodput" not in compute_metrics(GOODPUT_RECORDS, 2.0, goodput_slo_ms=slo_ms)


@pytest.mark.parametrize("slo_ms", [{"itl": 10.0}, {"ttft": -1.0}])
def test_goodput_rejects_bad_slo(slo_ms: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        compute_metrics(GOODPUT_RECORDS, 2.0, goodput_slo_ms=slo_ms)


@pytest.mark.parametrize(
    ("metric", "p", "key"),
    [
        ("ttft", 99, "p99_ttft_ms"),
        ("itl", 99.9, "p99.9_itl_ms"),
        ("tpot", 50.0, "p50_tpot_ms"),
        ("e2el", 0, "p0_e2el_ms"),
        ("ttft", 12.5, "p12.5_ttft_ms"),
    ],
)
def test_percentile_key(metric: str, p: float, key: str) -> None:
    assert percentile_key(metric, p) == key


def test_metric_names_match_compute_metrics_keys() -> None:
    records = [ok(10.0, (10.2, 10.3, 10.7), 9)]
    result = compute_metrics(records, 1.0, percentiles=(99.9,))
    names = metric_names((99.9,))
    assert len(names) == len(set(names)) == 10 + 4 * 4
    assert list(result) == names
    # ITL gaps 0.1 and 0.4: p99.9 = 0.1 + 0.999 * 0.3
    assert result["p99.9_itl_ms"] == pytest.approx(399.7)
    assert metric_names()[:3] == ["completed", "failed", "duration"]
    assert "p99_ttft_ms" in metric_names() and "p25_e2el_ms" in metric_names()


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([], 0),
        ([(0.0, 1.0)], 1),
        ([(0.0, 1.0), (1.0, 2.0)], 1),  # touching intervals do not overlap
        ([(0.0, 1.0), (0.0, 1.0), (0.0, 1.0)], 3),
        ([(0.0, 10.0), (1.0, 2.0), (3.0, 4.0), (5.0, 6.0)], 2),
        ([(0.0, 1.0), (0.5, 1.5), (1.0, 2.0), (1.2, 1.3)], 3),
    ],
)
def test_max_in_flight(intervals: list[tuple[float, float]], expected: int) -> None:
    assert max_in_flight(intervals) == expected


def test_max_concurrent_requests_is_exact() -> None:
    # In flight: [0, 1), [0.5, 1.5), [1.0, 2.0), [1.2, 1.3): at most 3 at once (1.2..1.3).
    # vLLM's per-second buckets would put all 4 in second 1.
    records = [
        ok(0.0, (0.5, 1.0), 2),
        ok(0.5, (1.0, 1.5), 2),
        ok(1.0, (1.5, 2.0), 2),
        ok(1.2, (1.25, 1.3), 2),
    ]
    assert compute_metrics(records, 2.0)["max_concurrent_requests"] == 3


def test_only_given_records_are_measured() -> None:
    warmup = [ok(0.0, (9.0,), 1, prompt_tokens=1000)]
    measured = [ok(10.0, (10.1, 10.2), 2), ok(10.0, (10.3, 10.4), 2)]
    result = compute_metrics(measured, 1.0)
    assert result["completed"] == 2
    assert result["total_input_tokens"] == 20
    assert result["mean_ttft_ms"] == pytest.approx(200.0)
    assert result["max_concurrent_requests"] == 2
    everything = compute_metrics(warmup + measured, 1.0)
    assert everything["completed"] == 3
    assert everything["total_input_tokens"] == 1020
    assert everything["mean_ttft_ms"] == pytest.approx((9000.0 + 100.0 + 300.0) / 3)


@pytest.mark.parametrize("duration", [0.0, -1.0])
def test_rejects_non_positive_duration(duration: float) -> None:
    with pytest.raises(ValueError):
        compute_metrics([], duration)


def test_goodput_uses_the_sweeps_sla() -> None:
    # A sweep's SLA becomes per-request limits (the tightest per metric); std and error_rate
    # keys do not. TTFT <= 125 ms and TPOT <= 125 ms: the first two records are good.
    sla = {"p99_ttft_ms": 250, "p50_ttft_ms": 125, "p99_tpot_ms": 125, "std_e2el_ms": 1,
           "error_rate": 0.1}
    slo = goodput_slo_ms(sla)
    assert slo == {"ttft": 125, "tpot": 125}
    assert compute_metrics(GOODPUT_RECORDS, 2.0, goodput_slo_ms=slo)["request_goodput"] == 1.0


def test_percentiles_are_configurable() -> None:
    records = [ok(0.0, (t / 10,), 1) for t in range(1, 11)]  # TTFT 100..1000 ms
    result = compute_metrics(records, 1.0, percentiles=(10, 90, 99.5))
    assert result["p10_ttft_ms"] == pytest.approx(190.0)
    assert result["p90_ttft_ms"] == pytest.approx(910.0)
    assert result["p99.5_ttft_ms"] == pytest.approx(995.5)
    assert "p99_ttft_ms" not in result
