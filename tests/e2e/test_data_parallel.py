"""sweeps/shapes_cpu.yaml on real parts (a vLLM CPU server per trial on the shared Ray, Parquet
read back): one engine against vLLM's own data parallel (`--data-parallel-size 2`, #36's first
shape), kept small (40 requests, no confirmation runs). Guards: a DP trial reserving one
engine's bundle only (placement), vLLM's DP engines not both serving (vLLM's internal load
balancing behind our one API server, read from its per-engine `vllm:request_success_total`),
and the shape reaching the rows, the per-device metrics and the shipped configuration."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cli import run_joined
from tests.clusters import join_shared
from tests.paths import ROOT
from tests.sweeps import read_trials

pytestmark = pytest.mark.server


@pytest.mark.timeout(600)
def test_one_engine_and_data_parallel_2_are_both_measured(shared_ray, tiny_model, short_tmp):
    sweep = yaml.safe_load((ROOT / "sweeps" / "shapes_cpu.yaml").read_text())
    sweep["model"] = str(tiny_model)
    sweep["search_space"] = str(ROOT / sweep["search_space"])
    sweep["results_dir"] = str(short_tmp / "results")
    sweep["workload"].update(num_prompts=40, warmup_requests=4)
    # what is tested is the shapes and their rows: every request sent (no early stop) and no
    # trial failing the SLA for this machine's speed
    sweep["search"].update(confirm_top=0, stop_early=False)
    sweep["sla"] = {"p99_ttft_ms": 600_000}
    path = short_tmp / "shapes_cpu.yaml"
    path.write_text(yaml.safe_dump(join_shared(sweep, shared_ray)))
    done = run_joined(shared_ray, ["run", str(path)], short_tmp)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    trials = read_trials(short_tmp / "results", "shapes_cpu").set_index(
        "param_data_parallel_size")
    assert sorted(trials.index) == [1, 2]
    assert (trials["state"] == "COMPLETE").all(), trials[["fail_reason", "fail_detail"]]
    assert (trials["completed"] == 40).all()
    one, dp = trials.loc[1], trials.loc[2]
    assert (one["shape"], dp["shape"]) == ("TP1xPP1", "TP1xPP1xDP2")
    assert len(one["placement"]) == 1 and len(dp["placement"]) == 2  # a bundle per engine
    assert "--data-parallel-size 2" in dp["serve_command"]
    # both engines finished requests: vLLM balanced them (48/52 when probed)
    assert (one["engines_served"], one["engine_share_min"]) == (1, 1.0)
    assert dp["engines_served"] == 2 and 0 < dp["engine_share_min"] <= 0.5
    # per-device metrics count both engines' devices
    assert dp["output_throughput_per_gpu"] == pytest.approx(dp["output_throughput"] / 2)

    # whichever shape ships (the measurement's call), its export counts its engines, and its
    # Ray Serve LLM config passes Ray's own classes (build_dp_openai_app for DP 2)
    export = run_joined(shared_ray, ["export", str(path), "--format", "json"], short_tmp)
    assert export.returncode == 0, export.stdout[-2000:] + export.stderr[-2000:]
    shipped = json.loads(export.stdout)
    winner = int(shipped["flags"].get("data-parallel-size") or 1)
    assert shipped["data_parallel_size"] == winner
    serve = run_joined(shared_ray, ["export", str(path), "--format", "ray-serve"], short_tmp)
    assert serve.returncode == 0, serve.stdout[-2000:] + serve.stderr[-2000:]
    builder = "build_dp_openai_app" if winner == 2 else "build_openai_app"
    assert f"ray.serve.llm:{builder}" in serve.stdout
