"""Several workloads in one sweep: the `workloads:` section and its rejected combinations, the
load plan per workload, the trial's aggregate metrics and verdict, the workloads table written
and read back with DuckDB."""

from __future__ import annotations

from datetime import UTC
from datetime import datetime

import duckdb
import pytest
import yaml

from framework.base.errors import ConfigError
from framework.config.specs import load_sweep
from framework.config.workload_spec import WorkloadSpec
from framework.results.store import ResultStore
from framework.results.workload_rows import workload_columns
from framework.results.workload_rows import workload_rows
from framework.sweep.trial_load import load_plan
from framework.sweep.trial_load import with_run_settings
from framework.trial.measure import LoadStep
from framework.trial.run import TrialOutcome
from framework.trial.saturation import SaturationSettings
from framework.trial.saturation import detect
from framework.trial.workloads import WorkloadResult
from framework.trial.workloads import aggregate_metrics
from framework.trial.workloads import combine_values
from framework.trial.workloads import evaluate_workloads
from tests.paths import ROOT

MODEL_DIR = ROOT / "models" / "tiny-llama"


def _sweep(tmp_path, top=None, second=None):
    data = {"name": "w", "model": str(MODEL_DIR),
            "search_space": str(ROOT / "search_spaces" / "tiny_cpu.yaml"),
            "workloads": [
                {"name": "short", "request_rate": 8, "num_prompts": 12, "input_len": 32,
                 "output_len": 8, "warmup_requests": 2, "seed": 1},
                {"name": "mixed", "weight": 3, "request_rate": 2, "num_prompts": 10,
                 "max_concurrency": 4, "warmup_requests": 3, "seed": 2, "mix": [
                     {"name": "chat", "weight": 0.7, "input_len": 32, "output_len": 8},
                     {"name": "summarize", "weight": 0.3, "input_len": 200, "output_len": 8}],
                 **(second or {})}],
            "objective": {"metric": "output_throughput", "aggregate": "mean"},
            "sla": {"p99_ttft_ms": 1000, "summarize.p99_ttft_ms": 3000},
            "results_dir": str(tmp_path / "results"), **(top or {})}
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_workloads_load_and_the_first_stands_for_workload(tmp_path):
    spec = load_sweep(_sweep(tmp_path))
    assert [w.name for w in spec.workloads] == ["short", "mixed"]
    assert [w.weight for w in spec.workloads] == [1.0, 3.0]
    assert spec.workload.input_len == 32 and spec.workload.num_prompts == 12
    assert spec.objective.aggregate == "mean"


@pytest.mark.parametrize(("top", "second", "key", "says"), [
    ({"search": {"repeats": 2}}, None, "workloads", "search.repeats"),
    ({"search": {"precision": 0.1}}, None, "workloads", "search.precision"),
    ({"search": {"screen": 0.2}}, None, "workloads", "search.screen"),
    (None, {"name": "short"}, "workloads", "repeats a name"),
    (None, {"percentiles": [50, 99]}, "workloads", "same percentiles"),
    (None, {"weight": 0}, "workloads.1.weight", "greater than 0"),
    ({"workload": {"input_len": 8}}, None, "workload", "either workload: or workloads:"),
    ({"objective": {"aggregate": "max"}}, None, "objective.aggregate", "'min' or 'mean'"),
])
def test_bad_workloads_are_one_line_errors(tmp_path, top, second, key, says):
    with pytest.raises(ConfigError) as err:
        load_sweep(_sweep(tmp_path, top, second))
    assert err.value.key == key and says in err.value.reason, str(err.value)


def test_capacity_mode_gives_each_workload_its_own_capacity_plan(tmp_path):
    """#34 item 2: capacity: with workloads: loads, and every workload's plan has its steps
    (refused before: "several workloads do not combine with capacity: yet")."""
    spec = load_sweep(_sweep(tmp_path, {"capacity": {"start_rate": 1, "max_steps": 2},
                                        "sla": {"p99_ttft_ms": 500},
                                        "objective": {"metric": "capacity_rps"}}))
    plan = load_plan(spec)
    assert [p.load.capacity is not None for p in plan.workloads] == [True, True]
    assert all(len(p.load.capacity.step_requests) == 2 for p in plan.workloads)


def test_load_plan_has_one_plan_per_workload(tmp_path):
    spec = load_sweep(_sweep(tmp_path))
    plan = load_plan(spec)
    assert [p.name for p in plan.workloads] == ["short", "mixed"]
    assert plan.warmup == () and plan.aggregate == "mean"  # each workload warms up itself
    short, mixed = (p.load for p in plan.workloads)
    assert len(short.measured) == 12 and len(short.warmup) == 2 and short.classes == ()
    assert len(mixed.measured) == 10 and len(mixed.warmup) == 3
    assert mixed.classes == ("chat", "summarize") and mixed.max_concurrency == 4
    assert [r.request_class for r in mixed.measured].count("summarize") == 3
    assert {r.prompt_len for r in mixed.measured if r.request_class == "summarize"} == {200}
    assert short.arrivals[-1] == pytest.approx(12 / 8) and mixed.arrivals[-1] == pytest.approx(5)
    assert plan.saturation == SaturationSettings()
    # a trial's run settings reach every workload
    tuned = with_run_settings(plan, spec, {"max_concurrency": 2})
    assert [p.load.max_concurrency for p in tuned.workloads] == [2, 2]


def _result(name, weight, throughput, p99_ttft, failed=0, **more):
    return WorkloadResult(name, weight, {"completed": 10, "failed": failed, "duration": 5.0,
                                         "output_throughput": throughput,
                                         "p99_ttft_ms": p99_ttft,
                                         "max_concurrent_requests": 3 + failed, **more})


@pytest.mark.parametrize(("values", "weights", "how", "maximize", "expected"), [
    ([10, 30], [1, 1], "min", True, 10),
    ([10, 30], [1, 1], "min", False, 30),  # the worst latency is the largest
    ([10, 30], [1, 3], "mean", True, 25),
    ([10, 30], [1, 3], "mean", False, 25),
])
def test_combine_values(values, weights, how, maximize, expected):
    assert combine_values(values, weights, how, maximize) == expected


def test_aggregate_metrics_adds_counts_and_takes_the_worst_or_the_mean():
    a, b = _result("a", 1, 100.0, 200.0), _result("b", 3, 60.0, 900.0, failed=2,
                                                   **{"chat.p99_ttft_ms": 50.0})
    worst = aggregate_metrics([a, b], "min")
    assert worst["completed"] == 20 and worst["failed"] == 2 and worst["duration"] == 10.0
    assert worst["output_throughput"] == 60.0 and worst["p99_ttft_ms"] == 900.0
    assert worst["max_concurrent_requests"] == 5
    assert worst["chat.p99_ttft_ms"] == 50.0  # only b has the class
    mean = aggregate_metrics([a, b], "mean")
    assert mean["output_throughput"] == pytest.approx(70.0)  # (100 + 3 x 60) / 4
    assert mean["p99_ttft_ms"] == 900.0  # latencies: the worst, what the SLA is judged on
    assert mean["completed"] == 20


def test_the_sla_must_hold_on_each_workload():
    a, b = _result("a", 1, 100.0, 200.0), _result("b", 3, 60.0, 900.0,
                                                   **{"summarize.p99_ttft_ms": 4000.0})
    sla = {"p99_ttft_ms": 500, "summarize.p99_ttft_ms": 3000}
    verdict, each = evaluate_workloads([a, b], sla, ["output_throughput"], [True], "mean")
    assert [v.feasible for v in each] == [True, False]
    assert not verdict.feasible
    assert verdict.objective == pytest.approx(70.0)
    assert verdict.constraints["p99_ttft_ms"] == pytest.approx((900 - 500) / 500)  # the worst
    assert verdict.constraints["summarize.p99_ttft_ms"] > 0
    assert "summarize.p99_ttft_ms" not in each[0].constraints  # a has no summarize class
    assert [v.split(":")[0] for v in verdict.violations] == ["b", "b"]
    ok, _ = evaluate_workloads([a], sla, ["output_throughput"], [True], "min")
    assert ok.feasible and ok.objective == 100.0
    worst, _ = evaluate_workloads([a, b], {}, ["output_throughput", "p99_ttft_ms"],
                                  [True, False], "min")
    assert worst.values == (60.0, 900.0) and worst.feasible


def test_workload_rows_are_written_and_read_back_with_duckdb(tmp_path):
    a, b = _result("short", 1, 100.0, 200.0), _result("mixed", 3, 60.0, 900.0)
    flood = detect([(t / 2, 5.0 * t) for t in range(1, 41)], SaturationSettings())
    steps = (LoadStep(8.0, 0.0, (), workload="short"),
             LoadStep(2.0, 0.0, (), stopped="over-saturated: ...", workload="mixed",
                      saturation=flood))
    outcome = TrialOutcome(started_at=datetime.now(UTC), argv=(), steps=steps, workloads=(a, b))
    _, each = evaluate_workloads([a, b], {"p99_ttft_ms": 500}, ["output_throughput"], [True],
                                 "min")
    columns = workload_columns([50, 99], ["chat"])
    store = ResultStore(tmp_path, "w")
    specs = {"short": WorkloadSpec(request_rate=8.0, max_concurrency=4),
             "mixed": WorkloadSpec(burstiness=0.5)}
    store.write_workloads(7, workload_rows(7, outcome, each, columns, specs), columns)
    rows = duckdb.sql(
        f"SELECT trial_number, workload, weight, feasible, objective, output_throughput, "
        f"error_rate, saturated, saturation_slope, stopped_early, \"chat.p99_ttft_ms\", sweep, "
        f"request_rate, max_concurrency, burstiness, speed_up "
        f"FROM read_parquet('{tmp_path}/w/workloads/**/*.parquet', hive_partitioning=true) "
        "ORDER BY weight").fetchall()
    assert rows[0][12:] == (8.0, 4, 1.0, 1.0)  # each workload's offered-load settings
    assert rows[1][12:] == (None, None, 0.5, 1.0)  # unpaced, unbounded
    assert rows[0][:7] == (7, "short", 1.0, True, 100.0, 100.0, 0.0)
    assert rows[0][7] is None and rows[0][9] is None  # no watched run
    assert rows[1][:5] == (7, "mixed", 3.0, False, 60.0)
    assert rows[1][7] is True and rows[1][8] == pytest.approx(10.0)
    assert rows[1][9].startswith("over-saturated") and rows[1][10] is None and rows[1][11] == "w"


def test_the_workload_digest_covers_every_workload(tmp_path):
    from framework.results.provenance import workload_sha256

    one = workload_sha256(load_sweep(_sweep(tmp_path)))
    assert one == workload_sha256(load_sweep(_sweep(tmp_path)))
    assert one != workload_sha256(load_sweep(_sweep(tmp_path, second={"request_rate": 3})))
