"""sweep.load_curve: a searched load setting becomes one workload per value of every trial."""

from __future__ import annotations

from typing import Any

import pytest

from framework.base.errors import ConfigError
from framework.config.search_space import SearchSpace
from framework.config.specs import SweepSpec
from framework.sweep.load_curve import MAX_VALUES
from framework.sweep.load_curve import as_load_curve

SEQS = {"max-num-seqs": {"type": "categorical", "choices": [4, 8]}}


def spec(**extra: Any) -> SweepSpec:
    return SweepSpec.model_validate({"name": "t", "model": "m", "search_space": "s.yaml",
                                     "workload": {"input_len": 32, "output_len": 8}, **extra})


def space(**params: Any) -> SearchSpace:
    return SearchSpace.model_validate({"parameters": {**SEQS, **params}})


def run(kind: str = "categorical", **fields: Any) -> dict[str, Any]:
    return {"type": kind, "kind": "run", **fields}


def test_without_a_searched_load_nothing_changes():
    s, sp = spec(), space()
    assert as_load_curve(s, sp) == (s, sp)


def test_each_value_is_a_workload_of_every_trial_and_leaves_the_space():
    curved, left = as_load_curve(spec(), space(**{"request-rate": run(choices=[2, 0.5])}))
    assert [(w.name, w.request_rate, w.input_len) for w in curved.workloads] == [
        ("request-rate-2", 2.0, 32), ("request-rate-0.5", 0.5, 32)]
    assert list(left.parameters) == ["max-num-seqs"] and left.run_params == ()
    assert curved.workload.request_rate == 2.0  # what reads one workload sees the first


def test_an_int_range_gives_its_steps_and_several_workloads_each_get_the_curve():
    two = spec(workload=None, workloads=[
        {"name": "chat", "input_len": 32, "output_len": 8},
        {"name": "long", "input_len": 256, "output_len": 8, "weight": 2}])
    curved, _ = as_load_curve(two, space(**{"max-concurrency": run("int", low=1, high=3)}))
    assert [(w.name, w.max_concurrency, w.weight) for w in curved.workloads] == [
        ("chat-max-concurrency-1", 1, 1.0), ("chat-max-concurrency-2", 2, 1.0),
        ("chat-max-concurrency-3", 3, 1.0), ("long-max-concurrency-1", 1, 2.0),
        ("long-max-concurrency-2", 2, 2.0), ("long-max-concurrency-3", 3, 2.0)]


def test_allow_load_bound_keeps_the_setting_searched():
    kept = spec(objective={"allow_load_bound": True})
    sp = space(**{"request-rate": run(choices=[1, 2])})
    assert as_load_curve(kept, sp) == (kept, sp)


@pytest.mark.parametrize(("params", "extra", "key", "found"), [
    ({"request-rate": run(choices=[1, 2]), "max-concurrency": run(choices=[1, 2])}, {},
     "parameters.max-concurrency", "one load setting per sweep"),
    ({"request-rate": run("float", low=1.0, high=4.0)}, {}, "parameters.request-rate",
     f"give at most {MAX_VALUES} as choices"),
    ({"max-concurrency": run("int", low=1, high=64)}, {}, "parameters.max-concurrency",
     "as choices"),
    ({"request-rate": run(choices=[1, 2])}, {"search": {"screen": 0.5}},
     "parameters.request-rate", "search.screen"),
])
def test_what_cannot_be_a_curve_is_one_line_naming_the_parameter(params, extra, key, found):
    with pytest.raises(ConfigError) as err:
        as_load_curve(spec(**extra), space(**params))
    assert (err.value.file, err.value.key) == ("s.yaml", key)
    assert found in err.value.reason and "\n" not in str(err.value)


def test_validate_says_the_setting_is_a_curve_and_the_baseline_needs_no_default_for_it(tmp_path):
    """The space's load setting has no default (vLLM has none: every trial, the baseline too,
    runs each value); validate and plan name the curve's values."""
    import yaml

    from tests.cli import cli_in_process
    from tests.paths import TINY_MODEL

    (tmp_path / "space.yaml").write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [4, 256], "default": 256},
        "request-rate": run(choices=[2, 4])}}))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "lc", "model": str(TINY_MODEL), "search_space": str(tmp_path / "space.yaml"),
        "engine": "fake", "workload": {"input_len": 16, "output_len": 4},
        "objective": {"metric": "p99_ttft_ms", "direction": "minimize"},
        "results_dir": str(tmp_path / "results")}))
    said = "request-rate measured as a curve of each configuration at 2, 4"
    for command in ("validate", "plan"):
        res = cli_in_process(command, str(sweep), cwd=tmp_path)
        assert res.returncode == 0 and said in res.stdout, res.stdout + res.stderr
