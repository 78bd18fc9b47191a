"""sweeps/trace_capacity.yaml end to end on a real vLLM CPU server (capacity mode on a timed
trace, `target: {from_trace: true}` and `pricing:`) on the shared Ray: the run exits 0, prints
the fleet answer for the trace's own rate, and the printed answer and every trial row's fleet
columns equal fleet_for() recomputed from the row's capacity_rps; each trial's capacity is the
highest rate step whose SLA held, its capacity in speed-up is capacity_rps over the trace's mean
rate, and each step's requests were sent at the trace's times over that step's speed-up (#34
item 2); the shipped configuration exported in every format (#20), each checked by its
platform's schema.

One trial (vLLM's defaults, the example's first), not the example's two: every check here is
per trial row or of the shipped row, which one real server's row already fails on (fleet
columns not from capacity_rps, a printed answer or export not from the rows, a capacity that is
not the highest held step, a step not paced as the trace, a CPU deployment exported with a GPU
image or limit). Which of several trials ships and is printed is test_decision_fake.py's, on
FakeEngine (#31). Capacity by rates (sweeps/capacity_target.yaml, validated as shipped by
tests/unit/test_shipped_files.py) is the same machinery with Poisson arrivals: its steps on
FakeEngine are test_search_integration.py's and test_oversaturation.py's."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import duckdb
import kubernetes_validate
import pandas as pd
import pytest
import yaml

from framework.cluster.serve_llm import check_ray_serve_config
from framework.config.trace_spec import TimedTraceSpec
from framework.fleet.sizing import fleet_for
from framework.load.trace import mean_rate
from framework.load.trace import read_trace
from framework.load.trace import send_offsets
from tests.cli import cli_in_process
from tests.cli import run_joined
from tests.clusters import join_shared
from tests.paths import ROOT
from tests.sweeps import read_trials

pytestmark = pytest.mark.server

FLEET_LINE = re.compile(r"Fleet for ([\d.]+) req/s \(\+20% headroom\): (\d+) replicas? x 1 CPU worker "
                        r"= (\d+) CPU workers? at ([\d.]+) req/s each \(trial (\d+)[^;]*; "
                        r"([\d.]+) USD/h")


@pytest.mark.timeout(900)
def test_trace_capacity_example_prints_the_fleet_of_its_rows(shared_ray, tiny_model, short_tmp):
    spec = yaml.safe_load((ROOT / "sweeps" / "trace_capacity.yaml").read_text())
    spec.update(model=str(tiny_model), results_dir=str(short_tmp / "results"),
                search_space=str(ROOT / spec["search_space"]))
    spec["workload"]["dataset_path"] = str(ROOT / spec["workload"]["dataset_path"])
    spec["search"]["n_trials"] = 1  # the baseline: one vLLM server (module docstring)
    # an SLA that 1x holds on any machine (the shipped 300 / 50 ms: 32x here when idle): a
    # capacity of 0 would leave no fleet to check, and this test is not about a speed
    spec["sla"] = {"p99_ttft_ms": 5000, "p99_tpot_ms": 500}
    # no over-saturation stops: one would end a step above capacity with its finished requests
    # all under the SLA (its slow ones still in flight), which check_steps could not tell from a
    # step that held; the SLA guard still ends a broken step early
    spec["search"]["saturation"] = {"enabled": False}
    sweep = short_tmp / "trace_capacity.yaml"
    sweep.write_text(yaml.safe_dump(join_shared(spec, shared_ray)))
    res = run_joined(shared_ray, ["run", str(sweep), "--summary-json", str(short_tmp / "s.json")],
                     short_tmp)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]

    trace_spec = TimedTraceSpec(**spec["workload"]["timed_trace"])
    target = mean_rate(read_trace(spec["workload"]["dataset_path"], trace_spec))  # from_trace
    offsets = send_offsets(read_trace(spec["workload"]["dataset_path"], trace_spec,
                                      spec["workload"]["num_prompts"]))
    trials = read_trials(short_tmp / "results", "trace_capacity")
    assert list(trials["state"]) == ["COMPLETE"], trials[["fail_reason", "fail_detail"]]
    for _, row in trials.iterrows():
        fleet = fleet_for(target, row["capacity_rps"], headroom=0.2, price_per_replica_hour=0.10)
        assert row["capacity_rps"] > 0, row["sla_violations"]
        assert row["capacity_speed_up"] == pytest.approx(row["capacity_rps"] / target)
        assert row["target_rps"] == pytest.approx(target)
        assert (row["replicas_for_target"], row["gpus_for_target"]) == (fleet.replicas, fleet.gpus)
        assert row["cost_per_hour_for_target"] == pytest.approx(fleet.cost_per_hour)
        assert row["objective"] == row["capacity_rps"]  # the example maximizes capacity
        assert row["cost_per_mtok_output"] == pytest.approx(
            0.10 / (row["output_throughput"] * 3600) * 1e6)

    printed = FLEET_LINE.search(res.stdout)
    assert printed, res.stdout[-3000:]
    rate, replicas, workers, capacity, trial, cost = printed.groups()
    assert float(rate) == pytest.approx(target, rel=1e-3)
    row = trials[trials["trial_number"] == int(trial)].iloc[0]
    fleet = fleet_for(target, row["capacity_rps"], headroom=0.2, price_per_replica_hour=0.10)
    assert (int(replicas), int(workers)) == (fleet.replicas, fleet.gpus)
    assert float(capacity) == pytest.approx(row["capacity_rps"], rel=1e-3)
    assert float(cost) == pytest.approx(fleet.cost_per_hour, abs=0.005)
    summary = json.loads((short_tmp / "s.json").read_text())
    assert summary["feasible"] and summary["fleet"]["gpus"] == fleet.gpus
    print(f"capacity_rps per trial: {list(trials['capacity_rps'])}; fleet: {printed.group(0)}")
    for _, row in trials.iterrows():
        check_steps(short_tmp / "results", row, spec, offsets, target)
    check_exports(sweep, trials, short_tmp, str(tiny_model), spec, target)


def check_steps(results: Path, row: pd.Series, spec: dict, offsets: list[float],
                trace_rate: float) -> None:
    """The trial's rate steps as its request rows hold them: numbered from 0, the first at the
    start rate, the capacity one of them with the SLA held there, and every rate tried above
    the capacity broke the SLA (or failed requests); each recorded request due at its trace
    offset over the step's speed-up (rate / the trace's mean rate). A step the SLA guard cut
    keeps only the requests finished by then, not a prefix of the trace (s16's CI: a long
    early request still in flight), so only a step that held must hold every request."""
    sla, capacity = spec["sla"], spec["capacity"]
    assert 1 <= row["capacity_steps"] <= capacity["max_steps"]
    where = (f"read_parquet('{results}/trace_capacity/requests/**/*.parquet') "
             f"WHERE trial_number = {row['trial_number']}")
    steps = duckdb.sql(
        f"SELECT step, any_value(rate), quantile_cont(ttft_ms, 0.99), quantile_cont(tpot_ms, 0.99),"
        f" count(*) FILTER (WHERE NOT success) FROM {where} GROUP BY step ORDER BY step").fetchall()
    assert [s[0] for s in steps] == list(range(int(row["capacity_steps"])))
    assert steps[0][1] == capacity["start_rate"]
    assert row["capacity_rps"] in {s[1] for s in steps}
    assert row["p99_ttft_ms"] <= sla["p99_ttft_ms"] and row["p99_tpot_ms"] <= sla["p99_tpot_ms"]
    for step, rate, p99_ttft, p99_tpot, failed in steps:
        if rate > row["capacity_rps"]:
            assert p99_ttft > sla["p99_ttft_ms"] or p99_tpot > sla["p99_tpot_ms"] or failed, (
                rate, p99_ttft, p99_tpot)
        due = duckdb.sql(f"SELECT request_index, scheduled_s FROM {where} AND step = {step} "
                         "ORDER BY request_index").fetchall()
        speed_up = rate / trace_rate
        assert [d for _, d in due] == pytest.approx(
            [offsets[i] / speed_up for i, _ in due], abs=1e-6), step
        if rate <= row["capacity_rps"]:  # a step that held ran whole: every request recorded
            assert [i for i, _ in due] == list(range(len(due))), step


def check_exports(sweep: Path, trials: pd.DataFrame, tmp: Path, model: str, spec: dict,
                  target_rps: float) -> None:
    """Every `export` format of the real sweep: what `best` ships, sized by framework.fleet,
    each file accepted by Ray Serve LLM's config classes / Kubernetes' schemas."""
    target, price = spec["target"], spec["pricing"]["per_replica_hour"]
    best = cli_in_process("best", str(sweep), "--format", "yaml")
    assert best.returncode == 0, best.stderr
    shipped = yaml.safe_load(best.stdout)
    row = trials[trials["trial_number"] == shipped["trial"]].iloc[0]
    # the target x (1 + headroom) over the shipped configuration's capacity (one server: its row)
    replicas = math.ceil(target_rps * (1 + target["headroom"]) / row["capacity_rps"] - 1e-9)

    res = cli_in_process("export", str(sweep), "--format", "serve")
    assert res.returncode == 0 and res.stdout == shipped["command"] + "\n"
    assert res.stdout.startswith(f"vllm serve {model}")

    doc = json.loads(cli_in_process("export", str(sweep), "--format", "json").stdout)
    assert doc["trial"] == shipped["trial"] and doc["flags"] == shipped["flags"]
    assert doc["verdict"] == shipped["verdict"]
    assert doc["fleet"]["replicas"] == replicas and doc["fleet"]["gpus_per_replica"] == 1
    assert doc["fleet"]["cost_per_hour"] == pytest.approx(replicas * price)
    assert doc["cost_per_mtok"] == pytest.approx(price / (row["output_throughput"] * 3600) * 1e6)

    out = tmp / "serve.yaml"
    res = cli_in_process("export", str(sweep), "--format", "ray-serve", "-o", str(out))
    assert res.returncode == 0, res.stderr
    app = yaml.safe_load(out.read_text())
    assert check_ray_serve_config(app) == 1  # Ray Serve LLM's LLMServingArgs / engine config
    (llm,) = app["applications"][0]["args"]["llm_configs"]
    assert llm["deployment_config"] == {"num_replicas": replicas}
    assert llm["engine_kwargs"]["max_model_len"] == spec["server"]["args"]["max-model-len"]
    assert llm["accelerator_config"] == {"kind": "cpu"}

    res = cli_in_process("export", str(sweep), "--format", "k8s")
    assert res.returncode == 0 and "&id" not in res.stdout  # no YAML anchors
    deployment, service = yaml.safe_load_all(res.stdout)
    for manifest in (deployment, service):
        kubernetes_validate.validate(manifest, "1.33.0", strict=True)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert deployment["spec"]["replicas"] == replicas
    assert "nvidia.com/gpu" not in container["resources"]["limits"]  # CPU: vLLM's CPU image
    assert container["image"].startswith("vllm/vllm-openai-cpu:v")
    # the local model on the default claim (framework/fleet/manifests.py, model_source)
    assert container["args"][:1] == [f"/models/{Path(model).name}"]
    assert "--max-model-len" in container["args"]
