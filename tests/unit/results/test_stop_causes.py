"""How a load stopped early is worded, by cause (results.early.causes): a run whose SLA was
surely broken keeps its wording; an over-saturated run (its queue kept growing, which says
nothing of an SLA, and may be feasible with no SLA at all) says so instead, in every place
that names the stop: the result label (console and report tables), the live progress line,
the summary's stopped-early line, the report's table legend and its plots' note."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from rich.console import Console

from framework.results.console import Progress
from framework.results.console import print_summary
from framework.results.console import stopped_early_line
from framework.results.html_report import _table
from framework.results.queries import result_label
from framework.results.report_plots import stopped_early_note
from tests.unit.results.test_report_plots import SPEC

SLA_STOP = "p99_ttft_ms: at least 900 ms whatever the other 88 requests do (12 done)"
SATURATED = ("over-saturated: waiting requests +3.1/s (+-20%) over 5.0-10.2 s of the run, "
             "11 samples, 30 waiting at the end")


def row(number: int, stopped: str | None, feasible: bool = True,
        capacity: float | None = None) -> dict[str, object]:
    return {"trial_number": number, "state": "COMPLETE", "fail_reason": None, "feasible": feasible,
            "sla_violations": "" if feasible else "p99_ttft_ms 900 ms > 500 ms (+80%)",
            "stopped_early": stopped, "capacity_rps": capacity, "completed": 10, "failed": 2,
            "objective": 1.0, "is_baseline": False, "startup_s": 1.0, "p99_ttft_ms": 900.0,
            "p99_tpot_ms": 5.0, "param_max_num_seqs": 8}


@pytest.mark.parametrize("stopped, feasible, capacity, label", [
    (None, True, None, "feasible"),
    (SLA_STOP, False, None,
     "SLA violated: p99_ttft_ms 900 ms > 500 ms (+80%); stopped early after 12 requests"),
    (SATURATED, True, None,
     "feasible; stopped early after 12 requests (over-saturated: queue kept growing)"),
    (SATURATED, False, None, "SLA violated: p99_ttft_ms 900 ms > 500 ms (+80%); stopped early "
     "after 12 requests (over-saturated: queue kept growing)"),
    (f"{SLA_STOP}; {SATURATED}", False, 0.0, "SLA violated: p99_ttft_ms 900 ms > 500 ms (+80%); "
     "stopped early after 12 requests (SLA surely broken or over-saturated: queue kept growing)"),
    (SATURATED, True, 4.0, "feasible"),  # capacity held at a step that ran in full
])
def test_the_result_label_and_progress_line_name_the_cause(stopped, feasible, capacity, label):
    r = row(3, stopped, feasible, capacity)
    assert result_label(r) == label
    out = io.StringIO()
    Progress(Console(file=out, width=400), 5, "objective", True).trial_finished(
        r, "p99_ttft_ms", "p99_tpot_ms")
    early = label.split("; ", 1)[1] if "stopped early" in label else None
    assert (early in out.getvalue()) if early else "stopped early" not in out.getvalue()


@pytest.mark.parametrize("stops, line, note, legend", [
    ([SLA_STOP, SLA_STOP],
     "Stopped early (SLA surely broken): trials 1, 2; their metrics cover only the requests "
     "before the stop.", "trials 1 (after 12 requests), 2 (after 12 requests), stopped early "
     "once the SLA was surely broken;", "stopped early (SLA surely broken):"),
    ([SATURATED, None],
     "Stopped early (over-saturated: queue kept growing): trial 1; their metrics cover only the "
     "requests before the stop.", "trial 1 (after 12 requests), stopped early (over-saturated: "
     "queue kept growing);", "stopped early (over-saturated: queue kept growing):"),
    ([SLA_STOP, SATURATED],
     "Stopped early (SLA surely broken): trial 1; Stopped early (over-saturated: queue kept "
     "growing): trial 2; their metrics cover only the requests before the stop.",
     "stopped early (SLA surely broken or over-saturated: queue kept growing);",
     "stopped early (SLA surely broken or over-saturated: queue kept growing):"),
    ([None], None, "", "stopped early (SLA surely broken):"),  # the legend's default
])
def test_the_summary_line_note_and_legend_name_the_causes(stops, line, note, legend):
    trials = pd.DataFrame([row(n, s, s != SLA_STOP) for n, s in enumerate(stops, 1)])
    assert stopped_early_line(trials) == line
    assert note in stopped_early_note(trials) and (note or not stopped_early_note(trials))
    assert legend in _table(trials, SPEC, ["param_max_num_seqs"], None)


def test_an_over_saturated_run_without_an_sla_never_says_the_sla_broke():
    out = io.StringIO()
    print_summary(Console(file=out, width=400), pd.DataFrame([row(0, SATURATED)]),
                  ["max-num-seqs"], "objective", True, {})
    text = out.getvalue()
    assert "SLA: none" in text and "over-saturated: queue kept growing" in text
    assert "surely broken" not in text
