"""Where a sweep's time went, from its trial rows (pure apart from pandas).

Each trial's seconds, summed over the trials (side by side, they can add up to more than the
wall time):
- its fresh server's start-up, phase by phase (`startup_<phase>_s`, engine.startup_log), and
  what no phase covers: `startup_s` of reused servers (the prefix-cache reset) and of rows
  without phases (failed before ready, older rows);
- share-gate waits (`gate_wait_s`), warm-up (`warmup_s`), the measured load (`bench_s`, with
  any screening run);
- the rest of the trial: `trial_s` less all of the above (the still-serving check, the
  quality probe, a stop made inside the trial, recording), at least 0.
Wall time = the last trial's end (`started_at + trial_s`) - the first trial's start; the time
in it when no trial ran (the driver between trials; the pause of a resumed sweep) is its own
line. Efficiency = sum of bench_s / wall time: the share of the sweep spent measuring.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import pandas as pd

from framework.engine.startup_log import STARTUP_PHASE_COLUMNS

PHASE_LABELS = {
    "startup_placement_s": "start-up: placement",
    "startup_imports_s": "start-up: process start and imports",
    "startup_weights_s": "start-up: weight loading",
    "startup_profile_kv_s": "start-up: profiling and KV allocation",
    "startup_compile_s": "start-up: compile and graph capture",
    "startup_api_s": "start-up: API ready",
}
UNSPLIT = "start-up: not split (reused servers, rows without phases)"
GATE, WARMUP, LOAD = "share-gate waits", "warm-up", "measured load"
REST = "rest of the trials (health check, quality probe, stop, recording, failed start-ups)"
IDLE = "no trial running (driver between trials)"


@dataclass(frozen=True)
class TimeReport:
    """`lines`: (label, seconds) in the order above; `wall_s` > 0."""

    trials: int
    wall_s: float
    lines: tuple[tuple[str, float], ...]

    @property
    def load_s(self) -> float:
        return dict(self.lines)[LOAD]

    @property
    def efficiency(self) -> float:
        return self.load_s / self.wall_s


def _col(trials: pd.DataFrame, column: str) -> pd.Series:
    """A column as floats, null and absent as 0."""
    if column not in trials:
        return pd.Series(0.0, index=trials.index)
    return trials[column].astype(float).fillna(0)


def busy_s(starts: list[float], ends: list[float]) -> float:
    """Length of the union of the intervals [start, end]."""
    total, reach = 0.0, None
    for start, end in sorted(zip(starts, ends)):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def time_report(trials: pd.DataFrame) -> TimeReport | None:
    """The sweep's time by phase; None without a trial that ran (wall time 0) or without
    started_at and trial_s."""
    if trials.empty or not {"started_at", "trial_s"} <= set(trials.columns):
        return None
    trials = trials.dropna(subset=["started_at"])
    starts = (trials["started_at"] - trials["started_at"].min()).dt.total_seconds().astype(float)
    ends = starts + _col(trials, "trial_s")
    wall = float(ends.max()) if len(ends) else 0.0
    if not wall > 0:
        return None
    phases = {label: float(_col(trials, column).sum()) for column, label in PHASE_LABELS.items()}
    known = [c for c, _ in STARTUP_PHASE_COLUMNS if c in trials]
    split = trials[known].notna().any(axis=1) if known else pd.Series(False, index=trials.index)
    unsplit = float(_col(trials, "startup_s")[~split].sum())
    gate, warmup, load = (float(_col(trials, c).sum())
                          for c in ("gate_wait_s", "warmup_s", "bench_s"))
    rest = float((_col(trials, "trial_s") - _col(trials, "startup_s") - _col(trials, "gate_wait_s")
                  - _col(trials, "warmup_s") - _col(trials, "bench_s")).clip(lower=0).sum())
    idle = wall - busy_s(list(starts), list(ends))
    lines = (*phases.items(), (UNSPLIT, unsplit), (GATE, gate), (WARMUP, warmup),
             (LOAD, load), (REST, rest), (IDLE, max(0.0, idle)))
    return TimeReport(trials=len(trials), wall_s=wall, lines=tuple(lines))


def text_table(report: TimeReport) -> str:
    """A markdown table: each line's seconds and share of the wall time, and the efficiency."""
    rows = ["| where | s | % of wall |", "| --- | ---: | ---: |"]
    rows += [f"| {label} | {seconds:.1f} | {100 * seconds / report.wall_s:.1f} |"
             for label, seconds in report.lines]
    rows.append(f"| wall time ({report.trials} trials) | {report.wall_s:.1f} | 100.0 |")
    return ("\n".join(rows) + f"\n\nEfficiency (measured load / wall time): "
            f"{100 * report.efficiency:.1f} %")


def html_section(trials: pd.DataFrame) -> str:
    """The report's "Where the time went": the efficiency, then the table (id `time-report`)."""
    report = time_report(trials)
    if report is None:
        return "<p>No trial ran yet.</p>"
    rows = "".join(f"<tr><td>{html.escape(label)}</td><td class='n'>{seconds:.1f}</td>"
                   f"<td class='n'>{100 * seconds / report.wall_s:.1f}</td></tr>"
                   for label, seconds in report.lines)
    return (f"<p id='efficiency'>Efficiency: {100 * report.efficiency:.1f}% of the wall time "
            f"({report.wall_s / 60:.1f} min, {report.trials} trials) was measured load.</p>"
            "<table id='time-report'><thead><tr><th>where</th><th>s (summed over trials)</th>"
            f"<th>% of wall</th></tr></thead><tbody>{rows}</tbody></table>"
            "<p class='small'>Start-up phases are read from each server's log "
            "(docs/RESULTS.md, start-up phases); trials side by side can sum to more than the "
            "wall time.</p>")
