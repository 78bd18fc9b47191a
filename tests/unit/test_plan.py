"""`plan`: space size, the feasible share, the time estimate; and the command itself."""

from __future__ import annotations

import pandas as pd
import pytest

from framework.config.search_space import SearchSpace
from framework.config.search_space import load_search_space
from framework.engine.feasibility import Feasibility
from framework.results.queries import phase_means
from framework.sweep.plan import DEFAULTS_S
from framework.sweep.plan import configurations
from framework.sweep.plan import feasible_share
from framework.sweep.plan import runs_per_server
from framework.sweep.plan import sample
from framework.sweep.plan import space_size
from framework.sweep.plan import time_estimate
from tests.helpers import ROOT
from tests.helpers import cli_in_process


def space(parameters: dict) -> SearchSpace:
    return SearchSpace.model_validate({"parameters": parameters})


COND = space({"spec": {"type": "bool"},
              "tokens": {"type": "int", "low": 1, "high": 4, "when": {"spec": True}},
              "seqs": {"type": "categorical", "choices": [8, 16, 32]}})


def test_space_size():
    assert space_size(load_search_space(ROOT / "search_spaces" / "tiny_cpu.yaml")) == 127 * 4 * 2 * 2
    assert space_size(COND) == (1 + 4) * 3  # tokens only where spec is true
    assert space_size(space({"u": {"type": "float", "low": 0.8, "high": 0.9}})) is None


def test_configurations_leave_out_inactive_parameters():
    configs = list(configurations(COND))
    assert len(configs) == 15 and len({tuple(sorted(c.items())) for c in configs}) == 15
    assert all(("tokens" in c) == c["spec"] for c in configs)


def test_sample_respects_ranges_conditions_and_seed():
    sp = space({"spec": {"type": "bool"},
                "tokens": {"type": "int", "low": 1, "high": 64, "log": True, "when": {"spec": True}},
                "util": {"type": "float", "low": 0.8, "high": 0.95}})
    drawn = sample(sp, 300, seed=4)
    assert drawn == sample(sp, 300, seed=4)
    assert all(0.8 <= c["util"] <= 0.95 and ("tokens" in c) == c["spec"] for c in drawn)
    tokens = [c["tokens"] for c in drawn if "tokens" in c]
    assert min(tokens) >= 1 and max(tokens) <= 64
    assert sum(t <= 8 for t in tokens) > len(tokens) / 3  # log-uniform: half below sqrt(64)


def test_feasible_share_counts_and_groups_reasons_without_numbers():
    def check(config):
        seqs = config["seqs"]
        if seqs > 8:
            return Feasibility(ok=False, reasons=(f"max-num-seqs {seqs} must be <= 8 (test)",))
        return Feasibility(ok=True)

    share = feasible_share(list(configurations(COND)), True, check)
    assert (share.checked, share.feasible, share.exhaustive) == (15, 5, True)
    assert share.top_reasons == (("max-num-seqs N must be <= N", 10),)
    assert feasible_share([{"seqs": 8}], True, lambda c: None) is None


def rows(**columns) -> pd.DataFrame:
    return pd.DataFrame(columns)


def test_time_estimate_from_history_or_defaults():
    history = rows(state=["COMPLETE", "COMPLETE", "FAIL"], startup_s=[20.0, 30.0, None],
                   warmup_s=[2.0, None, None], bench_s=[8.0, 12.0, None],
                   trial_s=[33.0, 45.0, 5.0])
    est = time_estimate(phase_means(history), "cpu", n_trials=10, side_by_side=2)
    assert est.per_trial_s == pytest.approx({"startup": 25.0, "warmup": 1.0, "bench": 10.0,
                                             "overhead": 3.0})
    assert est.total_s == pytest.approx(10 * 39.0 / 2)
    assert phase_means(pd.DataFrame()) is None
    fresh = time_estimate(None, "gpu", n_trials=4, side_by_side=1)
    assert fresh.per_trial_s == DEFAULTS_S["gpu"] and "defaults" in fresh.source
    assert fresh.starts == 4


def test_time_estimate_with_server_reuse():
    """Reused trials (start-up ~0) do not count in the start-up mean; 10 trials at 4 run
    settings per server need ceil(10 / 4) = 3 starts: (3 x 25 + 10 x 14) / 1 s."""
    history = rows(state=["COMPLETE"] * 3, startup_s=[20.0, 30.0, 0.1],
                   server_reused=[False, False, True], warmup_s=[1.0, 1.0, 1.0],
                   bench_s=[10.0, 10.0, 10.0], trial_s=[34.0, 44.0, 14.1])
    est = time_estimate(phase_means(history), "cpu", n_trials=10, side_by_side=1, runs_per_server=4)
    assert est.per_trial_s["startup"] == pytest.approx(25.0)
    assert est.starts == 3
    assert est.total_s == pytest.approx(3 * 25.0 + 10 * 14.0, rel=1e-3)


@pytest.mark.parametrize("parameters, sampler, expected", [
    ({"max-num-seqs": {"type": "categorical", "choices": [8, 16]}}, "tpe", 1),
    ({"max-num-seqs": {"type": "categorical", "choices": [8, 16]},
      "max-concurrency": {"type": "categorical", "choices": [1, 2, 4], "kind": "run"},
      "burstiness": {"type": "categorical", "choices": [0.5, 1.0], "kind": "run"}}, "tpe", 6),
    ({"request-rate": {"type": "float", "low": 1, "high": 8, "kind": "run"}}, "random", 1),
    # 40 values: the grid walks them all on one server; TPE's siblings skip so many
    ({"max-concurrency": {"type": "int", "low": 1, "high": 40, "kind": "run"}}, "grid", 40),
    ({"max-concurrency": {"type": "int", "low": 1, "high": 40, "kind": "run"}}, "tpe", 1),
    ({"max-concurrency": {"type": "int", "low": 1, "high": 16, "kind": "run"}}, "tpe", 16),
])
def test_runs_per_server(parameters, sampler, expected):
    assert runs_per_server(space(parameters), sampler) == expected


def test_plan_command_on_the_seeds_70b_sweep():
    res = cli_in_process("plan", "sweeps/llama70b_8xa100.yaml", "--gpus", "8")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "sweep llama70b-8xa100: 9 parameters, unbounded (float ranges)"
    assert "configurations pass" in lines[1] and "with 8 GPUs" in lines[1]
    assert any("TP N x PP N = N workers, but only N devices are available" in ln for ln in lines)
    assert lines[-1].startswith("  time: (30 server starts x 180 s + 30 trials x (warmup 10 s")
