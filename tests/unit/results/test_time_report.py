"""results.time_report: where a sweep's time went, from trial rows built by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from framework.results.time_report import GATE
from framework.results.time_report import IDLE
from framework.results.time_report import LOAD
from framework.results.time_report import REST
from framework.results.time_report import UNSPLIT
from framework.results.time_report import WARMUP
from framework.results.time_report import busy_s
from framework.results.time_report import html_section
from framework.results.time_report import text_table
from framework.results.time_report import time_report

T0 = pd.Timestamp("2026-11-26 10:00:00", tz="UTC")
NAN = math.nan


def trials(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    frame["started_at"] = [T0 + pd.Timedelta(seconds=r["at"]) for r in rows]
    return frame.drop(columns="at")


def row(at: float, trial_s: float, startup_s: float | None, phases: list[float | None],
        warmup_s: float = 0.0, bench_s: float = 0.0, gate_wait_s: float = 0.0) -> dict:
    names = ["startup_placement_s", "startup_imports_s", "startup_weights_s",
             "startup_profile_kv_s", "startup_compile_s", "startup_api_s"]
    return {"at": at, "trial_s": trial_s, "startup_s": startup_s, "warmup_s": warmup_s,
            "bench_s": bench_s, "gate_wait_s": gate_wait_s,
            **{n: NAN if v is None else v for n, v in zip(names, phases)}}


@pytest.mark.parametrize("starts, ends, expected", [
    ([0, 10], [5, 20], 15),          # apart: 5 + 10
    ([0, 3], [5, 20], 20),           # overlapping: [0, 20]
    ([0, 2, 30], [10, 4, 31], 11),   # one inside another, then apart: 10 + 1
    ([], [], 0),
])
def test_busy_time_is_the_union_of_the_intervals(starts, ends, expected):
    assert busy_s(starts, ends) == expected


def test_every_second_is_counted_once_in_a_sequential_sweep():
    # trial 0 at 0 s for 60 s: start-up 40 = 1 + 30 + 2 + 5 + 0 + 2, warm-up 3, load 15,
    #   rest 60 - 40 - 3 - 15 = 2
    # trial 1 at 62 s for 20 s on the reused server: start-up 0.5 (not split), load 15,
    #   rest 20 - 0.5 - 0 - 15 = 4.5
    # wall 82 s, nothing running 62 - 60 = 2 s; efficiency (15 + 15) / 82
    report = time_report(trials([
        row(0, 60, 40, [1, 30, 2, 5, 0, 2], warmup_s=3, bench_s=15),
        row(62, 20, 0.5, [None] * 6, bench_s=15),
    ]))
    lines = dict(report.lines)
    assert report.wall_s == pytest.approx(82)
    assert lines["start-up: process start and imports"] == 30
    assert lines[UNSPLIT] == pytest.approx(0.5)
    assert (lines[WARMUP], lines[LOAD], lines[GATE]) == (3, 30, 0)
    assert lines[REST] == pytest.approx(6.5)
    assert lines[IDLE] == pytest.approx(2)
    assert sum(lines.values()) == pytest.approx(report.wall_s)  # sequential: all accounted
    assert report.efficiency == pytest.approx(30 / 82)


def test_side_by_side_trials_sum_past_the_wall_and_gate_waits_count_apart():
    # start-ahead: trial 1 starts at 10 s while trial 0 (0-50 s) runs; it waits 20 s at the
    # gate once ready (in trial_s, not in startup_s): 10 + 40 = 50 start-up + gate 20 + load
    # 5 = 75 = trial_s; wall 85 s, never idle; efficiency (10 + 5) / 85
    report = time_report(trials([
        row(0, 50, 38, [0, 30, 1, 5, 0, 2], bench_s=10, gate_wait_s=0),
        row(10, 75, 50, [0, 40, 1, 5, 0, 4], bench_s=5, gate_wait_s=20),
    ]))
    lines = dict(report.lines)
    assert report.wall_s == pytest.approx(85) and lines[IDLE] == 0
    assert lines[GATE] == 20 and lines[REST] == pytest.approx(2)  # trial 0: 50 - 38 - 10
    assert report.efficiency == pytest.approx(15 / 85)
    table = text_table(report)
    assert "| measured load | 15.0 | 17.6 |" in table and "Efficiency" in table


def test_rows_without_a_run_give_no_report_and_the_section_says_so():
    assert time_report(pd.DataFrame()) is None
    assert time_report(pd.DataFrame({"trial_number": [0], "state": ["FAIL"]})) is None
    never = trials([row(0, 0, None, [None] * 6)])
    assert time_report(never) is None
    assert "No trial ran" in html_section(never)


def test_the_section_escapes_nothing_it_should_not_and_names_the_efficiency():
    page = html_section(trials([row(0, 60, 40, [1, 30, 2, 5, 0, 2], warmup_s=3, bench_s=15)]))
    assert "id='efficiency'" in page and "25.0% of the wall time" in page  # 15 / 60
    assert "start-up: weight loading" in page and "id='time-report'" in page
