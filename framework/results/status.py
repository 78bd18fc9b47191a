"""`status` and `best` from the stored results alone (works on running, finished and killed
sweeps: it reads the Parquet trial rows and the driver file, never Ray or Optuna).

Remaining time estimate = mean wall time of the finished trials x trials still to run, divided
by the trials that ran side by side (1 for the CPU engine).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import yaml

from framework.base.vocabulary import Scalar
from framework.base.vocabulary import with_unit
from framework.config.search_space import SHAPE_SETTINGS
from framework.engine.server_args import trial_flags
from framework.results.queries import best_row
from framework.results.queries import cut_short_mask
from framework.results.queries import ok_trials
from framework.results.queries import pareto_front
from framework.results.queries import result_label
from framework.results.rows import param_column
from framework.results.rows import plain
from framework.results.verdict import SweepVerdict
from framework.results.verdict import decide

SHOWN_VIOLATIONS = 5
"""SLA-violating trials `status` names with their broken limits (the latest ones)."""


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
    stopped_early: int = 0  # COMPLETE trials whose load stopped early (early.causes)
    verdict: str | None = None  # results.verdict's headline
    baseline: str | None = None  # the baseline trial's number, objective and result
    violations: tuple[str, ...] = ()  # the latest SLA-violating trials and what they broke

    def lines(self, name: str, objective: str) -> list[str]:
        fails = ", ".join(f"{k} {v}" for k, v in sorted(self.failed.items())) or "none"
        best = (f"trial {self.best_trial}: {objective} = "
                f"{with_unit(objective, self.best_objective)}"
                if self.best_trial is not None else "no feasible trial yet")
        remaining = "-" if self.remaining_s is None else f"~{self.remaining_s / 60:.1f} min"
        driver = f"running (pid {self.driver_pid})" if self.driver_pid else "not running"
        early = f", stopped early {self.stopped_early}" if self.stopped_early else ""
        return [f"sweep {name}: {self.finished}/{self.target} trials finished; driver {driver}",
                f"  complete {self.complete} (feasible {self.feasible}, SLA violated "
                f"{self.infeasible}{early}); infeasible (not launched) {self.rejected}; "
                + (f"pruned {self.pruned}; " if self.pruned else "") + f"failed: {fails}",
                *([f"  baseline (vLLM's defaults): {self.baseline}"] if self.baseline else []),
                f"  best feasible single measurement: {best}",
                *([f"  verdict: {self.verdict}"] if self.verdict else []),
                *[f"  SLA violated: {v}" for v in self.violations],
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


def sweep_status(trials: pd.DataFrame, target: int, maximize: bool,
                 concurrency: int, driver_pid: int | None,
                 objective_metric: str | None = None,
                 sla: Mapping[str, float] | None = None) -> Status:
    """The sweep's progress from its trial rows; `objective_metric` names the objective's unit
    in the baseline and violation lines; with it, the verdict so far (results.verdict)."""
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
    best = best_row(trials, maximize)
    objective = "objective" if objective_metric is None else objective_metric
    violating = complete[complete["feasible"] == False].sort_values("trial_number")  # noqa: E712
    violations = tuple(_trial_text(r.to_dict(), objective)
                       for _, r in violating.tail(SHOWN_VIOLATIONS).iterrows())
    if len(violating) > SHOWN_VIOLATIONS:
        violations += (f"{len(violating) - SHOWN_VIOLATIONS} earlier trials not shown",)
    base = trials[trials["is_baseline"] == True].sort_values("trial_number")  # noqa: E712
    return Status(finished=len(trials), target=target, complete=len(complete),
                  feasible=int((complete["feasible"] == True).sum()),  # noqa: E712
                  infeasible=int((complete["feasible"] == False).sum()),  # noqa: E712
                  failed=failed.value_counts().to_dict(),
                  rejected=int((trials["state"] == "INFEASIBLE").sum()),
                  pruned=int((trials["state"] == "PRUNED").sum()),
                  best_objective=float(best["objective"]) if best is not None else None,
                  best_trial=int(best["trial_number"]) if best is not None else None,
                  elapsed_s=elapsed,
                  remaining_s=remaining, driver_pid=driver_pid,
                  stopped_early=int((cut_short_mask(trials)
                                     & (trials["state"] == "COMPLETE")).sum()),
                  baseline=(_trial_text(base.iloc[0].to_dict(), objective)
                            if not base.empty else None),
                  violations=violations,
                  verdict=(decide(trials, objective_metric, maximize, sla or {}).headline
                           if objective_metric is not None else None))


def _trial_text(row: dict[str, Any], objective: str) -> str:
    """`trial N: <objective> = <value with unit>, <result_label>` (no value unless COMPLETE)."""
    value = (f"{objective} = {with_unit(objective, row.get('objective'))}, "
             if row["state"] == "COMPLETE" else "")
    return f"trial {int(row['trial_number'])}: {value}{result_label(row)}"


def verdict_text(trials: pd.DataFrame, verdict: SweepVerdict, objective: str) -> str:
    """What `best` says next to the command: the trial it ships with its value, then the
    verdict (with its interval)."""
    if verdict.ship is None:
        return verdict.headline
    row = trials[trials["trial_number"] == verdict.ship].iloc[0]
    what = "vLLM's defaults, " if verdict.number is None else ""
    value = verdict.estimate if verdict.number is not None else verdict.baseline
    shown = with_unit(objective, value.value if value else row["objective"])
    return f"trial {verdict.ship} ({what}{objective} {shown}): {verdict.headline}"


def shipped_flags(trials: pd.DataFrame, number: int, params: Sequence[str],
                  fixed: Mapping[str, Scalar], run_params: Sequence[str] = ()
                  ) -> tuple[pd.Series, dict[str, Scalar | None]]:
    """Trial `number`'s row and every vLLM flag it ran with: the fixed server args and its
    parameters (none for the vLLM-defaults baseline), run settings and shape settings
    (search_space.SHAPE_SETTINGS: `replicas`, never a vLLM flag) left out."""
    row = trials[trials["trial_number"] == number].iloc[0]
    values = {p: plain(row[param_column(p)]) for p in params
              if p not in run_params and p not in SHAPE_SETTINGS}
    return row, trial_flags(fixed, values, bool(row["is_baseline"]))


def best_as_yaml(trials: pd.DataFrame, verdict: SweepVerdict, params: list[str],
                 fixed: dict[str, Scalar], model: str,
                 run_params: Sequence[str] = ()) -> str:
    """The configuration to ship (`verdict.ship`, which must be set) as YAML: the verdict, its
    gain interval, every vLLM flag it runs with, and (`load`) its run settings."""
    return yaml.safe_dump(best_fields(trials, verdict, params, fixed, model, run_params),
                          sort_keys=False)


def best_fields(trials: pd.DataFrame, verdict: SweepVerdict, params: list[str],
                fixed: dict[str, Scalar], model: str,
                run_params: Sequence[str] = ()) -> dict[str, object]:
    """best_as_yaml's fields (plain Python values, for YAML and JSON)."""
    number = verdict.ship
    assert number is not None
    row, flags = shipped_flags(trials, number, params, fixed, run_params)
    est = verdict.estimate if verdict.number is not None else verdict.baseline
    out: dict[str, object] = {
        "trial": number, "verdict": verdict.kind, "statement": verdict.headline,
        "objective": est.value if est else plain(row["objective"]),
        "gain": verdict.gain.value if verdict.gain else None,
        "gain_ci95": [verdict.gain.low, verdict.gain.high] if verdict.gain else None,
        "model": model, "flags": flags, "command": str(row["serve_command"])}
    if run_params:
        out["load"] = {p: plain(row[param_column(p)]) for p in run_params}
    if shape := {p: plain(row[param_column(p)]) for p in params if p in SHAPE_SETTINGS}:
        out["shape"] = shape
    return out


def pareto_trials(trials: pd.DataFrame, metrics: list[str], directions: list[str]) -> pd.DataFrame:
    """The feasible trials no other feasible trial dominates (at least as good in every metric,
    better in one; directions 'maximize' / 'minimize'), sorted by the first metric, best first."""
    ok = ok_trials(trials).dropna(subset=metrics)
    points = [[float(row[m]) for m in metrics] for _, row in ok.iterrows()]
    return ok.iloc[pareto_front(points, [d == "maximize" for d in directions])]
