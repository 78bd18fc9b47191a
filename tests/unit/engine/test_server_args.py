"""Parameters -> vLLM argv and the pasteable `vllm serve` command."""

from __future__ import annotations

import shlex

import pytest

from framework.engine.server_args import flag_args
from framework.engine.server_args import merge_flags
from framework.engine.server_args import serve_command
from framework.engine.server_args import server_argv


@pytest.mark.parametrize(("params", "expected"), [
    ({}, []),
    ({"max-num-seqs": 64}, ["--max-num-seqs", "64"]),
    ({"enable-prefix-caching": True}, ["--enable-prefix-caching"]),
    ({"enable-prefix-caching": False}, ["--no-enable-prefix-caching"]),
    ({"max-num-seqs": None}, []),
    ({"seed": 0}, ["--seed", "0"]),                      # 0 is a value, not "off"
    ({"gpu-memory-utilization": 0.9}, ["--gpu-memory-utilization", "0.9"]),
    ({"dtype": "bfloat16"}, ["--dtype", "bfloat16"]),
    ({"chat-template": "a b"}, ["--chat-template", "a b"]),  # one argv element, no splitting
    ({"served-model-name": ""}, ["--served-model-name", ""]),
    # order as given; None dropped in place
    ({"b": 1, "a": True, "c": None, "d": False, "e": "x"},
     ["--b", "1", "--a", "--no-d", "--e", "x"]),
])
def test_flag_args(params, expected):
    assert flag_args(params) == expected


@pytest.mark.parametrize(("fixed", "params", "expected"), [
    ({}, {}, []),
    ({"a": 1, "b": 2}, {}, [("a", 1), ("b", 2)]),
    ({}, {"x": 1, "y": True}, [("x", 1), ("y", True)]),
    # fixed first in file order, then params
    ({"enforce-eager": True, "max-model-len": 512}, {"max-num-seqs": 8},
     [("enforce-eager", True), ("max-model-len", 512), ("max-num-seqs", 8)]),
    # a param replaces the fixed arg of the same name and takes the param's position
    ({"a": 1, "b": 2, "c": 3}, {"b": 5, "d": 4}, [("a", 1), ("c", 3), ("b", 5), ("d", 4)]),
    # a None param removes the fixed flag (flag_args omits None)
    ({"a": 1, "b": 2}, {"a": None}, [("b", 2), ("a", None)]),
    ({"flag": True}, {"flag": False}, [("flag", False)]),
])
def test_merge_flags(fixed, params, expected):
    fixed_before, params_before = dict(fixed), dict(params)
    merged = merge_flags(fixed, params)
    assert list(merged.items()) == expected
    assert fixed == fixed_before and params == params_before  # inputs untouched


def test_merged_none_param_drops_fixed_flag_from_argv():
    merged = merge_flags({"max-model-len": 512, "enforce-eager": True}, {"max-model-len": None})
    assert flag_args(merged) == ["--enforce-eager"]


@pytest.mark.parametrize(("model", "flags", "host", "port", "expected"), [
    ("models/tiny-llama", {}, "127.0.0.1", 8000,
     ["--model", "models/tiny-llama", "--host", "127.0.0.1", "--port", "8000"]),
    ("m", {"max-num-seqs": 8, "enforce-eager": True, "enable-prefix-caching": False}, "0.0.0.0",
     31337,
     ["--model", "m", "--max-num-seqs", "8", "--enforce-eager", "--no-enable-prefix-caching",
      "--host", "0.0.0.0", "--port", "31337"]),
    ("/abs/my model", {"x": None}, "::1", 1, ["--model", "/abs/my model", "--host", "::1",
                                               "--port", "1"]),
])
def test_server_argv(model, flags, host, port, expected):
    argv = server_argv(model, flags, host, port)
    assert argv == expected
    assert all(isinstance(a, str) for a in argv)


@pytest.mark.parametrize(("model", "flags", "expected"), [
    ("models/tiny-llama", {}, "vllm serve models/tiny-llama"),
    ("models/tiny-llama", {"max-num-seqs": 8, "enforce-eager": True},
     "vllm serve models/tiny-llama --max-num-seqs 8 --enforce-eager"),
    ("m", {"enable-chunked-prefill": False, "x": None}, "vllm serve m --no-enable-chunked-prefill"),
    # a value with a space is single-quoted, as is a model path with one
    ("m", {"served-model-name": "tiny llama"}, "vllm serve m --served-model-name 'tiny llama'"),
    ("my models/tiny", {}, "vllm serve 'my models/tiny'"),
    ("m", {"chat-template": "{{ x }}"}, "vllm serve m --chat-template '{{ x }}'"),
])
def test_serve_command(model, flags, expected):
    assert serve_command(model, flags) == expected


def test_serve_command_round_trips_through_shell_parsing():
    flags = {"served-model-name": "it's a \"model\"", "max-num-seqs": 4, "enforce-eager": True,
             "override-generation-config": '{"temperature": 0.5}'}
    command = serve_command("dir with space/m", flags)
    assert shlex.split(command) == ["vllm", "serve", "dir with space/m", *flag_args(flags)]
    assert "host" not in command and "port" not in command


@pytest.mark.parametrize("fixed, params, baseline, expected", [
    ({"enforce-eager": True}, {"max-num-seqs": 8}, False, {"enforce-eager": True, "max-num-seqs": 8}),
    ({"enforce-eager": True}, {"max-num-seqs": 8}, True, {"enforce-eager": True}),
    ({}, {"tensor-parallel-size": 2}, False,
     {"tensor-parallel-size": 2, "distributed-executor-backend": "ray"}),
    ({"pipeline-parallel-size": 2}, {}, False,
     {"pipeline-parallel-size": 2, "distributed-executor-backend": "ray"}),
    ({"distributed-executor-backend": "mp"}, {"tensor-parallel-size": 2}, False,
     {"distributed-executor-backend": "mp", "tensor-parallel-size": 2}),
    ({}, {"tensor-parallel-size": 1, "pipeline-parallel-size": 1}, False,
     {"tensor-parallel-size": 1, "pipeline-parallel-size": 1}),
])
def test_trial_flags(fixed, params, baseline, expected):
    from framework.engine.server_args import trial_flags

    assert trial_flags(fixed, params, baseline) == expected
