"""sweep/remeasure.remeasure_load: what a launched trial's load keeps of the sweep's early stop
and precision rule, by what the trial re-measures (hand-built spec, plan and proposals)."""

from __future__ import annotations

import pandas as pd
import pytest

from framework.config.specs import SweepSpec
from framework.load.workload import RequestSpec
from framework.search.tuner import Proposal
from framework.sweep.remeasure import remeasure_load
from framework.trial.measure import LoadPlan

GUARD = {"p99_tpot_ms": 11.0}


def _spec(precision: float | None) -> SweepSpec:
    return SweepSpec.model_validate({
        "name": "x", "model": "m", "search_space": "s.yaml", "sla": GUARD,
        "search": {"precision": precision, "precision_max_runs": 3}})


def _load() -> LoadPlan:
    reqs = [RequestSpec(prompt="x", prompt_len=1, output_len=4)] * 4
    return LoadPlan(model="m", warmup=(), measured=reqs, arrivals=None, max_concurrency=4,
                    ignore_eos=True, request_timeout_s=60, percentiles=(99,), goodput_slo_ms={},
                    startup_timeout_s=60, sla_guard=GUARD)


@pytest.mark.parametrize(("is_baseline", "confirm_of", "guarded"), [
    (False, None, True),   # a search trial stops as soon as its SLA surely breaks
    (True, None, True),    # the baseline too: that it breaks the SLA is all the verdict needs
    (True, 0, True),       # and so do its re-measurements
    (False, 3, False),     # a confirmation runs in full: the verdict takes the mean of servers
])
def test_only_confirmations_of_tuned_configurations_run_unguarded(is_baseline, confirm_of,
                                                                  guarded):
    p = Proposal(number=9, params={}, is_baseline=is_baseline, trial=None,  # type: ignore[arg-type]
                 confirm_of=confirm_of)
    load = remeasure_load(_spec(None), _load(), p, 1, pd.DataFrame())
    assert (load.sla_guard == GUARD) is guarded
    assert load.precision is None


def test_the_precision_rule_is_set_with_search_precision():
    p = Proposal(number=1, params={}, is_baseline=False, trial=None)  # type: ignore[arg-type]
    load = remeasure_load(_spec(0.05), _load(), p, 2, pd.DataFrame())
    assert load.precision is not None
    assert (load.precision.target, load.precision.max_runs, load.precision.devices) == (0.05, 3, 2)


@pytest.mark.parametrize(("baseline", "repeats", "runs"), [
    (True, 0, 0), (True, 1, 0),   # the one re-measurement runs among the confirmations
    (True, 2, 1), (True, 4, 3), (False, 3, 0)])
def test_interleaved_runs(baseline, repeats, runs):
    from framework.config.search_spec import SearchSpec

    assert SearchSpec(baseline=baseline, baseline_repeats=repeats).interleaved_runs == runs
