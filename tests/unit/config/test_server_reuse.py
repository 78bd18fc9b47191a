"""Server reuse (issue 8): parameters marked `kind: run` are load settings, not vLLM flags;
trials whose vLLM flags are equal measure on one running server (same PID), its prefix cache
reset between them, so one run does not warm the next. Unit tests for the pieces, then sweeps
through the CLI: FakeEngine (with and without `server.reuse`) and real vLLM on CPU."""

from __future__ import annotations

import math

import pytest
import yaml

from framework.base.errors import ConfigError
from framework.config.search_space import SearchSpace
from framework.config.search_space import load_search_space
from framework.config.specs import SweepSpec
from framework.load.workload import RequestSpec
from framework.load.workload import arrival_offsets
from framework.search.tuner import Tuner
from framework.sweep.trial_load import with_run_settings
from framework.trial.measure import LoadPlan

SPACE = {"max-num-seqs": {"type": "categorical", "choices": [4, 8, 16], "default": 16},
         "max-concurrency": {"type": "categorical", "choices": [2, 4], "kind": "run"},
         "enable-prefix-caching": {"type": "bool", "default": True}}


def test_run_settings_are_split_from_vllm_flags():
    space = SearchSpace.model_validate({"parameters": SPACE})
    params = {"max-num-seqs": 8, "max-concurrency": 4, "enable-prefix-caching": False}
    assert space.run_params == ("max-concurrency",)
    assert space.server_params(params) == {"max-num-seqs": 8, "enable-prefix-caching": False}
    assert space.run_settings(params) == {"max_concurrency": 4}


@pytest.mark.parametrize("param, message", [
    ({"request-rate": {"type": "float", "low": 1, "high": 8}}, "mark it kind: run"),
    ({"max-num-seqs": {"type": "int", "low": 1, "high": 8, "kind": "run"}}, "is kind: server"),
    ({"max-concurrency": {"type": "int", "low": 1, "high": 8, "kind": "later"}}, "kind"),
])
def test_a_misplaced_kind_is_a_one_line_error(tmp_path, param, message):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"parameters": param}))
    with pytest.raises(ConfigError) as err:
        load_search_space(path)
    text = str(err.value)
    assert str(path) in text and message in text and "\n" not in text


def _plan(n: int) -> LoadPlan:
    reqs = [RequestSpec(prompt="x", prompt_len=1, output_len=4)] * n
    return LoadPlan(model="m", warmup=(), measured=reqs, arrivals=None, max_concurrency=32,
                    ignore_eos=True, request_timeout_s=60, percentiles=(99,), goodput_slo_ms={},
                    startup_timeout_s=60)


@pytest.mark.parametrize("settings, concurrency, rate", [
    ({}, 32, None),
    ({"max_concurrency": 4}, 4, None),
    ({"request_rate": 5.0}, 32, 5.0),
    ({"request_rate": math.inf, "max_concurrency": 2}, 2, None),
    ({"request_rate": 2.0, "burstiness": 0.5}, 32, 2.0),
])
def test_run_settings_change_only_the_load_shape(settings, concurrency, rate):
    spec = SweepSpec.model_validate({"name": "x", "model": "m", "search_space": "s.yaml",
                                     "workload": {"max_concurrency": 32, "seed": 7}})
    plan = _plan(20)
    out = with_run_settings(plan, spec, settings)
    assert out.measured == plan.measured and out.warmup == plan.warmup
    assert out.max_concurrency == concurrency and out.request_rate == rate
    if rate is None:
        assert out.arrivals is None
    else:
        burst = settings.get("burstiness", 1.0)
        assert list(out.arrivals) == list(arrival_offsets(20, rate, burst, 7))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grid_with_run_settings_groups_trials_by_server_flags(tmp_path, seed):
    """Each server configuration's run settings come one after another (so the server can be
    kept), every grid point exactly once."""
    space = SearchSpace.model_validate({"parameters": SPACE})
    tuner = Tuner(tmp_path / "j.log", "g", space, ["maximize"], "grid", seed, 2)
    asked = [tuner.ask() for _ in range(12)]
    points = [tuple(p.params[n] for n in SPACE) for p in asked]
    assert len(set(points)) == 12
    servers = [space.server_params(p.params) for p in asked]
    for i in range(0, 12, 2):
        assert servers[i] == servers[i + 1], points
    firsts = [tuple(sorted(servers[i].items())) for i in range(0, 12, 2)]
    assert len(set(firsts)) == 6


@pytest.mark.parametrize("params, expected", [
    ({"max-num-seqs": 8, "max-concurrency": 2}, [{"max-num-seqs": 8, "max-concurrency": 4}]),
    ({"max-num-seqs": 8}, []),  # no run setting in the trial
])
def test_siblings_vary_only_the_run_settings(params, expected):
    space = SearchSpace.model_validate({"parameters": SPACE})
    assert space.siblings(params) == expected


def test_siblings_cover_every_other_combination_and_skip_wide_ranges():
    space = SearchSpace.model_validate({"parameters": {
        "max-num-seqs": {"type": "int", "low": 1, "high": 64},
        "max-concurrency": {"type": "int", "low": 4, "high": 12, "step": 4, "kind": "run"},
        "burstiness": {"type": "categorical", "choices": [0.5, 1.0], "kind": "run"}}})
    got = space.siblings({"max-num-seqs": 3, "max-concurrency": 8, "burstiness": 1.0})
    assert len(got) == 5 and all(g["max-num-seqs"] == 3 for g in got)
    assert {(g["max-concurrency"], g["burstiness"]) for g in got} == {
        (4, 0.5), (4, 1.0), (8, 0.5), (12, 0.5), (12, 1.0)}
    wide = SearchSpace.model_validate({"parameters": {
        "request-rate": {"type": "float", "low": 1, "high": 8, "kind": "run"}}})
    assert wide.siblings({"request-rate": 2.0}) == []
