"""results/queries: which rows come from a load stopped early, and which row is the best single
measurement (COMPLETE, feasible, measured in full), table-tested on hand-built rows."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from framework.results.queries import best_row
from framework.results.queries import cut_short
from framework.results.queries import cut_short_mask

STOPPED = "p99_ttft_ms: at least 612 ms whatever the other 188 requests do (12 done)"


@pytest.mark.parametrize(("row", "expected"), [
    ({"stopped_early": None}, False),
    ({"stopped_early": math.nan}, False),  # pandas' null in a str column
    ({"stopped_early": ""}, False),
    ({}, False),  # rows of an older schema
    ({"stopped_early": STOPPED}, True),
    ({"stopped_early": STOPPED, "capacity_rps": math.nan}, True),
    # capacity mode: the metrics are those of a step that held the SLA, which ran in full
    ({"stopped_early": STOPPED, "capacity_rps": 6.5}, False),
    # capacity 0: no step held; the metrics are the lowest rate's, which may have stopped
    ({"stopped_early": STOPPED, "capacity_rps": 0.0}, True),
])
def test_cut_short(row, expected):
    assert cut_short(row) is expected


def trials(*rows: dict) -> pd.DataFrame:
    """Trial rows: a feasible baseline (trial 0, objective 100) and a better trial (1, 150),
    each changed by `rows` (dicts keyed by trial number 0 or 1)."""
    base = [
        {"trial_number": 0, "is_baseline": True, "state": "COMPLETE", "feasible": True,
         "objective": 100.0, "sla_violations": "", "stopped_early": None, "completed": 200,
         "failed": 0, "fail_reason": None, "serve_command": "vllm serve m",
         "confirmation_of": None},
        {"trial_number": 1, "is_baseline": False, "state": "COMPLETE", "feasible": True,
         "objective": 150.0, "sla_violations": "", "stopped_early": None, "completed": 200,
         "failed": 0, "fail_reason": None, "serve_command": "vllm serve m --max-num-seqs 8",
         "confirmation_of": None},
    ]
    for change in rows:
        base[change["trial_number"]].update(change)
    return pd.DataFrame(base)


@pytest.mark.parametrize(("change", "maximize", "expected"), [
    ({"trial_number": 0}, True, 1),
    ({"trial_number": 0}, False, 0),
    # a stopped-early row never counts: its value covers part of a load
    ({"trial_number": 1, "stopped_early": STOPPED, "completed": 12}, True, 0),
    ({"trial_number": 1, "feasible": False}, True, 0),
    ({"trial_number": 1, "state": "FAIL", "objective": math.nan}, True, 0),
])
def test_best_row_is_the_best_feasible_measurement_in_full(change, maximize, expected):
    assert int(best_row(trials(change), maximize)["trial_number"]) == expected


def test_best_row_none_without_a_feasible_measurement():
    rows = trials({"trial_number": 0, "feasible": False}, {"trial_number": 1, "feasible": False})
    assert best_row(rows, True) is None
    assert best_row(rows.iloc[0:0], True) is None


def test_cut_short_mask_marks_the_rows_stopped_early():
    rows = trials({"trial_number": 1, "stopped_early": STOPPED})
    assert cut_short_mask(rows).tolist() == [False, True]
    assert cut_short_mask(rows.drop(columns=["stopped_early"])).tolist() == [False, False]
    assert cut_short_mask(rows.iloc[0:0]).tolist() == []
