"""What the report's plots and table show, by rule (framework/results/report_plots.py,
html_report.py), on hand-built rows of six trials whose roles are known:

0 baseline, feasible        1 feasible, on the front       2 feasible, dominated by 1
3 SLA violated, fastest     4 stopped early (12 of 200 requests, throughput of a short load)
5 FAIL
"""

from __future__ import annotations

import html
import math
import re

import pandas as pd
import pytest

from framework.config.search_space import SearchSpace
from framework.config.specs import SweepSpec
from framework.results.html_report import render_report
from framework.results.report_plots import BASELINE_NAME
from framework.results.report_plots import effects_figure
from framework.results.report_plots import pareto_figure

SLA = {"p99_ttft_ms": 500.0, "p99_tpot_ms": 10.0}
EARLY = "p99_ttft_ms: at least 900 ms whatever the other 188 requests do (12 done)"
BROKEN = "p99_ttft_ms 612 ms > 500 ms (+22%)"


def rows() -> pd.DataFrame:
    cases = [  # number, state, feasible, objective, p99 ttft, max-num-seqs, stopped, violations
        (0, "COMPLETE", True, 100.0, 200.0, 128, None, ""),
        (1, "COMPLETE", True, 150.0, 150.0, 16, None, ""),
        (2, "COMPLETE", True, 120.0, 300.0, 32, None, ""),
        (3, "COMPLETE", False, 400.0, 612.0, 64, None, BROKEN),
        (4, "COMPLETE", False, 999.0, 900.0, 2, EARLY, "p99_ttft_ms 900 ms > 500 ms (+80%)"),
        (5, "FAIL", None, math.nan, math.nan, 8, None, None),
    ]
    return pd.DataFrame([{
        "trial_number": n, "state": state, "feasible": feasible, "is_baseline": n == 0,
        "objective": objective, "output_throughput": objective, "p99_ttft_ms": ttft,
        "p99_tpot_ms": 8.0 if state == "COMPLETE" else math.nan,
        "kv_cache_usage_max": 0.25 if state == "COMPLETE" else math.nan,
        "param_max_num_seqs": seqs, "param_enable_prefix_caching": True,
        "stopped_early": stopped, "sla_violations": violations,
        "completed": (12 if stopped else 200) if state == "COMPLETE" else math.nan,
        "failed": 0 if state == "COMPLETE" else math.nan,
        "fail_reason": "startup_crash" if state == "FAIL" else None,
        "fail_detail": None, "log_tail": None, "vllm_version": "0.32",
        "serve_command": f"vllm serve m --max-num-seqs {seqs}",
    } for n, state, feasible, objective, ttft, seqs, stopped, violations in cases])


SPEC = SweepSpec.model_validate({"name": "x", "model": "m", "search_space": "s.yaml", "sla": SLA})
SPACE = SearchSpace.model_validate({"parameters": {
    "max-num-seqs": {"type": "int", "low": 2, "high": 128, "log": True, "default": 128},
    "enable-prefix-caching": {"type": "bool", "default": True}}})
PARAMS = ["param_max_num_seqs", "param_enable_prefix_caching"]


def traces(fig) -> dict[str, list]:
    """Trace name -> the trial numbers it draws (read back from its hover texts / points)."""
    out: dict[str, list] = {}
    for trace in fig.data:
        out.setdefault(trace.name, []).extend(zip(trace.x, trace.y))
    return out


def test_pareto_plot_leaves_out_a_load_stopped_early_and_joins_only_feasible_points():
    fig = pareto_figure(rows(), SPEC, PARAMS, "ttft")
    drawn = traces(fig)
    # (ttft, throughput) of each trial
    assert sorted(drawn["feasible"]) == [(150.0, 150.0), (200.0, 100.0), (300.0, 120.0)]
    assert drawn["SLA violated"] == [(612.0, 400.0)]  # 4 (999 tok/s from 12 requests) is not
    # the front: 1 dominates 0 and 2; 3 would dominate every feasible point but broke the SLA
    assert drawn["Pareto front (feasible)"] == [(150.0, 150.0)]
    assert drawn[BASELINE_NAME] == [(200.0, 100.0)]
    assert fig.layout.xaxis.title.text == "p99_ttft_ms"
    assert fig.layout.yaxis.title.text == "output_throughput (tok/s)"
    assert any("500 ms" in (a.text or "") for a in fig.layout.annotations)  # the SLA's limit
    for trace in fig.data[:2]:  # a point's hover names its values' units
        assert "p99_ttft_ms %{x:.4g} ms" in trace.hovertemplate
        assert "output_throughput %{y:,.4g} tok/s" in trace.hovertemplate


def test_pareto_without_a_feasible_point_draws_no_front():
    infeasible = rows().assign(feasible=False)
    names = [t.name for t in pareto_figure(infeasible, SPEC, PARAMS, "ttft").data]
    assert "Pareto front (feasible)" not in names and "SLA violated" in names
    only_early = rows()[rows()["trial_number"] == 4]
    assert pareto_figure(only_early, SPEC, PARAMS, "ttft") is None


def test_effects_put_a_log_parameter_on_a_log_axis_and_mark_the_baseline():
    fig = effects_figure(rows(), SPEC, PARAMS, {"param_max_num_seqs"})
    assert fig.layout.xaxis.type == "log"  # max-num-seqs: log: true
    assert fig.layout.xaxis2.type == "category"  # a bool
    assert fig.layout.yaxis.title.text == "output_throughput (tok/s)"
    assert "output_throughput %{y:,.4g} tok/s" in fig.data[0].hovertemplate
    first = [t for t in fig.data if t.xaxis == "x"]
    assert sorted(x for t in first if t.name != BASELINE_NAME for x in t.x) == [16, 32, 64, 128]
    assert [list(t.x) for t in first if t.name == BASELINE_NAME] == [[128]]
    linear = effects_figure(rows(), SPEC, PARAMS, set())
    assert linear.layout.xaxis.type != "log"


def test_the_report_marks_units_stopped_early_and_violations(tmp_path):
    out = render_report(rows(), SPEC, {"max-num-seqs": 1.0}, tmp_path / "r.html", space=SPACE)
    text = out.read_text(encoding="utf-8")
    body = text[text.index("<body>"):]
    table = body[body.index("<table id='trials'>"):body.index("</table>",
                                                              body.index("<table id='trials'>"))]
    headers = re.findall(r"<th>([^<]*)</th>", table)
    assert "output_throughput (tok/s)" in headers and "P99 TTFT (ms)" in headers
    row4 = re.search(r"<tr class='early'><td>4</td>.*?</tr>", table).group(0)
    assert "stopped early after 12 requests" in row4
    row3 = re.search(r"<tr class=''><td>3</td>.*?</tr>", table).group(0)
    assert html.escape(f"SLA violated: {BROKEN}", quote=False) in row3
    assert "Left out of the plots and the importances: trial 4 (after 12 requests)" in body
    assert html.escape("p99_ttft_ms <= 500 ms, p99_tpot_ms <= 10 ms", quote=False) in body
    # one server per configuration: the noise is unknown, so no winner and the defaults ship
    assert "Not distinguishable from vLLM" in body and "150 tok/s" in body
    assert "Keep vLLM" in body and "Winner:" not in body
    assert "1 stopped early" in body  # the overview's count


@pytest.mark.parametrize(("change", "note"), [
    ({"feasible": False, "sla_violations": BROKEN},
     html.escape(f"vLLM's defaults break your SLA: {BROKEN} (one server)", quote=False)),
    ({"state": "FAIL", "fail_reason": "startup_crash"},
     "no measured vLLM-default baseline to compare with"),
])
def test_the_report_computes_no_gain_against_a_baseline_that_broke_or_failed(tmp_path, change,
                                                                            note):
    trials = rows()
    for key, value in change.items():
        trials.loc[trials["trial_number"] == 0, key] = value
    text = render_report(trials, SPEC, None, tmp_path / "r.html").read_text(encoding="utf-8")
    assert note in text and "95% interval +" not in text
