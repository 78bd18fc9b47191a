"""Real vLLM servers that fail: killed in the middle of the load (FAIL(server_died) with the
log tail, the request rows measured so far kept, the sweep's other trials unaffected), and out
of KV cache memory at start-up (FAIL(oom_at_startup))."""

from __future__ import annotations

import time

import duckdb
import pandas as pd
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
    write_sweep,
)

pytestmark = pytest.mark.server


@pytest.mark.timeout(900)
def test_engine_killed_mid_load_is_server_died_with_partial_rows(tiny_model, short_tmp):
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = write_sweep(short_tmp, tiny_model, n_trials=2, name="faults")
    spec = yaml.safe_load(sweep.read_text())
    spec["workload"].update({"num_prompts": 400, "output_len": 32, "request_rate": 25.0})
    sweep.write_text(yaml.safe_dump(spec))
    with cli_process(["run", str(sweep)], short_tmp, env) as proc:
        seen = read_until(proc, "trial 0: under load", timeout_s=400)
        assert "trial 0: under load" in seen, seen
        time.sleep(3)
        engines = [p for p in marked_processes(marker) if "EngineCore" in " ".join(p.cmdline())]
        assert engines, "no vLLM EngineCore process found"
        for p in engines:
            p.kill()
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, seen + out
    trials = read_trials(short_tmp / "results", "faults")
    assert list(trials["trial_number"]) == [0, 1]
    dead = trials.iloc[0]
    assert dead["state"] == "FAIL" and dead["fail_reason"] == "server_died", dead["fail_detail"]
    assert dead["log_tail"] and len(dead["log_tail"].splitlines()) <= 50
    assert trials.iloc[1]["state"] == "COMPLETE"
    n, ok = duckdb.sql(
        f"SELECT count(*), count(*) FILTER (WHERE success) FROM read_parquet("
        f"'{short_tmp}/results/faults/requests/**/*.parquet', hive_partitioning=true) "
        "WHERE trial_number = 0").fetchall()[0]
    assert n > 0 and 0 < ok < 400, (n, ok)
    assert wait_no_marked_processes(marker) == []


@pytest.mark.timeout(600)
def test_kv_cache_too_small_at_startup_is_oom_at_startup(tiny_model, short_tmp):
    """Two KV blocks cannot hold one 512-token sequence: vLLM's memory check stops the engine
    before ready; the trial is FAIL(oom_at_startup) naming vLLM's own numbers."""
    marker = new_marker()
    env = cli_env(marker, short_tmp)
    sweep = write_sweep(short_tmp, tiny_model, n_trials=1, name="oom")
    spec = yaml.safe_load(sweep.read_text())
    spec["server"]["args"]["num-gpu-blocks-override"] = 2
    sweep.write_text(yaml.safe_dump(spec))
    res = run_cli(["run", str(sweep)], short_tmp, env, timeout_s=500)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    trials = read_trials(short_tmp / "results", "oom")
    row = trials.iloc[0]
    assert row["fail_reason"] == "oom_at_startup", (row["fail_reason"], row["fail_detail"])
    assert "KV cache" in row["fail_detail"] and "512" in row["fail_detail"], row["fail_detail"]
    assert row["startup_s"] is None or pd.isna(row["startup_s"])
    assert wait_no_marked_processes(marker) == []
