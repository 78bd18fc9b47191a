"""The queries every reader of a sweep's trial rows shares, defined once: the measured and
feasible trials, the trials whose metrics come from a load stopped early, a trial's state
label, the best trial (after confirmation runs: the best confirmed mean) with its gain over a
baseline that is COMPLETE, feasible and measured in full, the Pareto front, and the phase means
a time estimate starts from."""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from framework.results.early import cut_short
from framework.results.early import requests_done
from framework.results.early import text as _text
from framework.results.rows import param_column
from framework.trial.objective import gain


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
    stopped early, how many requests its metrics cover: `SLA violated: p99_ttft_ms 612 ms >
    500 ms (+22%); stopped early after 12 requests`."""
    text = state_label(row)
    if text == "SLA violated" and _text(row.get("sla_violations")):
        text += f": {_text(row.get('sla_violations'))}"
    if cut_short(row):
        text += f"; stopped early after {requests_done(row)} requests"
    return text


@dataclass(frozen=True)
class Best:
    """The best feasible trial; `gain` over the baseline is None when the baseline cannot
    serve as one, and `baseline_note` then says why (baseline_objective is None too)."""

    number: int
    objective: float
    serve_command: str
    params: dict[str, object]
    baseline_objective: float | None
    gain: float | None
    baseline_note: str | None = None


def baseline_for_gain(trials: pd.DataFrame) -> tuple[float | None, str | None]:
    """(the baseline's objective, None) when the first baseline trial is COMPLETE, feasible,
    measured in full (not stopped early) and non-zero; else (None, why not), e.g. "vLLM's
    defaults break your SLA (p99_tpot_ms 6.1 ms > 4.5 ms (+36%))"."""
    if trials.empty or "is_baseline" not in trials:
        return None, "no baseline trial"
    base = trials[trials["is_baseline"] == True]  # noqa: E712
    if "confirmation_of" in base:
        base = base[base["confirmation_of"].isna()]
    if base.empty:
        return None, "no baseline trial"
    row = base.sort_values("trial_number").iloc[0].to_dict()
    number = int(row["trial_number"])
    if row["state"] != "COMPLETE":
        return None, f"the baseline trial {number} did not complete ({state_label(row)})"
    if row.get("feasible") != True:  # noqa: E712
        broken = _text(row.get("sla_violations")) or "SLA violated"
        if cut_short(row):
            broken += f"; load stopped early after {requests_done(row)} requests"
        return None, f"vLLM's defaults break your SLA ({broken})"
    if cut_short(row):
        return None, (f"the baseline trial {number} was stopped early "
                      f"({_text(row.get('stopped_early'))})")
    objective = float(row["objective"])
    if objective == 0 or math.isnan(objective):
        return None, f"the baseline trial {number} measured an objective of {objective:g}"
    return objective, None


def confirmed_scores(trials: pd.DataFrame) -> dict[int, float]:
    """Trials re-measured by confirmation runs -> the mean objective over the original and its
    confirmations; a trial any of whose measurements is not COMPLETE and feasible is left
    out (its confirmation broke the SLA or failed)."""
    if "confirmation_of" not in trials or trials["confirmation_of"].isna().all():
        return {}
    scores: dict[int, float] = {}
    for original, group in trials.groupby("confirmation_of"):
        measured = pd.concat([trials[trials["trial_number"] == original], group])
        good = (measured["state"] == "COMPLETE") & (measured["feasible"] == True)  # noqa: E712
        if len(measured) > len(group) and good.all():
            scores[int(original)] = float(measured["objective"].mean())
    return scores


def best_trial(trials: pd.DataFrame, params: Sequence[str], maximize: bool) -> Best | None:
    """The best COMPLETE and feasible trial, with its gain over the baseline trial when that
    can serve as one (baseline_for_gain; else gain None and the reason in baseline_note).
    After confirmation runs the best is chosen among the confirmed trials on the mean of
    their measurements (confirmed_scores), if any survived."""
    if trials.empty:
        return None
    ok = ok_trials(trials)
    if ok.empty:
        return None
    scores = confirmed_scores(trials)
    if scores:
        number = (max if maximize else min)(scores, key=scores.__getitem__)
        row, value = ok[ok["trial_number"] == number].iloc[0], scores[number]
    else:
        row = ok.loc[ok["objective"].idxmax() if maximize else ok["objective"].idxmin()]
        value = float(row["objective"])
    base_obj, note = baseline_for_gain(trials)
    return Best(number=int(row["trial_number"]), objective=value,
                serve_command=str(row["serve_command"]),
                params={p: row[param_column(p)] for p in params},
                baseline_objective=base_obj,
                gain=gain(value, base_obj, maximize) if base_obj is not None else None,
                baseline_note=note)


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


def phase_means(trials: pd.DataFrame) -> PhaseMeans | None:
    """The phase means of the COMPLETE trials (None if there is none); overhead = trial time
    less start-up, warm-up and load, at least 0."""
    done = trials[trials["state"] == "COMPLETE"] if not trials.empty else trials
    if done.empty:
        return None

    def col(name: str) -> pd.Series:  # rows of older schemas may lack a column
        return done[name].astype(float) if name in done else pd.Series(0.0, index=done.index)

    warmup = col("warmup_s").fillna(0)
    fresh = (~done["server_reused"].fillna(False).astype(bool) if "server_reused" in done
             else pd.Series(True, index=done.index))

    def mean(series: pd.Series) -> float | None:
        value = series.mean()
        return None if pd.isna(value) or math.isnan(float(value)) else float(value)

    return PhaseMeans(trials=len(done), startup=mean(col("startup_s")[fresh]), warmup=mean(warmup),
                      bench=mean(col("bench_s")),
                      overhead=mean((col("trial_s") - col("startup_s") - warmup
                                     - col("bench_s")).clip(lower=0)))


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
    """The k best COMPLETE, feasible trials that are not themselves re-measurements, one per
    configuration (serve_command), as (number, parameters, is_baseline), best first."""
    if trials.empty:
        return []
    ok = ok_trials(trials)
    ok = ok[ok["confirmation_of"].isna()]
    if skip_baseline:
        ok = ok[ok["is_baseline"] != True]  # noqa: E712
    top = ok.sort_values("objective", ascending=not maximize).drop_duplicates("serve_command")
    return [(int(r["trial_number"]), trial_params(trials, int(r["trial_number"]), params),
             bool(r["is_baseline"])) for _, r in top.head(k).iterrows()]


def best_measured(trials: pd.DataFrame, maximize: bool) -> float | None:
    """The best objective of a COMPLETE, feasible trial measured in full (not stopped early)."""
    if trials.empty:
        return None
    ok = ok_trials(trials)
    if "stopped_early" in ok:
        ok = ok[ok["stopped_early"].isna()]
    if ok.empty:
        return None
    values = ok["objective"].astype(float)
    return float(values.max() if maximize else values.min())
