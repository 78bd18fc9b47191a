"""`status` and `best` from the stored results alone (works on running, finished and killed
sweeps: it reads the Parquet trial rows and the driver file, never Ray or Optuna).

Remaining time estimate = mean wall time of the finished trials x trials still to run, divided
by the trials that ran side by side (1 for the CPU engine).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import psutil
import yaml

from framework.results.queries import best_trial, ok_trials, pareto_front
from framework.results.rows import param_column, plain
from framework.engine.server_args import trial_flags
from framework.base.vocabulary import Scalar


@dataclass(frozen=True)
class Status:
    finished: int
    target: int
    complete: int
    feasible: int
    infeasible: int
    failed: dict[str, int]
    rejected: int  # INFEASIBLE: ruled out by the feasibility model, never launched
    pruned: int  # PRUNED: stopped after the screening run
    best_objective: float | None
    best_trial: int | None
    elapsed_s: float
    remaining_s: float | None
    driver_pid: int | None

    def lines(self, name: str, objective: str) -> list[str]:
        fails = ", ".join(f"{k} {v}" for k, v in sorted(self.failed.items())) or "none"
        best = (f"trial {self.best_trial}: {objective} = {self.best_objective:.4g}"
                if self.best_trial is not None else "no feasible trial yet")
        remaining = "-" if self.remaining_s is None else f"~{self.remaining_s / 60:.1f} min"
        driver = f"running (pid {self.driver_pid})" if self.driver_pid else "not running"
        return [f"sweep {name}: {self.finished}/{self.target} trials finished; driver {driver}",
                f"  complete {self.complete} (feasible {self.feasible}, SLA violated "
                f"{self.infeasible}); infeasible (not launched) {self.rejected}; "
                + (f"pruned {self.pruned}; " if self.pruned else "") + f"failed: {fails}",
                f"  best feasible: {best}",
                f"  elapsed {self.elapsed_s / 60:.1f} min; remaining {remaining}"]


def live_driver(state_file: Path) -> int | None:
    """PID of the driver recorded in driver.json if that process is still the one recorded."""
    try:
        state = json.loads(state_file.read_text())
        if psutil.Process(state["pid"]).create_time() == state["create_time"]:
            return int(state["pid"])
    except (OSError, ValueError, KeyError, psutil.NoSuchProcess):
        pass
    return None


def sweep_status(trials: pd.DataFrame, target: int, params: list[str], maximize: bool,
                 concurrency: int, driver_pid: int | None) -> Status:
    if trials.empty:
        return Status(0, target, 0, 0, 0, {}, 0, 0, None, None, 0.0, None, driver_pid)
    complete = trials[trials["state"] == "COMPLETE"]
    failed = trials[trials["state"] == "FAIL"]["fail_reason"].fillna("unknown")
    starts = trials["started_at"].dropna()
    ends = (trials["started_at"] + pd.to_timedelta(trials["trial_s"].fillna(0), unit="s")).dropna()
    elapsed = (ends.max() - starts.min()).total_seconds() if len(starts) else 0.0
    left = max(0, target - len(trials))
    mean_trial = trials["trial_s"].dropna().mean()
    remaining = None if pd.isna(mean_trial) else left * float(mean_trial) / max(1, concurrency)
    best = best_trial(trials, params, maximize)
    return Status(finished=len(trials), target=target, complete=len(complete),
                  feasible=int((complete["feasible"] == True).sum()),  # noqa: E712
                  infeasible=int((complete["feasible"] == False).sum()),  # noqa: E712
                  failed=failed.value_counts().to_dict(),
                  rejected=int((trials["state"] == "INFEASIBLE").sum()),
                  pruned=int((trials["state"] == "PRUNED").sum()),
                  best_objective=best.objective if best else None,
                  best_trial=best.number if best else None, elapsed_s=elapsed,
                  remaining_s=remaining, driver_pid=driver_pid)


def best_as_yaml(trials: pd.DataFrame, params: list[str], maximize: bool,
                 fixed: dict[str, Scalar], model: str,
                 run_params: Sequence[str] = ()) -> str | None:
    """The best feasible trial as YAML: its objective, every vLLM flag it ran with, and
    (`load`) the values of its run settings (search parameters of kind run)."""
    best = best_trial(trials, params, maximize)
    if best is None:
        return None
    row = trials[trials["trial_number"] == best.number].iloc[0]
    values = {p: plain(row[param_column(p)]) for p in params if p not in run_params}
    flags = trial_flags(fixed, values, bool(row["is_baseline"]))
    out = {"trial": best.number, "objective": best.objective, "model": model, "flags": flags,
           "command": best.serve_command}
    if run_params:
        out["load"] = {p: plain(row[param_column(p)]) for p in run_params}
    return yaml.safe_dump(out, sort_keys=False)



def pareto_trials(trials: pd.DataFrame, metrics: list[str], directions: list[str]) -> pd.DataFrame:
    """The feasible trials no other feasible trial dominates (at least as good in every metric,
    better in one; directions 'maximize' / 'minimize'), sorted by the first metric, best first."""
    ok = ok_trials(trials).dropna(subset=metrics)
    points = [[float(row[m]) for m in metrics] for _, row in ok.iterrows()]
    return ok.iloc[pareto_front(points, [d == "maximize" for d in directions])]
