"""The report's plots (framework.results.html_report lays out the page): throughput against
the SLA's latencies with the Pareto front, parameter importances, the objective against
each parameter, and each configuration's latency-vs-load curve (load_curve_plot). Each
returns an HTML fragment, or a sentence when there is nothing to plot.

What they show and leave out, by rule:
- only COMPLETE trials measured in full: a trial whose load stopped early (queries.cut_short)
  has throughputs from a fraction of its requests, so it is left out of every plot and named
  under them (stopped_early_note);
- the Pareto front joins feasible trials only; infeasible ones are drawn, apart in colour;
- the baseline (vLLM's defaults) is marked by a star wherever it is drawn;
- axis titles carry units (vocabulary.label); a parameter with `log: true` in the search
  space is on a log axis.
Strings from the rows are HTML-escaped, also in plot labels, which plotly renders as HTML.
"""

from __future__ import annotations

import html
import math
from collections.abc import Collection
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from framework.base.vocabulary import THROUGHPUT_METRICS
from framework.base.vocabulary import label
from framework.base.vocabulary import unit_of
from framework.base.vocabulary import with_unit
from framework.config.specs import SweepSpec
from framework.results.early import SLA_BROKEN
from framework.results.early import causes_text
from framework.results.early import requests_done
from framework.results.queries import cut_short_mask
from framework.results.queries import pareto_front

FEASIBLE, INFEASIBLE, FRONT, LIMIT, BASELINE = "#2ca02c", "#ff7f0e", "#1f77b4", "#d62728", "#222"
BASELINE_NAME = "baseline (vLLM's defaults)"
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def missing(value: object) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def fmt(value: object) -> str:
    if missing(value):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if hasattr(value, "item"):
        return fmt(value.item())
    return str(value)


def esc(value: object) -> str:
    """`value` as text for HTML element content and plotly labels (not for attributes)."""
    return html.escape(fmt(value), quote=False)


def flag_name(column: str) -> str:
    return column.removeprefix("param_").replace("_", "-")


def _plot(fig: go.Figure, height: int = 420, top: int = 50) -> str:
    fig.update_layout(height=height, margin={"l": 60, "r": 20, "t": top, "b": 50},
                      template="plotly_white")
    div = fig.to_html(full_html=False, include_plotlyjs=False, config=_PLOT_CONFIG)
    return f'<div class="plot">{div}</div>'


def _hover(row: pd.Series, params: Sequence[str]) -> str:
    values = "<br>".join(f"{html.escape(flag_name(p))}={esc(row[p])}" for p in params)
    base = " (baseline)" if row.get("is_baseline") == True else ""  # noqa: E712
    return f"trial {int(row['trial_number'])}{base}<br>{values}"


def _numeric(trials: pd.DataFrame, column: str) -> pd.Series:
    if column not in trials.columns:
        return pd.Series([math.nan] * len(trials), index=trials.index, dtype=float)
    return pd.to_numeric(trials[column], errors="coerce")


def measured(trials: pd.DataFrame) -> pd.DataFrame:
    """The COMPLETE trials measured in full (not cut short): the ones the plots show."""
    if trials.empty:
        return trials
    return trials[(trials["state"] == "COMPLETE") & ~cut_short_mask(trials)]


def stopped_early_note(trials: pd.DataFrame) -> str:
    """A sentence naming the COMPLETE trials left out of the plots because their load stopped
    early ("" when there is none)."""
    if trials.empty:
        return ""
    early = trials[(trials["state"] == "COMPLETE") & cut_short_mask(trials)]
    if early.empty:
        return ""
    names = ", ".join(f"{int(r['trial_number'])} (after {requests_done(r.to_dict())} requests)"
                      for _, r in early.iterrows())
    why = causes_text([r.to_dict() for _, r in early.iterrows()])
    how = "once the SLA was surely broken" if why == SLA_BROKEN else f"({html.escape(why)})"
    return (f"<p class='small early-note'>Left out of the plots and the importances: trial"
            f"{'s' if len(early) > 1 else ''} {names}, stopped early {how}; their throughputs "
            "come from a fraction of the load.</p>")


def latency_key(spec: SweepSpec, trials: pd.DataFrame, metric: str) -> str:
    """The SLA's key on `metric` (ttft/tpot) if any, else p99 or mean from the columns."""
    for key in spec.sla:
        if f"_{metric}_ms" in key:
            return key
    return f"p99_{metric}_ms" if f"p99_{metric}_ms" in trials.columns else f"mean_{metric}_ms"


def throughput_key(spec: SweepSpec) -> str:
    metric = spec.objective.metric
    return metric if metric in THROUGHPUT_METRICS else "output_throughput"


def _by_verdict(done: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(label, colour, rows) for the feasible and the SLA-violating completed trials."""
    feasible = done["feasible"] == True  # noqa: E712
    return [("feasible", FEASIBLE, done[feasible]), ("SLA violated", INFEASIBLE, done[~feasible])]


def _baseline(done: pd.DataFrame) -> pd.DataFrame:
    return done[done["is_baseline"] == True] if "is_baseline" in done else done.iloc[0:0]  # noqa: E712


def _star(xs: list[Any], ys: list[Any], show: bool = True) -> go.Scatter:
    return go.Scatter(x=xs, y=ys, mode="markers", name=BASELINE_NAME, legendgroup="baseline",
                      showlegend=show, hoverinfo="skip",
                      marker={"symbol": "star", "size": 18, "color": "rgba(0,0,0,0)",
                              "line": {"color": BASELINE, "width": 2}})


def pareto_plot(trials: pd.DataFrame, spec: SweepSpec, params: Sequence[str], metric: str) -> str:
    """pareto_figure as HTML, or a sentence when no trial can be drawn."""
    fig = pareto_figure(trials, spec, params, metric)
    if fig is None:
        return (f"<p>No trial measured in full has both {latency_key(spec, trials, metric)} "
                f"and {throughput_key(spec)}: nothing to plot.</p>")
    return _plot(fig)


def pareto_figure(trials: pd.DataFrame, spec: SweepSpec, params: Sequence[str],
                  metric: str) -> go.Figure | None:
    """Throughput against the SLA's `metric` (ttft / tpot) latency key, the limit drawn, the
    Pareto front of the feasible trials joined, the baseline starred; None if no trial
    measured in full has both values."""
    x_key, y_key = latency_key(spec, trials, metric), throughput_key(spec)
    done = measured(trials)
    done = done.assign(_x=_numeric(done, x_key), _y=_numeric(done, y_key)).dropna(
        subset=["_x", "_y"])
    if done.empty:
        return None
    fig = go.Figure()
    hover = (f"%{{text}}<br>{x_key} %{{x:.4g}} {unit_of(x_key)}<br>"
             f"{y_key} %{{y:,.4g}} {unit_of(y_key)}<extra></extra>")
    for name, color, part in _by_verdict(done):
        fig.add_trace(go.Scatter(x=part["_x"].tolist(), y=part["_y"].tolist(), mode="markers",
                                 name=name, marker={"color": color, "size": 10},
                                 text=[_hover(r, params) for _, r in part.iterrows()],
                                 hovertemplate=hover))
    feasible = done[done["feasible"] == True]  # noqa: E712
    if not feasible.empty:
        front = pareto_front(list(zip(feasible["_x"], feasible["_y"])), [False, True])
        fig.add_trace(go.Scatter(x=[feasible["_x"].iloc[i] for i in front],
                                 y=[feasible["_y"].iloc[i] for i in front], mode="lines+markers",
                                 name="Pareto front (feasible)",
                                 line={"color": FRONT, "dash": "dot"},
                                 marker={"symbol": "circle-open", "size": 16, "color": FRONT}))
    base = _baseline(done)
    if not base.empty:
        fig.add_trace(_star(base["_x"].tolist(), base["_y"].tolist()))
    if x_key in spec.sla:
        fig.add_vline(x=spec.sla[x_key], line={"color": LIMIT, "dash": "dash"},
                      annotation_text=f"SLA {x_key} <= {with_unit(x_key, spec.sla[x_key])}")
    fig.update_layout(title=f"{y_key} vs {x_key}", xaxis_title=label(x_key),
                      yaxis_title=label(y_key))
    return fig


def importances_plot(importances: Mapping[str, float] | None) -> str:
    if not importances:
        return ("<p>No parameter importances (needs at least two trials measured in full with "
                "different parameters).</p>")
    names = list(importances)[::-1]
    fig = go.Figure(go.Bar(x=[importances[n] for n in names], y=names, orientation="h",
                           marker={"color": FRONT}))
    fig.update_layout(title="Parameter importances (Optuna, normalized)",
                      xaxis_title="importance (share of the objective's variance, 0-1)")
    return _plot(fig, height=max(260, 60 + 40 * len(names)))


def _categories(values: pd.Series) -> list[str] | None:
    """Sorted labels when a parameter is best shown on a category axis (not a number, or at
    most 6 distinct numbers), else None."""
    present = values.dropna()
    numeric = pd.api.types.is_numeric_dtype(present) and not pd.api.types.is_bool_dtype(present)
    if numeric and present.nunique() > 6:
        return None
    try:
        ordered = sorted(set(present.tolist()))
    except TypeError:
        ordered = sorted(set(present.tolist()), key=str)
    return [esc(v) for v in ordered]


def effects_plot(trials: pd.DataFrame, spec: SweepSpec, params: Sequence[str],
                 log_params: Collection[str] = ()) -> str:
    """effects_figure as HTML, or a sentence when there is nothing to draw."""
    fig = effects_figure(trials, spec, params, log_params)
    if fig is None:
        return "<p>No trial measured in full (or no parameter): no effect to plot.</p>"
    return _plot(fig, height=fig.layout.height, top=90)


def effects_figure(trials: pd.DataFrame, spec: SweepSpec, params: Sequence[str],
                   log_params: Collection[str] = ()) -> go.Figure | None:
    """The objective against each parameter (columns `params`), one subplot each; those in
    `log_params` (param columns of `log: true` parameters) on a log x axis, the others on a
    linear or category axis; None if no trial measured in full has an objective."""
    done = measured(trials)
    done = done.assign(_y=_numeric(done, "objective")).dropna(subset=["_y"])
    if done.empty or not params:
        return None
    cols = min(3, len(params))
    rows = math.ceil(len(params) / cols)
    fig = make_subplots(rows=rows, cols=cols,
                        subplot_titles=[html.escape(flag_name(p))
                                        + (" (log axis)" if p in log_params else "")
                                        for p in params])
    base = _baseline(done)
    metric = spec.objective.metric
    hover = f"%{{text}}<br>{metric} %{{y:,.4g}} {unit_of(metric)}<extra></extra>"
    for index, param in enumerate(params):
        at = {"row": index // cols + 1, "col": index % cols + 1}
        categories = None if param in log_params else _categories(done[param])
        if param in log_params:
            fig.update_xaxes(type="log", **at)
        elif categories:
            fig.update_xaxes(type="category", categoryorder="array", categoryarray=categories,
                             **at)
        for name, color, part in _by_verdict(done):
            xs = [esc(v) if categories else v for v in part[param].tolist()]
            fig.add_trace(go.Scatter(x=xs, y=part["_y"].tolist(), mode="markers", name=name,
                                     legendgroup=name, showlegend=index == 0,
                                     marker={"color": color, "size": 9},
                                     text=[_hover(r, params) for _, r in part.iterrows()],
                                     hovertemplate=hover), **at)
        if not base.empty:
            xs = [esc(v) if categories else v for v in base[param].tolist()]
            fig.add_trace(_star(xs, base["_y"].tolist(), show=index == 0), **at)
    fig.update_yaxes(title_text=label(spec.objective.metric), col=1)
    fig.update_layout(title=f"{spec.objective.metric} by parameter", height=320 * rows + 80)
    return fig


LOAD_AXES = {"request_rate": "request rate (req/s)", "max_concurrency": "max concurrency",
             "burstiness": "burstiness", "speed_up": "trace speed-up (x)"}


def varying_load(workloads: pd.DataFrame) -> str | None:
    """The load column (workload_rows.LOAD_COLUMNS) whose value differs between a trial's
    workloads, the x of a load curve (sweep.load_curve); None if none or several do."""
    if workloads.empty:
        return None
    first = workloads[workloads["trial_number"] == workloads["trial_number"].iloc[0]]
    varying = [c for c in LOAD_AXES if c in first and first[c].nunique(dropna=False) > 1]
    return varying[0] if len(varying) == 1 else None


def load_curve_plot(workloads: pd.DataFrame, trials: pd.DataFrame, spec: SweepSpec,
                    params: Sequence[str]) -> str:
    """The objective metric against the offered load, one line per complete trial (its
    configuration's curve), markers hollow where that load broke the SLA; the SLA's bound on
    the metric as a dashed line. A sentence when the workloads are not one load's values."""
    x = varying_load(workloads)
    metric = spec.objective.metric
    if x is None or metric not in workloads:
        return "<p>No load curve: the trials' workloads differ in no single load setting.</p>"
    done = trials[(trials["state"] == "COMPLETE") & ~cut_short_mask(trials)]
    fig = go.Figure()
    for _, trial in done.iterrows():
        points = workloads[workloads["trial_number"] == trial["trial_number"]].sort_values(x)
        settings = ", ".join(f"{flag_name(p)}={fmt(trial[p])}" for p in params
                             if not missing(trial[p]))
        name = esc(f"trial {trial['trial_number']}" + (f": {settings}" if settings else ""))
        fig.add_trace(go.Scatter(
            x=points[x], y=points[metric], mode="lines+markers", name=name,
            marker={"symbol": ["circle" if ok else "circle-open" for ok in points["feasible"]],
                    "size": 9}))
    if metric in spec.sla:
        fig.add_hline(y=spec.sla[metric], line={"dash": "dash", "color": LIMIT},
                      annotation_text=esc(f"SLA {metric} <= {spec.sla[metric]:g}"))
    fig.update_layout(xaxis_title=LOAD_AXES[x], yaxis_title=esc(label(metric)),
                      legend={"title": "configuration"})
    return _plot(fig)
