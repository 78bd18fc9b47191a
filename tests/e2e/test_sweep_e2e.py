"""A real sweep on real parts: local Ray, vLLM CPU servers, Optuna journal, Parquet read back."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import duckdb
import kubernetes_validate
import pandas as pd
import pytest
import yaml

from framework.cluster.serve_llm import check_ray_serve_config
from framework.engine.startup_log import STARTUP_PHASE_COLUMNS
from framework.engine.startup_log import read_marks
from framework.results.diagnosis import VERDICTS
from tests.browser import check_sweep_report
from tests.helpers import cli_env
from tests.helpers import cli_in_process
from tests.helpers import new_marker
from tests.helpers import read_trials
from tests.helpers import read_until
from tests.helpers import run_cli
from tests.helpers import shared_memory
from tests.helpers import start_driver
from tests.helpers import vllm_leftovers
from tests.helpers import vsweep_leftovers
from tests.helpers import wait_no_marked_processes
from tests.helpers import write_sweep

pytestmark = pytest.mark.server
PHASES = [name for name, _ in STARTUP_PHASE_COLUMNS]


@pytest.mark.timeout(900)
def test_two_trial_sweep_writes_parquet_and_resumes(tiny_model, short_tmp):
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = write_sweep(short_tmp, tiny_model, n_trials=2)
    doc = yaml.safe_load(sweep.read_text())
    doc["cluster"] = {"start_ahead": 1}  # both servers start side by side, each measured alone
    sweep.write_text(yaml.safe_dump(doc))
    shm_before = shared_memory()
    try:
        first = run_cli(["run", str(sweep)], short_tmp, env, timeout_s=600)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        assert "trial 0" in first.stdout and "trial 1" in first.stdout
        assert "vLLM's defaults" in first.stdout  # the verdict: a winner only beyond the noise
        assert wait_no_marked_processes(marker) == []
        # no server log, control socket, result file or zygote folder is left in the temp dir,
        # no IPC socket or store file of vLLM's, and no shared memory in /dev/shm: each server
        # was shut down by vLLM before its processes were killed
        assert vsweep_leftovers(short_tmp) == []
        assert vllm_leftovers(short_tmp) == []
        assert shared_memory() - shm_before == set()

        trials = read_trials(short_tmp / "results", "e2e")
        assert list(trials["trial_number"]) == [0, 1]
        assert set(trials["sweep"]) == {"e2e"}
        assert list(trials["is_baseline"]) == [True, False]
        assert list(trials["state"]) == ["COMPLETE", "COMPLETE"], trials[["fail_reason", "fail_detail"]]
        baseline, tuned = trials.iloc[0], trials.iloc[1]
        # Start-ahead on real Ray: trial 1's server was started before trial 0 ended, and one
        # of them waited, ready, while the other was measured (share_gate's rule, unit-tested).
        assert tuned["started_at"] < baseline["started_at"] + pd.Timedelta(seconds=baseline["trial_s"])
        assert trials["gate_wait_s"].max() > 0.5, trials[["gate_wait_s", "startup_s", "bench_s"]]
        # On the CPU engine the one lever is warm_start (its default); the GPU ones add no flag.
        assert [list(v) for v in trials["startup_levers"]] == [["warm_start"], ["warm_start"]]
        assert "--max-cudagraph-capture-size" not in list(tuned["vllm_argv"])
        # The baseline passes none of the tuned flags; the tuned trial passes all four.
        assert "--max-num-seqs" not in list(baseline["vllm_argv"])
        assert "--max-num-seqs" in list(tuned["vllm_argv"])
        assert str(tuned["param_max_num_seqs"]) in list(tuned["vllm_argv"])
        for _, row in trials.iterrows():
            assert row["completed"] == 40 and row["failed"] == 0
            assert row["output_throughput"] > 0 and row["p99_ttft_ms"] > 0
            assert row["startup_s"] > 1 and row["bench_s"] > 0
            assert row["feasible"] == (row["p99_ttft_ms"] <= 2000 and row["p99_tpot_ms"] <= 100)
            # Start-up phases from the server's own log (engine.startup_log): each known, >= 0,
            # adding up to startup_s; the log carries every closing line, so the API phase
            # (the remainder) is only the app and uvicorn starting, not a missed phase.
            phases = [row[c] for c in PHASES]
            assert all(pd.notna(v) and v >= 0 for v in phases), dict(zip(PHASES, phases))
            assert sum(phases) == pytest.approx(row["startup_s"], rel=0.05)
            assert row["startup_api_s"] < 10, dict(zip(PHASES, phases))
            log = Path(row["server_log"])
            marks = read_marks((log if log.is_absolute() else short_tmp / log).read_text())
            assert marks.weights_end <= marks.engine_end <= marks.api_start, marks
        # The quality probe: the baseline probes twice (its self-agreement, stored with its
        # answers); the tuned trial changes no flag that changes outputs and is not probed.
        assert baseline["quality_ok"] and baseline["token_agreement"] == baseline[
            "quality_baseline_agreement"]
        assert pd.isna(tuned["token_agreement"]) and pd.isna(tuned["quality_ok"])
        assert (short_tmp / "results" / "e2e" / "probes" / "trial-00000.parquet").is_file()
        assert not (short_tmp / "results" / "e2e" / "probes" / "trial-00001.parquet").exists()

        requests = duckdb.sql(
            f"SELECT trial_number, count(*) AS n, sum(output_tokens) AS out, sum(prompt_tokens) AS inp "
            f"FROM read_parquet('{short_tmp}/results/e2e/requests/**/*.parquet', hive_partitioning=true) "
            "GROUP BY trial_number ORDER BY trial_number").fetchall()
        assert [r[0] for r in requests] == [0, 1]
        for (_number, n, out, inp), (_, row) in zip(requests, trials.iterrows()):
            assert n == 40
            assert out == row["total_output_tokens"] and inp == row["total_input_tokens"]

        # Same sweep again: the study is complete, nothing runs, nothing is duplicated.
        again = run_cli(["run", str(sweep)], short_tmp, env, timeout_s=300)
        assert again.returncode == 0, again.stderr[-2000:]
        assert "nothing to run" in again.stdout
        assert len(read_trials(short_tmp / "results", "e2e")) == 2

        # Extending continues the numbering of the same study.
        more = run_cli(["run", str(sweep), "--add-trials", "1"], short_tmp, env, timeout_s=600)
        assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
        trials = read_trials(short_tmp / "results", "e2e")
        assert list(trials["trial_number"]) == [0, 1, 2]
        assert set(trials["diagnosis"]) <= set(VERDICTS) - {"not_measured"}, trials["diagnosis"]
        assert trials["diagnosis_detail"].str.len().gt(20).all()
        assert (trials["est_kv_tokens_capacity"] > 0).all()  # the CPU engine's KV space model
        assert (trials["output_throughput_per_gpu"] == trials["output_throughput"]).all()  # TP 1
        assert trials["vllm_sweep_commit"].str.fullmatch(r"[0-9a-f]{40}").all()
        assert trials["hardware"].str.startswith("cpu: ").all()
        assert trials["workload_sha256"].nunique() == 1 and trials["model_config_sha256"].nunique() == 1

        # The report of this real sweep renders in headless Chromium with its plots, no errors.
        html, rendered = check_sweep_report(sweep, short_tmp, env)
        assert rendered.plot_count >= 3 and html.parent == short_tmp / "results" / "e2e"
    finally:
        assert wait_no_marked_processes(marker) == []


@pytest.mark.timeout(600)
def test_ctrl_c_mid_trial_stops_everything_and_keeps_results(tiny_model, short_tmp):
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = write_sweep(short_tmp, tiny_model, n_trials=3, name="intr")
    proc = start_driver(sweep, short_tmp, env)
    try:
        seen = read_until(proc, "starting server", timeout_s=300)
        assert "starting server" in seen, seen
        time.sleep(8)  # the server actor is up and vLLM is starting
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, seen + out
        assert "interrupted" in out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        left = wait_no_marked_processes(marker)
    assert left == []
    trials = read_trials(short_tmp / "results", "intr")
    assert list(trials["trial_number"]) == [0]
    assert trials.iloc[0]["state"] == "FAIL" and trials.iloc[0]["fail_reason"] == "interrupted"


@pytest.mark.timeout(900)
def test_capacity_mode_on_real_vllm_gives_a_capacity_per_trial(tiny_model, short_tmp):
    """A real CPU sweep in capacity mode: each COMPLETE trial ends with capacity_rps, the
    highest rate at which its SLA held, measured in rate steps on the same server. Then its
    shipped configuration exported in every format (#20), each checked by its platform's
    schema."""
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = write_sweep(short_tmp, tiny_model, n_trials=2, name="capacity")
    spec = yaml.safe_load(sweep.read_text())
    spec.pop("objective")  # capacity: implies the objective capacity_rps
    spec["workload"].update({"num_prompts": 60, "max_concurrency": None, "warmup_requests": 4})
    spec["sla"] = {"p99_ttft_ms": 300, "p99_tpot_ms": 60}
    spec["capacity"] = {"start_rate": 4.0, "tolerance": 0.3, "max_steps": 5,
                        "step_duration_s": 3.0, "min_requests": 10}
    spec["target"] = {"request_rate": 40.0, "headroom": 0.2}  # only `export` reads these
    spec["pricing"] = {"per_replica_hour": 0.5}
    sweep.write_text(yaml.safe_dump(spec))
    try:
        res = run_cli(["run", str(sweep)], short_tmp, env, timeout_s=700)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "req/s: SLA" in res.stdout
    finally:
        assert wait_no_marked_processes(marker) == []
    trials = read_trials(short_tmp / "results", "capacity")
    row = trials.iloc[0]
    assert row["state"] == "COMPLETE", row["fail_detail"]
    # the tiny model serves ~70 req/s on this machine: the start rate, 4 req/s, holds the SLA
    assert row["capacity_rps"] >= 4.0 and row["objective"] == row["capacity_rps"]
    assert 2 <= row["capacity_steps"] <= 5  # 4 req/s held, so at least one higher rate was tried
    steps = duckdb.sql(
        f"SELECT step, any_value(rate), quantile_cont(ttft_ms, 0.99), quantile_cont(tpot_ms, 0.99),"
        f" count(*) FILTER (WHERE NOT success) FROM read_parquet('{short_tmp}/results/capacity/"
        "requests/**/*.parquet') GROUP BY step ORDER BY step").fetchall()
    assert [s[0] for s in steps] == list(range(int(row["capacity_steps"])))
    assert steps[0][1] == 4.0
    assert row["capacity_rps"] in {s[1] for s in steps}
    assert row["p99_ttft_ms"] <= 300 and row["p99_tpot_ms"] <= 60  # the metrics at capacity
    for _, rate, p99_ttft, p99_tpot, failed in steps:
        if rate > row["capacity_rps"]:  # every rate tried above the capacity broke the SLA
            assert p99_ttft > 300 or p99_tpot > 60 or failed, (rate, p99_ttft, p99_tpot)
    check_exports(sweep, trials, short_tmp, str(tiny_model))


def check_exports(sweep, trials, tmp, model):
    """Every `export` format of the real sweep: what `best` ships, sized by framework.fleet,
    each file accepted by Ray Serve LLM's config classes / Kubernetes' schemas."""
    best = cli_in_process("best", str(sweep), "--format", "yaml")
    assert best.returncode == 0, best.stderr
    shipped = yaml.safe_load(best.stdout)
    row = trials[trials["trial_number"] == shipped["trial"]].iloc[0]
    # 40 req/s x 1.2 over the shipped configuration's capacity (one server: its row's value)
    replicas = math.ceil(40.0 * 1.2 / row["capacity_rps"] - 1e-9)

    res = cli_in_process("export", str(sweep), "--format", "serve")
    assert res.returncode == 0 and res.stdout == shipped["command"] + "\n"
    assert res.stdout.startswith(f"vllm serve {model}")

    doc = json.loads(cli_in_process("export", str(sweep), "--format", "json").stdout)
    assert doc["trial"] == shipped["trial"] and doc["flags"] == shipped["flags"]
    assert doc["verdict"] == shipped["verdict"]
    assert doc["fleet"]["replicas"] == replicas and doc["fleet"]["gpus_per_replica"] == 1
    assert doc["fleet"]["cost_per_hour"] == pytest.approx(replicas * 0.5)
    assert doc["cost_per_mtok"] == pytest.approx(0.5 / (row["output_throughput"] * 3600) * 1e6)

    out = tmp / "serve.yaml"
    res = cli_in_process("export", str(sweep), "--format", "ray-serve", "-o", str(out))
    assert res.returncode == 0, res.stderr
    app = yaml.safe_load(out.read_text())
    assert check_ray_serve_config(app) == 1  # Ray Serve LLM's LLMServingArgs / engine config
    (llm,) = app["applications"][0]["args"]["llm_configs"]
    assert llm["deployment_config"] == {"num_replicas": replicas}
    assert llm["engine_kwargs"]["max_model_len"] == 512 and llm["accelerator_config"] == {"kind": "cpu"}

    res = cli_in_process("export", str(sweep), "--format", "k8s")
    assert res.returncode == 0 and "&id" not in res.stdout  # no YAML anchors
    deployment, service = yaml.safe_load_all(res.stdout)
    for manifest in (deployment, service):
        kubernetes_validate.validate(manifest, "1.33.0", strict=True)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert deployment["spec"]["replicas"] == replicas and "resources" not in container  # CPU
    assert container["args"][:1] == [model] and "--max-model-len" in container["args"]
