"""Failure paths on a real private Ray with FakeEngine servers (the named stand-in: these paths
are about the driver, the actors and the process tree, not about vLLM): the whole-trial
deadline, SIGTERM of the driver (with re-queueing of the interrupted trial), a server actor
killed mid-load, and the API key (required by the server, never written anywhere)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import duckdb
import pytest
import yaml

from tests.helpers import (
    cli_env,
    cli_process,
    marked_processes,
    new_marker,
    read_trials,
    read_until,
    run_cli,
    wait_no_marked_processes,
)

pytestmark = pytest.mark.server


SECRET = "sk-vllm-sweep-test-3f9a7c1e"


def fake_sweep(tmp: Path, model: Path, name: str, *, tpot_ms: float, num_prompts: int,
               output_len: int, search: dict, server: dict | None = None) -> Path:
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 4], "default": 4}}}))
    sweep = tmp / f"{name}.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": name, "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"startup_timeout_s": 60, **(server or {}),
                   "env": {"FAKE_ENGINE_STARTUP_S": "0.5", "FAKE_ENGINE_TTFT_MS": "20",
                           "FAKE_ENGINE_TPOT_MS": str(tpot_ms)}},
        "workload": {"num_prompts": num_prompts, "input_len": 16, "output_len": output_len,
                     "max_concurrency": 2, "warmup_requests": 0},
        "sla": {"p99_ttft_ms": 60000},
        "search": {"n_trials": 1, "seed": 1, **search},
        "cluster": {"num_cpus": 2, "num_gpus": 2, "max_concurrent_trials": 1},
        "results_dir": str(tmp / "results"),
    }))
    return sweep


def request_count(results: Path, name: str, number: int) -> int:
    return duckdb.sql(f"SELECT count(*) FROM read_parquet('{results}/{name}/requests/**/*.parquet', "
                      f"hive_partitioning=true) WHERE trial_number = {number}").fetchall()[0][0]


@pytest.mark.timeout(300)
def test_trial_deadline_ends_the_trial_keeps_its_requests_and_the_api_key_stays_secret(
        tiny_model, short_tmp):
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = fake_sweep(short_tmp, tiny_model, "deadline", tpot_ms=200, num_prompts=16,
                       output_len=16, search={"trial_timeout_s": 8, "n_trials": 2},
                       server={"api_key_env": "SWEEP_TEST_KEY", "dummy_weights": True})
    missing = run_cli(["run", str(sweep)], short_tmp, env, timeout_s=120)
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.strip().count("\n") == 0 and "SWEEP_TEST_KEY" in missing.stderr

    env["SWEEP_TEST_KEY"] = SECRET
    res = run_cli(["run", str(sweep)], short_tmp, env, timeout_s=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert wait_no_marked_processes(marker) == []
    trials = read_trials(short_tmp / "results", "deadline")
    assert list(trials["fail_reason"]) == ["trial_timeout", "trial_timeout"], trials["fail_detail"]
    assert all("8 s deadline while under load" in d for d in trials["fail_detail"])
    assert all(7 <= t < 30 for t in trials["trial_s"]), list(trials["trial_s"])
    # 2 at a time, ~3.2 s each: the requests finished before the deadline are kept (and they
    # succeeded, so the key reached the server, which answers 401 without it).
    for number in (0, 1):
        n = request_count(short_tmp / "results", "deadline", number)
        assert 2 <= n < 16, n
    ok = duckdb.sql(f"SELECT count(*) FILTER (WHERE success) FROM read_parquet("
                    f"'{short_tmp}/results/deadline/requests/**/*.parquet')").fetchall()[0][0]
    assert ok >= 4
    assert trials["dummy_weights"].all()
    assert all(list(a)[list(a).index("--load-format") + 1] == "dummy" for a in trials["vllm_argv"])
    assert not trials["serve_command"].str.contains("load-format").any()
    leaked = [p for p in (short_tmp / "results").rglob("*")
              if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaked == [] and SECRET not in res.stdout + res.stderr


@pytest.mark.timeout(300)
def test_sigterm_of_the_driver_records_interrupted_and_requeues_it(tiny_model, short_tmp):
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = fake_sweep(short_tmp, tiny_model, "sigterm", tpot_ms=100, num_prompts=8,
                       output_len=16, search={"requeue_interrupted": True})
    with cli_process(["run", str(sweep)], short_tmp, env) as proc:
        seen = read_until(proc, "trial 0: under load", timeout_s=120)
        assert "trial 0: under load" in seen, seen
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, seen + out
    assert wait_no_marked_processes(marker) == []
    first = read_trials(short_tmp / "results", "sigterm")
    assert list(first["fail_reason"]) == ["interrupted"]

    again = run_cli(["run", str(sweep)], short_tmp, env, timeout_s=180)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert wait_no_marked_processes(marker) == []
    trials = read_trials(short_tmp / "results", "sigterm")
    assert list(trials["trial_number"]) == [0, 1]
    assert list(trials["state"]) == ["FAIL", "COMPLETE"]
    assert trials.iloc[1]["param_max_num_seqs"] == trials.iloc[0]["param_max_num_seqs"]
    assert request_count(short_tmp / "results", "sigterm", 1) == 8


@pytest.mark.timeout(300)
def test_server_actor_killed_mid_load_is_server_died_and_leaves_nothing(tiny_model, short_tmp):
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = fake_sweep(short_tmp, tiny_model, "actor", tpot_ms=100, num_prompts=16,
                       output_len=16, search={"n_trials": 2})
    with cli_process(["run", str(sweep)], short_tmp, env) as proc:
        seen = read_until(proc, "trial 0: under load", timeout_s=120)
        assert "trial 0: under load" in seen, seen
        actors = [p for p in marked_processes(marker) if "ServerActor" in " ".join(p.cmdline())]
        assert len(actors) == 1, [(p.pid, p.name()) for p in actors]
        os.kill(actors[0].pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, seen + out
    assert wait_no_marked_processes(marker) == []
    trials = read_trials(short_tmp / "results", "actor")
    assert list(trials["state"]) == ["FAIL", "COMPLETE"], trials[["fail_reason", "fail_detail"]]
    assert trials.iloc[0]["fail_reason"] == "server_died", trials.iloc[0]["fail_detail"]
    assert trials.iloc[0]["trial_s"] < 40  # no wait for node-death detection on the driver's node
