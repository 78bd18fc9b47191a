"""What the README promises of a driver's life, on FakeEngine servers (a named stand-in) under a
private local Ray with fake GPUs, so each run takes seconds:
- `search.requeue_interrupted`: a trial cut short by kill -9 of the driver runs again on resume;
- a second `run` of a sweep whose driver lives is refused with exit 3 and one line;
- a trial whose every request fails is FAIL(load_failed), and the sweep goes on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import (
    CLI,
    cli_env,
    new_marker,
    read_trials,
    read_until,
    run_cli,
    wait_no_marked_processes,
)

pytestmark = pytest.mark.server


def fake_sweep(tmp: Path, model: Path, name: str, startup_s: float, **extra) -> Path:
    space = tmp / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [4, 8, 16], "default": 16}}}))
    sweep = tmp / f"{name}.yaml"
    spec = {"name": name, "model": str(model), "search_space": str(space), "engine": "fake",
            "server": {"reuse": False, "env": {"FAKE_ENGINE_STARTUP_S": str(startup_s)}},
            "workload": {"num_prompts": 12, "input_len": 16, "output_len": 4, "warmup_requests": 0},
            "search": {"sampler": "grid", "n_trials": 3, "baseline": False},
            "cluster": {"num_cpus": 2, "num_gpus": 1}, "results_dir": str(tmp / "results")}
    for key, value in extra.items():
        spec[key] = {**spec.get(key, {}), **value}
    sweep.write_text(yaml.safe_dump(spec))
    return sweep


def start_driver(sweep: Path, tmp: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "run", str(sweep)], cwd=tmp, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.timeout(300)
def test_kill_9_mid_trial_requeues_that_trial_on_resume(tiny_model, short_tmp):
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = fake_sweep(short_tmp, tiny_model, "requeue", startup_s=4,
                       search={"requeue_interrupted": True})
    first_row = short_tmp / "results" / "requeue" / "trials" / "sweep=requeue" / "trial-00000.parquet"
    proc = start_driver(sweep, short_tmp, env)
    try:
        deadline = time.monotonic() + 120
        while not first_row.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert first_row.exists(), proc.stdout.read() if proc.poll() is not None else "no row"
        time.sleep(1)  # trial 1 is asked and starting (4 s start-up): its row is never written
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        end(proc)
    assert list(read_trials(short_tmp / "results", "requeue")["trial_number"]) == [0]

    again = run_cli(["run", str(sweep)], short_tmp, env, timeout_s=240)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert wait_no_marked_processes(marker) == []
    trials = read_trials(short_tmp / "results", "requeue")
    interrupted = trials[trials["fail_reason"] == "interrupted"]
    assert len(interrupted) >= 1 and 0 not in set(interrupted["trial_number"]), trials
    complete = trials[trials["state"] == "COMPLETE"]
    for _, row in interrupted.iterrows():  # each interrupted configuration ran again, later
        again_ = complete[(complete["param_max_num_seqs"] == row["param_max_num_seqs"])
                          & (complete["trial_number"] > row["trial_number"])]
        assert len(again_) == 1, trials[["trial_number", "state", "fail_reason",
                                         "param_max_num_seqs"]]
    assert sorted(complete["param_max_num_seqs"]) == [4, 8, 16]


@pytest.mark.timeout(300)
def test_a_second_driver_of_a_running_sweep_exits_3(tiny_model, short_tmp):
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = fake_sweep(short_tmp, tiny_model, "twice", startup_s=20)
    first = start_driver(sweep, short_tmp, env)
    try:
        seen = read_until(first, "starting server", timeout_s=120)
        assert "starting server" in seen, seen
        second = run_cli(["run", str(sweep)], short_tmp, env, timeout_s=120)
        assert second.returncode == 3, second.stdout[-2000:] + second.stderr[-2000:]
        lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and f"another driver (pid {first.pid})" in lines[0], second.stderr
        assert "Traceback" not in second.stdout + second.stderr
        assert first.poll() is None, "the first driver must go on"
    finally:
        end(first)
    assert wait_no_marked_processes(marker) == []


@pytest.mark.timeout(300)
def test_every_request_failing_is_load_failed_and_the_sweep_goes_on(tiny_model, short_tmp):
    """FakeEngine serves /v1/completions only: a chat workload gets 404 on every request."""
    marker = new_marker()
    sweep = fake_sweep(short_tmp, tiny_model, "noload", startup_s=0.5,
                       workload={"endpoint": "chat"}, search={"n_trials": 2})
    res = run_cli(["run", str(sweep)], short_tmp, cli_env(marker, short_tmp), timeout_s=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert wait_no_marked_processes(marker) == []
    trials = read_trials(short_tmp / "results", "noload")
    assert list(trials["state"]) == ["FAIL", "FAIL"], trials[["state", "fail_reason"]]
    assert list(trials["fail_reason"]) == ["load_failed", "load_failed"]
    assert all("all 12 requests failed" in d and "404" in d for d in trials["fail_detail"])
