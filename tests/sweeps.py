"""Sweep files and results for tests: sweep documents (write_sweep, write_fake_sweep,
killed_sweep_file), stored rows (write_rows, read_trials), FakeEngine's occupancy log, and
the keys of `vllm bench serve`'s result file."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from pathlib import Path

import duckdb
import pandas as pd
import yaml

from framework.config.search_space import load_search_space
from framework.results.rows import TrialContext
from framework.results.rows import trial_columns
from framework.results.rows import trial_row
from framework.results.store import ResultStore
from framework.trial.objective import Verdict
from framework.trial.run import TrialOutcome
from tests.paths import ROOT

# Tests measure each configuration once: no baseline re-measurements or confirmation runs (the
# defaults add them; tests/e2e/test_search_integration.py tests them on FakeEngine).
NO_REMEASURE = {"confirm_top": 0, "baseline_repeats": 0}


def write_sweep(tmp: Path, model: Path, n_trials: int, name: str = "e2e") -> Path:
    """A sweep of `n_trials` vLLM CPU trials of 40 requests each. Its SLA is one any machine
    holds and its runs are never cut (stop_early off): one stall of a loaded machine would
    otherwise cut a run below its 40 requests, or leave no trial feasible (exit 4)."""
    sweep = {
        "name": name,
        "model": str(model),
        "search_space": str(ROOT / "search_spaces" / "tiny_cpu.yaml"),
        "server": {"args": {"enforce-eager": True, "max-model-len": 512},
                   "startup_timeout_s": 240},
        "workload": {"num_prompts": 40, "input_len": 64, "output_len": 16,
                     "max_concurrency": 8, "warmup_requests": 8, "seed": 1},
        "objective": {"metric": "output_throughput", "direction": "maximize"},
        "sla": {"p99_ttft_ms": 60000, "p99_tpot_ms": 1000},
        "search": {**NO_REMEASURE, "n_trials": n_trials, "seed": 3, "stop_early": False},
        "results_dir": str(tmp / "results"),
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def read_trials(results: Path, name: str) -> pd.DataFrame:
    return duckdb.sql(
        f"SELECT * FROM read_parquet('{results}/{name}/trials/**/*.parquet', hive_partitioning=true)"
        " ORDER BY trial_number").df()


def shipped_example(name: str, model: Path, tmp: Path, prompts: int) -> dict:
    """sweeps/<name>.yaml as a test runs it: this test's model and results folder, `prompts`
    requests after 4 warm-ups, no confirmation runs, every request sent (no early stop)."""
    sweep = yaml.safe_load((ROOT / "sweeps" / f"{name}.yaml").read_text())
    sweep["model"] = str(model)
    sweep["search_space"] = str(ROOT / sweep["search_space"])
    sweep["results_dir"] = str(tmp / "results")
    sweep["workload"].update(num_prompts=prompts, warmup_requests=4)
    sweep["search"].update(confirm_top=0, stop_early=False)
    return sweep


def read_requests(results: Path, name: str) -> pd.DataFrame:
    return duckdb.sql(
        f"SELECT * FROM read_parquet('{results}/{name}/requests/**/*.parquet', "
        "hive_partitioning=true, union_by_name=true) ORDER BY trial_number, request_index").df()


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def killed_sweep_file(tmp: Path, tiny_model: Path) -> Path:
    """The sweep file of write_rows' stored sweep `killed`, results under tmp/results."""
    path = tmp / "killed.yaml"
    path.write_text(yaml.safe_dump({
        "name": "killed", "model": str(tiny_model),
        "search_space": str(ROOT / "search_spaces" / "tiny_cpu.yaml"),
        "server": {"args": {"enforce-eager": True, "max-model-len": 512}},
        "workload": {"percentiles": [50, 99]}, "search": {"n_trials": 10},
        "results_dir": str(tmp / "results")}))
    return path


def write_rows(results: Path) -> None:
    """Five stored trials of a killed sweep `killed`: baseline, a better one, a better but
    infeasible one, a start-up crash and an infeasible configuration."""
    space = load_search_space(ROOT / "search_spaces" / "tiny_cpu.yaml")
    columns = trial_columns(space, (50, 99))
    store = ResultStore(results, "killed")
    base = {"max-num-seqs": 128, "max-num-batched-tokens": 2048, "enable-chunked-prefill": True,
            "enable-prefix-caching": True}
    cases = [  # number, params, baseline, objective, feasible, fail_reason
        (0, base, True, 100.0, True, None),
        (1, {**base, "max-num-seqs": 16}, False, 150.0, True, None),
        (2, {**base, "max-num-seqs": 4}, False, 400.0, False, None),  # best value, but infeasible
        (3, {**base, "max-num-seqs": 8}, False, None, None, "startup_crash"),
        (4, {**base, "max-num-seqs": 2}, False, None, None, "infeasible"),
    ]
    for number, params, baseline, objective, feasible, fail in cases:
        outcome = TrialOutcome(started_at=T0 + timedelta(seconds=60 * number), argv=("--x",),
                               trial_s=40.0, fail_reason=fail,
                               metrics={"completed": 10, "failed": 0} if fail is None else {})
        verdict = None if fail else Verdict(objective, feasible, {}, ())
        ctx = TrialContext(number=number, params=params, is_baseline=baseline,
                           serve_command=f"vllm serve m --trial {number}", vllm_version="x",
                           server_log="")
        store.write_trial(trial_row(ctx, outcome, verdict, columns), columns)


SAMPLE = ROOT / "datasets" / "sharegpt_sample.json"


# The keys `vllm bench serve` 0.32 wrote (openai backend, no --save-detailed, --goodput given,
# --percentile-metrics ttft,e2el --metric-percentiles 50,99), in its order.
VLLM_KEYS = [
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
    "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
    "max_concurrent_requests", "rtfx", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
    "p50_ttft_ms", "p99_ttft_ms", "mean_e2el_ms", "median_e2el_ms", "std_e2el_ms", "p50_e2el_ms",
    "p99_e2el_ms",
]


DETAIL_KEYS = ["input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors"]


NAME = "fake-report"


def write_fake_sweep(folder: Path, model: Path, address: str | None) -> Path:
    space = folder / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 8, 128], "default": 128},
        "tensor-parallel-size": {"type": "categorical", "choices": [1, 4], "default": 1},
    }}, sort_keys=False))
    sweep = folder / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": NAME, "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"host": "node", "env": {"FAKE_ENGINE_STARTUP_S": "0",
                                            "FAKE_ENGINE_TTFT_MS": "30",
                                            "FAKE_ENGINE_TPOT_MS": "30"}},
        "workload": {"num_prompts": 32, "input_len": 8, "output_len": 32, "max_concurrency": 8,
                     "warmup_requests": 0, "request_timeout_s": 60},
        # a request takes ~1 s (30 ms + 31 x 30 ms): 128 slots answer in ~30 ms, far under
        # the SLA (a stall of a loaded machine stays under it too), 2 slots queue the other
        # 6 requests in flight, their TTFT ~2-3 s
        "sla": {"p99_ttft_ms": 1500, "p99_tpot_ms": 200},
        # after the baseline, seed 10 proposes max-num-seqs 2 (TTFT over the SLA, so its run
        # stops early after a few requests: the report marks it and leaves it out of the
        # plots), 128, then TP 4 (on a cluster of fewer than 4 GPUs, one that cannot be placed;
        # tests/e2e/test_html_report.py swaps it for TP 16 on the shared Ray's 8)
        "search": {**NO_REMEASURE, "sampler": "random", "n_trials": 4, "baseline": True,
                   "seed": 10, "stop_early": True},
        "cluster": {"address": address, "max_concurrent_trials": 1},
        "results_dir": str(folder / "results"),
    }))
    return sweep


def occupancy_events(path: Path) -> tuple[dict[str, float], dict[int, list[dict]]]:
    """FakeEngine's occupancy log: when each group was released (group id -> wall time), and
    each trial's device events (trial number from the event's tag, the trial's log path)."""
    events = [json.loads(line) for line in path.read_text().splitlines()]
    released = {e["group"]: e["t"] for e in events if e.get("released")}
    by_trial: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if not e.get("released"):
            by_trial[int(Path(e["tag"]).stem.split("-")[1])].append(e)
    return released, by_trial


def trials_on(text: str) -> dict[str, int]:
    """Node IP -> the first trial whose worker FakeEngine's occupancy log (its text) shows on
    that node (the trial number from the event's tag, the trial's log path); release events
    (no node) and a last line still being written are skipped."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "node_ip" in event:
            found.setdefault(event["node_ip"], int(Path(event["tag"]).stem.split("-")[1]))
    return found
