"""`validate` (sweep.loader.load with every check) on sweep files: a bad value in server.args or
in a search space, and parts that contradict each other, are one ConfigError naming the file,
the key and the value; what vLLM accepts passes. Real files, the tiny model and the installed
vLLM's parser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from framework.base.errors import ConfigError
from framework.sweep import loader

SPACE = {"parameters": {"max-num-seqs": {"type": "int", "low": 2, "high": 64, "default": 64}}}


def write(tmp: Path, model: Path, sweep: dict[str, Any] | None = None,
          space: dict[str, Any] | None = None) -> Path:
    """A sweep (tiny model, a small workload, `sweep`'s keys on top) and its search space."""
    space_path = tmp / "space.yaml"
    space_path.write_text(yaml.safe_dump(space or SPACE))
    body = {"name": "v", "model": str(model), "search_space": str(space_path),
            "workload": {"input_len": 64, "output_len": 16}, "results_dir": str(tmp / "results")}
    for key, value in (sweep or {}).items():
        body[key] = {**body[key], **value} if isinstance(body.get(key), dict) else value
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def refused(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        loader.load(path)
    return caught.value


def server(**args: Any) -> dict[str, Any]:
    return {"server": {"args": args}}


@pytest.mark.parametrize("args, value, found", [
    ({"max-model-len": "abc"}, "abc", "invalid human_readable_int_or_auto value"),
    ({"max-model-len": -5}, -5, "greater than or equal to -1"),
    ({"max-model-len": 0}, 0, "must be -1 (auto) or >= 1"),
    ({"kv-cache-dtype": "fp9"}, "fp9", "invalid choice"),
    ({"enforce-eager": "yes"}, "yes", "is a switch"),
    ({"gpu-memory-utilization": 2}, 2, "less than or equal to 1"),
])
def test_a_bad_fixed_value(tmp_path, tiny_model, args, value, found):
    err = refused(write(tmp_path, tiny_model, server(**args)))
    name = next(iter(args))
    assert (err.file, err.key, err.value) == (str(tmp_path / "sweep.yaml"),
                                              f"server.args.{name}", value)
    assert found in err.reason
    assert "\n" not in str(err)


def test_fixed_args_vllm_refuses_together(tmp_path, tiny_model):
    err = refused(write(tmp_path, tiny_model, server(**{"enable-auto-tool-choice": True})))
    assert (err.key, err.value) == ("server.args", {"enable-auto-tool-choice": True})
    assert "--tool-call-parser" in err.reason


@pytest.mark.parametrize("param, key, value, found", [
    ({"kv-cache-dtype": {"type": "categorical", "choices": ["auto", "fp9"], "default": "auto"}},
     "parameters.kv-cache-dtype.choices", "fp9", "invalid choice"),
    ({"max-num-seqs": {"type": "int", "low": 0, "high": 64, "default": 64}},
     "parameters.max-num-seqs.low", 0, "greater than or equal to 1"),
    ({"max-num-seqs": {"type": "float", "low": 2, "high": 64, "default": 64}},  # int flag
     "parameters.max-num-seqs.low", 2.0, "invalid int value: '2.0'"),
    ({"gpu-memory-utilization": {"type": "float", "low": 0.5, "high": 1.2, "default": 0.92}},
     "parameters.gpu-memory-utilization.high", 1.2, "less than or equal to 1"),
    ({"max-model-len": {"type": "bool", "default": True}}, "parameters.max-model-len", True,
     "expected one argument"),
    ({"max-model-len": {"type": "categorical", "choices": [512, "abc"], "default": 512}},
     "parameters.max-model-len.choices", "abc", "invalid human_readable_int_or_auto"),
    ({"max-concurrency": {"type": "categorical", "choices": [0, 4], "default": 4, "kind": "run"}},
     "parameters.max-concurrency.choices", 0, "greater than 0 (it sets workload.max_concurrency)"),
    ({"max-concurrency": {"type": "float", "low": 1, "high": 8, "default": 8, "kind": "run"}},
     "parameters.max-concurrency.low", 1.0, "valid integer"),  # a float range, an int setting
])
def test_a_bad_value_a_parameter_can_take(tmp_path, tiny_model, param, key, value, found):
    err = refused(write(tmp_path, tiny_model, space={"parameters": param}))
    assert (err.file, err.key, err.value) == (str(tmp_path / "space.yaml"), key, value)
    assert found is None or found in err.reason, err.reason


@pytest.mark.parametrize("sweep, space, key, value, found", [
    (server(**{"max-num-seqs": 8}), None, "parameters.max-num-seqs", "max-num-seqs",
     "also fixed in server.args"),
    # every request: 64 + 16 tokens, max-model-len 64 refuses each prompt
    (server(**{"max-model-len": 64}), None, "server.args.max-model-len", 64,
     "every request is refused"),
    (server(**{"max-model-len": 70}), None, "server.args.max-model-len", 70,
     "64 prompt + 16 output = 80 tokens exceed max-model-len 70"),
    ({}, {"parameters": {"max-model-len": {"type": "categorical", "choices": [48, 72],
                                           "default": 72}}},
     "parameters.max-model-len", 72, "exceed max-model-len 72 in every trial"),
    # unset: vLLM takes the tiny model's max_position_embeddings, 4096
    ({"workload": {"input_len": 4000, "output_len": 200}}, None, "workload.input_len", 4000,
     "max_position_embeddings 4096"),
    (server(**{"no-enable-chunked-prefill": True, "max-model-len": 512,
               "max-num-batched-tokens": 256}), None,
     "server.args.max-num-batched-tokens", 256, "chunked prefill is off"),
    (server(**{"enable-chunked-prefill": False, "max-model-len": 1024}),
     {"parameters": {"max-num-batched-tokens": {"type": "categorical", "choices": [256, 512],
                                                "default": 512}}},
     "parameters.max-num-batched-tokens", 512, "at most 512) < max-model-len (at least 1024)"),
    (server(**{"max-num-batched-tokens": 64}),
     {"parameters": {"max-num-seqs": {"type": "categorical", "choices": [128, 256],
                                      "default": 256}}},
     "server.args.max-num-batched-tokens", 64, "< max-num-seqs (at least 128)"),
    ({"objective": {"metric": "request_goodput"}}, None, "objective.metric", "request_goodput",
     "this sla sets none"),
    ({"workload": {"output_len": 1}, "sla": {"p99_tpot_ms": 10}}, None, "sla.p99_tpot_ms",
     "p99_tpot_ms", "every request has 1 output token"),
])
def test_parts_that_make_every_trial_fail(tmp_path, tiny_model, sweep, space, key, value, found):
    err = refused(write(tmp_path, tiny_model, sweep, space))
    assert (err.key, err.value) == (key, value)
    assert found in err.reason, err.reason
    assert err.file == str(tmp_path / ("sweep.yaml" if not key.startswith("parameters")
                                       else "space.yaml"))


def test_results_dir_that_is_a_file(tmp_path, tiny_model):
    (tmp_path / "taken").write_text("")
    err = refused(write(tmp_path, tiny_model, {"results_dir": str(tmp_path / "taken")}))
    assert (err.key, err.value) == ("results_dir", str(tmp_path / "taken"))
    assert "exists and is not a directory" in err.reason


def test_tokenizer_folder_without_tokenizer(tmp_path, tiny_model):
    err = refused(write(tmp_path, tiny_model, {"workload": {"tokenizer": str(tmp_path)}}))
    assert (err.key, err.value) == ("workload.tokenizer", str(tmp_path))


@pytest.mark.parametrize("sweep, space", [
    # some trials fit: the ones that do not fail alone (the feasibility model's business)
    ({}, {"parameters": {"max-model-len": {"type": "categorical", "choices": [48, 512],
                                           "default": 512}}}),
    (server(**{"enable-chunked-prefill": False, "max-model-len": 1024}),
     {"parameters": {"max-num-batched-tokens": {"type": "categorical", "choices": [512, 1024],
                                                "default": 1024}}}),
    (server(**{"max-model-len": "1k", "max-num-batched-tokens": "2k"}), None),
    (server(**{"max-model-len": "auto"}), None),
    ({"objective": {"metric": "request_goodput"}, "sla": {"p99_ttft_ms": 500}}, None),
    # the fake engine is no vLLM: its flags are not vLLM's to judge
    ({"engine": "fake", "server": {"args": {"max-model-len": 8}}}, None),
])
def test_what_vllm_accepts_passes(tmp_path, tiny_model, sweep, space):
    assert loader.load(write(tmp_path, tiny_model, sweep, space)).spec.name == "v"


def test_a_search_space_given_as_the_sweep(tmp_path, tiny_model):
    space = write(tmp_path, tiny_model).with_name("space.yaml")
    with pytest.raises(ConfigError) as caught:
        loader.load(space)
    err = caught.value
    assert (err.file, err.key, err.value) == (str(space), "(top level)", "parameters")
    assert "this is a search-space file" in err.reason and "where a sweep file belongs" in err.reason


def test_a_sweep_given_as_its_search_space(tmp_path, tiny_model):
    first = write(tmp_path, tiny_model)
    second = tmp_path / "second.yaml"
    second.write_text(first.read_text().replace(str(tmp_path / "space.yaml"), str(first)))
    err = refused(second)
    assert (err.file, err.key, err.value) == (str(first), "(top level)", "model")
    assert "this is a sweep file" in err.reason


def test_an_autoscaling_config_that_is_missing_or_has_no_node_types(tmp_path, tiny_model):
    missing = tmp_path / "nowhere.yaml"
    err = refused(write(tmp_path, tiny_model, {"cluster": {"autoscaling_config": str(missing)}}))
    assert (err.key, err.value, err.reason) == ("cluster.autoscaling_config", str(missing),
                                                "file not found")
    empty = tmp_path / "c.yaml"
    empty.write_text(yaml.safe_dump({"cluster_name": "x"}))
    err = refused(write(tmp_path, tiny_model, {"cluster": {"autoscaling_config": str(empty)}}))
    assert err.key == "cluster.autoscaling_config" and "available_node_types" in err.reason
    assert "\n" not in str(err)


def test_the_repository_cluster_yaml_is_an_autoscaling_config(tmp_path, tiny_model):
    root = Path(__file__).resolve().parents[3]
    sweep = loader.load(write(tmp_path, tiny_model,
                              {"cluster": {"autoscaling_config": str(root / "cluster.yaml")}}))
    assert sweep.spec.cluster.autoscaling_config == root / "cluster.yaml"
