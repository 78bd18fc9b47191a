"""Server reuse (issue 8): parameters marked `kind: run` are load settings, not vLLM flags;
trials whose vLLM flags are equal measure on one running server (same PID), its prefix cache
reset between them, so one run does not warm the next. Unit tests for the pieces, then sweeps
through the CLI: FakeEngine (with and without `server.reuse`) and real vLLM on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helpers import NO_REMEASURE
from tests.helpers import cli_env
from tests.helpers import new_marker
from tests.helpers import read_trials
from tests.helpers import run_cli
from tests.helpers import wait_no_marked_processes


def _fake_reuse_sweep(tmp: Path, name: str, reuse: bool, **search) -> tuple[str, Path]:
    space = tmp / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [4, 8], "default": 8},
        "max-concurrency": {"type": "categorical", "choices": [2, 4], "kind": "run"}}}))
    sweep = tmp / f"{name}.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": name, "model": str(Path("models/tiny-llama").resolve()),
        "search_space": str(space), "engine": "fake",
        "server": {"reuse": reuse, "env": {"FAKE_ENGINE_STARTUP_S": "0.5"}},
        "workload": {"num_prompts": 12, "input_len": 16, "output_len": 4, "warmup_requests": 4},
        "search": {**NO_REMEASURE, "sampler": "grid", "n_trials": 4, "baseline": False, **search},
        "cluster": {"num_cpus": 2, "num_gpus": 1}, "results_dir": str(tmp / "results")}))
    marker = new_marker()
    res = run_cli(["run", str(sweep)], tmp, cli_env(marker, tmp), timeout_s=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert wait_no_marked_processes(marker) == []
    return res.stdout, tmp / "results"


@pytest.mark.server
@pytest.mark.timeout(300)
def test_fake_engine_sweep_reuses_servers_only_across_run_settings(short_tmp):
    out, results = _fake_reuse_sweep(short_tmp, "reuse", True, confirm_top=1)
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
    assert grid["launch_s"].iloc[1] < 0.5 and grid["running_requests_max"].iloc[1] <= 4
    assert not confirmation["server_reused"].iloc[0]
    assert confirmation["server_pid"].iloc[0] not in pids
    assert "reusing the running server" in out


@pytest.mark.server
@pytest.mark.timeout(300)
def test_without_reuse_every_trial_starts_its_own_server(short_tmp):
    _, results = _fake_reuse_sweep(short_tmp, "noreuse", False)
    trials = read_trials(results, "noreuse")
    assert not trials["server_reused"].any()
    assert trials["server_pid"].nunique() == 4


@pytest.mark.server
@pytest.mark.timeout(600)
def test_real_vllm_keeps_one_server_across_run_settings(tiny_model, short_tmp):
    """Real vLLM on CPU: two trials with equal flags share the API server process; the
    second starts with an empty prefix cache though it sends the same prompts (vLLM logs the
    reset; the engine contract test shows the reset empties the cache)."""
    space = short_tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-concurrency": {"type": "categorical", "choices": [4, 8], "kind": "run"}}}))
    sweep = short_tmp / "real.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "real", "model": str(tiny_model), "search_space": str(space),
        "server": {"args": {"enforce-eager": True, "max-model-len": 512,
                            "enable-prefix-caching": True}, "startup_timeout_s": 240},
        "workload": {"num_prompts": 24, "input_len": 300, "output_len": 8,
                     "warmup_requests": 4},
        "search": {**NO_REMEASURE, "sampler": "grid", "n_trials": 2, "baseline": False},
        "results_dir": str(short_tmp / "results")}))
    marker = new_marker()
    res = run_cli(["run", str(sweep)], short_tmp, cli_env(marker, short_tmp), timeout_s=540)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert wait_no_marked_processes(marker) == []
    trials = read_trials(short_tmp / "results", "real").sort_values("trial_number")
    assert (trials["state"] == "COMPLETE").all(), trials["fail_detail"].tolist()
    assert trials["server_reused"].tolist() == [False, True]
    assert trials["server_pid"].nunique() == 1
    assert sorted(trials["param_max_concurrency"]) == [4, 8]
    assert trials["running_requests_max"].iloc[0] <= trials["param_max_concurrency"].iloc[0]
    assert trials["prefix_cache_hit_rate"].iloc[1] < 0.05, trials["prefix_cache_hit_rate"]
    log = Path(trials["server_log"].iloc[1]).read_text(errors="replace")
    assert "prefix cache reset in-process: done" in log, log[-3000:]
    assert "POST /reset_prefix_cache" not in log  # vLLM's dev route stays closed


@pytest.mark.server
@pytest.mark.timeout(300)
def test_tpe_measures_a_new_server_at_its_other_run_settings_next(short_tmp):
    """With TPE, a trial that started a server is followed by its sibling (other
    max-concurrency, same flags), which runs on the same server."""
    _, results = _fake_reuse_sweep(short_tmp, "tpe", True, sampler="tpe", n_trials=6)
    trials = read_trials(results, "tpe").sort_values("trial_number").reset_index(drop=True)
    assert len(trials) == 6 and (trials["state"] == "COMPLETE").all()
    starters = trials.index[~trials["server_reused"]].tolist()
    assert trials["server_reused"].sum() >= 2, trials[["param_max_num_seqs", "server_reused"]]
    for i in starters:
        if i + 1 >= len(trials) or trials.loc[i + 1, "server_reused"] == False:  # noqa: E712
            continue  # its sibling had run before
        a, b = trials.loc[i], trials.loc[i + 1]
        assert a["param_max_num_seqs"] == b["param_max_num_seqs"]
        assert a["param_max_concurrency"] != b["param_max_concurrency"]
        assert a["server_pid"] == b["server_pid"]
