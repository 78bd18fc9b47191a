"""`status` and `best` read only the stored rows: they work on a sweep killed mid-way."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.cli import cli_in_process
from tests.sweeps import killed_sweep_file
from tests.sweeps import write_rows


def cli(*args: str) -> subprocess.CompletedProcess:
    """The command in this process (tests.cli.cli_in_process)."""
    return cli_in_process(*args)


def cli_child(*args: str) -> subprocess.CompletedProcess:
    """The command as a child process: what `$(vllm-sweep best ...)` captures."""
    return subprocess.run([sys.executable, "-m", "framework.cli", *args], capture_output=True,
                          text=True, timeout=120)


def test_status_of_a_killed_sweep(tmp_path, tiny_model):
    write_rows(tmp_path / "results")
    dead = {"pid": 999999, "create_time": 1.0, "session": "gone"}
    (tmp_path / "results" / "killed" / "driver.json").write_text(json.dumps(dead))
    res = cli("status", str(killed_sweep_file(tmp_path, tiny_model)))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "5/10 trials finished; driver not running" in out
    assert ("complete 3 (feasible 2, SLA violated 1); infeasible (not launched) 1; "
            "failed: startup_crash 1") in out
    assert "best feasible single measurement: trial 1: output_throughput = 150 tok/s" in out
    assert "baseline (vLLM's defaults): trial 0: output_throughput = 100 tok/s, feasible" in out
    assert "SLA violated: trial 2: output_throughput = 400 tok/s, SLA violated" in out
    # 4 minutes between the first start and the last end (40 s); 5 trials x 40 s remain.
    assert "elapsed 4.7 min; remaining ~3.3 min" in out


def test_best_ships_the_defaults_when_no_gain_is_distinguishable(tmp_path, tiny_model):
    write_rows(tmp_path / "results")
    sweep = str(killed_sweep_file(tmp_path, tiny_model))
    res = cli_child("best", sweep)
    # every configuration was measured on one server only, so the server-to-server noise is
    # unknown and trial 1's 150 tok/s is no known gain over the defaults' 100: stdout is the
    # defaults' command alone (for $(vllm-sweep best ...)); stderr says why, in one line
    assert res.returncode == 0 and res.stdout.strip() == "vllm serve m --trial 0"
    info = res.stderr.strip().splitlines()
    assert len(info) == 1 and info[0].startswith(
        "trial 0 (vLLM's defaults, output_throughput 100 tok/s): Trial 1 measured")
    assert "Not distinguishable from vLLM's defaults" in info[0] and "150 tok/s" in info[0]
    res = cli("best", sweep, "--format", "yaml")
    doc = yaml.safe_load(res.stdout)
    assert doc["trial"] == 0 and doc["objective"] == pytest.approx(100.0)
    assert doc["verdict"] == "not_distinguishable" and doc["gain"] is None
    assert doc["flags"] == {"enforce-eager": True, "max-model-len": 512}


@pytest.mark.parametrize("flags", [[], ["--format", "yaml"], ["--pareto"]])
def test_best_of_a_sweep_that_never_ran_says_there_are_no_results(tmp_path, tiny_model, flags):
    res = cli("best", str(killed_sweep_file(tmp_path, tiny_model)), *flags)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.splitlines() == [f"no results for sweep killed in {tmp_path}/results/killed"]


def test_status_of_a_sweep_that_never_ran(tmp_path, tiny_model):
    res = cli("status", str(killed_sweep_file(tmp_path, tiny_model)))
    assert res.returncode == 0, res.stderr
    assert "0/10 trials finished" in res.stdout
    assert res.stdout.splitlines()[-1] == f"  no results yet in {tmp_path}/results/killed"


def test_best_without_a_feasible_trial_exits_1(tmp_path, tiny_model):
    write_rows(tmp_path / "results")
    for number in (0, 1):  # the feasible trials gone: 2 violates the SLA, 3 and 4 failed
        (tmp_path / "results" / "killed" / "trials" / "sweep=killed"
         / f"trial-{number:05d}.parquet").unlink()
    res = cli("best", str(killed_sweep_file(tmp_path, tiny_model)))
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.splitlines() == ["No feasible configuration: no configuration met the SLA."]


def test_pareto_trials_keeps_the_feasible_non_dominated_ones():
    import pandas as pd

    from framework.results.status import pareto_trials

    trials = pd.DataFrame({
        "trial_number": [0, 1, 2, 3, 4, 5],
        "state": ["COMPLETE"] * 5 + ["FAIL"],
        "feasible": [True, True, True, False, True, None],
        "output_throughput": [10.0, 20.0, 15.0, 99.0, 20.0, None],
        "p99_ttft_ms": [100.0, 300.0, 400.0, 1.0, 300.0, None],
    })
    front = pareto_trials(trials, ["output_throughput", "p99_ttft_ms"], ["maximize", "minimize"])
    # 2 is dominated by 1; 3 is infeasible; 1 and 4 tie (neither dominates the other)
    assert list(front["trial_number"]) in ([1, 4, 0], [4, 1, 0])


def confirmed_trials():
    import pandas as pd

    rows = [  # number, objective, feasible, confirmation_of
        (0, 100.0, True, None), (1, 150.0, True, None), (2, 140.0, True, None),
        (3, 120.0, True, 1),    # trial 1 re-measured lower: mean 135
        (4, 138.0, True, 2),    # trial 2 re-measured: mean 139 -> the confirmed best
    ]
    return pd.DataFrame({
        "trial_number": [r[0] for r in rows], "state": ["COMPLETE"] * len(rows),
        "feasible": [r[2] for r in rows], "objective": [r[1] for r in rows],
        "confirmation_of": pd.array([r[3] for r in rows], dtype="Int64"),
        "is_baseline": [True, False, False, False, False],
        "serve_command": [f"vllm serve m --t {r[0]}" for r in rows],
        "objective_cv": [None] * len(rows)})


def test_confirmation_runs_move_the_noise_line_and_not_the_best_single_measurement():
    from framework.results.console import noise_line
    from framework.results.queries import best_row

    trials = confirmed_trials()
    # |120 - 150| / 150 = 20%, |138 - 140| / 140 = 1.4%: median 10.7%
    assert "confirmation runs moved the objective by 10.7% (median of 2)" in noise_line(trials)
    # status names the best single measurement (trial 1's 150); which configuration ships is
    # results.verdict's (tests/unit/results/test_verdict.py), never a second rule here
    assert int(best_row(trials, maximize=True)["trial_number"]) == 1
    assert noise_line(trials.iloc[:3].copy()) is None
