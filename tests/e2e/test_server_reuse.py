"""Server reuse (issue 8): parameters marked `kind: run` are load settings, not vLLM flags;
trials whose vLLM flags are equal measure on one running server (same PID), its prefix cache
reset between them, so one run does not warm the next. Unit tests for the pieces, then sweeps
through the CLI on FakeEngine (with and without `server.reuse`); on real vLLM on CPU:
tests/e2e/test_chat_mix.py (two trials of one server, the cache reset between them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.cli import run_joined
from tests.clusters import SharedRay
from tests.clusters import join_shared
from tests.paths import TINY_MODEL
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_trials


def _fake_reuse_sweep(ray: SharedRay, tmp: Path, name: str, reuse: bool,
                      **search) -> tuple[str, Path]:
    space = tmp / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [4, 8], "default": 8},
        "max-concurrency": {"type": "categorical", "choices": [2, 4], "kind": "run"}}}))
    sweep = tmp / f"{name}.yaml"
    sweep.write_text(yaml.safe_dump(join_shared({
        "name": name, "model": str(TINY_MODEL),
        "search_space": str(space), "engine": "fake",
        "server": {"reuse": reuse, "env": {"FAKE_ENGINE_STARTUP_S": "0.5"}},
        "workload": {"num_prompts": 12, "input_len": 16, "output_len": 4, "warmup_requests": 4},
        "search": {**NO_REMEASURE, "sampler": "grid", "n_trials": 4, "baseline": False, **search},
        "objective": {"allow_load_bound": True},  # run settings searched to test reuse
        "results_dir": str(tmp / "results")}, ray)))
    res = run_joined(ray, ["run", str(sweep)], tmp)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout, tmp / "results"


@pytest.mark.server
@pytest.mark.timeout(300)
def test_fake_engine_sweep_reuses_servers_only_across_run_settings(shared_ray, short_tmp):
    out, results = _fake_reuse_sweep(shared_ray, short_tmp, "reuse", True, confirm_top=1)
    trials = read_trials(results, "reuse").sort_values("trial_number")
    grid, confirmation = trials[trials["confirmation_of"].isna()], \
        trials[trials["confirmation_of"].notna()]
    assert len(grid) == 4 and len(confirmation) == 1 and (trials["state"] == "COMPLETE").all()
    assert grid["server_reused"].tolist() == [False, True, False, True], out[-2000:]
    pids = grid["server_pid"].tolist()
    assert pids[0] == pids[1] and pids[2] == pids[3] and pids[0] != pids[2]
    assert grid["param_max_num_seqs"].iloc[0] == grid["param_max_num_seqs"].iloc[1]
    assert grid["param_max_concurrency"].iloc[0] != grid["param_max_concurrency"].iloc[1]
    # the measured prompts are the same in every trial: only a reset cache shows no hits
    assert (grid["prefix_cache_hit_rate"] == 0).all(), grid["prefix_cache_hit_rate"].tolist()
    assert grid["server_log"].iloc[1] == grid["server_log"].iloc[0]
    # the same pid above is the proof that nothing was launched (no bound on launch_s: a time)
    assert grid["running_requests_max"].iloc[1] <= 4
    # one engine served each run (FakeEngine labels its counter as vLLM does: engine="0")
    assert (grid["engines_served"] == 1).all() and (grid["engine_share_min"] == 1.0).all()
    assert not confirmation["server_reused"].iloc[0]
    assert confirmation["server_pid"].iloc[0] not in pids
    assert "reusing the running server" in out


@pytest.mark.server
@pytest.mark.timeout(300)
def test_without_reuse_every_trial_starts_its_own_server(shared_ray, short_tmp):
    """The grid's first two trials: equal vLLM flags, other max-concurrency (the pair that
    shares a server with reuse on, above): each starts its own."""
    _, results = _fake_reuse_sweep(shared_ray, short_tmp, "noreuse", False, n_trials=2)
    trials = read_trials(results, "noreuse")
    assert len(trials) == 2 and not trials["server_reused"].any()
    assert trials["param_max_num_seqs"].nunique() == 1, trials["param_max_num_seqs"].tolist()
    assert trials["server_pid"].nunique() == 2


@pytest.mark.server
@pytest.mark.timeout(300)
def test_tpe_measures_a_new_server_at_its_other_run_settings_next(shared_ray, short_tmp):
    """With TPE, a trial that started a server is followed by its sibling (other
    max-concurrency, same flags), which runs on the same server. Checked whatever TPE proposes
    (its proposals follow near-tie measurements): a starter whose sibling has not run yet is
    followed by it; one whose sibling ran before may be followed by any proposal, its own
    configuration again among them (on its server: reused, yet no sibling)."""
    _, results = _fake_reuse_sweep(shared_ray, short_tmp, "tpe", True, sampler="tpe", n_trials=6)
    trials = read_trials(results, "tpe").sort_values("trial_number").reset_index(drop=True)
    assert len(trials) == 6 and (trials["state"] == "COMPLETE").all()
    shown = trials[["param_max_num_seqs", "param_max_concurrency", "server_reused"]]
    # the first starter's sibling, then the next starter's or the parked server taken
    assert trials["server_reused"].sum() >= 2, shown
    ran = [(r["param_max_num_seqs"], r["param_max_concurrency"]) for _, r in trials.iterrows()]
    loads = {2, 4}  # _fake_reuse_sweep's max-concurrency choices
    for i in trials.index[~trials["server_reused"]]:
        seqs, load = ran[i]
        (other,) = loads - {load}
        if (seqs, other) in ran[:i] or i + 1 >= len(trials):
            continue  # its sibling had run before, or the sweep ended with it
        a, b = trials.loc[i], trials.loc[i + 1]
        assert ran[i + 1] == (seqs, other) and b["server_reused"], shown
        assert a["server_pid"] == b["server_pid"]
