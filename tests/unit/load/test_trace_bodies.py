"""benchmarks/trace_bodies.py: the pure comparison of two clients' requests, and its stub
(a real HTTP server on 127.0.0.1 that our load generator must read as a valid stream)."""

from __future__ import annotations

import asyncio
import json

import pytest

from benchmarks.trace_bodies import field_diffs
from benchmarks.trace_bodies import header_diffs
from benchmarks.trace_bodies import out_of_order
from benchmarks.trace_bodies import prompt_shape
from benchmarks.trace_bodies import row_of_request_id
from benchmarks.trace_bodies import stub
from benchmarks.trace_bodies import tally
from framework.load.loadgen import completion_payload
from framework.load.loadgen import run_load
from framework.load.workload import RequestSpec


@pytest.mark.parametrize(("prompt", "shape"), [
    ([5, 6, 7], "ids[3]"), ([], "ids[0]"), ("hello", "text[5 chars]"), ([True], "list"),
    ([[1, 2]], "list"), (None, "NoneType"),
])
def test_prompt_shape(prompt, shape) -> None:
    assert prompt_shape(prompt) == shape


@pytest.mark.parametrize(("theirs", "ours", "lines"), [
    ({"a": 1}, {"a": 1}, []),
    ({"prompt": [1, 2]}, {"prompt": [3, 4]}, []),                 # same shape: ids are salted
    ({"prompt": [1, 2]}, {"prompt": [3]}, ["prompt: vllm ids[2], ours ids[1]"]),
    ({"prompt": [1]}, {"prompt": "x"}, ["prompt: vllm ids[1], ours text[1 chars]"]),
    ({"logprobs": None}, {}, ["logprobs: vllm null, ours absent"]),
    ({}, {"seed": 3}, ["seed: vllm absent, ours 3"]),
    ({"temperature": 0}, {"temperature": 0.0}, ["temperature: vllm 0, ours 0.0"]),  # int vs float
    ({"ignore_eos": True}, {"ignore_eos": 1}, ["ignore_eos: vllm true, ours 1"]),
    ({"b": 1, "a": {"x": 1}}, {"b": 2, "a": {"x": 2}},
     ['a: vllm {"x": 1}, ours {"x": 2}', "b: vllm 1, ours 2"]),  # sorted by name
])
def test_field_diffs(theirs, ours, lines) -> None:
    assert field_diffs(theirs, ours) == lines


def test_field_diffs_of_a_trace_request_are_the_two_known_fields() -> None:
    """Ours (completion_payload, --temperature 0, a trace row) against the body vLLM 0.32's
    async_request_openai_completions builds for the same row (its payload, then ignore_eos
    and extra_body): only the two fields vllm bench always sends."""
    spec = RequestSpec(prompt="", prompt_len=3, output_len=12, token_ids=(7, 8, 9))
    ours = json.loads(json.dumps(completion_payload("m", spec, True, {"temperature": 0.0})))
    theirs = {"model": "m", "prompt": [1, 2, 3], "repetition_penalty": 1.0, "max_tokens": 12,
              "logprobs": None, "stream": True, "stream_options": {"include_usage": True},
              "ignore_eos": True, "temperature": 0.0}
    assert field_diffs(theirs, ours) == ["logprobs: vllm null, ours absent",
                                         "repetition_penalty: vllm 1.0, ours absent"]


@pytest.mark.parametrize(("theirs", "ours", "lines"), [
    ({"Host": "a:1", "Content-Length": "9"}, {"host": "b:2", "content-length": "8"}, []),
    ({"Accept": "*/*"}, {"accept": "*/*"}, []),                    # names compare lower-cased
    ({"x-request-id": "bench-1e04ee37-12"}, {},
     ["header x-request-id: vllm bench-<run>-<row>, ours absent"]),
    ({"x-request-id": "bench-1e04ee37-1"}, {"X-Request-Id": "bench-0badcafe-2"}, []),
    ({"x-request-id": "mine"}, {"x-request-id": "yours"},
     ["header x-request-id: vllm mine, ours yours"]),
    ({"User-Agent": "u", "Accept": "*/*"}, {"Accept": "text/event-stream"},
     ["header accept: vllm */*, ours text/event-stream", "header user-agent: vllm u, ours absent"]),
])
def test_header_diffs(theirs, ours, lines) -> None:
    assert header_diffs(theirs, ours) == lines


@pytest.mark.parametrize(("value", "row"), [
    ("bench-1e04ee37-0", 0), ("bench-1e04ee37-149", 149), ("x-deadbeef-7", 7), ("bench-1", None),
    ("", None), ("bench-1e04ee37-", None),
])
def test_row_of_request_id(value, row) -> None:
    assert row_of_request_id(value) == row


def test_out_of_order_and_tally() -> None:
    assert out_of_order([0, 1, 3, 2, 4]) == [(2, 3), (3, 2)]
    assert out_of_order([]) == []
    assert tally([["a", "b"], ["b"], []]) == ["2/3  b", "1/3  a"]


@pytest.mark.timeout(30)
def test_the_stub_answers_a_stream_our_client_reads_and_records_each_request() -> None:
    specs = [RequestSpec("", 3, 4, token_ids=(1, 2, 3)), RequestSpec("", 2, 1, token_ids=(4, 5))]
    with stub() as (url, records):
        result = asyncio.run(run_load(url, "m", specs))
    assert [(r.success, r.prompt_tokens, r.output_tokens, len(r.chunk_s))
            for r in result.records] == [(True, 3, 4, 4), (True, 2, 1, 1)]
    assert sorted(json.loads(r["body"])["max_tokens"] for r in records) == [1, 4]
    assert all(r["method"] == "POST" and r["path"] == "/v1/completions" for r in records)
