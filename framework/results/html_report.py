"""One self-contained HTML report of a sweep: plotly.js is inlined once in the page head, so the
file opens with no network access.

Sections, from the trial rows alone (plus the sweep spec and optional parameter importances):
the best feasible configuration with its `vllm serve` command and gain over the baseline;
Pareto plots of throughput vs the SLA's TTFT and TPOT keys with the limits drawn and the front
highlighted; parameter importances; the objective against each parameter; the table of all
trials with a per-trial diagnosis (framework.results.diagnosis); the failures with their log tails.
Every section degrades to a sentence when there is nothing to plot. Every string taken from
the rows (fail reasons and details, log tails, parameter values, versions) is HTML-escaped,
also in plot labels, which plotly renders as HTML.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from framework.results.diagnosis import diagnose
from framework.results.quality_report import quality_section
from framework.results.queries import best_trial, pareto_front, state_label
from framework.base.vocabulary import THROUGHPUT_METRICS
from framework.base.vocabulary import limit_text
from framework.config.specs import SweepSpec

FEASIBLE, INFEASIBLE, FRONT, LIMIT = "#2ca02c", "#ff7f0e", "#1f77b4", "#d62728"
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}
_STATS = (("mean", "Mean"), ("median", "Median"), ("p99", "P99"))
_LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:1.6em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:4px}
pre{background:#f5f5f5;padding:10px;white-space:pre-wrap;word-break:break-all;font-size:.85em}
table{border-collapse:collapse;font-size:.82em}th,td{border:1px solid #ddd;padding:3px 6px}
th{background:#f0f0f0;position:sticky;top:0}td.n{text-align:right;font-variant-numeric:tabular-nums}
.wide{overflow-x:auto}.small{color:#555;font-size:.9em}.ok{color:#1a7f1a}.bad{color:#b35c00}
.fail{color:#c0392b}tr.best{background:#eaf7ea}.plot{max-width:1100px}
td.diag{min-width:300px}
"""


def _missing(value: object) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def _fmt(value: object) -> str:
    if _missing(value):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if hasattr(value, "item"):
        return _fmt(value.item())  # type: ignore[union-attr]
    return str(value)


def _esc(value: object) -> str:
    """`value` as text for HTML element content and plotly labels (not for attributes)."""
    return html.escape(_fmt(value), quote=False)


def _flag(column: str) -> str:
    return column.removeprefix("param_").replace("_", "-")


def _plot(fig: go.Figure, height: int = 420, top: int = 50) -> str:
    fig.update_layout(height=height, margin={"l": 60, "r": 20, "t": top, "b": 50},
                      template="plotly_white")
    div = fig.to_html(full_html=False, include_plotlyjs=False, config=_PLOT_CONFIG)
    return f'<div class="plot">{div}</div>'


def _hover(row: pd.Series, params: Sequence[str]) -> str:
    values = "<br>".join(f"{html.escape(_flag(p))}={_esc(row[p])}" for p in params)
    return f"trial {int(row['trial_number'])}<br>{values}"


def _numeric(trials: pd.DataFrame, column: str) -> pd.Series:
    if column not in trials.columns:
        return pd.Series([math.nan] * len(trials), index=trials.index, dtype=float)
    return pd.to_numeric(trials[column], errors="coerce")


def _complete(trials: pd.DataFrame) -> pd.DataFrame:
    return trials[trials["state"] == "COMPLETE"] if not trials.empty else trials


def _latency_key(spec: SweepSpec, trials: pd.DataFrame, metric: str) -> str:
    """The SLA's key on `metric` (ttft/tpot) if any, else p99 or mean from the columns."""
    for key in spec.sla:
        if f"_{metric}_ms" in key:
            return key
    return f"p99_{metric}_ms" if f"p99_{metric}_ms" in trials.columns else f"mean_{metric}_ms"


def _throughput_key(spec: SweepSpec) -> str:
    metric = spec.objective.metric
    return metric if metric in THROUGHPUT_METRICS else "output_throughput"


def _by_verdict(done: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(label, colour, rows) for the feasible and the SLA-violating completed trials."""
    feasible = done["feasible"] == True  # noqa: E712
    return [("feasible", FEASIBLE, done[feasible]), ("SLA violated", INFEASIBLE, done[~feasible])]


def _pareto(trials: pd.DataFrame, spec: SweepSpec, params: Sequence[str], metric: str) -> str:
    x_key, y_key = _latency_key(spec, trials, metric), _throughput_key(spec)
    done = _complete(trials).assign(_x=_numeric(trials, x_key), _y=_numeric(trials, y_key))
    done = done.dropna(subset=["_x", "_y"])
    if done.empty:
        return f"<p>No completed trial has both {x_key} and {y_key}: nothing to plot.</p>"
    fig = go.Figure()
    for label, color, part in _by_verdict(done):
        fig.add_trace(go.Scatter(x=part["_x"].tolist(), y=part["_y"].tolist(), mode="markers",
                                 name=label, marker={"color": color, "size": 10},
                                 text=[_hover(r, params) for _, r in part.iterrows()],
                                 hoverinfo="text+x+y"))
    front = pareto_front(list(zip(done["_x"], done["_y"])), [False, True])
    fig.add_trace(go.Scatter(x=[done["_x"].iloc[i] for i in front],
                             y=[done["_y"].iloc[i] for i in front], mode="lines+markers",
                             name="Pareto front", line={"color": FRONT, "dash": "dot"},
                             marker={"symbol": "circle-open", "size": 16, "color": FRONT}))
    if x_key in spec.sla:
        fig.add_vline(x=spec.sla[x_key], line={"color": LIMIT, "dash": "dash"},
                      annotation_text=f"SLA {x_key} <= {spec.sla[x_key]:g}")
    fig.update_layout(title=f"{y_key} vs {x_key}", xaxis_title=x_key, yaxis_title=y_key)
    return _plot(fig)


def _importances(importances: Mapping[str, float] | None) -> str:
    if not importances:
        return ("<p>No parameter importances (needs at least two completed trials with "
                "different parameters).</p>")
    names = list(importances)[::-1]
    fig = go.Figure(go.Bar(x=[importances[n] for n in names], y=names, orientation="h",
                           marker={"color": FRONT}))
    fig.update_layout(title="Parameter importances (Optuna, normalized)", xaxis_title="importance")
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
    return [_esc(v) for v in ordered]


def _effects(trials: pd.DataFrame, spec: SweepSpec, params: Sequence[str]) -> str:
    done = _complete(trials).assign(_y=_numeric(trials, "objective")).dropna(subset=["_y"])
    if done.empty or not params:
        return "<p>No completed trial (or no parameter): no effect to plot.</p>"
    cols = min(3, len(params))
    rows = math.ceil(len(params) / cols)
    fig = make_subplots(rows=rows, cols=cols,
                        subplot_titles=[html.escape(_flag(p)) for p in params])
    for index, param in enumerate(params):
        categories = _categories(done[param])
        if categories:
            fig.update_xaxes(type="category", categoryorder="array", categoryarray=categories,
                             row=index // cols + 1, col=index % cols + 1)
        for label, color, part in _by_verdict(done):
            xs = [_esc(v) if categories else v for v in part[param].tolist()]
            fig.add_trace(go.Scatter(x=xs, y=part["_y"].tolist(), mode="markers", name=label,
                                     legendgroup=label, showlegend=index == 0,
                                     marker={"color": color, "size": 9},
                                     text=[_hover(r, params) for _, r in part.iterrows()]),
                          row=index // cols + 1, col=index % cols + 1)
    fig.update_yaxes(title_text=spec.objective.metric, col=1)
    fig.update_layout(title=f"{spec.objective.metric} by parameter")
    return _plot(fig, height=320 * rows + 80, top=90)


def _best(trials: pd.DataFrame, spec: SweepSpec, params: Sequence[str]) -> tuple[str, int | None]:
    maximize = spec.objective.direction == "maximize"
    limits = ", ".join(limit_text(k, v) for k, v in spec.sla.items()) or "none"
    done = _complete(trials)
    best = best_trial(trials, [], maximize)
    if best is None:
        if done.empty:
            return (f"<p class='fail'>No trial completed ({len(trials)} failed): there is no "
                    "configuration to recommend.</p>", None)
        return (f"<p class='bad'>No feasible configuration: none of the {len(done)} completed "
                f"trials met the SLA ({html.escape(limits)}).</p>", None)
    row = trials[trials["trial_number"] == best.number].iloc[0]
    if best.gain is not None:
        gain = (f"{best.gain:+.1%} over the vLLM-default baseline "
                f"({spec.objective.metric} = {best.baseline_objective:.4g})")
    else:
        gain = "gain over the baseline: n/a (no completed baseline trial)"
    cells = "".join(f"<tr><th>{html.escape(_flag(p))}</th><td>{_esc(row[p])}</td></tr>"
                    for p in params)
    return (f"<p class='ok'><b>Trial {best.number}</b>: {spec.objective.metric} = "
            f"<b>{best.objective:.4g}</b>, {gain}. SLA: {html.escape(limits)}.</p>"
            f"<table>{cells}</table><p>Command:</p>"
            f"<pre id='serve-command'>{html.escape(best.serve_command, quote=False)}</pre>",
            best.number)


def _result(row: Mapping[str, object]) -> tuple[str, str]:
    """The state label (queries.state_label), escaped, and its CSS class."""
    label = state_label(row)
    css = "ok" if label == "feasible" else "bad" if label == "SLA violated" else "fail"
    return _esc(label), css


def _table(trials: pd.DataFrame, spec: SweepSpec, params: Sequence[str], best: int | None) -> str:
    metrics: list[tuple[str, str]] = []
    for key, label in _LATENCIES:
        metrics += [(f"{stat}_{key}_ms", f"{name} {label} (ms)") for stat, name in _STATS
                    if f"{stat}_{key}_ms" in trials.columns]
    metrics += [(k, label) for k, label in (("request_throughput", "Request throughput (req/s)"),
                                            ("output_throughput", "Output throughput (tok/s)"))
                if k in trials.columns]
    head = ["#", "state", "fail_reason", *[_flag(p) for p in params], spec.objective.metric,
            "result", "diagnosis", *[label for _, label in metrics]]
    lines = ["<div class='wide'><table id='trials'><thead><tr>"
             + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for _, series in trials.iterrows():
        row = series.to_dict()
        number = int(row["trial_number"])
        result, css = _result(row)
        diagnosis = diagnose(row, spec.sla)
        cells = [f"<td>{number}{'*' if row.get('is_baseline') == True else ''}</td>",  # noqa: E712
                 f"<td>{_esc(row['state'])}</td>", f"<td>{_esc(row.get('fail_reason'))}</td>",
                 *[f"<td>{_esc(row[p])}</td>" for p in params],
                 f"<td class='n'>{_esc(row.get('objective'))}</td>",
                 f"<td class='{css}'>{result}</td>",
                 f"<td class='diag'><b>{html.escape(diagnosis.verdict)}</b><br>"
                 f"<span class='small'>{html.escape(diagnosis.text, quote=False)}</span></td>",
                 *[f"<td class='n'>{_esc(row.get(k))}</td>" for k, _ in metrics]]
        lines.append(f"<tr class='{'best' if number == best else ''}'>{''.join(cells)}</tr>")
    lines.append("</tbody></table></div><p class='small'>* baseline: vLLM's defaults (no tuned "
                 "flag passed); the best feasible trial is highlighted.</p>")
    return "\n".join(lines)


def _failures(trials: pd.DataFrame) -> str:
    failed = trials[trials["state"] != "COMPLETE"] if not trials.empty else trials
    if failed.empty:
        return "<p>No trial failed.</p>"
    parts = []
    for _, row in failed.iterrows():
        detail = "" if _missing(row.get("fail_detail")) else str(row["fail_detail"])
        tail = "" if _missing(row.get("log_tail")) else str(row["log_tail"])
        parts.append(
            f"<details class='failure' open><summary>trial {int(row['trial_number'])}: "
            f"<b class='fail'>{_esc(row.get('fail_reason'))}</b></summary>"
            f"<p>{html.escape(detail, quote=False) or '(no detail)'}</p>"
            + (f"<pre>{html.escape(tail, quote=False)}</pre>" if tail else "") + "</details>")
    return "\n".join(parts)


def _overview(trials: pd.DataFrame, spec: SweepSpec) -> str:
    states = trials["state"].value_counts().to_dict() if not trials.empty else {}
    done = _complete(trials)
    feasible = int((done["feasible"] == True).sum()) if not done.empty else 0  # noqa: E712
    versions = sorted({str(v) for v in trials.get("vllm_version", pd.Series(dtype=str)).dropna()})
    limits = ", ".join(limit_text(k, v) for k, v in spec.sla.items()) or "none"
    return (f"<p>Model <code>{html.escape(str(spec.model))}</code>, engine {spec.engine}, vLLM "
            f"{html.escape(', '.join(versions) or 'n/a')}. Objective: {spec.objective.direction} "
            f"<b>{spec.objective.metric}</b>; SLA: {html.escape(limits)}. Workload: "
            f"{spec.workload.dataset}, {spec.workload.num_prompts} prompts, input "
            f"{spec.workload.input_len} / output {spec.workload.output_len} tokens, max "
            f"concurrency {spec.workload.max_concurrency or 'unlimited'}.</p>"
            f"<p>Trials: {len(trials)}; complete {states.get('COMPLETE', 0)} ({feasible} "
            f"feasible); pruned {states.get('PRUNED', 0)}; failed or not launched "
            f"{len(trials) - states.get('COMPLETE', 0) - states.get('PRUNED', 0)}.</p>")


def render_report(trials: pd.DataFrame, spec: SweepSpec, importances: Mapping[str, float] | None,
                  out: Path) -> Path:
    """Write the sweep's report to `out` (one HTML file, no external reference); returns `out`."""
    params = [c for c in trials.columns if c.startswith("param_")]
    best_html, best_number = _best(trials, spec, params)
    title = f"vllm-sweep report: {spec.name}"
    body = [
        f"<h1>{html.escape(title)}</h1>", _overview(trials, spec),
        "<h2>Best feasible configuration</h2>", best_html,
        "<h2>Throughput vs latency</h2>",
        _pareto(trials, spec, params, "ttft"), _pareto(trials, spec, params, "tpot"),
        "<h2>Parameter importances</h2>", _importances(importances),
        "<h2>Effect of each parameter</h2>", _effects(trials, spec, params),
        "<h2>All trials</h2>", _table(trials, spec, params, best_number) if not trials.empty
        else "<p>No trials yet.</p>",
        "<h2>Output quality</h2>", quality_section(trials),
        "<h2>Failures</h2>", _failures(trials),
    ]
    page = (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
