"""Datasets (random, ShareGPT, prefix-shared) and arrival offsets, with the tiny-llama tokenizer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from framework.load.prompts import load_tokenizer
from framework.load.sharegpt import first_exchange
from framework.load.sharegpt import read_sharegpt
from framework.load.sharegpt import sample_sharegpt_conversations
from framework.load.sharegpt import sharegpt_requests
from framework.load.workload import Dataset
from framework.load.workload import arrival_offsets
from framework.load.workload import prefix_shared_requests
from framework.load.workload import random_requests
from tests.paths import ROOT

MODEL_DIR = ROOT / "models" / "tiny-llama"


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
    with pytest.raises(ValueError, match=r"num_prompts must be|output_len must be|range_ratio must be|"
                                         r"input_len"):
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


def conversation(prompt: str, reply: str, first: str = "human") -> dict:
    return {"conversations": [{"from": first, "value": prompt}, {"from": "gpt", "value": reply}]}


@pytest.mark.parametrize(
    ("turns", "expected"),
    [
        ([{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}], ("q", "a")),
        ([{"from": "system", "value": "s"}, {"from": "human", "value": "q"},
          {"from": "gpt", "value": "a"}, {"from": "human", "value": "q2"}], ("q", "a")),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], ("q", "a")),
        ([{"from": "gpt", "value": "a0"}, {"from": "human", "value": "q"},
          {"from": "gpt", "value": "a"}], ("q", "a")),
        ([{"from": "human", "value": "q"}], None),
        ([{"from": "human", "value": "q"}, {"from": "human", "value": "q2"}], None),
        ("not a list", None),
        ([["not", "a", "dict"]], None),
    ],
)
def test_first_exchange(turns, expected) -> None:
    assert first_exchange(turns) == expected


def test_read_sharegpt_json_and_jsonl(tmp_path: Path) -> None:
    entries = [conversation("p1", "r1"), {"conversations": [{"from": "human", "value": "x"}]},
               {"no": "turns"}, conversation("p2", "r2", first="user")]
    as_json = tmp_path / "d.json"
    as_json.write_text(json.dumps(entries))
    as_jsonl = tmp_path / "d.jsonl"
    as_jsonl.write_text("\n".join(json.dumps(e) for e in entries) + "\n\n")
    assert read_sharegpt(as_json) == read_sharegpt(as_jsonl) == [("p1", "r1"), ("p2", "r2")]


@pytest.mark.parametrize(("name", "text", "match"), [
    ("bad.json", "{not json", "not valid JSON"),
    ("bad.jsonl", '{"conversations": []}\n{oops', "not valid JSONL"),
    ("obj.json", '{"conversations": []}', "expected a list"),
])
def test_read_sharegpt_rejects_bad_files(tmp_path: Path, name: str, text: str, match: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_sharegpt(path)


def word_pairs(n: int) -> list[tuple[str, str]]:
    """Prompt i has i + 1 words, reply i has 2 * (i + 1) words."""
    return [(" ".join(["token"] * (i + 1)), " ".join(["reply"] * 2 * (i + 1))) for i in range(n)]


def test_sharegpt_lengths_come_from_the_tokenizer(tokenizer) -> None:
    requests = sharegpt_requests(tokenizer, word_pairs(30), 30, seed=0)
    assert sorted(r.prompt for r in requests) == sorted(p for p, _ in word_pairs(30))
    replies = dict(word_pairs(30))
    for r in requests:
        assert r.prompt_len == len(tokenizer.encode(r.prompt).ids)
        reply = tokenizer.encode(replies[r.prompt], add_special_tokens=False)
        assert r.output_len == len(reply.ids)
    fixed = sharegpt_requests(tokenizer, word_pairs(30), 10, seed=0, output_len=7)
    assert {r.output_len for r in fixed} == {7}


def test_sharegpt_seeded(tokenizer) -> None:
    pairs = word_pairs(50)
    first = sharegpt_requests(tokenizer, pairs, 20, seed=3)
    assert first == sharegpt_requests(tokenizer, pairs, 20, seed=3)
    assert first != sharegpt_requests(tokenizer, pairs, 20, seed=4)
    assert len({r.prompt for r in first}) == 20  # enough usable: drawn without replacement


def test_sharegpt_filters_are_inclusive(tokenizer) -> None:
    pairs = word_pairs(60)
    lens = sorted(len(tokenizer.encode(p).ids) for p, _ in pairs)
    low, high = lens[10], lens[40]
    requests = sharegpt_requests(tokenizer, pairs, 500, seed=1, min_prompt_tokens=low,
                                 max_prompt_tokens=high)
    got = {r.prompt_len for r in requests}
    assert min(got) == low and max(got) == high
    assert len({r.prompt for r in requests}) == sum(low <= n <= high for n in lens)


def test_sharegpt_oversamples_with_replacement(tokenizer) -> None:
    pairs = word_pairs(3)
    requests = sharegpt_requests(tokenizer, pairs, 25, seed=2)
    assert len(requests) == 25
    assert {r.prompt for r in requests} == {p for p, _ in pairs}
    assert requests == sharegpt_requests(tokenizer, pairs, 25, seed=2)


def test_sharegpt_skips_empty_and_rejects_nothing_usable(tokenizer) -> None:
    pairs = [("", "reply"), ("prompt", ""), ("prompt words", "a reply")]
    requests = sharegpt_requests(tokenizer, pairs, 2, seed=0)
    assert [r.prompt for r in requests] == ["prompt words"] * 2
    with pytest.raises(ValueError, match="none of 3 conversations"):
        sharegpt_requests(tokenizer, pairs, 2, seed=0, min_prompt_tokens=1000)
    assert sharegpt_requests(tokenizer, pairs, 0, seed=0) == []


def test_shipped_sample_is_the_generator_output() -> None:
    path = ROOT / "datasets" / "sharegpt_sample.json"
    conversations = sample_sharegpt_conversations(100, seed=0)
    assert json.loads(path.read_text()) == conversations
    assert path.stat().st_size < 200_000
    assert len(read_sharegpt(path)) == 100


def test_sample_has_varied_lengths(tokenizer) -> None:
    pairs = read_sharegpt(ROOT / "datasets" / "sharegpt_sample.json")
    requests = sharegpt_requests(tokenizer, pairs, 100, seed=0)
    prompt_lens = [r.prompt_len for r in requests]
    output_lens = [r.output_len for r in requests]
    assert min(prompt_lens) < 20 and max(prompt_lens) > 200
    assert min(output_lens) < 20 and max(output_lens) > 200


def test_prefix_groups_share_exactly_their_prefix(tokenizer) -> None:
    requests = prefix_shared_requests(tokenizer, 24, 96, 16, prefix_len=40, num_groups=3, seed=5)
    ids = [tokenizer.encode(r.prompt).ids for r in requests]
    assert all(len(x) == r.prompt_len == 96 and r.output_len == 16 for x, r in zip(ids, requests))
    for g in range(3):
        members = ids[g::3]
        assert all(m[:40] == members[0][:40] for m in members)
        assert len({tuple(m[40:]) for m in members}) == len(members)  # suffixes are unique
    prefixes = {tuple(x[:40]) for x in ids}
    assert len(prefixes) == 3
    assert len({r.prompt for r in requests}) == 24


def test_prefix_shared_seeded(tokenizer) -> None:
    first = prefix_shared_requests(tokenizer, 8, 64, 8, 32, 2, seed=1)
    assert first == prefix_shared_requests(tokenizer, 8, 64, 8, 32, 2, seed=1)
    assert first != prefix_shared_requests(tokenizer, 8, 64, 8, 32, 2, seed=2)
    assert prefix_shared_requests(tokenizer, 0, 64, 8, 32, 2, seed=1) == []


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"num_prompts": -1}, "num_prompts"),
    ({"output_len": 0}, "output_len"),
    ({"num_groups": 0}, "num_groups"),
    ({"prefix_len": 0}, "prefix_len"),
    ({"prefix_len": 64}, "leaves no suffix"),
])
def test_prefix_shared_rejects_bad_input(tokenizer, kwargs: dict, match: str) -> None:
    args = {"num_prompts": 4, "input_len": 64, "output_len": 8, "prefix_len": 32,
            "num_groups": 2, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        prefix_shared_requests(tokenizer, **args)


def test_dataset_dispatches_to_each_generator(tokenizer) -> None:
    sample = ROOT / "datasets" / "sharegpt_sample.json"
    assert Dataset("random", 32, 8).requests(tokenizer, 5, 1) == random_requests(
        tokenizer, 5, 32, 8, 1)
    assert Dataset("prefix-shared", 48, 8, prefix_len=16, prefix_groups=2).requests(
        tokenizer, 5, 1) == prefix_shared_requests(tokenizer, 5, 48, 8, 16, 2, 1)
    assert Dataset("sharegpt", path=sample, max_prompt_tokens=50).requests(
        tokenizer, 5, 1) == sharegpt_requests(tokenizer, read_sharegpt(sample), 5, 1,
                                              max_prompt_tokens=50)
    with pytest.raises(ValueError, match="needs a path"):
        Dataset("sharegpt").requests(tokenizer, 5, 1)
