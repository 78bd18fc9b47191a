"""framework.fleet through the product: the target's rate and the price file read at load time
(one-line errors), the fleet row columns, the fleet objectives (validated, evaluated, told to
Optuna as a failed constraint when no rate held the SLA), the Decision (summary JSON, fleet
line), and a capacity-mode runner sweep on FakeEngine servers whose rows equal
fleet_for(capacity_rps) (against the runner's contract launcher, no Ray)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from optuna.trial import TrialState
from rich.console import Console

from framework.base.errors import ConfigError
from framework.config.specs import SweepSpec
from framework.fleet.columns import FLEET_COLUMNS
from framework.fleet.columns import Target
from framework.fleet.columns import fleet_values
from framework.fleet.columns import with_objectives
from framework.fleet.prices import Price
from framework.fleet.sizing import fleet_for
from framework.results.decision import fleet_answer
from framework.results.decision import fleet_text
from framework.results.decision import sweep_decision
from framework.results.verdict import decide
from framework.search.tuner import Evaluation
from framework.search.tuner import Tuner
from framework.sweep.loader import load
from framework.sweep.runner import Runner
from framework.trial.objective import evaluate
from tests.paths import ROOT
from tests.unit.sweep.test_runner_contract import FakeLauncher
from tests.unit.sweep.test_runner_contract import _sweep

PRICE = Price(per_replica_hour=3.6, per_gpu_hour=1.8, currency="USD", source="test")


@pytest.mark.parametrize(("metrics", "target", "price", "tp", "expected"), [
    # capacity 8 req/s, target 40 x 1.2 = 48 -> 6 replicas x TP 2 = 12 GPUs; 6 x $3.6 = $21.6/h;
    # $3.6/h over 1000 tok/s = 3.6 M tok/h -> $1 per M; over 2000 tok/s -> $0.5
    ({"capacity_rps": 8.0, "output_throughput": 1000.0, "total_token_throughput": 2000.0},
     Target(40, 0.2), PRICE, 2,
     {"target_rps": 40, "replicas_for_target": 6, "gpus_for_target": 12,
      "cost_per_hour_for_target": 21.6, "cost_per_mtok_output": 1.0, "cost_per_mtok_total": 0.5}),
    # no rate held the SLA: no replicas, GPUs or cost; the per-token cost stays
    ({"capacity_rps": 0.0, "output_throughput": 1000.0}, Target(40), PRICE, 1,
     {"target_rps": 40, "replicas_for_target": None, "gpus_for_target": None,
      "cost_per_hour_for_target": None, "cost_per_mtok_output": 1.0}),
    # no price: replicas and GPUs, no cost
    ({"capacity_rps": 10.0, "output_throughput": 1000.0}, Target(40), None, 1,
     {"replicas_for_target": 4, "gpus_for_target": 4, "cost_per_hour_for_target": None,
      "cost_per_mtok_output": None, "price_source": None}),
    # no target: fleet columns null, the price and per-token cost still known
    ({"output_throughput": 2000.0}, None, PRICE, 1,
     {"target_rps": None, "gpus_for_target": None, "price_per_replica_hour": 3.6,
      "price_source": "test", "cost_per_mtok_output": 0.5}),
    ({}, Target(40), PRICE, 1, {"replicas_for_target": None, "cost_per_mtok_output": None}),
])
def test_fleet_values(metrics, target, price, tp, expected):
    got = fleet_values(metrics, target, price, tp=tp)
    assert set(got) == {name for name, _ in FLEET_COLUMNS}
    for key, value in expected.items():
        assert got[key] == (value if value is None or isinstance(value, str)
                            else pytest.approx(value)), key


def test_with_objectives_leaves_out_what_a_run_lacks():
    runs = [{"capacity_rps": 8.0, "output_throughput": 1000.0},
            {"capacity_rps": 8.0, "output_throughput": 0.0}]
    out = with_objectives(runs, Target(40), PRICE)
    assert all(r["gpus_for_target"] == 5 for r in out)  # 40 / 8
    assert all("cost_per_mtok_output" not in r for r in out)  # run 2 generated nothing


def spec(**extra) -> SweepSpec:
    base = {"name": "s", "model": "m", "search_space": "x.yaml",
            "sla": {"p99_ttft_ms": 500}, "capacity": {}}
    return SweepSpec.model_validate({**base, **extra})


@pytest.mark.parametrize(("extra", "error"), [
    ({"objective": {"metric": "gpus_for_target"}}, "needs a target: section"),
    ({"objective": {"metric": "cost_per_hour_for_target"}, "capacity": None},
     "needs a capacity: section"),
    ({"objective": {"metric": "gpus_for_target", "direction": "maximize"},
      "target": {"request_rate": 10}}, "is minimized"),
    ({"objective": {"metric": "output_throughput"}, "target": {"request_rate": 10}},
     r"the objective is capacity_rps \(maximized\) or one of"),
    ({"target": {"request_rate": 10, "from_trace": True}}, "exactly one of"),
    ({"objective": {"metric": "cost_per_mtok_output"}, "capacity": None,
      "workloads": [{"name": "a"}, {"name": "b"}]}, "does not combine with workloads"),
])
def test_fleet_objectives_are_validated(extra, error):
    with pytest.raises(ValueError, match=error):
        spec(**extra)


@pytest.mark.parametrize("metric", ["gpus_for_target", "cost_per_hour_for_target",
                                    "cost_per_mtok_output"])
def test_fleet_objectives_default_to_minimize(metric):
    s = spec(objective={"metric": metric}, target={"request_rate": 10})
    assert s.objective.direction == "minimize"


def test_no_value_is_infeasible_not_zero():
    v = evaluate({"completed": 20, "failed": 0, "p99_ttft_ms": 100.0}, {"p99_ttft_ms": 500},
                 "gpus_for_target")
    assert math.isnan(v.objective) and not v.feasible
    assert v.violations == ("gpus_for_target: none, no rate held the SLA (no number of replicas "
                            "carries the target)",)


def test_tuner_tells_no_value_as_a_failed_constraint(tmp_path):
    from framework.config.search_space import load_search_space
    space = load_search_space(ROOT / "search_spaces" / "capacity_target.yaml")
    tuner = Tuner(tmp_path / "j", "s", space, ["minimize"], "random", seed=0, startup_trials=1,
                  constraint_keys=["p99_ttft_ms"])
    none, some = tuner.ask(), tuner.ask()
    tuner.tell(none, Evaluation(objective=math.nan, constraints={"p99_ttft_ms": 0.5}))
    tuner.tell(some, Evaluation(objective=12.0, constraints={"p99_ttft_ms": -0.1}))
    t = tuner.study.trials[none.number]
    assert t.state == TrialState.COMPLETE and t.values == [1e12]
    assert t.constraints == {"p99_ttft_ms": 0.5, "feasibility": 1.0}
    assert tuner.study.best_trial.number == some.number


# --- load time: the target's rate, the price file --------------------------------------------

def fake_sweep(tmp: Path, **extra) -> Path:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 4], "default": 4}}}))
    path = tmp / "sweep.yaml"
    # a latency objective: a throughput at a trace's own pace ranks the traffic (load_meaning)
    path.write_text(yaml.safe_dump({"name": "f", "model": str(model), "search_space": str(space),
                                    "engine": "fake", "sla": {"p99_ttft_ms": 500},
                                    "objective": {"metric": "p99_ttft_ms", "direction": "minimize"},
                                    "results_dir": str(tmp / "results"), **extra}))
    return path


@pytest.mark.parametrize(("lines", "multiplier", "rate"), [
    # 4 requests at 0, 1000, 1500, 2000 ms (x 0.001 s): 4 / 2 s = 2 req/s
    ([0, 1000, 1500, 2000], 0.001, 2.0),
    # out of order: span = latest - earliest = 10 - 2 = 8 s; 3 / 8
    ([5, 2, 10], 1.0, 0.375),
])
def test_target_from_trace_is_its_mean_rate(tmp_path, lines, multiplier, rate):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": 4, "output_length": 2})
                             + "\n" for t in lines))
    path = fake_sweep(tmp_path, workload={"dataset": "timed_trace", "dataset_path": str(trace),
                                          "timed_trace": {"sec_multiplier": multiplier},
                                          "endpoint": "completions"},
                      target={"from_trace": True, "headroom": 0.5})
    sw = load(path, check_flags=False)
    assert sw.target == Target(pytest.approx(rate), 0.5)


def test_a_trace_without_span_has_no_rate(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 3, "input_length": 4, "output_length": 2}) + "\n")
    path = fake_sweep(tmp_path, workload={"dataset": "timed_trace", "dataset_path": str(trace),
                                          "endpoint": "completions"},
                      target={"from_trace": True})
    with pytest.raises(ConfigError) as err:
        load(path, check_flags=False)
    assert (err.value.key, err.value.value) == ("target.from_trace", str(trace))
    assert "span 0 s" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("pricing", "file_text", "where", "key", "value"), [
    ({"file": "missing.yaml"}, None, "sweep.yaml", "pricing.file", "missing.yaml"),
    ({"file": "prices.yaml"}, "H100-80GB: -2\n", "prices.yaml", "H100-80GB", -2),
    ({"file": "prices.yaml"}, "H100-80GB: cheap\n", "prices.yaml", "H100-80GB", "cheap"),
    # FakeEngine, a cost objective, no per_replica_hour: no price is invented
    ({}, None, "sweep.yaml", "objective.metric", "cost_per_mtok_output"),
])
def test_price_errors_are_one_line(tmp_path, monkeypatch, pricing, file_text, where, key, value):
    monkeypatch.chdir(tmp_path)  # pricing.file is relative to the working directory
    if file_text is not None:
        (tmp_path / "prices.yaml").write_text(file_text)
    path = fake_sweep(tmp_path, pricing=pricing, objective={"metric": "cost_per_mtok_output"})
    with pytest.raises(ConfigError) as err:
        load(path, check_flags=False)
    assert Path(err.value.file).name == where and (err.value.key, err.value.value) == (key, value)
    assert "\n" not in str(err.value)


def test_price_file_prices_a_gpu_replica(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prices.yaml").write_text("H100-80GB: 2.5\n")
    sw = load(fake_sweep(tmp_path, pricing={"file": "prices.yaml"}), check_flags=False)
    assert sw.file_prices == {"H100-80GB": 2.5}
    assert sw.price(2, 1) is None  # FakeEngine: only per_replica_hour prices it
    gpu = sw.spec.model_copy(update={"engine": "gpu", "gpu": "H100-80GB"})
    price = type(sw)(sw.path, gpu, sw.space, file_prices=sw.file_prices).price(2, 1)
    assert price is not None and price.per_replica_hour == 5.0  # 2 GPUs x 2.5
    assert price.source == "price file prices.yaml"


# --- a capacity-mode runner sweep on FakeEngine servers --------------------------------------

def capacity_sweep(tmp: Path, name: str, sla: dict, objective: str) -> Path:
    path = _sweep(tmp, name, {"max-num-seqs": {"type": "categorical", "choices": [2, 4]}},
                  False, 2)
    data = yaml.safe_load(path.read_text())
    data.update(sla=sla, objective={"metric": objective}, target={"request_rate": 50,
                                                                  "headroom": 0.1},
                pricing={"per_replica_hour": 0.5},
                capacity={"start_rate": 8, "max_rate": 32, "max_steps": 3, "tolerance": 0.5,
                          "step_duration_s": 0.5, "min_requests": 4})
    data["workload"].update(num_prompts=12)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.timeout(180)
def test_capacity_sweep_rows_are_the_fleet_of_their_capacity(tmp_path):
    sw = load(capacity_sweep(tmp_path, "fleet", {"p99_ttft_ms": 60_000}, "gpus_for_target"))
    out = io.StringIO()
    runner = Runner(sw, FakeLauncher(gpus=1), Console(file=out, width=400))
    runner.run(2)
    runner.summary()
    trials = runner.store.read_trials()
    assert [c for c in trials.columns if c in dict(FLEET_COLUMNS)] == [n for n, _ in FLEET_COLUMNS]
    assert list(trials["state"]) == ["COMPLETE", "COMPLETE"]
    for _, row in trials.iterrows():
        assert row["capacity_rps"] > 0 and row["feasible"]
        fleet = fleet_for(50, row["capacity_rps"], headroom=0.1, price_per_replica_hour=0.5)
        assert (row["target_rps"], row["replicas_for_target"], row["gpus_for_target"]) \
            == (50, fleet.replicas, fleet.gpus)
        assert row["cost_per_hour_for_target"] == pytest.approx(fleet.cost_per_hour)
        assert row["objective"] == fleet.gpus  # what Optuna minimized
        assert row["cost_per_mtok_output"] == pytest.approx(
            0.5 / (row["output_throughput"] * 3600) * 1e6)
        assert row["price_source"] == "sweep pricing.per_replica_hour"
    verdict = decide(trials, "gpus_for_target", False, sw.spec.sla)
    f = fleet_answer(trials, verdict, 0.1)
    assert f is not None and f.gpus is not None
    assert fleet_text(f) in out.getvalue().replace("\n", "")  # the console's final summary
    decision = json.loads(json.dumps(sweep_decision(trials, sw.spec, sw.space, "s.yaml").as_json()))
    assert decision["feasible"] and decision["fleet"]["gpus"] == f.gpus
    assert decision["best"]["command"] == trials.loc[trials["trial_number"] == verdict.ship,
                                                     "serve_command"].iloc[0]
    assert decision["exports"][0] == "vllm-sweep export s.yaml --format serve"


@pytest.mark.timeout(180)
def test_each_workload_finds_its_capacity_and_the_trial_takes_the_smallest(tmp_path):
    """Capacity mode with several workloads (#34 item 2): each workload's own rate steps on the
    trial's server, its capacity in the workloads table, the trial's the smallest (aggregate
    min), the fleet sized on it. A 200-token answer takes at least 200 ms at FakeEngine's 1 ms
    a token, so `long` holds a 100 ms end-to-end SLA at no rate: its capacity is 0 whatever
    the machine's speed, and so is the trial's (a maximum would be `short`'s)."""
    path = capacity_sweep(tmp_path, "mixed", {"p99_e2el_ms": 100}, "capacity_rps")
    data = yaml.safe_load(path.read_text())
    base = data.pop("workload")
    data["workloads"] = [{**base, "name": "short", "output_len": 2},
                         {**base, "name": "long", "output_len": 200}]
    path.write_text(yaml.safe_dump(data))
    sw = load(path)
    runner = Runner(sw, FakeLauncher(gpus=1), Console(file=io.StringIO(), width=400))
    runner.run(1)
    trial = runner.store.read_trials().iloc[0]
    each = pd.read_parquet(runner.store.sweep_dir / "workloads").set_index("workload")
    assert each.loc["long", "capacity_rps"] == 0
    assert trial["capacity_rps"] == min(each["capacity_rps"])
    steps = pd.read_parquet(runner.store.sweep_dir / "requests")
    first = 0  # the trial's steps in order: short's, then long's
    for name in ("short", "long"):
        mine = steps[steps["workload"] == name].groupby("step")["rate"].first()
        count = int(each.loc[name, "capacity_steps"])
        assert list(mine.index) == list(range(first, first + count)), (name, list(mine.index))
        assert mine.iloc[0] == data["capacity"]["start_rate"]
        first += count
    assert trial["replicas_for_target"] is None or pd.isna(trial["replicas_for_target"])


@pytest.mark.timeout(180)
def test_no_capacity_is_an_infeasible_trial_not_zero_gpus(tmp_path):
    sw = load(capacity_sweep(tmp_path, "none", {"p99_ttft_ms": 0.001}, "gpus_for_target"))
    runner = Runner(sw, FakeLauncher(gpus=1), Console(file=io.StringIO()))
    runner.run(1)
    row = runner.store.read_trials().iloc[0]
    assert row["state"] == "COMPLETE" and row["capacity_rps"] == 0 and not row["feasible"]
    assert pd.isna(row["gpus_for_target"]) and math.isnan(row["objective"])
    assert "no number of replicas carries the target" in row["sla_violations"]
    told = runner.tuner.study.trials[0]
    assert told.values == [1e12] and told.constraints["feasibility"] == 1.0
    decision = sweep_decision(runner.store.read_trials(), sw.spec, sw.space, "s.yaml")
    assert not decision.feasible and decision.as_json()["fleet"] is None


def _rows(capacities: list[float], feasible: bool = True) -> pd.DataFrame:
    """Trial 0 and its confirmation runs, each with the fleet columns of its capacity (target
    40 req/s, price 2.0 per replica-hour)."""
    rows = []
    for i, capacity in enumerate(capacities):
        fleet = fleet_values({"capacity_rps": capacity, "output_throughput": 1000.0}, Target(40),
                             Price(2.0, None, "USD", "sweep pricing.per_replica_hour"))
        rows.append({"trial_number": i, "state": "COMPLETE", "is_baseline": False,
                     "confirmation_of": None if i == 0 else 0, "objective": capacity,
                     "feasible": feasible, "p99_ttft_ms": 100.0, "objective_cv": None,
                     "repeats": 1, "stopped_early": None, "capacity_rps": capacity,
                     "output_throughput": 1000.0, "serve_command": "vllm serve m <&>", **fleet})
    return pd.DataFrame(rows)


def test_the_fleet_is_sized_on_the_lowest_capacity_of_the_shipped_configuration():
    trials = _rows([10.0, 8.0, 9.0])  # trial 0, confirmed twice: 8 req/s is the least favourable
    verdict = decide(trials, "capacity_rps", True, {"p99_ttft_ms": 500})
    f = fleet_answer(trials, verdict)
    assert verdict.ship == 0 and f is not None
    assert (f.trial, f.measurements, f.capacity_rps, f.replicas) == (1, 3, 8.0, 5)  # 40 / 8
    assert f.cost_per_hour == 10.0  # 5 x 2.0
    assert fleet_text(f).startswith("Fleet for 40 req/s: 5 replicas x 1 GPU = 5 GPUs at 8 req/s")


def test_decision_section_escapes_and_says_when_nothing_ships():
    from framework.results.decision_report import decision_section

    s = spec(target={"request_rate": 40}, objective={"metric": "capacity_rps"})
    page = decision_section(_rows([10.0]), s, "sweeps/x.yaml")
    assert "vllm serve m &lt;&amp;&gt;" in page and "<&>" not in page
    assert "vllm-sweep export sweeps/x.yaml --format k8s" in page
    assert "8.00 USD" in page and "sweep pricing.per_replica_hour" in page  # 40 / 10 = 4 x 2.0
    none = decision_section(_rows([0.0], feasible=False), s, "sweeps/x.yaml")
    assert "id='decision-none'" in none and "No feasible configuration" in none


def test_a_capacity_found_after_a_step_stopped_early_is_a_measurement():
    """Capacity mode: a step above the capacity stopped early (its SLA surely broken) leaves
    `stopped_early` set, but the capacity's own step ran in full: the verdict counts it (the
    real example sweep found 362 req/s this way and was called infeasible before)."""
    trials = _rows([10.0]).assign(stopped_early="p99_ttft_ms: at least 304 ms")
    assert decide(trials, "capacity_rps", True, {"p99_ttft_ms": 500}).ship == 0
    none = _rows([0.0]).assign(stopped_early="p99_ttft_ms: at least 304 ms")
    assert decide(none, "capacity_rps", True, {"p99_ttft_ms": 500}).ship is None
