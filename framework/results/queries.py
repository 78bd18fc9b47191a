"""The queries every reader of a sweep's trial rows shares, defined once: the measured and
feasible trials, the trials whose metrics come from a load stopped early, a trial's state
label, the best single measurement, the Pareto front, and the phase means a time estimate starts
from. Which configuration the sweep ships, and its gain, is framework.results.verdict's alone."""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field

import pandas as pd

from framework.engine.startup_log import STARTUP_PHASE_COLUMNS
from framework.results.early import cut_short
from framework.results.early import stopped_text
from framework.results.early import text as _text
from framework.results.rows import param_column


def ok_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The COMPLETE trials that met the SLA."""
    return trials[(trials["state"] == "COMPLETE") & (trials["feasible"] == True)]  # noqa: E712


def cut_short_mask(trials: pd.DataFrame) -> pd.Series:
    """cut_short of every row (all False without a `stopped_early` column)."""
    if trials.empty or "stopped_early" not in trials:
        return pd.Series(False, index=trials.index, dtype=bool)
    return trials.apply(lambda r: cut_short(r.to_dict()), axis=1).astype(bool)


def state_label(row: Mapping[str, object]) -> str:
    """PRUNED, INFEASIBLE (ruled out before launch), FAIL(<reason>), feasible or SLA violated."""
    if row["state"] in ("PRUNED", "INFEASIBLE"):
        return str(row["state"])
    if row["state"] != "COMPLETE":
        return f"FAIL({row['fail_reason']})"
    return "feasible" if row["feasible"] == True else "SLA violated"  # noqa: E712


def result_label(row: Mapping[str, object]) -> str:
    """state_label, with the limits a violating trial broke (and by how much) and, for a load
    stopped early, how many requests its metrics cover and why if not its SLA (early.
    stopped_text): `SLA violated: p99_ttft_ms 612 ms > 500 ms (+22%); stopped early after 12
    requests`."""
    text = state_label(row)
    if text == "SLA violated" and _text(row.get("sla_violations")):
        text += f": {_text(row.get('sla_violations'))}"
    if cut_short(row):
        text += f"; {stopped_text(row)}"
    return text


def pareto_front(points: Sequence[Sequence[float]], maximize: Sequence[bool]) -> list[int]:
    """Indices of the points no other point dominates (at least as good in every metric, better
    in one), best first by the first metric; equal points are all kept."""
    signs = [1.0 if m else -1.0 for m in maximize]
    scored = [[s * float(v) for s, v in zip(signs, p)] for p in points]

    def dominated(i: int) -> bool:
        return any(all(q >= p for q, p in zip(other, scored[i])) and other != scored[i]
                   for other in scored)

    return sorted((i for i in range(len(scored)) if not dominated(i)),
                  key=lambda i: [-v for v in scored[i]])


@dataclass(frozen=True)
class PhaseMeans:
    """Mean seconds per phase over a sweep's measured trials (start-up over fresh servers
    only; None where no trial measured it)."""

    trials: int
    startup: float | None
    warmup: float | None
    bench: float | None
    overhead: float | None
    # each start-up phase column's mean over the fresh servers that logged it (startup_log)
    startup_phases: Mapping[str, float] = field(default_factory=dict)
    screen_survival: float | None = None  # COMPLETE / (COMPLETE + PRUNED)


def phase_means(trials: pd.DataFrame) -> PhaseMeans | None:
    """The phase means of the COMPLETE trials (None if there is none); overhead = trial time
    less start-up, warm-up and load, at least 0; screen_survival = the share of the measured
    trials (COMPLETE or PRUNED) that were not pruned."""
    done = trials[trials["state"] == "COMPLETE"] if not trials.empty else trials
    if done.empty:
        return None
    pruned = int((trials["state"] == "PRUNED").sum())

    def col(name: str) -> pd.Series:  # rows of older schemas may lack a column
        return done[name].astype(float) if name in done else pd.Series(0.0, index=done.index)

    warmup = col("warmup_s").fillna(0)
    fresh = (~done["server_reused"].fillna(False).astype(bool) if "server_reused" in done
             else pd.Series(True, index=done.index))

    def mean(series: pd.Series) -> float | None:
        value = series.mean()
        return None if pd.isna(value) or math.isnan(float(value)) else float(value)

    phases = {c: mean(done[c].astype(float)[fresh]) for c, _ in STARTUP_PHASE_COLUMNS if c in done}
    return PhaseMeans(trials=len(done), startup=mean(col("startup_s")[fresh]), warmup=mean(warmup),
                      bench=mean(col("bench_s")),
                      overhead=mean((col("trial_s") - col("startup_s") - warmup
                                     - col("bench_s")).clip(lower=0)),
                      startup_phases={c: v for c, v in phases.items() if v is not None},
                      screen_survival=len(done) / (len(done) + pruned))


def _cell(value: object) -> object:
    """A stored cell as a plain Python value; None for null (NaN where a null number was read)."""
    value = value.item() if hasattr(value, "item") else value
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def trial_params(trials: pd.DataFrame, number: int, params: Sequence[str]) -> dict[str, object]:
    """Trial `number`'s parameter values as stored (null ones left out; {} if no such row)."""
    row = trials[trials["trial_number"] == number]
    if row.empty:
        return {}
    values = {p: _cell(row.iloc[0][param_column(p)]) for p in params
              if param_column(p) in row}
    return {p: v for p, v in values.items() if v is not None}


def confirmation_candidates(trials: pd.DataFrame, params: Sequence[str], k: int,
                            maximize: bool, skip_baseline: bool
                            ) -> list[tuple[int, dict[str, object], bool]]:
    """The k best COMPLETE, feasible trials that are not themselves re-measurements and have
    none yet, one per configuration (serve_command), as (number, parameters, is_baseline),
    best first."""
    if trials.empty:
        return []
    ok = ok_trials(trials)
    confirmed = set(trials["confirmation_of"].dropna().astype(int))
    ok = ok[ok["confirmation_of"].isna() & ~ok["trial_number"].isin(confirmed)]
    if skip_baseline:
        ok = ok[ok["is_baseline"] != True]  # noqa: E712
    top = ok.sort_values("objective", ascending=not maximize).drop_duplicates("serve_command")
    return [(int(r["trial_number"]), trial_params(trials, int(r["trial_number"]), params),
             bool(r["is_baseline"])) for _, r in top.head(k).iterrows()]


def best_row(trials: pd.DataFrame, maximize: bool) -> pd.Series | None:
    """The COMPLETE, feasible row measured in full (not stopped early) with the best objective:
    the best single measurement, not a verdict (one run may win by noise)."""
    if trials.empty:
        return None
    ok = ok_trials(trials)
    if "stopped_early" in ok:
        ok = ok[ok["stopped_early"].isna()]
    ok = ok.dropna(subset=["objective"])
    if ok.empty:
        return None
    values = ok["objective"].astype(float)
    return ok.loc[values.idxmax() if maximize else values.idxmin()]


def best_measured(trials: pd.DataFrame, maximize: bool) -> float | None:
    """best_row's objective."""
    row = best_row(trials, maximize)
    return None if row is None else float(row["objective"])
