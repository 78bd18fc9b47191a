"""The rules `validate` applies across a sweep's parts, table-tested as pure functions: the
values a parameter is probed at, request lengths against max-model-len, vLLM's scheduler
rules in every trial, metrics a workload cannot produce, the results location, and which kind
of file was given."""

from __future__ import annotations

import os

import pytest

from framework.config.search_space import BoolParam
from framework.config.search_space import CategoricalParam
from framework.config.search_space import FloatParam
from framework.config.search_space import IntParam
from framework.config.specs import SweepSpec
from framework.config.specs import WorkloadSpec
from framework.config.yaml_io import wrong_kind
from framework.sweep.cross_checks import RequestLengths
from framework.sweep.cross_checks import chunk_problem
from framework.sweep.cross_checks import length_problem
from framework.sweep.cross_checks import metric_problem
from framework.sweep.cross_checks import request_lengths
from framework.sweep.cross_checks import results_problem
from framework.sweep.cross_checks import seqs_problem
from framework.sweep.value_checks import probe_values


@pytest.mark.parametrize("param, probed", [
    (BoolParam(type="bool"), [("", True), ("", False)]),
    (CategoricalParam(type="categorical", choices=("auto", "fp8"), default="auto"),
     [("choices", "auto"), ("choices", "fp8")]),
    (IntParam(type="int", low=2, high=128, log=True, default=64), [("low", 2), ("high", 128)]),
    # a stepped range never reaches high: its top step is what the sampler can send
    (IntParam(type="int", low=16, high=100, step=16), [("low", 16), ("high", 100), ("step", 96)]),
    (IntParam(type="int", low=16, high=96, step=16), [("low", 16), ("high", 96)]),
    (FloatParam(type="float", low=0.8, high=0.95, default=0.92), [("low", 0.8), ("high", 0.95)]),
])
def test_probe_values(param, probed):
    assert probe_values(param) == probed


@pytest.mark.parametrize("workload, special, prompt, output", [
    ({"input_len": 128, "output_len": 64}, 1, (128, 128), (64, 64)),
    # r = 0.5: text n = 127 -> [63, 191] + 1 special; outputs [32, 96]
    ({"input_len": 128, "output_len": 64, "range_ratio": 0.5}, 1, (64, 192), (32, 96)),
    ({"input_len": 128, "output_len": 1, "range_ratio": 0.5}, 0, (64, 192), (1, 2)),
    ({"dataset": "prefix-shared", "input_len": 300, "output_len": 8, "prefix_len": 256}, 1,
     (300, 300), (8, 8)),
])
def test_request_lengths(workload, special, prompt, output):
    lengths = request_lengths(WorkloadSpec(**workload), special)
    assert (lengths.prompt, lengths.output) == (prompt, output)


def test_request_lengths_of_sharegpt_come_from_its_file(tmp_path):
    data = tmp_path / "conv.json"
    data.write_text("[]")
    assert request_lengths(WorkloadSpec(dataset="sharegpt", dataset_path=data), 1) is None


FIXED = RequestLengths(prompt=(128, 128), output=(64, 64))
SPREAD = RequestLengths(prompt=(64, 192), output=(32, 96))


@pytest.mark.parametrize("lengths, max_lens, found", [
    (FIXED, [192], None),                    # 128 + 64 fits exactly
    (FIXED, [191], "192 tokens exceed max-model-len 191 in every trial"),
    (FIXED, [128], "every request is refused"),  # prompt == max-model-len leaves no output
    (FIXED, [127, 100], "every request is refused"),
    (FIXED, [128, 4096], None),              # one trial can serve it
    (RequestLengths((8, 8), (600, 600)), [512], "every request is refused"),  # output too long
    (SPREAD, [200], "192 prompt + 96 output = 288 tokens exceed max-model-len 200"),
    (SPREAD, [64], "every request is refused: prompts of 64-192 tokens"),
])
def test_length_problem(lengths, max_lens, found):
    problem = length_problem(lengths, max_lens)
    assert problem == found if found is None else found in problem, problem


@pytest.mark.parametrize("chunked, tokens, max_lens, found", [
    ([False], [512], [2048], "at most 512) < max-model-len (at least 2048) in every trial"),
    ([False], [512, 1024], [2048, 4096], "at most 1024) < max-model-len (at least 2048)"),
    ([False], [512, 2048], [2048], None),     # one value of max-num-batched-tokens fits
    ([False, True], [512], [2048], None),     # trials with chunked prefill on
    ([None], [512], [2048], None),            # vLLM's default: chunked prefill on
    ([False], [None], [2048], None),          # vLLM raises its default to max-model-len
    ([False], [512], [None], None),           # max-model-len unknown
    ([False], [2048], [2048], None),
])
def test_chunk_problem(chunked, tokens, max_lens, found):
    problem = chunk_problem(chunked, tokens, max_lens)
    assert problem == found if found is None else found in problem, problem


@pytest.mark.parametrize("tokens, seqs, found", [
    ([64], [128], "at most 64) < max-num-seqs (at least 128) in every trial"),
    ([64, 128], [128, 256], None),
    ([64], [None], None),     # vLLM lowers its default max-num-seqs to max-num-batched-tokens
    ([None], [4096], None),   # left to the feasibility model, trial by trial
])
def test_seqs_problem(tokens, seqs, found):
    problem = seqs_problem(tokens, seqs)
    assert problem == found if found is None else found in problem, problem


def spec(**fields) -> SweepSpec:
    return SweepSpec(name="t", model="m", search_space="s.yaml", **fields)


ONE_TOKEN = RequestLengths((16, 16), (1, 1))


@pytest.mark.parametrize("sweep, lengths, found", [
    (spec(objective={"metric": "request_goodput"}), FIXED, ("objective.metric", "request_goodput")),
    (spec(objective={"metric": "request_goodput_per_gpu"}, sla={"error_rate": 0.1}), FIXED,
     ("objective.metric", "request_goodput_per_gpu")),
    (spec(objective={"metric": "output_throughput", "pareto_with": ["request_goodput"]},
          sla={"p99_itl_ms": 50}), FIXED, ("objective.pareto_with", "request_goodput")),
    (spec(objective={"metric": "request_goodput"}, sla={"p99_ttft_ms": 500}), FIXED, None),
    (spec(objective={"metric": "request_goodput"}, sla={"mean_e2el_ms": 500}), FIXED, None),
    (spec(sla={"p99_tpot_ms": 10}), ONE_TOKEN, ("sla.p99_tpot_ms", "p99_tpot_ms")),
    (spec(objective={"metric": "mean_itl_ms", "direction": "minimize"}), ONE_TOKEN,
     ("objective.metric", "mean_itl_ms")),
    (spec(sla={"p99_tpot_ms": 10}), RequestLengths((16, 16), (1, 2)), None),
    (spec(sla={"p99_ttft_ms": 10}), ONE_TOKEN, None),
    (spec(sla={"p99_tpot_ms": 10}), None, None),  # sharegpt: lengths unknown
])
def test_metric_problem(sweep, lengths, found):
    problem = metric_problem(sweep, lengths)
    assert (problem[:2] if problem else None) == found, problem


def test_results_problem(tmp_path):
    assert results_problem(tmp_path / "results", "x") is None      # made on first write
    (tmp_path / "results" / "x").mkdir(parents=True)
    assert results_problem(tmp_path / "results", "x") is None
    (tmp_path / "file").write_text("")
    assert results_problem(tmp_path / "file", "x") == (tmp_path / "file",
                                                       "exists and is not a directory")
    assert results_problem(tmp_path / "file" / "deeper", "x")[0] == tmp_path / "file"
    (tmp_path / "results" / "y").write_text("")
    assert results_problem(tmp_path / "results", "y")[1] == "exists and is not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any directory")
def test_results_problem_in_a_read_only_directory(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert results_problem(locked / "results", "x") == (locked, "is not writable")
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("data, kind, found", [
    ({"parameters": {}}, "sweep", ("search-space", ["parameters"])),
    ({"description": "d", "parameters": {}}, "sweep", ("search-space", ["parameters"])),
    ({"name": "x", "model": "m", "search_space": "s"}, "search-space",
     ("sweep", ["model", "search_space"])),
    ({"name": "x", "search_space": "s"}, "search-space", ("sweep", ["search_space"])),
    ({"name": "x", "model": "m", "parameters": {}}, "sweep", None),   # its own errors say more
    ({"name": "x"}, "sweep", None),
    ({"parameters": {}}, "search-space", None),
])
def test_wrong_kind(data, kind, found):
    assert wrong_kind(data, kind) == found
