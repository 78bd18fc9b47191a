"""vLLM's latency histograms from /metrics text: parsing (label sets summed), the per-run delta,
Prometheus' interpolated quantile and the exact mean, and the fine buckets' validity for vLLM."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from framework.engine.server_histograms import FINE_BUCKETS
from framework.engine.server_histograms import TTFT
from framework.engine.server_histograms import Histogram
from framework.engine.server_histograms import fine_buckets_flag
from framework.engine.server_histograms import parse_histograms
from framework.engine.server_histograms import run_summary

INF = math.inf


def exposition(name: str, engines: dict[str, tuple[list[float], float, float]],
               bounds: list[float]) -> str:
    """Prometheus text of one histogram: per engine label, (cumulative counts, sum, count)."""
    lines = [f"# HELP {name} h.", f"# TYPE {name} histogram"]
    for engine, (cumulative, total, count) in engines.items():
        labels = f'engine="{engine}",model_name="m"'
        for le, c in zip([*bounds, INF], cumulative):
            text = "+Inf" if math.isinf(le) else repr(le)
            lines.append(f'{name}_bucket{{{labels},le="{text}"}} {c}')
        lines += [f"{name}_count{{{labels}}} {count}", f"{name}_sum{{{labels}}} {total}"]
    return "\n".join(lines) + "\n"


def test_parse_sums_label_sets_and_ignores_other_metrics() -> None:
    text = (exposition(TTFT, {"0": ([1, 3, 4], 0.5, 4), "1": ([0, 2, 2], 0.25, 2)}, [0.01, 0.02])
            + exposition("vllm:request_queue_time_seconds", {"0": ([9, 9, 9], 9.0, 9)},
                         [0.01, 0.02])
            + 'vllm:num_requests_running{engine="0"} 3.0\n')
    parsed = parse_histograms(text)
    assert list(parsed) == [TTFT]
    assert parsed[TTFT] == Histogram(((0.01, 1.0), (0.02, 5.0), (INF, 6.0)), 0.75, 6.0)


def test_parse_rejects_a_bucket_without_bound() -> None:
    with pytest.raises(ValueError, match="without le"):
        parse_histograms(f'{TTFT}_bucket{{engine="0"}} 1.0\n')


H = Histogram(((0.01, 2.0), (0.02, 6.0), (0.04, 10.0), (INF, 10.0)), 0.2, 10.0)


@pytest.mark.parametrize(("q", "expected"), [
    (0.0, 0.0),           # rank 0: lower edge of the first bucket
    (0.1, 0.005),         # rank 1 of 2 in [0, 0.01]
    (0.2, 0.01),          # rank 2: the first bucket's top
    (0.5, 0.0175),        # rank 5: 3 of 4 into (0.01, 0.02]
    (0.9, 0.035),         # rank 9: 3 of 4 into (0.02, 0.04]
    (1.0, 0.04),
])
def test_quantile_interpolates_as_prometheus(q: float, expected: float) -> None:
    assert H.quantile(q) == pytest.approx(expected)


def test_quantile_in_the_inf_bucket_is_the_highest_bound_and_empty_is_none() -> None:
    tail = Histogram(((0.01, 1.0), (INF, 4.0)), 1.0, 4.0)
    assert tail.quantile(0.5) == 0.01
    empty = Histogram(((0.01, 0.0), (INF, 0.0)), 0.0, 0.0)
    assert empty.quantile(0.5) is None and empty.mean() is None
    with pytest.raises(ValueError, match="q must be"):
        H.quantile(1.5)


def test_delta_is_the_runs_observations() -> None:
    before = Histogram(((0.01, 1.0), (0.02, 1.0), (INF, 1.0)), 0.005, 1.0)
    after = Histogram(((0.01, 1.0), (0.02, 4.0), (INF, 5.0)), 0.105, 5.0)
    delta = after.minus(before)
    assert delta == Histogram(((0.01, 0.0), (0.02, 3.0), (INF, 4.0)), pytest.approx(0.1), 4.0)
    assert delta.mean() == pytest.approx(0.025)
    assert delta.quantile(0.5) == pytest.approx(0.01 + 0.01 * 2 / 3)
    with pytest.raises(ValueError, match="bucket bounds"):
        after.minus(Histogram(((0.05, 0.0), (INF, 0.0)), 0.0, 0.0))


def test_run_summary_in_ms_and_missing_histograms_are_none() -> None:
    before = {TTFT: Histogram(((0.01, 0.0), (0.02, 0.0), (INF, 0.0)), 0.0, 0.0)}
    after = {TTFT: Histogram(((0.01, 0.0), (0.02, 2.0), (INF, 2.0)), 0.03, 2.0)}
    out = run_summary(before, after)
    assert out["median_ttft_ms"] == pytest.approx(15.0)
    assert out["mean_ttft_ms"] == pytest.approx(15.0) and out["ttft_count"] == 2.0
    assert out["median_itl_ms"] is None and out["mean_e2el_ms"] is None


def test_fine_buckets_are_valid_custom_histogram_buckets() -> None:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    source = Path(spec.submodule_search_locations[0], "v1", "metrics", "buckets.py").read_text()
    families = source.split("BucketFamilyKey = Literal[", 1)[1].split("]", 1)[0]
    flag, value = fine_buckets_flag()
    assert flag == "--custom-histogram-buckets" and json.loads(value) == FINE_BUCKETS
    for family, bounds in FINE_BUCKETS.items():
        assert f'"{family}"' in families
        assert all(b > 0 and math.isfinite(b) for b in bounds)
        assert all(a < b for a, b in zip(bounds, bounds[1:])), family
    # fine where the tiny model's values lie: <= 0.5 ms TTFT steps, <= 0.1 ms ITL steps
    ttft = FINE_BUCKETS["time_to_first_token"]
    assert max(b - a for a, b in zip(ttft, ttft[1:]) if b <= 0.1) <= 0.0005 + 1e-9
    itl = FINE_BUCKETS["inter_token_latency"]
    assert max(b - a for a, b in zip(itl, itl[1:]) if b <= 0.02) <= 0.0001 + 1e-9
