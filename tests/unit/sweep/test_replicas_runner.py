"""The replicas shape through the real runner, without Ray: a `replicas: {kind: shape}`
parameter makes a trial N FakeEngine servers behind the router (framework/engine/router.py,
a real process), measured as one deployment (test_runner_contract's launcher and sweep)."""

from __future__ import annotations

import pandas as pd
import pytest

from framework.trial.replicas import replica_log
from tests.unit.sweep.test_runner_contract import FakeLauncher
from tests.unit.sweep.test_runner_contract import _run
from tests.unit.sweep.test_runner_contract import _sweep
from tests.unit.sweep.test_runner_contract import _told_once_with_rows


@pytest.mark.timeout(180)
def test_two_replicas_are_one_trial_measured_through_the_router(tmp_path):
    """Guards the replicas seam: each of a 2-replica trial's servers serves half of its
    requests (round robin; every request row names its server), both servers and the router
    end with the trial, the devices and the shape count both servers, and the one-server
    trial is unchanged (no replica, TP1xPP1)."""
    space = {"replicas": {"type": "categorical", "choices": [1, 2], "kind": "shape",
                          "default": 1}}
    launcher = FakeLauncher(gpus=2)
    runner, counted, out = _run(_sweep(tmp_path, "replicas", space, False, 2), launcher, 2)
    trials = _told_once_with_rows(runner, counted, 2).set_index("trial_number")
    assert list(trials["state"]) == ["COMPLETE", "COMPLETE"], out

    by_replicas = {int(n): number for number, n in trials["param_replicas"].items()}
    one, two = by_replicas[1], by_replicas[2]
    assert trials.loc[one, "shape"] == "TP1xPP1"
    assert trials.loc[two, "shape"] == "2xTP1xPP1"
    # the router relabels each server's engine ("0" -> "0.0", "1.0"): both served
    assert trials.loc[two, "engines_served"] == 2 and trials.loc[one, "engines_served"] == 1

    mine = pd.read_parquet(runner.store.requests_path(two))
    counts = mine["replica"].value_counts().to_dict()
    assert counts == {0: 4, 1: 4}, counts  # 8 measured requests, alternated
    assert pd.read_parquet(runner.store.requests_path(one))["replica"].isna().all()

    # three servers in all, each stopped exactly once; at most both devices held at once
    assert len(launcher.servers) == 3
    assert [s.stops for s in launcher.servers] == [1, 1, 1]
    assert launcher.most_held == 2
    # replica 1 logged beside the trial's log; the router's log says it was ready
    log = runner.store.log_path(two)
    assert replica_log(log, 1).is_file() and replica_log(log, 1) != log
    assert "router ready" in log.with_name(log.stem + ".router.log").read_text()
