"""sweeps/shapes_cpu.yaml on real parts (vLLM CPU servers on the shared Ray, Parquet read back):
its four shapes, one server, 2 replicas behind the router, vLLM's own data parallel
(`--data-parallel-size 2`) and 2 replicas of DP 2 (#36), kept small (24 requests, no
confirmation runs). Guards: a trial reserving fewer bundles than its servers and engines
(placement), a replica or a DP engine that serves nothing (the router's per-request header;
vLLM's per-engine `vllm:request_success_total`, relabelled per replica by the router), and the
shape reaching the rows, the per-device metrics and the shipped configuration's exports."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cli import run_joined
from tests.clusters import join_shared
from tests.sweeps import read_requests
from tests.sweeps import read_trials
from tests.sweeps import shipped_example

pytestmark = pytest.mark.server


PROMPTS = 24


@pytest.mark.timeout(900)
def test_four_deployment_shapes_are_each_measured(shared_ray, tiny_model, short_tmp):
    sweep = shipped_example("shapes_cpu", tiny_model, short_tmp, PROMPTS)
    # the shapes and their rows are tested: no trial failing the SLA for this machine's speed
    sweep["sla"] = {"p99_ttft_ms": 600_000}
    path = short_tmp / "shapes_cpu.yaml"
    path.write_text(yaml.safe_dump(join_shared(sweep, shared_ray)))
    done = run_joined(shared_ray, ["run", str(path)], short_tmp)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    trials = read_trials(short_tmp / "results", "shapes_cpu").set_index(
        ["param_replicas", "param_data_parallel_size"]).sort_index()
    assert list(trials.index) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert (trials["state"] == "COMPLETE").all(), trials[["fail_reason", "fail_detail"]]
    assert (trials["completed"] == PROMPTS).all()
    assert list(trials["shape"]) == ["TP1xPP1", "TP1xPP1xDP2", "2xTP1xPP1", "2xTP1xPP1xDP2"]
    # a bundle per engine, every server's
    assert [len(p) for p in trials["placement"]] == [1, 2, 2, 4]
    # every engine of every server finished requests: vLLM balanced its DP engines (48/52
    # when probed), the router alternated its replicas
    assert list(trials["engines_served"]) == [1, 2, 2, 4]
    assert (trials["engine_share_min"] > 0).all()
    one, dp = trials.loc[(1, 1)], trials.loc[(1, 2)]
    assert one["engine_share_min"] == 1.0 and "--data-parallel-size 2" in dp["serve_command"]
    # a shape is not a vLLM flag; per-device metrics count every server's devices
    assert "replicas" not in " ".join(trials["serve_command"])
    for (replicas, size), row in trials.iterrows():
        assert row["output_throughput_per_gpu"] == pytest.approx(
            row["output_throughput"] / (replicas * size))
    # each request row names the replica that answered: 12 each, round robin after 4 warm-ups
    requests = read_requests(short_tmp / "results", "shapes_cpu")
    for (replicas, _), row in trials.iterrows():
        mine = requests[requests["trial_number"] == row["trial_number"]]
        if replicas == 1:
            assert mine["replica"].isna().all()
        else:
            assert mine["replica"].value_counts().to_dict() == {0: PROMPTS // 2, 1: PROMPTS // 2}

    # whichever shape ships (the measurement's call), its exports count its servers and
    # engines: the JSON, a runnable command per server (and the router), and a Ray Serve LLM
    # config Ray's own classes accept (build_dp_openai_app for DP 2; num_replicas the servers)
    export = run_joined(shared_ray, ["export", str(path), "--format", "json"], short_tmp)
    assert export.returncode == 0, export.stdout[-2000:] + export.stderr[-2000:]
    shipped = json.loads(export.stdout)
    size = int(shipped["flags"].get("data-parallel-size") or 1)
    servers = int(trials.loc[trials["trial_number"] == shipped["trial"]].index[0][0])
    assert (shipped["data_parallel_size"], shipped["servers"]) == (size, servers)
    assert "replicas" not in shipped["flags"]
    command = run_joined(shared_ray, ["export", str(path), "--format", "serve"], short_tmp)
    assert command.returncode == 0, command.stderr[-2000:]
    lines = [line for line in command.stdout.splitlines() if not line.startswith("#")]
    assert sum(line.startswith("vllm serve ") for line in lines) == servers
    assert any("framework.engine.router" in line for line in lines) == (servers > 1)
    serve = run_joined(shared_ray, ["export", str(path), "--format", "ray-serve"], short_tmp)
    assert serve.returncode == 0, serve.stdout[-2000:] + serve.stderr[-2000:]
    builder = "build_dp_openai_app" if size == 2 else "build_openai_app"
    assert f"ray.serve.llm:{builder}" in serve.stdout
    assert f"num_replicas: {servers}" in serve.stdout
