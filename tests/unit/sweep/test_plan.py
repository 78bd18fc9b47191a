"""`plan`: space size, the feasible share, the time estimate; and the command itself."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from framework.config.search_space import SearchSpace
from framework.config.search_space import configurations
from framework.config.search_space import load_search_space
from framework.engine.feasibility import Feasibility
from framework.results.queries import phase_means
from framework.sweep.plan import DEFAULTS_S
from framework.sweep.plan import TimeEstimate
from framework.sweep.plan import feasible_share
from framework.sweep.plan import remeasurements
from framework.sweep.plan import runs_per_server
from framework.sweep.plan import sample
from framework.sweep.plan import servers_per_trial
from framework.sweep.plan import space_size
from framework.sweep.plan import time_estimate
from tests.cli import cli_in_process
from tests.paths import ROOT


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


def test_time_estimate_counts_each_workload_of_a_trial_without_history():
    """A trial measures each workload (or load-curve value) in turn: the default warm-up and
    load count once per workload; a history's means already hold them all."""
    three = time_estimate(None, "cpu", n_trials=2, side_by_side=1, loads=3)
    cpu = DEFAULTS_S["cpu"]
    assert three.per_trial_s == pytest.approx({**cpu, "warmup": 3 * cpu["warmup"],
                                               "bench": 3 * cpu["bench"]})
    assert "3 workloads a trial" in three.source
    history = rows(state=["COMPLETE"], startup_s=[20.0], warmup_s=[2.0], bench_s=[8.0],
                   trial_s=[33.0])
    assert time_estimate(phase_means(history), "cpu", 2, 1, loads=3).per_trial_s["bench"] == 8.0


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
    # 30 trials + 1 confirmation run (confirm_top's default; no baseline to repeat)
    assert lines[-1].startswith("  time: (31 server starts x 180 s + 31 trials x (warmup 10 s")


PER = {"startup": 40.0, "warmup": 3.0, "bench": 10.0, "overhead": 2.0}


@pytest.mark.parametrize("starts, side, start_ahead, expected", [
    # sequential: 4 x 40 + 4 x 15 = 220
    (4, 1, 0, 4 * 40 + 4 * 15),
    # reuse: 2 servers for 4 trials: 2 x 40 + 4 x 15 = 140
    (2, 1, 0, 2 * 40 + 4 * 15),
    # GPU trials side by side on their own devices: (4 x 40 + 4 x 15) / 2 = 110
    (4, 2, 0, (4 * 40 + 4 * 15) / 2),
    # start-ahead 1: pairs of start-ups, each 1.31x: 4 x 40 x 1.31 / 2 = 104.8, measured one
    # at a time: + 60 = 164.8
    (4, 2, 1, 4 * 40 * 1.31 / 2 + 60),
    # start-ahead 2: three at once, each 1 + 2 x 0.31 = 1.62x: 4 x 40 x 1.62 / 3 = 86.4, + 60
    (4, 3, 2, 4 * 40 * 1.62 / 3 + 60),
])
def test_wall_time_counts_reuse_and_start_ahead(starts, side, start_ahead, expected):
    est = TimeEstimate(dict(PER), "test", trials=4, side_by_side=side, starts=starts,
                       start_ahead=start_ahead)
    assert est.total_s == pytest.approx(expected)


def test_start_ahead_reproduces_the_measured_wall_ratio():
    """docs/BENCHMARKS.md, start-ahead (4 trials): median start-up 36.6 s, wall 186 s without;
    the rest per trial = (186 - 4 x 36.6) / 4 = 9.9 s. With start-ahead 1 the estimate is
    4 x 36.6 x 1.31 / 2 + 4 x 9.9 = 135.5 s: 0.73x, where 0.74x [0.72-0.97] was measured."""
    per = {"startup": 36.6, "warmup": 0.0, "bench": 9.9, "overhead": 0.0}
    today = TimeEstimate(per, "bench", trials=4, side_by_side=1, starts=4)
    ahead = TimeEstimate(per, "bench", trials=4, side_by_side=2, starts=4, start_ahead=1)
    assert today.total_s == pytest.approx(186.0, abs=0.5)
    assert ahead.total_s / today.total_s == pytest.approx(0.73, abs=0.01)


@pytest.mark.parametrize("states, bench, screen, expected_bench", [
    # no history: 10 s full run x (0.2 screen + 50% default survival) = 7
    (None, None, 0.2, 10.0 * 0.7),
    # history: 3 COMPLETE (screen + full: bench 12 = 10 x 1.2), 1 PRUNED: survival 3/4;
    # 10 x (0.2 + 0.75) = 9.5
    (["COMPLETE", "COMPLETE", "COMPLETE", "PRUNED"], 12.0, 0.2, 9.5),
    # no screening: the COMPLETE trials' mean as it is
    (["COMPLETE", "COMPLETE", "COMPLETE", "PRUNED"], 12.0, None, 12.0),
])
def test_screening_counts_the_screen_and_the_survivors(states, bench, screen, expected_bench):
    history = None if states is None else phase_means(rows(
        state=states, startup_s=[30.0] * 4, warmup_s=[1.0] * 4, bench_s=[bench] * 4,
        trial_s=[45.0] * 4))
    est = time_estimate(history, "cpu", n_trials=4, side_by_side=1, screen=screen)
    assert est.per_trial_s["bench"] == pytest.approx(expected_bench)
    assert ("screening:" in "\n".join(est.lines())) == (screen is not None)


def test_start_up_phases_come_from_fresh_servers_and_are_printed():
    # trial 0 fresh: imports 30, api 2; trial 1 fresh: imports 20, api 4; trial 2 reused
    history = phase_means(rows(
        state=["COMPLETE"] * 3, startup_s=[33.0, 25.0, 0.2], server_reused=[False, False, True],
        warmup_s=[1.0] * 3, bench_s=[10.0] * 3, trial_s=[45.0, 37.0, 11.0],
        startup_placement_s=[1.0, 1.0, None], startup_imports_s=[30.0, 20.0, None],
        startup_api_s=[2.0, 4.0, None]))
    assert history.startup_phases == {"startup_placement_s": 1.0, "startup_imports_s": 25.0,
                                      "startup_api_s": 3.0}
    assert history.startup == 29.0  # the phases' means add up to the start-up mean
    est = time_estimate(history, "cpu", n_trials=4, side_by_side=1)
    assert "start-up by phase: placement 1.0 s, imports 25.0 s, api 3.0 s" in "\n".join(est.lines())


@pytest.mark.parametrize("confirm_top, baseline, repeats, extra", [
    (2, True, 2, 3),   # the quickstart: 2 confirmations + the baseline's last repeat
    (1, True, 0, 1),   # no baseline repeat
    (0, False, 2, 0),  # no baseline: nothing to repeat
])
def test_remeasurements_add_fresh_trials(confirm_top, baseline, repeats, extra):
    assert remeasurements(confirm_top, baseline, repeats) == extra
    # on the grid, the mid-search ones come on top of n_trials too
    assert remeasurements(confirm_top, baseline, repeats, interleaved=2) == extra + 2
    # 10 trials + extra, each re-measurement on its own server: (10 + extra) x (30 + 16) s
    est = time_estimate(None, "cpu", n_trials=10, side_by_side=1, remeasured=extra)
    assert (est.trials, est.starts) == (10 + extra, 10 + extra)
    assert est.total_s == pytest.approx((10 + extra) * (30 + 3 + 10 + 3))


@pytest.mark.parametrize(("engine", "warm", "startup", "zygote"), [
    ("cpu", False, 30.0, 0.0),
    ("cpu", True, 8.0, 11.0),
    # GPU: the zygote's start is counted, the per-server default kept (imports are small there)
    ("gpu", True, 180.0, 11.0),
])
def test_warm_start_changes_the_default_start_up_and_adds_the_zygote_once(
        engine, warm, startup, zygote):
    est = time_estimate(None, engine, n_trials=4, side_by_side=1, warm=warm)
    assert est.per_trial_s["startup"] == startup and est.zygote_s == zygote
    cold = time_estimate(None, engine, n_trials=4, side_by_side=1)
    assert est.total_s - cold.total_s == pytest.approx(zygote + 4 * (startup - cold.per_trial_s["startup"]))
    assert est.lines()[0].startswith(f"  time: zygote {zygote:.0f} s + " if warm else "  time: (")


@pytest.mark.parametrize(("configs", "servers"), [
    ([], 1.0),
    ([{"max-num-seqs": 8}], 1.0),
    # the four shapes of sweeps/shapes_cpu.yaml: 1, 1 (DP is one server), 2, 1 + 1
    ([{"prefill-servers": 0, "replicas": 1, "data-parallel-size": 1},
      {"prefill-servers": 0, "replicas": 1, "data-parallel-size": 2},
      {"prefill-servers": 0, "replicas": 2}, {"prefill-servers": 1}], 1.5),
])
def test_servers_per_trial(configs, servers):
    assert servers_per_trial(configs) == servers


def test_a_deployment_start_says_how_many_servers_it_is():
    estimate = time_estimate(None, "gpu", n_trials=4, side_by_side=1)
    assert "servers on average" not in "\n".join(estimate.lines())
    shaped = replace(estimate, servers=2.5)
    assert shaped.total_s == estimate.total_s  # started together: one start-up a deployment
    assert "a deployment of 2.5 servers on average (~10 servers)" in shaped.lines()[0]
