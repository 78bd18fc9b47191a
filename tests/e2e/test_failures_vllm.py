"""kill -9 of a driver of real vLLM servers mid-sweep, then the same `run` again: the study
continues, the interrupted trial is recorded once as FAIL(interrupted), no row is duplicated or
lost, no partial Parquet file is visible, and no process of either run remains (its private
Ray's, its vLLM servers', its warm zygote's). It is about the process boundary (a driver's
private Ray and vLLM orphaned by kill -9), so it keeps a private Ray and a driver process.

The other failures of real vLLM servers (a server and its warm zygote killed mid-load, out of
KV cache memory at start-up) are read from the one sweep of tests/e2e/test_quality_probe.py,
on the session's shared Ray (docs/TESTS_MOVED.md)."""

from __future__ import annotations

import duckdb
import pytest

from tests.cli import cli_env
from tests.cli import cli_in_process
from tests.cli import end_driver
from tests.cli import kill_driver
from tests.cli import read_until
from tests.cli import start_driver
from tests.procs import engine_cores
from tests.procs import new_engine_core
from tests.procs import new_marker
from tests.procs import wait_no_marked_processes
from tests.sweeps import read_trials
from tests.sweeps import write_sweep

pytestmark = pytest.mark.server


@pytest.mark.timeout(900)
def test_kill_9_of_the_driver_then_resume(tiny_model, short_tmp):
    """Guards a resume after kill -9 of the driver: a trial left RUNNING in the journal, a row
    written twice or lost, a partial Parquet file, and the killed run's private Ray, vLLM
    EngineCore and zygote orphaned. Three trials, the fewest that show each: trial 0 complete
    before the kill (its rows must survive the resume once), trial 1 killed while its vLLM
    starts, trial 2 measured by the second run (the study goes on)."""
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = write_sweep(short_tmp, tiny_model, n_trials=3, name="resume")
    proc = start_driver(sweep, short_tmp, env)
    try:
        seen = read_until(proc, "trial 0: under load", timeout_s=400)
        assert "trial 0: under load" in seen, seen
        trial_0 = engine_cores(marker)  # trial 0's server is up: its EngineCore
        assert trial_0, seen
        seen += read_until(proc, "trial 1: starting server", timeout_s=400)
        assert "trial 1: starting server" in seen, seen
        # kill while trial 1's vLLM is starting: its EngineCore exists, the server is not ready
        # (a warm start is ~5 s, so a fixed sleep can outlast the whole trial); any EngineCore
        # but trial 0's is trial 1's, even one forked before this line was read
        assert new_engine_core(marker, trial_0, timeout_s=120), seen
        kill_driver(proc)  # the driver alone: its Ray and vLLM are orphaned
    finally:
        end_driver(proc)
    after_kill = read_trials(short_tmp / "results", "resume")
    assert list(after_kill["trial_number"]) == [0]

    # the resumed run in-process (its private Ray too): the kill above is the process boundary
    again = cli_in_process("run", str(sweep), cwd=short_tmp, env=env)
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
