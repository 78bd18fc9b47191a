"""sweeps/capacity_target.yaml end to end on real vLLM CPU servers (2 trials, capacity mode,
`target:` and `pricing:`): the run exits 0, prints the fleet answer, and the printed answer and
every trial row's fleet columns equal fleet_for() recomputed from the row's capacity_rps."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from framework.fleet.sizing import fleet_for
from tests.helpers import ROOT
from tests.helpers import cli_env
from tests.helpers import new_marker
from tests.helpers import read_trials
from tests.helpers import run_cli
from tests.helpers import wait_no_marked_processes

pytestmark = pytest.mark.server

FLEET_LINE = re.compile(r"Fleet for 1000 req/s \(\+20% headroom\): (\d+) replicas? x 1 CPU worker "
                        r"= (\d+) CPU workers? at ([\d.]+) req/s each \(trial (\d+)[^;]*; "
                        r"([\d.]+) USD/h")


@pytest.mark.timeout(900)
def test_capacity_target_example_prints_the_fleet_of_its_rows(tiny_model, short_tmp):
    spec = yaml.safe_load((ROOT / "sweeps" / "capacity_target.yaml").read_text())
    spec.update(model=str(tiny_model), results_dir=str(short_tmp / "results"),
                search_space=str(ROOT / spec["search_space"]))
    sweep = short_tmp / "capacity_target.yaml"
    sweep.write_text(yaml.safe_dump(spec))
    marker = new_marker()
    res = run_cli(["run", str(sweep), "--summary-json", str(short_tmp / "s.json")], short_tmp,
                  cli_env(marker, short_tmp), timeout_s=840)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert wait_no_marked_processes(marker) == []

    trials = read_trials(short_tmp / "results", "capacity_target")
    assert list(trials["state"]) == ["COMPLETE", "COMPLETE"], trials[["fail_reason", "fail_detail"]]
    for _, row in trials.iterrows():
        fleet = fleet_for(1000, row["capacity_rps"], headroom=0.2, price_per_replica_hour=0.10)
        assert row["capacity_rps"] > 0, row["sla_violations"]
        assert (row["replicas_for_target"], row["gpus_for_target"]) == (fleet.replicas, fleet.gpus)
        assert row["cost_per_hour_for_target"] == pytest.approx(fleet.cost_per_hour)
        assert row["objective"] == fleet.gpus
        assert row["cost_per_mtok_output"] == pytest.approx(
            0.10 / (row["output_throughput"] * 3600) * 1e6)

    printed = FLEET_LINE.search(res.stdout)
    assert printed, res.stdout[-3000:]
    replicas, workers, capacity, trial, cost = printed.groups()
    row = trials[trials["trial_number"] == int(trial)].iloc[0]
    fleet = fleet_for(1000, row["capacity_rps"], headroom=0.2, price_per_replica_hour=0.10)
    assert (int(replicas), int(workers)) == (fleet.replicas, fleet.gpus)
    assert float(capacity) == pytest.approx(row["capacity_rps"], rel=1e-3)
    assert float(cost) == pytest.approx(fleet.cost_per_hour, abs=0.005)
    summary = json.loads((short_tmp / "s.json").read_text())
    assert summary["feasible"] and summary["fleet"]["gpus"] == fleet.gpus
    print(f"capacity_rps per trial: {list(trials['capacity_rps'])}; fleet: {printed.group(0)}")
