"""kill -9 of the driver mid-sweep, then the same `run` again: the study continues, the
interrupted trial is recorded once as FAIL(interrupted), no row is duplicated or lost, no
partial Parquet file is visible, and no process of either run remains."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import duckdb
import pytest

from tests.helpers import (
    CLI,
    cli_env,
    new_marker,
    read_trials,
    read_until,
    run_cli,
    wait_no_marked_processes,
    write_sweep,
)

pytestmark = pytest.mark.server


@pytest.mark.timeout(900)
def test_kill_9_of_the_driver_then_resume(tiny_model, short_tmp):
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = write_sweep(short_tmp, tiny_model, n_trials=3, name="resume")
    proc = subprocess.Popen([*CLI, "run", str(sweep)], cwd=short_tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        seen = read_until(proc, "trial 1: starting server", timeout_s=400)
        assert "trial 1: starting server" in seen, seen
        time.sleep(6)  # trial 1's server actor is up, vLLM is starting
        os.kill(proc.pid, signal.SIGKILL)  # the driver alone: its Ray and vLLM are orphaned
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    after_kill = read_trials(short_tmp / "results", "resume")
    assert list(after_kill["trial_number"]) == [0]

    again = run_cli(["run", str(sweep)], short_tmp, env, timeout_s=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "trial 1 was interrupted by an earlier run" in again.stdout
    trials = read_trials(short_tmp / "results", "resume")
    assert list(trials["trial_number"]) == [0, 1, 2]
    assert list(trials["state"]) == ["COMPLETE", "FAIL", "COMPLETE"]
    assert trials.iloc[1]["fail_reason"] == "interrupted"
    requests = duckdb.sql(
        f"SELECT trial_number, count(*) FROM read_parquet('{short_tmp}/results/resume/requests/"
        "**/*.parquet', hive_partitioning=true) GROUP BY ALL ORDER BY 1").fetchall()
    assert requests == [(0, 40), (2, 40)]
    visible = sorted(p.name for p in (short_tmp / "results" / "resume").rglob("*.parquet"))
    assert all(name.startswith("trial-") for name in visible), visible
    assert not (short_tmp / "results" / "resume" / "driver.json").exists()
    assert wait_no_marked_processes(marker, timeout_s=30) == []
