"""Search-space files -> SearchSpace: the shipped CPU space and a catalogue of malformed files."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from framework.base.errors import ConfigError
from framework.config.search_space import BoolParam
from framework.config.search_space import CategoricalParam
from framework.config.search_space import FloatParam
from framework.config.search_space import IntParam
from framework.config.search_space import SearchSpace
from framework.config.search_space import grid_points
from framework.config.search_space import grid_size
from framework.config.search_space import grid_values
from framework.config.search_space import load_search_space
from tests.paths import ROOT as REPO

TINY_CPU = REPO / "search_spaces" / "tiny_cpu.yaml"


def test_tiny_cpu_loads():
    space = load_search_space(TINY_CPU)

    assert list(space.parameters) == ["max-num-seqs", "max-num-batched-tokens",
                                      "enable-chunked-prefill", "enable-prefix-caching"]
    seqs = space.parameters["max-num-seqs"]
    assert isinstance(seqs, IntParam)
    assert (seqs.low, seqs.high, seqs.step, seqs.log) == (2, 128, 1, True)
    tokens = space.parameters["max-num-batched-tokens"]
    assert isinstance(tokens, CategoricalParam)
    assert tokens.choices == (512, 1024, 2048, 4096)
    assert all(type(c) is int for c in tokens.choices)  # YAML ints stay ints, not str/float
    assert isinstance(space.parameters["enable-chunked-prefill"], BoolParam)
    assert isinstance(space.parameters["enable-prefix-caching"], BoolParam)
    # every parameter learns its own name from its key
    assert [p.name for p in space.parameters.values()] == list(space.parameters)


def test_tiny_cpu_defaults():
    space = load_search_space(TINY_CPU)
    assert space.defaults() == {"max-num-seqs": 128, "max-num-batched-tokens": 2048,
                                "enable-chunked-prefill": True, "enable-prefix-caching": True}
    assert space.missing_defaults() == []


def test_defaults_skip_parameters_without_default(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(
        "parameters:\n"
        "  max-num-seqs: {type: int, low: 1, high: 8, default: 4}\n"
        "  gpu-memory-utilization: {type: float, low: 0.5, high: 0.95}\n"
        "  enforce-eager: {type: bool, default: false}\n"
        "  dtype: {type: categorical, choices: [half, bfloat16]}\n")
    space = load_search_space(path)
    assert space.defaults() == {"max-num-seqs": 4, "enforce-eager": False}
    assert space.missing_defaults() == ["gpu-memory-utilization", "dtype"]
    assert isinstance(space.parameters["gpu-memory-utilization"], FloatParam)


def param(body: str, name: str = "max-num-seqs") -> str:
    return f"parameters:\n  {name}: {body}\n"


# (id, file text, expected ConfigError.key (or its prefix before a union tag), mentions)
MALFORMED = [
    ("int-low-gt-high", param("{type: int, low: 64, high: 8}"), "parameters.max-num-seqs",
     ("low 64 > high 8",)),
    ("float-low-gt-high", param("{type: float, low: 0.9, high: 0.5}", "gpu-memory-utilization"),
     "parameters.gpu-memory-utilization", ("low 0.9 > high 0.5",)),
    ("empty-choices", param("{type: categorical, choices: []}", "dtype"), "parameters.dtype",
     ("choices is empty",)),
    ("duplicate-choice", param("{type: categorical, choices: [512, 1024, 512]}",
                               "max-num-batched-tokens"),
     "parameters.max-num-batched-tokens", ("repeat", "512")),
    ("int-default-above-range", param("{type: int, low: 2, high: 128, default: 256}"),
     "parameters.max-num-seqs", ("default 256", "[2, 128]")),
    ("int-default-below-range", param("{type: int, low: 2, high: 128, default: 1}"),
     "parameters.max-num-seqs", ("default 1",)),
    ("float-default-outside", param("{type: float, low: 0.5, high: 0.9, default: 0.95}",
                                    "gpu-memory-utilization"),
     "parameters.gpu-memory-utilization", ("default 0.95",)),
    ("default-not-in-choices", param("{type: categorical, choices: [512, 1024], default: 2048}",
                                     "max-num-batched-tokens"),
     "parameters.max-num-batched-tokens", ("2048", "not one of the choices")),
    ("int-log-low-zero", param("{type: int, low: 0, high: 128, log: true}"),
     "parameters.max-num-seqs", ("low > 0",)),
    ("float-log-low-negative", param("{type: float, low: -1.0, high: 1.0, log: true}", "x"),
     "parameters.x", ("low > 0",)),
    ("int-log-with-step", param("{type: int, low: 2, high: 128, log: true, step: 2}"),
     "parameters.max-num-seqs", ("step 1",)),
    ("int-step-zero", param("{type: int, low: 2, high: 128, step: 0}"),
     "parameters.max-num-seqs", ()),
    ("unknown-param-type", param("{type: string, default: x}", "dtype"), "parameters.dtype",
     ("'string'",)),
    ("missing-param-type", param("{low: 1, high: 2}"), "parameters.max-num-seqs", ()),
    ("unknown-param-key", param("{type: bool, deafult: true}", "enforce-eager"),
     "parameters.enforce-eager", ("deafult",)),
    ("int-missing-high", param("{type: int, low: 1}"), "parameters.max-num-seqs", ("high",)),
    ("unknown-top-level-key", "params:\n  x: {type: bool}\nparameters:\n  x: {type: bool}\n",
     "params", ()),
    ("no-parameters", "parameters: {}\n", "(top level)", ("no parameters",)),
    ("parameters-missing", "description: nothing\n", "parameters", ("Field required",)),
    # a rule over the parameters names the parameter and shows its entry, not the whole file
    ("flag-leading-dashes", param("{type: int, low: 2, high: 128}", "--max-num-seqs"),
     "parameters.--max-num-seqs", ("'--max-num-seqs'", "without dashes", "'high': 128}")),
    ("flag-with-space", param("{type: bool}", "'enable prefix caching'"),
     "parameters.enable prefix caching", ("'enable prefix caching'",)),
    ("when-names-a-later-parameter",
     "parameters:\n  a: {type: bool, when: {b: true}}\n  b: {type: bool}\n"
     "description: a long description that must not be repeated in the error\n",
     "parameters.a", ("not a parameter listed before it", "{'when': {'b': True}")),
    ("yaml-syntax-error", "parameters:\n  x: {type: bool\n", None, ("YAML syntax error",)),
    ("top-level-list", "- max-num-seqs\n", "(top level)", ("expected a mapping",)),
]


@pytest.mark.parametrize(("text", "key", "mentions"), [c[1:] for c in MALFORMED],
                         ids=[c[0] for c in MALFORMED])
def test_malformed_search_space_is_one_line_config_error(tmp_path, text, key, mentions):
    path = tmp_path / "space.yaml"
    path.write_text(text)

    with pytest.raises(ConfigError) as info:
        load_search_space(path)

    err = info.value
    message = str(err)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    if key is None:
        assert err.key.startswith("line ")
    else:
        # a discriminated union adds the parameter's type tag after the key
        assert err.key == key or err.key.startswith(key + ".")
        assert f": {err.key}: " in message
    for part in mentions:
        assert part in message


@pytest.mark.parametrize("parameters, message", [
    ({"a": {"type": "int", "low": 1, "high": 4, "when": {"b": True}},
      "b": {"type": "bool"}}, "not a parameter listed before it"),
    ({"b": {"type": "bool"}, "a": {"type": "int", "low": 1, "high": 4, "when": {"b": 3}}},
     "a value 'b' never takes"),
    ({"b": {"type": "categorical", "choices": ["x", "y"]},
      "a": {"type": "int", "low": 1, "high": 4, "when": {"b": "z"}}}, "never takes"),
])
def test_bad_conditions_are_rejected(parameters, message):
    with pytest.raises(ValidationError) as err:
        SearchSpace.model_validate({"parameters": parameters})
    assert message in str(err.value)


def test_grid_values_and_size():
    space = SearchSpace.model_validate({"parameters": {
        "a": {"type": "int", "low": 2, "high": 8, "step": 2},
        "b": {"type": "bool"}, "c": {"type": "categorical", "choices": [1, "x"]}}})
    assert grid_values(space) == {"a": [2, 4, 6, 8], "b": [False, True], "c": [1, "x"]}
    assert grid_size(space) == 16


@pytest.mark.parametrize("parameters, message", [
    ({"f": {"type": "float", "low": 0.8, "high": 0.95}}, "float range"),
    ({"a": {"type": "int", "low": 1, "high": 100}, "b": {"type": "int", "low": 1, "high": 100}},
     "10000 configurations"),
    ({"b": {"type": "bool"}, "a": {"type": "int", "low": 1, "high": 100, "when": {"b": True}},
      "c": {"type": "int", "low": 1, "high": 100}}, "up to 20000 configurations"),
])
def test_grid_refuses_what_it_cannot_enumerate(parameters, message):
    space = SearchSpace.model_validate({"parameters": parameters})
    with pytest.raises(ValueError, match=message):
        grid_points(space)


def test_a_conditional_grid_branches_only_where_its_condition_holds():
    """The four deployment shapes of issue #36 as one grid: prefill/decode, else replicas, and
    data parallel only on a single server: 4 points, not the product's 8."""
    space = SearchSpace.model_validate({"parameters": {
        "prefill-servers": {"type": "categorical", "choices": [0, 1], "kind": "shape"},
        "replicas": {"type": "categorical", "choices": [1, 2], "kind": "shape",
                     "when": {"prefill-servers": 0}},
        "data-parallel-size": {"type": "categorical", "choices": [1, 2],
                               "when": {"prefill-servers": 0, "replicas": 1}}}})
    assert grid_points(space) == [
        {"prefill-servers": 0, "replicas": 1, "data-parallel-size": 1},
        {"prefill-servers": 0, "replicas": 1, "data-parallel-size": 2},
        {"prefill-servers": 0, "replicas": 2},
        {"prefill-servers": 1}]
    assert grid_size(space) == 4
    assert grid_values(space)["replicas"] == [1, 2]


@pytest.mark.parametrize("parameters, message", [
    ({"replicas": {"type": "int", "low": 1, "high": 4}}, "mark it kind: shape"),
    ({"max-num-seqs": {"type": "int", "low": 1, "high": 4, "kind": "shape"}},
     "kind: shape is for replicas"),
    ({"replicas": {"type": "int", "low": 0, "high": 2, "kind": "shape"}}, "whole number >= 1"),
    ({"replicas": {"type": "float", "low": 1, "high": 2, "kind": "shape"}}, "whole number >= 1"),
    ({"replicas": {"type": "categorical", "choices": [1, "two"], "kind": "shape"}},
     "whole number >= 1"),
    ({"replicas": {"type": "int", "low": 1, "high": 2, "kind": "shape", "lossy": True}},
     "never lossy"),
])
def test_bad_shape_parameters_are_rejected(parameters, message):
    with pytest.raises(ValidationError) as err:
        SearchSpace.model_validate({"parameters": parameters})
    assert message in str(err.value)


def test_a_shape_parameter_is_neither_a_flag_nor_a_run_setting():
    space = SearchSpace.model_validate({"parameters": {
        "max-num-seqs": {"type": "int", "low": 1, "high": 4, "default": 4},
        "replicas": {"type": "categorical", "choices": [1, 2], "kind": "shape", "default": 1},
        "max-concurrency": {"type": "categorical", "choices": [2, 4], "kind": "run",
                            "default": 4}}})
    params = {"max-num-seqs": 2, "replicas": 2, "max-concurrency": 4}
    assert space.shape_params == ("replicas",)
    assert space.server_params(params) == {"max-num-seqs": 2}
    assert space.shape_settings(params) == {"replicas": 2}
    assert space.run_settings(params) == {"max_concurrency": 4}
    assert space.defaults()["replicas"] == 1
