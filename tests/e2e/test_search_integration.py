"""The search end to end on a private Ray with 8 fake GPUs and FakeEngine servers (the named
stand-in: what is under test is the feasibility model, the study and the rows, not vLLM): the
70B model's real config.json on A100-80GB, a grid over tensor-parallel sizes, two objectives.
Configurations the memory model rules out are INFEASIBLE rows that never launch, told to
Optuna as violated constraints; the rest run and form a Pareto front."""

from __future__ import annotations

from pathlib import Path

import duckdb
import optuna
import pandas as pd
import pytest
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from tests.cli import cli_in_process
from tests.cli import run_joined
from tests.clusters import SharedRay
from tests.clusters import join_shared
from tests.paths import ROOT
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_trials

pytestmark = pytest.mark.server


MODEL_70B = ROOT / "model_configs" / "deepseek-r1-distill-llama-70b"


def run_fake_sweep(ray: SharedRay, tmp: Path, name: str, parameters: dict, model: Path,
                   max_concurrent_trials: int | None = 1, **sections) -> tuple[str, Path]:
    """Write a FakeEngine sweep on the session's shared Ray (one trial at a time unless told
    otherwise) with these search parameters and sweep sections, run it in-process, check it
    exited 0 and left no trial process; returns its stdout and the sweep file."""
    space = tmp / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"parameters": parameters}))
    sweep = tmp / f"{name}.yaml"
    sweep.write_text(yaml.safe_dump(join_shared({
        "name": name, "model": str(model), "search_space": str(space), "engine": "fake",
        "results_dir": str(tmp / "results"), **sections}, ray, max_concurrent_trials)))
    res = run_joined(ray, ["run", str(sweep)], tmp)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout, sweep


@pytest.mark.timeout(300)
def test_infeasible_configurations_never_launch_and_the_rest_form_a_pareto_front(
        shared_ray, tiny_model, short_tmp):
    out, sweep = run_fake_sweep(
        shared_ray, short_tmp, "tp70b",
        {"tensor-parallel-size": {"type": "categorical", "choices": [1, 2, 4, 8]}},
        MODEL_70B, gpu="A100-80GB",
        server={"env": {"FAKE_ENGINE_STARTUP_S": "0.3", "FAKE_ENGINE_TPOT_MS": "5"}},
        workload={"tokenizer": str(tiny_model), "num_prompts": 16, "input_len": 16,
                  "output_len": 8, "max_concurrency": 4, "warmup_requests": 0},
        objective={"metric": "output_throughput_per_gpu", "direction": "maximize",
                   "pareto_with": ["p99_ttft_ms"]},
        sla={"p99_ttft_ms": 60000},
        search={**NO_REMEASURE, "sampler": "grid", "n_trials": 50, "baseline": False},
        max_concurrent_trials=None)  # as many as fit the shared Ray's 8 fake GPUs
    assert "the grid holds 4 configurations" in out

    trials = read_trials(short_tmp / "results", "tp70b").set_index("param_tensor_parallel_size")
    assert sorted(trials.index) == [1, 2, 4, 8]
    for tp in (1, 2):
        row = trials.loc[tp]
        assert row["state"] == "INFEASIBLE" and row["fail_reason"] == "infeasible"
        assert len(row["placement"]) == 0 and len(row["vllm_argv"]) == 0  # never launched
    assert "weights need 131" in trials.loc[1, "fail_detail"]  # GiB per GPU at TP 1
    assert "131072-token sequence needs" in trials.loc[2, "fail_detail"]
    assert trials.loc[1, "est_weights_gib_per_gpu"] == pytest.approx(
        2 * trials.loc[2, "est_weights_gib_per_gpu"])
    for tp in (4, 8):
        row = trials.loc[tp]
        assert row["state"] == "COMPLETE", row["fail_detail"]
        assert row["est_kv_tokens_capacity"] > 131072 and row["est_max_resident_seqs"] >= 1
        assert row["output_throughput_per_gpu"] == pytest.approx(row["output_throughput"] / tp)
        assert row["objective"] == pytest.approx(row["output_throughput_per_gpu"])
        assert len(row["placement"]) == tp

    backend = JournalFileBackend(str(short_tmp / "results" / "tp70b" / "optuna.journal"))
    study = optuna.load_study(study_name="tp70b", storage=JournalStorage(backend))
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    by_tp = {t.params["tensor-parallel-size"]: t for t in study.trials}
    # weights 131 GiB vs 72.8 usable: 0.8 short; KV for one sequence 20 GiB vs 5.2: 2.8 short
    assert 0.5 < by_tp[1].constraints["feasibility"] < by_tp[2].constraints["feasibility"]
    assert by_tp[4].constraints["feasibility"] == 0 and by_tp[8].constraints["feasibility"] == 0
    front = {t.params["tensor-parallel-size"] for t in study.best_trials}
    assert front and front <= {4, 8}

    pareto = cli_in_process("best", str(sweep), "--pareto", cwd=short_tmp)
    assert pareto.returncode == 0, pareto.stderr
    assert pareto.stdout.startswith("Pareto front of output_throughput_per_gpu, p99_ttft_ms")
    assert "--tensor-parallel-size 1 " not in pareto.stdout

    status = cli_in_process("status", str(sweep), cwd=short_tmp)
    assert "infeasible (not launched) 2" in status.stdout, status.stdout + status.stderr


@pytest.mark.timeout(300)
def test_capacity_mode_finds_a_higher_capacity_for_a_larger_batch(
        shared_ray, tiny_model, short_tmp):
    """FakeEngine decodes at most max-num-seqs requests at once (20 ms per token, 16 tokens):
    about 3 requests/s per slot, so 8 slots hold the TTFT limit at a higher rate than 2.
    Guards the capacity search (bracket from the start rate, then bisect; capacity = the highest
    step that held; each step's requests stored) and its stop once a step's SLA surely broke.
    Steps of 2 s from 4 req/s, at most 4 per trial: 2 slots (~6 req/s) break at 16 req/s at the
    latest (a queue of ~20 requests, ~3 s of TTFT) and bisect once; 8 slots (~24 req/s) hold
    through 32 req/s or break there. A queue of 2 s at up to 1.3x the rate a configuration holds
    stays under the 1 s limit, so either capacity may come out up to ~1.3x high, never near the
    other's (4x apart)."""
    out, _ = run_fake_sweep(
        shared_ray, short_tmp, "cap", {"max-num-seqs": {"type": "categorical", "choices": [2, 8]}},
        tiny_model,
        server={"env": {"FAKE_ENGINE_STARTUP_S": "0.3", "FAKE_ENGINE_TTFT_MS": "20",
                        "FAKE_ENGINE_TPOT_MS": "20"}},
        workload={"num_prompts": 80, "input_len": 16, "output_len": 16, "warmup_requests": 0},
        sla={"p99_ttft_ms": 1000},
        capacity={"start_rate": 4.0, "tolerance": 0.25, "max_steps": 4, "step_duration_s": 2.0,
                  "min_requests": 10},
        search={**NO_REMEASURE, "sampler": "grid", "n_trials": 2, "baseline": False})
    assert "req/s: SLA holds" in out and "req/s: SLA broken" in out

    trials = read_trials(short_tmp / "results", "cap").set_index("param_max_num_seqs")
    assert list(trials["state"]) == ["COMPLETE", "COMPLETE"]
    small, large = trials.loc[2], trials.loc[8]
    assert 0 < small["capacity_rps"] < large["capacity_rps"], (small["capacity_rps"], large["capacity_rps"])
    assert (trials["objective"] == trials["capacity_rps"]).all()
    assert (trials["p99_ttft_ms"] <= 1000).all()  # the metrics are those at the capacity rate

    steps = duckdb.sql(
        f"SELECT trial_number, step, any_value(rate) AS rate, count(*) AS n FROM read_parquet("
        f"'{short_tmp}/results/cap/requests/**/*.parquet') GROUP BY ALL ORDER BY ALL").df()
    for number, row in trials.reset_index().set_index("trial_number").iterrows():
        mine = steps[steps["trial_number"] == number]
        assert list(mine["step"]) == list(range(int(row["capacity_steps"])))
        assert list(mine["rate"][:2]) == [4.0, 8.0] or mine["rate"].iloc[1] == 2.0
        assert row["capacity_rps"] in set(mine["rate"])
        # steps that held ran out all their requests (at least min_requests); broken ones
        # may have stopped early, once their SLA was surely broken
        assert (mine[mine["rate"] <= row["capacity_rps"]]["n"] >= 10).all()
    assert trials["stopped_early"].notna().any()


@pytest.mark.timeout(300)
def test_capacity_over_multi_turn_steps_the_session_rate(shared_ray, tiny_model, short_tmp):
    """#34 item 2: capacity mode on a multi-turn workload (refused before) steps the rate at
    which sessions start: a step at r sessions/s starts round(r x 2 s) sessions (at least 3, at
    most the 20 drawn), each sending its 3 turns; the request rows carry the step and the
    session rate, and capacity_rps is in sessions/s. The SLA is loose enough never to break,
    so the steps double from the start rate to the step cap: 1, 2, 4 sessions/s."""
    out, _ = run_fake_sweep(
        shared_ray, short_tmp, "capmt", {"max-num-seqs": {"type": "categorical", "choices": [4]}},
        tiny_model,
        server={"env": {"FAKE_ENGINE_STARTUP_S": "0.3", "FAKE_ENGINE_TPOT_MS": "5"}},
        workload={"dataset": "multi_turn", "warmup_requests": 0, "multi_turn": {
            "num_sessions": 20, "turns": {"distribution": "constant", "value": 3},
            "prompt_tokens": {"distribution": "constant", "value": 16},
            "output_tokens": {"distribution": "constant", "value": 4}}},
        sla={"p99_ttft_ms": 600000},
        capacity={"start_rate": 1.0, "max_steps": 3, "step_duration_s": 2.0, "min_requests": 3},
        search={**NO_REMEASURE, "sampler": "grid", "n_trials": 1, "baseline": False})
    assert "sessions/s: SLA holds" in out and "requests in 3 sessions" in out, out[-3000:]
    trial = read_trials(short_tmp / "results", "capmt").iloc[0]
    assert trial["state"] == "COMPLETE" and trial["capacity_steps"] == 3
    assert trial["capacity_rps"] == 4.0 == trial["objective"]
    steps = duckdb.sql(
        f"SELECT step, any_value(rate) AS rate, count(*) AS n FROM read_parquet("
        f"'{short_tmp}/results/capmt/requests/**/*.parquet') GROUP BY ALL ORDER BY ALL").fetchall()
    assert steps == [(0, 1.0, 3 * 3), (1, 2.0, 4 * 3), (2, 4.0, 8 * 3)]


@pytest.mark.timeout(300)
def test_a_run_whose_sla_surely_broke_stops_early_with_the_same_verdict(
        shared_ray, tiny_model, short_tmp):
    """max-num-seqs 1 queues 40 requests sent at once behind one slot (~0.35 s each): TTFT
    passes 1 s after a few requests, so p90 over 40 is surely broken long before the end."""
    out, _ = run_fake_sweep(
        shared_ray, short_tmp, "early", {"max-num-seqs": {"type": "categorical", "choices": [1, 64]}},
        tiny_model,
        server={"env": {"FAKE_ENGINE_STARTUP_S": "0.3", "FAKE_ENGINE_TTFT_MS": "20",
                        "FAKE_ENGINE_TPOT_MS": "20"}},
        workload={"num_prompts": 40, "input_len": 16, "output_len": 16, "warmup_requests": 0,
                  "percentiles": [90]},
        sla={"p90_ttft_ms": 1000},
        search={**NO_REMEASURE, "sampler": "grid", "n_trials": 2, "baseline": False})
    assert "SLA surely broken" in out

    trials = read_trials(short_tmp / "results", "early").set_index("param_max_num_seqs")
    narrow, wide = trials.loc[1], trials.loc[64]
    assert narrow["state"] == "COMPLETE" and narrow["feasible"] == False  # noqa: E712
    assert narrow["stopped_early"].startswith("p90_ttft_ms: at least")
    assert 5 <= narrow["completed"] < 20  # stopped long before its 40 requests
    assert wide["feasible"] == True and pd.isna(wide["stopped_early"])  # noqa: E712
    assert wide["completed"] == 40


@pytest.mark.timeout(300)
def test_repeated_runs_on_one_server_give_a_mean_and_an_interval(
        shared_ray, tiny_model, short_tmp):
    """Three runs of 24 requests, 4 at a time, ~0.37 s each (20 ms + 7 x 50 ms): ~2.2 s a run,
    so a stall of a loaded machine in one run (under ~4.5 s: twice a run) keeps the objective's
    cv under 0.5; runs of ~0.33 s reached it with a stall of ~0.7 s."""
    out, _ = run_fake_sweep(
        shared_ray, short_tmp, "rep", {"max-num-seqs": {"type": "categorical", "choices": [16]}}, tiny_model,
        server={"env": {"FAKE_ENGINE_STARTUP_S": "0.3", "FAKE_ENGINE_TPOT_MS": "50"}},
        workload={"num_prompts": 24, "input_len": 16, "output_len": 8, "max_concurrency": 4,
                  "warmup_requests": 0},
        sla={"p99_ttft_ms": 5000},
        search={**NO_REMEASURE, "sampler": "grid", "n_trials": 1, "baseline": False, "repeats": 3,
                "sla_on": "ci_upper"})
    assert "under load (run 3/3)" in out

    row = read_trials(short_tmp / "results", "rep").iloc[0]
    requests = duckdb.sql(f"SELECT step, count(*) AS n, count(DISTINCT prompt_tokens) AS lens "
                          f"FROM read_parquet('{short_tmp}/results/rep/requests/**/*.parquet') "
                          "GROUP BY step ORDER BY step").fetchall()
    assert [(s, n) for s, n, _ in requests] == [(0, 24), (1, 24), (2, 24)]
    assert row["repeats"] == 3 and row["completed"] == 72  # counts add up over the runs
    assert row["objective_ci95_low"] <= row["objective"] <= row["objective_ci95_high"]
    assert 0 <= row["objective_cv"] < 0.5
    assert row["p99_ttft_ms_ci95_high"] >= row["p99_ttft_ms"] and row["feasible"]


@pytest.mark.timeout(300)
def test_confirmation_runs_remeasure_the_top_configurations_and_best_uses_them(
        shared_ray, tiny_model, short_tmp):
    """Guards the confirmation round: the top `confirm_top` feasible configurations (not all,
    not others) measured once more on fresh servers, once per study (not again on resume), and
    `best` estimating the winner from its confirmation run. Three configurations, two
    confirmed: the smallest grid in which one is left out."""
    out, sweep = run_fake_sweep(
        shared_ray, short_tmp, "confirm",
        {"max-num-seqs": {"type": "categorical", "choices": [2, 4, 8]}},
        tiny_model,
        server={"env": {"FAKE_ENGINE_STARTUP_S": "0.3", "FAKE_ENGINE_TPOT_MS": "10"}},
        workload={"num_prompts": 24, "input_len": 16, "output_len": 8, "max_concurrency": 16,
                  "warmup_requests": 0},
        sla={"p99_ttft_ms": 60000},
        search={"sampler": "grid", "n_trials": 3, "baseline": False, "confirm_top": 2,
                "baseline_repeats": 0})
    assert "confirmation runs on fresh servers: the 2 best feasible configurations once more" in out
    assert "confirmation run of trial" in out

    trials = read_trials(short_tmp / "results", "confirm")
    originals = trials[trials["confirmation_of"].isna()]
    confirms = trials.dropna(subset=["confirmation_of"])
    assert len(originals) == 3 and len(confirms) == 2
    top = originals.sort_values("objective", ascending=False).head(2)
    assert set(confirms["confirmation_of"].astype(int)) == set(top["trial_number"])
    for _, row in confirms.iterrows():
        original = originals[originals["trial_number"] == int(row["confirmation_of"])].iloc[0]
        assert row["param_max_num_seqs"] == original["param_max_num_seqs"]

    again = run_joined(shared_ray, ["run", str(sweep)], short_tmp)
    assert "nothing to run" in again.stdout  # confirmed once, not on every resume
    # the winner is estimated from its confirmation run alone (the run that picked it won a
    # maximum over noisy trials: results.verdict)
    again_values = {int(r["confirmation_of"]): r["objective"] for _, r in confirms.iterrows()}
    best = cli_in_process("best", str(sweep), cwd=short_tmp)
    winner = max(again_values, key=again_values.__getitem__)
    assert best.stdout.strip() == originals.set_index("trial_number").loc[winner, "serve_command"]
