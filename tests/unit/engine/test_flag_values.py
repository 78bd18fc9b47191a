"""Flag values against the installed vLLM's own parser and the bounds its config declares
(engine/flag_check), and a value against a pydantic field (config/bounds)."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel
from pydantic import Field
from pydantic import PositiveInt

from framework.config.bounds import declared_problem
from framework.config.specs import WorkloadSpec
from framework.engine.flag_check import args_problem
from framework.engine.flag_check import installed_vllm
from framework.engine.flag_check import value_problem


@pytest.mark.parametrize("name, value, found", [
    # argparse's type: vLLM's human_readable_int_or_auto refuses text
    ("max-model-len", "abc", "invalid human_readable_int_or_auto value: 'abc'"),
    # parses as an int; ModelConfig.max_model_len declares Field(ge=-1)
    ("max-model-len", -5, "greater than or equal to -1 (vLLM's ModelConfig.max_model_len)"),
    # within ge=-1, refused once the config is built (validate_model_config_after)
    ("max-model-len", 0, "max_model_len must be -1 (auto) or >= 1"),
    ("max-model-len", True, "expected one argument"),  # a switch form for a valued flag
    ("kv-cache-dtype", "fp9", "invalid choice: 'fp9'"),
    ("enable-prefix-caching", "yes", "--enable-prefix-caching is a switch"),
    ("enable-prefix-caching", 1, "--enable-prefix-caching is a switch"),
    ("headless", False, "unrecognized arguments: --no-headless"),  # store_true: no --no- form
    ("max-num-seqs", 2.0, "invalid int value: '2.0'"),  # what a float range would send
    ("max-num-seqs", 0, "greater than or equal to 1 (vLLM's SchedulerConfig.max_num_seqs)"),
    ("max-num-batched-tokens", "-2", "greater than or equal to 1"),
    ("gpu-memory-utilization", 1.5, "less than or equal to 1 (vLLM's CacheConfig"),
    ("gpu-memory-utilization", 0, "greater than 0 (vLLM's CacheConfig.gpu_memory_utilization)"),
    ("tensor-parallel-size", 0, "greater than or equal to 1 (vLLM's ParallelConfig"),
    ("block-size", -16, "greater than 0 (vLLM's CacheConfig.block_size)"),
])
def test_vllm_refuses_the_value_and_says_why(name, value, found):
    problem = value_problem(name, value)
    assert problem is not None and found in problem, problem


@pytest.mark.parametrize("name, value", [
    ("max-model-len", 512), ("max-model-len", "1k"), ("max-model-len", -1),
    ("max-model-len", "auto"), ("max_model_len", 512), ("kv-cache-dtype", "fp8"),
    ("enable-prefix-caching", True), ("enable-prefix-caching", False),
    ("enable-chunked-prefill", False), ("enforce-eager", True), ("max-num-seqs", 1),
    ("max-num-batched-tokens", "2k"), ("gpu-memory-utilization", 1.0),
    ("gpu-memory-utilization", 0.05), ("tensor-parallel-size", 8), ("block-size", 16),
])
def test_vllm_accepts_the_value(name, value):
    assert value_problem(name, value) is None


def test_every_constrained_flags_default_passes_its_declared_bounds():
    """The option -> config field map is right: vLLM's own defaults pass the bounds found for
    them, and the flags the shipped spaces search have theirs."""
    vllm = installed_vllm()
    defaults = {a.dest: a.default for a in vllm.parser._actions}
    assert {"max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
            "tensor_parallel_size", "pipeline_parallel_size", "block_size"} <= set(vllm.fields)
    for dest, (_, info) in vllm.fields.items():
        assert declared_problem(info, defaults[dest]) is None, dest


def test_the_parser_is_built_once():
    assert installed_vllm() is installed_vllm()


@pytest.mark.parametrize("args, found", [
    ({"enable-auto-tool-choice": True}, "--enable-auto-tool-choice requires --tool-call-parser"),
    ({"chat-template": "/no/such/template.jinja"}, "doesn't exist"),
])
def test_fixed_args_together_go_through_vllms_serve_args_check(args, found):
    problem = args_problem(args)
    assert problem is not None and found in problem, problem


def test_fixed_args_vllm_accepts_together():
    assert args_problem({"enforce-eager": True, "max-model-len": 512,
                         "no-enable-prefix-caching": True}) is None


class _Bounds(BaseModel):
    positive: float = Field(default=1.0, gt=0)
    auto_or_more: int = Field(default=-1, ge=-1)
    share: float = Field(default=0.5, gt=0, le=1)
    count: PositiveInt = 1


@pytest.mark.parametrize("info, value, found", [
    (_Bounds.model_fields["positive"], 0, "greater than 0"),
    (_Bounds.model_fields["auto_or_more"], -5, "greater than or equal to -1"),
    (_Bounds.model_fields["share"], 1.5, "less than or equal to 1"),
    (_Bounds.model_fields["count"], 0, "greater than 0"),
    (_Bounds.model_fields["count"], "x", "valid integer"),
    (WorkloadSpec.model_fields["max_concurrency"], 0, "greater than 0"),
    (WorkloadSpec.model_fields["max_concurrency"], 2.5, "valid integer"),
    (WorkloadSpec.model_fields["request_rate"], -1.0, "greater than 0"),
    (WorkloadSpec.model_fields["burstiness"], "x", "valid number"),
])
def test_declared_problem(info, value, found):
    problem = declared_problem(info, value)
    assert problem is not None and found in problem, problem


@pytest.mark.parametrize("info, value", [
    (_Bounds.model_fields["share"], 1),
    (_Bounds.model_fields["auto_or_more"], -1),
    (WorkloadSpec.model_fields["max_concurrency"], 4),
    (WorkloadSpec.model_fields["request_rate"], math.inf),
    (WorkloadSpec.model_fields["max_concurrency"], None),  # None is the caller's to judge
])
def test_declared_problem_accepts(info, value):
    assert declared_problem(info, value) is None


def test_declared_problem_strict_takes_no_float_for_an_int():
    concurrency = WorkloadSpec.model_fields["max_concurrency"]
    assert declared_problem(concurrency, 2.0) is None  # lax: 2.0 is the int 2
    assert "valid integer" in declared_problem(concurrency, 2.0, strict=True)
    assert declared_problem(WorkloadSpec.model_fields["request_rate"], 2.0, strict=True) is None
