"""results/queries: which rows come from a load stopped early, and which baseline a gain may be
computed against (COMPLETE, feasible, measured in full), table-tested on hand-built rows."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from framework.results.queries import baseline_for_gain
from framework.results.queries import best_trial
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


TPOT = "p99_tpot_ms 6.12 ms > 4.5 ms (+36%)"


@pytest.mark.parametrize(("change", "objective", "note"), [
    ({"trial_number": 0}, 100.0, None),
    ({"trial_number": 0, "feasible": False, "sla_violations": TPOT}, None,
     f"vLLM's defaults break your SLA ({TPOT})"),
    ({"trial_number": 0, "feasible": False, "sla_violations": TPOT, "stopped_early": STOPPED,
      "completed": 12, "failed": 0}, None,
     f"vLLM's defaults break your SLA ({TPOT}; load stopped early after 12 requests)"),
    ({"trial_number": 0, "state": "FAIL", "fail_reason": "startup_crash", "feasible": None,
      "objective": math.nan}, None,
     "the baseline trial 0 did not complete (FAIL(startup_crash))"),
    ({"trial_number": 0, "state": "PRUNED", "feasible": None, "objective": math.nan}, None,
     "the baseline trial 0 did not complete (PRUNED)"),
    ({"trial_number": 0, "objective": 0.0}, None,
     "the baseline trial 0 measured an objective of 0"),
    ({"trial_number": 0, "is_baseline": False}, None, "no baseline trial"),
])
def test_the_baseline_a_gain_is_computed_against(change, objective, note):
    rows = trials(change)
    assert baseline_for_gain(rows) == (objective, note)
    best = best_trial(rows, [], maximize=True)
    assert best.number == 1 and best.baseline_note == note
    assert (best.gain is None) is (objective is None)
    assert best.baseline_objective == objective


def test_a_feasible_baseline_cut_short_is_no_baseline():
    """Feasible yet stopped early can only be a capacity-mode row with capacity 0; its
    metrics cover part of a load."""
    rows = trials({"trial_number": 0, "stopped_early": STOPPED, "capacity_rps": 0.0})
    assert baseline_for_gain(rows) == (None, f"the baseline trial 0 was stopped early ({STOPPED})")


def test_a_confirmation_of_the_baseline_is_not_the_baseline():
    rows = pd.concat([trials(), pd.DataFrame([{
        "trial_number": 2, "is_baseline": True, "state": "COMPLETE", "feasible": False,
        "objective": 90.0, "sla_violations": TPOT, "confirmation_of": 0}])], ignore_index=True)
    assert baseline_for_gain(rows) == (100.0, None)


def test_cut_short_mask_marks_the_rows_stopped_early():
    rows = trials({"trial_number": 1, "stopped_early": STOPPED})
    assert cut_short_mask(rows).tolist() == [False, True]
    assert cut_short_mask(rows.drop(columns=["stopped_early"])).tolist() == [False, False]
    assert cut_short_mask(rows.iloc[0:0]).tolist() == []
