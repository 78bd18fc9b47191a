"""One self-contained HTML report of a sweep: plotly.js is inlined once in the page head, so the
file opens with no network access.

Sections, from the trial rows alone (plus the sweep spec, its search space and optional
parameter importances): first the Decision (results.decision_report: what to deploy, its gain,
the fleet and its cost, the export commands); the best feasible configuration with its `vllm
serve` command and gain over the baseline (or why there is none); the plots of framework.results.report_plots
(throughput vs the SLA's TTFT and TPOT keys, importances, the objective against each
parameter), which leave out trials whose load stopped early and say so; the table of all
trials with units in its headers, what each violating trial broke and by how much, the
stopped-early marking and a per-trial diagnosis (framework.results.diagnosis), in a box that
scrolls both ways (its header row stays in view), so the page never runs wider than the
window; the failures with their log tails; where the sweep's time went
(framework.results.time_report). Every section degrades to a sentence when there is
nothing to plot. Every string taken from the rows (fail reasons and details, log tails,
parameter values, versions) is HTML-escaped, also in plot labels.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from plotly.offline import get_plotlyjs

from framework.base.vocabulary import label
from framework.base.vocabulary import limits_text
from framework.config.search_space import SearchSpace
from framework.config.specs import SweepSpec
from framework.config.specs import WorkloadSpec
from framework.results.decision_report import decision_section
from framework.results.diagnosis import diagnose
from framework.results.early import causes_text
from framework.results.early import cut_short
from framework.results.prediction_report import prediction_section
from framework.results.quality_report import quality_section
from framework.results.queries import cut_short_mask
from framework.results.queries import result_label
from framework.results.queries import state_label
from framework.results.report_plots import effects_plot
from framework.results.report_plots import esc
from framework.results.report_plots import flag_name
from framework.results.report_plots import importances_plot
from framework.results.report_plots import load_curve_plot
from framework.results.report_plots import missing
from framework.results.report_plots import pareto_plot
from framework.results.report_plots import stopped_early_note
from framework.results.report_plots import varying_load
from framework.results.rows import param_column
from framework.results.time_report import html_section as time_section
from framework.results.verdict import decide

_STATS = (("mean", "Mean"), ("median", "Median"), ("p99", "P99"))
_LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:1.6em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:4px}
pre{background:#f5f5f5;padding:10px;white-space:pre-wrap;word-break:break-all;font-size:.85em}
table{border-collapse:collapse;font-size:.82em}th,td{border:1px solid #ddd;padding:3px 6px}
th{background:#f0f0f0;position:sticky;top:0;z-index:1}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.wide{overflow:auto;max-width:100%;max-height:80vh;border:1px solid #ddd}
.small{color:#555;font-size:.9em}.ok{color:#1a7f1a}.bad{color:#b35c00}
.fail{color:#c0392b}tr.best{background:#eaf7ea}tr.early td{color:#777;font-style:italic}
.plot{max-width:1100px}td.diag{min-width:260px;max-width:420px}
td.result{min-width:180px;max-width:320px}
"""


def _complete(trials: pd.DataFrame) -> pd.DataFrame:
    return trials[trials["state"] == "COMPLETE"] if not trials.empty else trials


def _best(trials: pd.DataFrame, spec: SweepSpec, params: Sequence[str]) -> tuple[str, int | None]:
    """The verdict (results.verdict) and, when there is one to ship, the configuration and its
    command: the winner, or vLLM's defaults when nothing beat them beyond the noise."""
    maximize = spec.objective.direction == "maximize"
    limits = limits_text(spec.sla)
    done = _complete(trials)
    if done.empty:
        return (f"<p class='fail'>No trial completed ({len(trials)} failed): there is no "
                "configuration to recommend.</p>", None)
    verdict = decide(trials, spec.objective.metric, maximize, spec.sla)
    css = "ok" if verdict.number is not None else "bad"
    text = "".join(f"<p class='{css}' id='verdict'>{html.escape(line, quote=False)}</p>"
                   for line in verdict.lines)
    text += f"<p>SLA: {html.escape(limits)}.</p>"
    if verdict.ship is None:
        return text, None
    row = trials[trials["trial_number"] == verdict.ship].iloc[0]
    what = "Winner" if verdict.number is not None else "Keep vLLM's defaults"
    cells = "".join(f"<tr><th>{html.escape(flag_name(p))}</th><td>{esc(row[p])}</td></tr>"
                    for p in params)
    command = html.escape(str(row["serve_command"]), quote=False)
    return (f"{text}<p><b>{what}: trial {verdict.ship}</b></p><table>{cells}</table>"
            f"<p>Command:</p><pre id='serve-command'>{command}</pre>", verdict.ship)


def _result(row: Mapping[str, object]) -> tuple[str, str]:
    """The result label (queries.result_label: the state, the limits broken and by how much,
    stopped early), escaped, and its CSS class."""
    state = state_label(row)
    css = "ok" if state == "feasible" else "bad" if state == "SLA violated" else "fail"
    return html.escape(result_label(row), quote=False), css


def _metric_columns(trials: pd.DataFrame) -> list[tuple[str, str]]:
    """(column, header with unit) of the request metrics the table shows."""
    metrics: list[tuple[str, str]] = []
    for key, name in _LATENCIES:
        metrics += [(f"{stat}_{key}_ms", f"{stat_name} {name} (ms)") for stat, stat_name in _STATS
                    if f"{stat}_{key}_ms" in trials.columns]
    return metrics + [(k, f"{k} ({unit})") for k, unit in (("request_throughput", "req/s"),
                                                           ("output_throughput", "tok/s"))
                      if k in trials.columns]


def _shape_columns(trials: pd.DataFrame) -> list[tuple[str, str]]:
    """The deployment shape and how many engines served, shown where the sweep's trials differ
    in shape (issue #36); a one-shape sweep's table is as before."""
    if "shape" not in trials.columns or trials["shape"].dropna().nunique() < 2:
        return []
    return [(k, name) for k, name in (("shape", "shape"), ("engines_served", "engines served"))
            if k in trials.columns]


def _table(trials: pd.DataFrame, spec: SweepSpec, params: Sequence[str], best: int | None) -> str:
    """Every trial, one row each, in a box that scrolls both ways (class `wide`)."""
    metrics = _metric_columns(trials)
    shape = _shape_columns(trials)
    head = ["#", *[name for _, name in shape], *[flag_name(p) for p in params],
            label(spec.objective.metric), "result", "diagnosis", *[name for _, name in metrics]]
    lines = ["<div class='wide' id='trials-box'><table id='trials'><thead><tr>"
             + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for _, series in trials.iterrows():
        row = series.to_dict()
        number = int(row["trial_number"])
        result, css = _result(row)
        diagnosis = diagnose(row, spec.sla)
        cells = [f"<td>{number}{'*' if row.get('is_baseline') == True else ''}</td>",  # noqa: E712
                 *[f"<td>{esc(row.get(k))}</td>" for k, _ in shape],
                 *[f"<td>{esc(row[p])}</td>" for p in params],
                 f"<td class='n'>{esc(row.get('objective'))}</td>",
                 f"<td class='result {css}'>{result}</td>",
                 f"<td class='diag'><b>{html.escape(diagnosis.verdict)}</b><br>"
                 f"<span class='small'>{html.escape(diagnosis.text, quote=False)}</span></td>",
                 *[f"<td class='n'>{esc(row.get(k))}</td>" for k, _ in metrics]]
        css_row = "best" if number == best else "early" if cut_short(row) else ""
        lines.append(f"<tr class='{css_row}'>{''.join(cells)}</tr>")
    why = causes_text([r.to_dict() for _, r in trials[cut_short_mask(trials)].iterrows()]
                      if not trials.empty else [])
    lines.append("</tbody></table></div><p class='small'>* baseline: vLLM's defaults (no tuned "
                 "flag passed); the best feasible trial is highlighted; rows in grey italics "
                 f"stopped early ({html.escape(why)}): their numbers cover only the requests "
                 "before the stop.</p>")
    return "\n".join(lines)


def _failures(trials: pd.DataFrame) -> str:
    failed = trials[trials["state"] != "COMPLETE"] if not trials.empty else trials
    if failed.empty:
        return "<p>No trial failed.</p>"
    parts = []
    for _, row in failed.iterrows():
        detail = "" if missing(row.get("fail_detail")) else str(row["fail_detail"])
        tail = "" if missing(row.get("log_tail")) else str(row["log_tail"])
        parts.append(
            f"<details class='failure' open><summary>trial {int(row['trial_number'])}: "
            f"<b class='fail'>{esc(row.get('fail_reason'))}</b></summary>"
            f"<p>{html.escape(detail, quote=False) or '(no detail)'}</p>"
            + (f"<pre>{html.escape(tail, quote=False)}</pre>" if tail else "") + "</details>")
    return "\n".join(parts)


def _workload_text(w: WorkloadSpec) -> str:
    """`random, 200 prompts, input 128 / output 64 tokens, max concurrency 32`; a mix names
    its classes with their shares and lengths instead of the dataset."""
    if w.mix:
        total = sum(c.weight for c in w.mix)
        sent = ", ".join(f"{c.name} {c.weight / total:.0%} ({v.dataset} {v.input_len} / "
                         f"{v.output_len})" for c in w.mix for v in [w.for_class(c.name)])
        what = f"mix of {sent}, {w.num_prompts} prompts"
    elif w.dataset == "timed_trace":
        what = f"timed_trace, {w.num_prompts} rows of {w.dataset_path} at {w.speed_up:g}x"
    else:
        what = (f"{w.dataset}, {w.num_prompts} prompts, input {w.input_len} / output "
                f"{w.output_len} tokens")
    rate = "" if w.request_rate == float("inf") else f", {w.request_rate:g} req/s"
    return f"{what}{rate}, max concurrency {w.max_concurrency or 'unlimited'}"


def _overview(trials: pd.DataFrame, spec: SweepSpec) -> str:
    states = trials["state"].value_counts().to_dict() if not trials.empty else {}
    done = _complete(trials)
    feasible = int((done["feasible"] == True).sum()) if not done.empty else 0  # noqa: E712
    early = int(cut_short_mask(done).sum()) if not done.empty else 0
    versions = sorted({str(v) for v in trials.get("vllm_version", pd.Series(dtype=str)).dropna()})
    if spec.workloads:
        load = (f"Workloads (objective: their {spec.objective.aggregate}): "
                + "; ".join(f"{w.name}: {_workload_text(w)}" for w in spec.workloads))
    else:
        load = f"Workload: {_workload_text(spec.workload)}"
    return (f"<p>Model <code>{html.escape(str(spec.model))}</code>, engine {spec.engine}, vLLM "
            f"{html.escape(', '.join(versions) or 'n/a')}. Objective: {spec.objective.direction} "
            f"<b>{html.escape(label(spec.objective.metric))}</b>; SLA: "
            f"{html.escape(limits_text(spec.sla))}. {html.escape(load)}.</p>"
            f"<p>Trials: {len(trials)}; complete {states.get('COMPLETE', 0)} ({feasible} "
            f"feasible" + (f", {early} stopped early" if early else "") + "); pruned "
            f"{states.get('PRUNED', 0)}; failed or not launched "
            f"{len(trials) - states.get('COMPLETE', 0) - states.get('PRUNED', 0)}.</p>")


def render_report(trials: pd.DataFrame, spec: SweepSpec, importances: Mapping[str, float] | None,
                  out: Path, space: SearchSpace | None = None, sweep_file: str = "SWEEP.yaml",
                  workloads: pd.DataFrame | None = None) -> Path:
    """Write the sweep's report to `out` (one HTML file, no external reference); returns `out`.
    `importances` should leave out the trials stopped early (the page says they are left
    out); `space`: the sweep's search space, whose `log: true` parameters get log axes;
    `sweep_file`: the sweep's path, in the Decision section's export commands; `workloads`:
    the workloads table, whose load curve (sweep.load_curve) gets its own section."""
    params = [c for c in trials.columns if c.startswith("param_")]
    log_params = {param_column(name) for name, p in (space.parameters.items() if space else ())
                  if getattr(p, "log", False)}
    best_html, best_number = _best(trials, spec, params)
    title = f"vllm-sweep report: {spec.name}"
    body = [
        f"<h1>{html.escape(title)}</h1>", decision_section(trials, spec, sweep_file),
        _overview(trials, spec),
        "<h2>Best feasible configuration</h2>", best_html,
        "<h2>Throughput vs latency</h2>",
        pareto_plot(trials, spec, params, "ttft"), pareto_plot(trials, spec, params, "tpot"),
        stopped_early_note(trials),
        *(("<h2>Latency against load</h2>",
            load_curve_plot(workloads, trials, spec, params))
          if workloads is not None and varying_load(workloads) else ()),
        "<h2>Parameter importances</h2>", importances_plot(importances),
        "<h2>Effect of each parameter</h2>", effects_plot(trials, spec, params, log_params),
        "<h2>All trials</h2>", _table(trials, spec, params, best_number) if not trials.empty
        else "<p>No trials yet.</p>",
        "<h2>Output quality</h2>", quality_section(trials),
        "<h2>Predicted vs measured</h2>", prediction_section(trials, spec.objective.metric),
        "<h2>Failures</h2>", _failures(trials),
        "<h2>Where the time went</h2>", time_section(trials),
    ]
    page = (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
