"""Console output: live progress lines while a sweep runs, and the final summary (rich).

Works from trial rows (the Parquet table as a DataFrame), so the summary printed at the end of a
run is the one any later reader of the results would compute.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
from rich.console import Console
from rich.table import Table

from framework.base.vocabulary import limit_text
from framework.results.queries import (  # noqa: F401 - Best and best_trial re-exported
    Best,
    best_trial,
    confirmed_scores,
    state_label,
)
from framework.results.rows import param_column


def _fmt(value: object, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


@dataclass
class Progress:
    """One line per event, prefixed with the elapsed time; safe in logs (no cursor tricks)."""

    console: Console
    total: int
    objective: str
    maximize: bool
    t0: float = 0.0
    best: float | None = None

    def __post_init__(self) -> None:
        self.t0 = time.monotonic()

    def _line(self, text: str) -> None:
        elapsed = time.monotonic() - self.t0
        self.console.print(f"[dim]{int(elapsed // 60):02d}:{int(elapsed % 60):02d}[/dim] {text}",
                           highlight=False)

    def note(self, text: str) -> None:
        self._line(text)

    def trial_started(self, number: int, done: int, params: Mapping[str, object], baseline: bool,
                      confirms: int | None = None) -> None:
        shown = "vLLM defaults (baseline)" if baseline else " ".join(f"{k}={v}" for k, v in params.items())
        again = f" (confirmation run of trial {confirms})" if confirms is not None else ""
        self._line(f"[bold]trial {number}[/bold] ({done + 1}/{self.total}) {shown}{again}")

    def phase(self, number: int, text: str) -> None:
        self._line(f"  trial {number}: {text}")

    def trial_finished(self, row: Mapping[str, object], ttft_key: str, tpot_key: str) -> None:
        number = row["trial_number"]
        if row["state"] == "INFEASIBLE":
            self._line(f"  trial {number}: [yellow]INFEASIBLE[/yellow] (not launched): "
                       f"{str(row['fail_detail'] or '')[:200]}")
            return
        if row["state"] == "PRUNED":
            self._line(f"  trial {number}: [cyan]PRUNED[/cyan] {str(row['fail_detail'] or '')[:200]}")
            return
        if row["state"] != "COMPLETE":
            self._line(f"  trial {number}: [red]FAIL[/red] {row['fail_reason']}: "
                       f"{str(row['fail_detail'] or '')[:160]}")
            return
        obj = float(row["objective"])  # type: ignore[arg-type]
        feasible = bool(row["feasible"])
        if feasible and (self.best is None or (obj > self.best if self.maximize else obj < self.best)):
            self.best = obj
        verdict = "[green]feasible[/green]" if feasible else f"[yellow]infeasible[/yellow] ({row['sla_violations']})"
        self._line(f"  trial {number}: {self.objective}={_fmt(obj)} {ttft_key}={_fmt(row.get(ttft_key))} "
                   f"{tpot_key}={_fmt(row.get(tpot_key))} {verdict}; ready in {_fmt(row['startup_s'], 3)} s; "
                   f"best feasible so far {_fmt(self.best)}")


def trials_table(trials: pd.DataFrame, params: Sequence[str], columns: Sequence[str]) -> Table:
    """One row per trial: parameters, the objective and SLA metrics, and the verdict."""
    table = Table(title="Trials")
    for name in ["#", *params, *columns, "result"]:
        table.add_column(name, justify="left" if name == "result" else "right", overflow="fold")
    for _, row in trials.iterrows():
        label = f"{int(row['trial_number'])}{'*' if row['is_baseline'] else ''}"
        table.add_row(label, *[_fmt(row[param_column(p)]) for p in params],
                      *[_fmt(row[c]) for c in columns], state_label(row))
    table.caption = "* baseline: vLLM's defaults (no tuned flag passed)"
    return table


def print_summary(console: Console, trials: pd.DataFrame, params: Sequence[str], objective: str,
                  maximize: bool, sla: Mapping[str, float]) -> Best | None:
    """The table of trials, the best feasible configuration, its gain and its command."""
    if trials.empty:
        console.print("no trials yet")
        return None
    shown = [objective, *[k for k in sla if k != objective and k in trials.columns]]
    if "token_agreement" in trials and trials["token_agreement"].notna().any():
        shown.append("token_agreement")  # the quality probe's, for the trials that ran it
    console.print(trials_table(trials, params, shown))
    best = best_trial(trials, params, maximize)
    limits = ", ".join(limit_text(k, v) for k, v in sla.items()) or "none"
    if best is None:
        console.print(f"[red]No feasible configuration[/red] (SLA: {limits}).")
        return None
    confirmed = " (mean with its confirmation run)" if confirmed_scores(trials) else ""
    console.print(f"\n[bold green]Best feasible configuration[/bold green]: trial {best.number}, "
                  f"{objective} = {best.objective:.4g}{confirmed} (SLA: {limits})")
    for name, value in best.params.items():
        console.print(f"  {name}: {value}")
    if best.gain is not None:
        console.print(f"Gain over the vLLM-default baseline ({best.baseline_objective:.4g}): "
                      f"{best.gain:+.1%}")
    else:
        console.print("Gain over the vLLM-default baseline: n/a (baseline trial did not complete)")
    console.print("Command:")
    console.print(f"  {best.serve_command}", highlight=False, soft_wrap=True)
    if (noise := noise_line(trials)) is not None:
        console.print(noise)
    return best


def noise_line(trials: pd.DataFrame) -> str | None:
    """How noisy this cluster's measurements were: the median run-to-run coefficient of
    variation of the objective over trials measured repeatedly (search.repeats), and the
    median relative change of confirmed trials' objectives on re-measurement."""
    parts = []
    if "objective_cv" in trials and trials["objective_cv"].notna().any():
        cv = trials["objective_cv"].dropna()
        parts.append(f"median coefficient of variation {cv.median():.1%} over {len(cv)} "
                     "repeatedly measured trials")
    if "confirmation_of" in trials and trials["confirmation_of"].notna().any():
        objective = trials.set_index("trial_number")["objective"]
        confirms = trials.dropna(subset=["confirmation_of", "objective"])
        changes = [abs(r["objective"] - objective.get(int(r["confirmation_of"])))
                   / objective.get(int(r["confirmation_of"]))
                   for _, r in confirms.iterrows() if objective.get(int(r["confirmation_of"]))]
        if changes:
            parts.append(f"confirmation runs moved the objective by {pd.Series(changes).median():.1%} "
                         f"(median of {len(changes)})")
    return f"Run-to-run noise: {'; '.join(parts)}." if parts else None
