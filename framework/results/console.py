"""Console output: live progress lines while a sweep runs, and the final summary (rich).

Works from trial rows (the Parquet table as a DataFrame), so the summary printed at the end of a
run is the one any later reader of the results would compute.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
from rich.console import Console
from rich.table import Table

from framework.base.vocabulary import in_unit
from framework.base.vocabulary import label
from framework.base.vocabulary import limits_text
from framework.base.vocabulary import with_unit
from framework.config.target_spec import TargetSpec
from framework.results.decision import fleet_answer
from framework.results.decision import fleet_text
from framework.results.early import causes_text
from framework.results.early import cut_short
from framework.results.early import stopped_text
from framework.results.queries import cut_short_mask
from framework.results.queries import result_label
from framework.results.rows import param_column
from framework.results.verdict import SweepVerdict
from framework.results.verdict import decide
from framework.results.verdict import sweep_noise


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
        verdict = ("[green]feasible[/green]" if feasible
                   else f"[yellow]infeasible[/yellow] ({row['sla_violations']})")
        early = f" [cyan]{stopped_text(row)}[/cyan]" if cut_short(row) else ""
        self._line(f"  trial {number}: {self.objective}={with_unit(self.objective, obj)} "
                   f"{ttft_key}={with_unit(ttft_key, row.get(ttft_key))} "
                   f"{tpot_key}={with_unit(tpot_key, row.get(tpot_key))} {verdict}{early}; "
                   f"ready in {with_unit('startup_s', row['startup_s'], 3)}; "
                   f"best feasible so far {with_unit(self.objective, self.best)}")


def _cell(column: str, value: object) -> str:
    """A number in the unit its header names (fractions as percentages)."""
    if isinstance(value, float) and not math.isnan(value):
        return _fmt(in_unit(column, value))
    return _fmt(value)


def trials_table(trials: pd.DataFrame, params: Sequence[str], columns: Sequence[str]) -> Table:
    """One row per trial: parameters, the objective and SLA metrics (units in the headers),
    and the result (result_label)."""
    table = Table(title="Trials")
    for name in ["#", *params, *[label(c) for c in columns], "result"]:
        table.add_column(name, justify="left" if name == "result" else "right", overflow="fold")
    for _, series in trials.iterrows():
        row = series.to_dict()
        number = f"{int(row['trial_number'])}{'*' if row['is_baseline'] else ''}"
        table.add_row(number, *[_fmt(row[param_column(p)]) for p in params],
                      *[_cell(c, row[c]) for c in columns], result_label(row))
    table.caption = "* baseline: vLLM's defaults (no tuned flag passed)"
    return table


def print_summary(console: Console, trials: pd.DataFrame, params: Sequence[str], objective: str,
                  maximize: bool, sla: Mapping[str, float], target: TargetSpec | None = None,
                  currency: str = "USD", device: str = "GPU") -> SweepVerdict | None:
    """The table of trials, then the verdict (results.verdict): the winner and its command only
    when its gain is beyond the measured noise (or the defaults break the SLA and it meets it),
    else what the noise allows one to say; with a `target`, the fleet of the configuration to
    deploy (results.decision.fleet_text)."""
    if trials.empty:
        console.print("no trials yet")
        return None
    shown = [objective, *[k for k in sla if k != objective and k in trials.columns]]
    if "token_agreement" in trials and trials["token_agreement"].notna().any():
        shown.append("token_agreement")  # the quality probe's, for the trials that ran it
    console.print(trials_table(trials, params, shown))
    if (early := stopped_early_line(trials)) is not None:
        console.print(early)
    console.print(f"SLA: {limits_text(sla)}")
    if (noise := noise_line(trials)) is not None:
        console.print(noise)
    verdict = decide(trials, objective, maximize, sla)
    style = "bold green" if verdict.number is not None else "bold yellow"
    for line in verdict.lines:
        console.print(f"[{style}]{line}[/{style}]", soft_wrap=True)
    fleet = fleet_answer(trials, verdict, target.headroom, currency, device) if target else None
    if fleet is not None:
        console.print(fleet_text(fleet), highlight=False, soft_wrap=True)
    if verdict.number is None:
        return verdict
    row = trials[trials["trial_number"] == verdict.number].iloc[0]
    for name in params:
        console.print(f"  {name}: {row[param_column(name)]}")
    console.print("Command:")
    console.print(f"  {row['serve_command']}", highlight=False, soft_wrap=True)
    return verdict


def stopped_early_line(trials: pd.DataFrame) -> str | None:
    """Which trials' metrics come from a load stopped early, by cause (early.causes: their SLA
    surely broken after a few requests, or over-saturated): their throughputs cover a fraction
    of the load."""
    early = trials[cut_short_mask(trials)] if not trials.empty else trials
    if early.empty:
        return None
    by_cause: dict[str, list[str]] = {}
    for _, r in early.iterrows():
        by_cause.setdefault(causes_text([r.to_dict()]), []).append(str(int(r["trial_number"])))
    return "; ".join(f"Stopped early ({why}): trial{'s' if len(ns) > 1 else ''} {', '.join(ns)}"
                     for why, ns in by_cause.items()) \
        + "; their metrics cover only the requests before the stop."


def noise_line(trials: pd.DataFrame) -> str | None:
    """How noisy this cluster's measurements were: the server-to-server spread measured on
    fresh servers (verdict.sweep_noise), the median run-to-run coefficient of variation of the
    objective over trials measured repeatedly, and the median relative change of confirmed
    trials' objectives on re-measurement."""
    parts = []
    noise = sweep_noise(trials)
    if noise.server_var is not None:
        parts.append(f"fresh servers of one configuration differ by {math.sqrt(noise.server_var):.1%} "
                     f"(standard deviation beyond run-to-run noise, {noise.df} degrees of freedom)")
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
