"""A real sweep on real parts: local Ray, vLLM CPU servers, Optuna journal, Parquet read back.

ONE module-scoped sweep (`e2e`) serves every test here, each test one thing it must show:
1. `vllm-sweep run` as the README runs it, a child process on a private Ray: two vLLM CPU
   servers started side by side (start-ahead), the baseline and one tuned trial measured,
   a verdict; then what the run left (processes, files, shared memory);
2. the same sweep again, in-process and joined to the session's shared Ray (RAY_ADDRESS; what
   is tested is the study, not Ray: a private Ray would cost a start for nothing to run), on the
   complete study: nothing to run;
3. `run --add-trials 1`, a child process again, Ctrl-C'd (SIGINT to its process group) while
   the added trial's vLLM is starting: exit 130, every process stopped, the trial recorded
   FAIL(interrupted) as number 2 (the study's numbering continued), the two measured rows kept.
The report of the sweep is rendered last. Run as root (as CI runs), the first run's temp dir is
shared, mode 1777 as /tmp, and a second local user (tests/second_user.py, uid 65534) tries
issue #33's findings against it while it runs.
"""

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
from tests.browser import check_report
from tests.cli import cli_env
from tests.cli import cli_in_process
from tests.cli import read_until
from tests.cli import run_cli
from tests.cli import run_joined
from tests.leftovers import ShmWatch
from tests.leftovers import vllm_leftovers
from tests.leftovers import vsweep_leftovers
from tests.paths import CLI
from tests.procs import new_engine_core
from tests.procs import new_marker
from tests.procs import wait_no_marked_processes
from tests.second_user import Attacker
from tests.second_user import Report
from tests.second_user import python_for_others
from tests.sweeps import read_trials
from tests.sweeps import write_sweep

pytestmark = pytest.mark.server
PHASES = [name for name, _ in STARTUP_PHASE_COLUMNS]


@dataclass(frozen=True)
class Interrupted:
    """`run --add-trials 1` Ctrl-C'd while its trial's vLLM was starting: whether vLLM had
    started (its EngineCore existed, the server not ready) when SIGINT came, the exit code,
    stdout and stderr, and the processes still running afterwards."""

    engine_started: bool
    returncode: int
    out: str
    left_processes: list[str]


@dataclass(frozen=True)
class E2ESweep:
    """The module's real sweep (see the module docstring): what each step printed and left."""

    tmp: Path
    sweep: Path
    env: dict[str, str]
    first: subprocess.CompletedProcess
    left_processes: list[str]
    left_files: list[str]
    left_vllm_files: list[str]
    leaked_shared_memory: set[str]
    trials: pd.DataFrame  # after the first run
    again: subprocess.CompletedProcess
    trials_again: pd.DataFrame
    interrupted: Interrupted
    trials_after: pd.DataFrame  # after the interrupted run
    second_user: Report | None  # what a second local user achieved (None: not run as root)


def _in_a_terminal() -> None:
    """Ctrl-C's default action, as in a terminal (a test run from a background job would hand
    the driver an ignored SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_mid_trial(args: list[str], cwd: Path, env: dict[str, str],
                        marker: str) -> Interrupted:
    """`vllm-sweep ARGS` as a child in its own session; once it starts a server and that
    server's vLLM has its EngineCore, SIGINT to the child's process group (Ctrl-C)."""
    proc = subprocess.Popen([*CLI, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_in_a_terminal)
    try:
        seen = read_until(proc, "starting server", timeout_s=300)
        started = "starting server" in seen and new_engine_core(marker, set(), timeout_s=240)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return Interrupted(started, proc.returncode, seen + out, wait_no_marked_processes(marker))


@pytest.fixture(scope="module")
def e2e(tiny_model, shared_ray) -> Iterator[E2ESweep]:
    tmp = Path(tempfile.mkdtemp(prefix="vst-"))  # short: Ray's socket paths
    shared = tmp / "t"  # the runs' temp dir (TMPDIR)
    shared.mkdir()
    marker = new_marker()
    env = cli_env(marker, shared)
    attacker = (Attacker(shared, tmp / "u", os.geteuid())
                if os.geteuid() == 0 and python_for_others() else None)
    sweep = write_sweep(tmp, tiny_model, n_trials=2)
    doc = yaml.safe_load(sweep.read_text())
    doc["cluster"] = {"start_ahead": 1}  # both servers start side by side, each measured alone
    sweep.write_text(yaml.safe_dump(doc))
    try:
        with ShmWatch(marker) as shm:
            first = run_cli(["run", str(sweep)], tmp, env, timeout_s=600)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        left = wait_no_marked_processes(marker)
        second_user = attacker.result() if attacker else None
        if attacker:
            attacker.remove_plants()  # the leftovers below are the sweep's own
        files, vllm_files = vsweep_leftovers(shared), vllm_leftovers(shared)
        leaked = shm.leaked()
        trials = read_trials(tmp / "results", "e2e")
        # the process boundary was checked above; the same sweep again in-process
        again = run_joined(shared_ray, ["run", str(sweep)], tmp,
                           env={"RAY_ADDRESS": shared_ray.address})
        trials_again = read_trials(tmp / "results", "e2e")
        interrupted = interrupt_mid_trial(["run", str(sweep), "--add-trials", "1"], tmp, env,
                                          marker)
        trials_after = read_trials(tmp / "results", "e2e")
        yield E2ESweep(tmp, sweep, env, first, left, files, vllm_files, leaked, trials, again,
                       trials_again, interrupted, trials_after, second_user)
    finally:
        if attacker:
            attacker.stop()
        assert wait_no_marked_processes(marker) == []
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_two_trial_run_ends_with_a_verdict(e2e):
    out = e2e.first.stdout
    assert "trial 0" in out and "trial 1" in out
    assert "vLLM's defaults" in out  # the verdict: a winner only beyond the noise


def test_a_run_leaves_no_process(e2e):
    assert e2e.left_processes == []


def test_a_run_leaves_no_run_folder(e2e):
    """No run folder (server logs, control sockets, zygote folders, the private Ray's session:
    framework/engine/run_folder.py) is left in the temp dir."""
    assert e2e.left_files == []


def test_a_run_leaves_no_vllm_ipc_or_compiler_file(e2e):
    """No IPC socket or store file of vLLM's, no torch inductor cache or compiler file."""
    assert e2e.left_vllm_files == []


def test_a_run_leaves_no_shared_memory(e2e):
    """No shm_broadcast ring or semaphore of its servers in /dev/shm (of those the run's own
    processes used, tests/leftovers.py: other tests' servers share /dev/shm): each server was
    shut down by vLLM before its processes were killed."""
    assert e2e.leaked_shared_memory == set()


def test_a_second_user_on_the_node_cannot_reach_into_the_run(e2e):
    """Issue #33's findings 1-3 tried by another local user while the first run ran
    (tests/second_user.py): the planted logging config never ran, no log went through the
    symlinks, the stale group record's process group lives, and the run's folder let the
    second user neither in nor move it; the run's results are those the other tests check."""
    got = e2e.second_user
    if got is None:
        pytest.skip("needs root to act as a second user (CI runs as root) and a Python "
                    "interpreter that user may run")
    assert got.run_folder is not None and got.run_folder.startswith(f"vsweep-{os.geteuid()}-"), got
    assert got.attempts == dict.fromkeys(("list", "create", "rename", "remove", "chmod"),
                                         "PermissionError"), got.attempts
    assert not got.code_ran and got.stolen == "" and got.sleeper_alive, got
    assert {"vsweep-logs", "vsweep-rpc-1", "vsweep-ctl-1.sock"} <= set(got.planted), got.planted


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
    sla = yaml.safe_load(e2e.sweep.read_text())["sla"]  # tests/sweeps.py write_sweep's
    for _, row in e2e.trials.iterrows():
        assert row["completed"] == 40 and row["failed"] == 0
        assert row["output_throughput"] > 0 and row["p99_ttft_ms"] > 0
        assert row["startup_s"] > 0 and row["bench_s"] > 0
        assert row["feasible"] == (row["p99_ttft_ms"] <= sla["p99_ttft_ms"]
                                   and row["p99_tpot_ms"] <= sla["p99_tpot_ms"])


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


def test_every_row_carries_its_diagnosis_estimates_and_provenance(e2e):
    trials = e2e.trials
    assert set(trials["diagnosis"]) <= set(VERDICTS) - {"not_measured"}, trials["diagnosis"]
    assert trials["diagnosis_detail"].str.len().gt(20).all()
    assert (trials["est_kv_tokens_capacity"] > 0).all()  # the CPU engine's KV space model
    assert (trials["output_throughput_per_gpu"] == trials["output_throughput"]).all()  # TP 1
    assert trials["vllm_sweep_commit"].str.fullmatch(r"[0-9a-f]{40}").all()
    assert trials["hardware"].str.startswith("cpu: ").all()
    assert trials["workload_sha256"].nunique() == 1 and trials["model_config_sha256"].nunique() == 1


def test_a_complete_study_runs_nothing_and_duplicates_nothing(e2e):
    assert e2e.again.returncode == 0, e2e.again.stderr[-2000:]
    assert "nothing to run" in e2e.again.stdout
    assert len(e2e.trials_again) == 2


def test_add_trials_continues_the_numbering_of_the_same_study(e2e):
    """The added trial is number 2 of the same study (its run was then interrupted: below)."""
    assert list(e2e.trials_after["trial_number"]) == [0, 1, 2]


def test_ctrl_c_mid_trial_stops_everything(e2e):
    """SIGINT while the trial's vLLM is starting (EngineCore up, not ready): exit 130, the
    driver says it was interrupted, no process of the run is left."""
    stopped = e2e.interrupted
    assert stopped.engine_started, stopped.out[-3000:]
    assert stopped.returncode == 130, stopped.out[-3000:]
    assert "interrupted" in stopped.out
    assert stopped.left_processes == []


def test_ctrl_c_mid_trial_records_it_and_keeps_results(e2e):
    """The trial in flight is recorded FAIL(interrupted); the measured rows stay as they were."""
    trials = e2e.trials_after
    added = trials.iloc[2]
    assert added["state"] == "FAIL" and added["fail_reason"] == "interrupted"
    assert list(trials["state"][:2]) == ["COMPLETE", "COMPLETE"]
    assert list(trials["objective"][:2]) == list(e2e.trials["objective"])


def test_the_report_of_the_sweep_renders_with_its_plots(e2e):
    """The report of this real sweep renders in headless Chromium with its plots, no errors."""
    res = cli_in_process("report", str(e2e.sweep), cwd=e2e.tmp, env=e2e.env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    html = Path(res.stdout.strip().splitlines()[-1])
    html = html if html.is_absolute() else e2e.tmp / html
    assert html.is_file(), res.stdout
    rendered = check_report(html, min_plots=3)
    assert rendered.plot_count >= 3 and html.parent == e2e.tmp / "results" / "e2e"
