"""A real sweep on real parts: local Ray, vLLM CPU servers, Optuna journal, Parquet read back."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pandas as pd
import pytest
import yaml

from framework.engine.startup_log import STARTUP_PHASE_COLUMNS
from framework.engine.startup_log import read_marks
from framework.results.diagnosis import VERDICTS
from tests.browser import check_sweep_report
from tests.helpers import cli_env
from tests.helpers import cli_in_process
from tests.helpers import new_engine_core
from tests.helpers import new_marker
from tests.helpers import read_trials
from tests.helpers import read_until
from tests.helpers import run_cli
from tests.helpers import shared_memory
from tests.helpers import start_driver
from tests.helpers import vllm_leftovers
from tests.helpers import vsweep_leftovers
from tests.helpers import wait_no_marked_processes
from tests.helpers import write_sweep

pytestmark = pytest.mark.server
PHASES = [name for name, _ in STARTUP_PHASE_COLUMNS]


@dataclass(frozen=True)
class E2ESweep:
    """The module's real sweep, run as the README runs it (a `vllm-sweep run` child process on
    a private Ray, two vLLM CPU servers side by side with start-ahead), then run again on the
    complete study, then extended by one trial; what each step printed and left."""

    tmp: Path
    sweep: Path
    first: subprocess.CompletedProcess
    left_processes: list[str]
    left_files: list[str]
    left_vllm_files: list[str]
    new_shared_memory: set[str]
    trials: pd.DataFrame  # after the first run
    again: subprocess.CompletedProcess
    trials_again: pd.DataFrame
    more: subprocess.CompletedProcess
    trials_more: pd.DataFrame
    env: dict[str, str]


@pytest.fixture(scope="module")
def e2e(tiny_model) -> Iterator[E2ESweep]:
    tmp = Path(tempfile.mkdtemp(prefix="vst-"))  # short: Ray's socket paths
    marker = new_marker()
    env = cli_env(marker, tmp)
    sweep = write_sweep(tmp, tiny_model, n_trials=2)
    doc = yaml.safe_load(sweep.read_text())
    doc["cluster"] = {"start_ahead": 1}  # both servers start side by side, each measured alone
    sweep.write_text(yaml.safe_dump(doc))
    shm_before = shared_memory()
    try:
        first = run_cli(["run", str(sweep)], tmp, env, timeout_s=600)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        left = wait_no_marked_processes(marker)
        files, vllm_files = vsweep_leftovers(tmp), vllm_leftovers(tmp)
        new_shm = shared_memory() - shm_before
        trials = read_trials(tmp / "results", "e2e")
        # the process boundary was checked above; the same sweep again and extended in-process
        again = cli_in_process("run", str(sweep), cwd=tmp, env=env)
        trials_again = read_trials(tmp / "results", "e2e")
        more = cli_in_process("run", str(sweep), "--add-trials", "1", cwd=tmp, env=env)
        trials_more = read_trials(tmp / "results", "e2e")
        yield E2ESweep(tmp, sweep, first, left, files, vllm_files, new_shm, trials, again,
                       trials_again, more, trials_more, env)
    finally:
        assert wait_no_marked_processes(marker) == []
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_two_trial_run_ends_with_a_verdict(e2e):
    out = e2e.first.stdout
    assert "trial 0" in out and "trial 1" in out
    assert "vLLM's defaults" in out  # the verdict: a winner only beyond the noise


def test_a_run_leaves_no_process_file_or_shared_memory(e2e):
    """No run folder (server logs, control sockets, zygote folders, the private Ray's session:
    framework/engine/run_folder.py) is left in the temp dir, no IPC socket or store file of
    vLLM's, no torch inductor cache or compiler file, and no shared memory in /dev/shm: each
    server was shut down by vLLM before its processes were killed."""
    assert e2e.left_processes == []
    assert e2e.left_files == []
    assert e2e.left_vllm_files == []
    assert e2e.new_shared_memory == set()


def test_the_rows_are_the_baseline_then_the_tuned_trial(e2e):
    trials = e2e.trials
    assert list(trials["trial_number"]) == [0, 1]
    assert set(trials["sweep"]) == {"e2e"}
    assert list(trials["is_baseline"]) == [True, False]
    assert list(trials["state"]) == ["COMPLETE", "COMPLETE"], trials[["fail_reason", "fail_detail"]]
    baseline, tuned = trials.iloc[0], trials.iloc[1]
    # The baseline passes none of the tuned flags; the tuned trial passes all four.
    assert "--max-num-seqs" not in list(baseline["vllm_argv"])
    assert "--max-num-seqs" in list(tuned["vllm_argv"])
    assert str(tuned["param_max_num_seqs"]) in list(tuned["vllm_argv"])
    # On the CPU engine the one lever is warm_start (its default); the GPU ones add no flag.
    assert [list(v) for v in trials["startup_levers"]] == [["warm_start"], ["warm_start"]]
    assert "--max-cudagraph-capture-size" not in list(tuned["vllm_argv"])


def test_start_ahead_started_the_second_server_while_the_first_was_measured(e2e):
    """Trial 1's server was started before trial 0 ended, and one of them waited, ready, while
    the other was measured (share_gate's rule, unit-tested)."""
    baseline, tuned = e2e.trials.iloc[0], e2e.trials.iloc[1]
    assert tuned["started_at"] < baseline["started_at"] + pd.Timedelta(seconds=baseline["trial_s"])
    # a wait, not a time bound: > 0 however fast the machine
    assert e2e.trials["gate_wait_s"].max() > 0, e2e.trials[["gate_wait_s", "startup_s", "bench_s"]]


def test_each_trial_measured_its_requests_against_the_sla(e2e):
    for _, row in e2e.trials.iterrows():
        assert row["completed"] == 40 and row["failed"] == 0
        assert row["output_throughput"] > 0 and row["p99_ttft_ms"] > 0
        assert row["startup_s"] > 0 and row["bench_s"] > 0
        assert row["feasible"] == (row["p99_ttft_ms"] <= 2000 and row["p99_tpot_ms"] <= 100)


def test_startup_phases_come_from_the_server_log_and_add_up(e2e):
    """Start-up phases from the server's own log (engine.startup_log): each known, >= 0, adding
    up to startup_s; the log carries every closing line, in order."""
    for _, row in e2e.trials.iterrows():
        phases = [row[c] for c in PHASES]
        assert all(pd.notna(v) and v >= 0 for v in phases), dict(zip(PHASES, phases))
        assert sum(phases) == pytest.approx(row["startup_s"], rel=0.05)
        log = Path(row["server_log"])
        marks = read_marks((log if log.is_absolute() else e2e.tmp / log).read_text())
        assert marks.weights_end <= marks.engine_end <= marks.api_start, marks


def test_the_quality_probe_runs_on_the_baseline_only(e2e):
    """The baseline probes twice (its self-agreement, stored with its answers); the tuned trial
    changes no flag that changes outputs and is not probed."""
    baseline, tuned = e2e.trials.iloc[0], e2e.trials.iloc[1]
    assert baseline["quality_ok"] and baseline["token_agreement"] == baseline[
        "quality_baseline_agreement"]
    assert pd.isna(tuned["token_agreement"]) and pd.isna(tuned["quality_ok"])
    probes = e2e.tmp / "results" / "e2e" / "probes"
    assert (probes / "trial-00000.parquet").is_file()
    assert not (probes / "trial-00001.parquet").exists()


def test_request_rows_add_up_to_each_trial_row(e2e):
    requests = duckdb.sql(
        f"SELECT trial_number, count(*) AS n, sum(output_tokens) AS out, sum(prompt_tokens) AS inp "
        f"FROM read_parquet('{e2e.tmp}/results/e2e/requests/**/*.parquet', hive_partitioning=true) "
        "WHERE trial_number < 2 GROUP BY trial_number ORDER BY trial_number").fetchall()
    assert [r[0] for r in requests] == [0, 1]
    for (_number, n, out, inp), (_, row) in zip(requests, e2e.trials.iterrows()):
        assert n == 40
        assert out == row["total_output_tokens"] and inp == row["total_input_tokens"]


def test_a_complete_study_runs_nothing_and_duplicates_nothing(e2e):
    assert e2e.again.returncode == 0, e2e.again.stderr[-2000:]
    assert "nothing to run" in e2e.again.stdout
    assert len(e2e.trials_again) == 2


def test_add_trials_continues_the_numbering_of_the_same_study(e2e):
    assert e2e.more.returncode == 0, e2e.more.stdout[-3000:] + e2e.more.stderr[-3000:]
    trials = e2e.trials_more
    assert list(trials["trial_number"]) == [0, 1, 2]


def test_every_row_carries_its_diagnosis_estimates_and_provenance(e2e):
    trials = e2e.trials_more
    assert set(trials["diagnosis"]) <= set(VERDICTS) - {"not_measured"}, trials["diagnosis"]
    assert trials["diagnosis_detail"].str.len().gt(20).all()
    assert (trials["est_kv_tokens_capacity"] > 0).all()  # the CPU engine's KV space model
    assert (trials["output_throughput_per_gpu"] == trials["output_throughput"]).all()  # TP 1
    assert trials["vllm_sweep_commit"].str.fullmatch(r"[0-9a-f]{40}").all()
    assert trials["hardware"].str.startswith("cpu: ").all()
    assert trials["workload_sha256"].nunique() == 1 and trials["model_config_sha256"].nunique() == 1


def test_the_report_of_the_sweep_renders_with_its_plots(e2e):
    """The report of this real sweep renders in headless Chromium with its plots, no errors."""
    html, rendered = check_sweep_report(e2e.sweep, e2e.tmp, e2e.env)
    assert rendered.plot_count >= 3 and html.parent == e2e.tmp / "results" / "e2e"


@pytest.mark.timeout(600)
def test_ctrl_c_mid_trial_stops_everything_and_keeps_results(tiny_model, short_tmp):
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = write_sweep(short_tmp, tiny_model, n_trials=3, name="intr")
    proc = start_driver(sweep, short_tmp, env)
    try:
        seen = read_until(proc, "starting server", timeout_s=300)
        assert "starting server" in seen, seen
        # the server actor is up and vLLM is starting: its EngineCore exists, it is not ready
        assert new_engine_core(marker, set(), timeout_s=240), seen
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, seen + out
        assert "interrupted" in out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        left = wait_no_marked_processes(marker)
    assert left == []
    trials = read_trials(short_tmp / "results", "intr")
    assert list(trials["trial_number"]) == [0]
    assert trials.iloc[0]["state"] == "FAIL" and trials.iloc[0]["fail_reason"] == "interrupted"
