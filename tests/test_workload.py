"""Random prompts and arrival offsets (framework.workload), with the real tiny-llama tokenizer."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from framework.workload import arrival_offsets, load_tokenizer, random_requests

MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "tiny-llama"
SPECIAL_IDS = {0, 1, 2, 3}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(MODEL_DIR)


def test_load_tokenizer_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "tokenizer.json")):
        load_tokenizer(tmp_path)


def test_same_seed_same_prompts(tokenizer) -> None:
    first = random_requests(tokenizer, 20, 64, 16, seed=7, range_ratio=0.3)
    second = random_requests(tokenizer, 20, 64, 16, seed=7, range_ratio=0.3)
    assert first == second


def test_different_seed_different_prompts(tokenizer) -> None:
    first = random_requests(tokenizer, 20, 64, 16, seed=7)
    second = random_requests(tokenizer, 20, 64, 16, seed=8)
    assert [r.prompt for r in first] != [r.prompt for r in second]


def test_prompts_within_a_run_differ(tokenizer) -> None:
    requests = random_requests(tokenizer, 20, 64, 16, seed=7)
    assert len({r.prompt for r in requests}) == 20


@pytest.mark.parametrize("input_len", [1, 2, 16, 128, 500, 1000])
def test_prompt_length_is_exact(tokenizer, input_len: int) -> None:
    requests = random_requests(tokenizer, 50, input_len, 32, seed=input_len)
    for request in requests:
        ids = tokenizer.encode(request.prompt).ids
        assert request.prompt_len == len(ids) == input_len
        assert request.output_len == 32
        assert not SPECIAL_IDS & set(ids)


def test_range_ratio_bounds(tokenizer) -> None:
    # input in [floor(100 * 0.5), ceil(100 * 1.5)], output in [floor(32 * 0.5), ceil(32 * 1.5)]
    requests = random_requests(tokenizer, 200, 100, 32, seed=3, range_ratio=0.5)
    input_lens = [r.prompt_len for r in requests]
    output_lens = [r.output_len for r in requests]
    assert 50 <= min(input_lens) and max(input_lens) <= 150
    assert 16 <= min(output_lens) and max(output_lens) <= 48
    assert len(set(input_lens)) > 20 and len(set(output_lens)) > 10
    for request in requests:
        assert len(tokenizer.encode(request.prompt).ids) == request.prompt_len


def test_zero_prompts(tokenizer) -> None:
    assert random_requests(tokenizer, 0, 16, 16, seed=0) == []


@pytest.mark.parametrize(
    ("num_prompts", "input_len", "output_len", "range_ratio"),
    [
        (-1, 16, 16, 0.0),
        (1, 0, 16, 0.0),
        (1, 16, 0, 0.0),
        (1, 16, 16, 1.0),
        (1, 16, 16, -0.1),
        (1, 1, 16, 0.5),  # floor(1 * 0.5) = 0 text tokens possible
    ],
)
def test_random_requests_rejects_bad_input(
    tokenizer, num_prompts: int, input_len: int, output_len: int, range_ratio: float
) -> None:
    with pytest.raises(ValueError):
        random_requests(tokenizer, num_prompts, input_len, output_len, 0, range_ratio)


def test_infinite_rate_sends_all_at_once() -> None:
    assert arrival_offsets(5, math.inf, 1.0, seed=0) == [0.0] * 5


def test_zero_requests() -> None:
    assert arrival_offsets(0, 2.0, 1.0, seed=0) == []


@pytest.mark.parametrize(("burstiness", "expected_cv"), [(1.0, 1.0), (4.0, 0.5), (0.25, 2.0)])
def test_gamma_gaps(burstiness: float, expected_cv: float) -> None:
    # Gamma(k, 1/(rate*k)) gaps: mean 1/rate, coefficient of variation 1/sqrt(k)
    rate, n = 4.0, 20000
    offsets = arrival_offsets(n, rate, burstiness, seed=11)
    gaps = np.diff([0.0, *offsets])
    assert np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(1 / rate, rel=1e-9)
    assert offsets[-1] == pytest.approx(n / rate)
    assert gaps.std() / gaps.mean() == pytest.approx(expected_cv, rel=0.05)


def test_arrivals_reproducible() -> None:
    assert arrival_offsets(50, 3.0, 1.0, seed=5) == arrival_offsets(50, 3.0, 1.0, seed=5)
    assert arrival_offsets(50, 3.0, 1.0, seed=5) != arrival_offsets(50, 3.0, 1.0, seed=6)


def test_infinite_burstiness_is_constant_rate() -> None:
    assert arrival_offsets(4, 2.0, math.inf, seed=0) == pytest.approx([0.5, 1.0, 1.5, 2.0])


@pytest.mark.parametrize(
    ("num", "rate", "burstiness", "bad_value"),
    [
        (-1, 1.0, 1.0, "-1"),
        (5, 0.0, 1.0, "0.0"),
        (5, -2.0, 1.0, "-2.0"),
        (5, math.nan, 1.0, "nan"),
        (5, 1.0, 0.0, "0.0"),
        (5, 1.0, -1.0, "-1.0"),
        (5, 1.0, math.nan, "nan"),
    ],
)
def test_arrivals_reject_bad_input(
    num: int, rate: float, burstiness: float, bad_value: str
) -> None:
    with pytest.raises(ValueError, match=f"got {bad_value}$"):
        arrival_offsets(num, rate, burstiness, seed=0)
