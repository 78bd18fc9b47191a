"""`status` and `best` read only the stored rows: they work on a sweep killed mid-way."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from framework.objective import Verdict
from framework.rows import TrialContext, trial_columns, trial_row
from framework.search_space import load_search_space
from framework.store import ResultStore
from framework.trial import TrialOutcome
from tests.conftest import ROOT

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def write_rows(results: Path) -> None:
    space = load_search_space(ROOT / "search_spaces" / "tiny_cpu.yaml")
    columns = trial_columns(space, (50, 99))
    store = ResultStore(results, "killed")
    base = {"max-num-seqs": 128, "max-num-batched-tokens": 2048, "enable-chunked-prefill": True,
            "enable-prefix-caching": True}
    cases = [  # number, params, baseline, objective, feasible, fail_reason
        (0, base, True, 100.0, True, None),
        (1, {**base, "max-num-seqs": 16}, False, 150.0, True, None),
        (2, {**base, "max-num-seqs": 4}, False, 400.0, False, None),  # best value, but infeasible
        (3, {**base, "max-num-seqs": 8}, False, None, None, "startup_crash"),
        (4, {**base, "max-num-seqs": 2}, False, None, None, "infeasible"),
    ]
    for number, params, baseline, objective, feasible, fail in cases:
        outcome = TrialOutcome(started_at=T0 + timedelta(seconds=60 * number), argv=("--x",),
                               trial_s=40.0, fail_reason=fail,
                               metrics={"completed": 10, "failed": 0} if fail is None else {})
        verdict = None if fail else Verdict(objective, feasible, {}, ())
        ctx = TrialContext(number=number, params=params, is_baseline=baseline,
                           serve_command=f"vllm serve m --trial {number}", vllm_version="x",
                           server_log="")
        store.write_trial(trial_row(ctx, outcome, verdict, columns), columns)


def sweep_file(tmp: Path, tiny_model: Path) -> Path:
    path = tmp / "killed.yaml"
    path.write_text(yaml.safe_dump({
        "name": "killed", "model": str(tiny_model),
        "search_space": str(ROOT / "search_spaces" / "tiny_cpu.yaml"),
        "server": {"args": {"enforce-eager": True, "max-model-len": 512}},
        "workload": {"percentiles": [50, 99]}, "search": {"n_trials": 10},
        "results_dir": str(tmp / "results")}))
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "framework.cli", *args], capture_output=True,
                          text=True, timeout=120)


def test_status_of_a_killed_sweep(tmp_path, tiny_model):
    write_rows(tmp_path / "results")
    dead = {"pid": 999999, "create_time": 1.0, "session": "gone"}
    (tmp_path / "results" / "killed" / "driver.json").write_text(json.dumps(dead))
    res = cli("status", str(sweep_file(tmp_path, tiny_model)))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "5/10 trials finished; driver not running" in out
    assert ("complete 3 (feasible 2, SLA violated 1); infeasible (not launched) 1; "
            "failed: startup_crash 1") in out
    assert "best feasible: trial 1: output_throughput = 150" in out
    # 4 minutes between the first start and the last end (40 s); 5 trials x 40 s remain.
    assert "elapsed 4.7 min; remaining ~3.3 min" in out


def test_best_is_the_best_feasible_trial_as_command_and_yaml(tmp_path, tiny_model):
    write_rows(tmp_path / "results")
    sweep = str(sweep_file(tmp_path, tiny_model))
    res = cli("best", sweep)
    assert res.returncode == 0 and res.stdout.strip() == "vllm serve m --trial 1"
    res = cli("best", sweep, "--format", "yaml")
    doc = yaml.safe_load(res.stdout)
    assert doc["trial"] == 1 and doc["objective"] == 150.0
    assert doc["flags"] == {"enforce-eager": True, "max-model-len": 512, "max-num-seqs": 16,
                            "max-num-batched-tokens": 2048, "enable-chunked-prefill": True,
                            "enable-prefix-caching": True}


def test_best_without_a_feasible_trial_exits_1(tmp_path, tiny_model):
    res = cli("best", str(sweep_file(tmp_path, tiny_model)))
    assert res.returncode == 1 and "no feasible trial yet" in res.stderr


def test_pareto_trials_keeps_the_feasible_non_dominated_ones():
    import pandas as pd

    from framework.status import pareto_trials

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
