"""Real-GPU tests, for the first user who has GPUs: `make test-gpu` (skipped without CUDA).

Each runs a short sweep with `engine: gpu` on this machine's Ray (or RAY_ADDRESS's cluster)
and asserts what the fake-GPU contract test (tests/e2e/test_gpu_devices.py) proves on emulated
devices, here on real ones:
- two concurrent TP=1 trials on distinct GPUs both start (on one GPU the second would fail
  vLLM's free-memory check at start-up);
- a TP=2 trial starts;
- PP=2 x TP=1 where the cluster has two GPU nodes: on one node while a node has two GPUs
  free, across both once every node but one GPU is held (what placement promises, #32);
- the opt-in `fork_start` lever: vLLM forks its EngineCore instead of spawning it;
- the opt-in `warm_start` lever on a GPU: two warm trials, one after the other, both complete on
  the GPU and the second one's start-up is shorter than the first (which waited for the zygote).
The model is $VLLM_SWEEP_GPU_MODEL, else the tiny local Llama (`make model`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.cli import cli_env
from tests.cli import run_cli
from tests.paths import ROOT
from tests.procs import new_marker
from tests.procs import wait_no_marked_processes
from tests.reservations import gpus_held
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_trials

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def _model() -> Path:
    return Path(os.environ.get("VLLM_SWEEP_GPU_MODEL", ROOT / "models" / "tiny-llama"))


def _sweep(tmp: Path, name: str, parameters: dict, n_trials: int, concurrent: int,
           **server: object) -> Path:
    space = tmp / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"parameters": parameters}))
    sweep = tmp / f"{name}.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": name, "model": str(_model()), "search_space": str(space), "engine": "gpu",
        "server": {"args": {"max-model-len": 512, "gpu-memory-utilization": 0.4},
                   "startup_timeout_s": 900, "reuse": False, **server},
        "workload": {"num_prompts": 20, "input_len": 64, "output_len": 16, "warmup_requests": 0},
        "search": {**NO_REMEASURE, "sampler": "grid", "n_trials": n_trials, "baseline": False},
        "cluster": {"max_concurrent_trials": concurrent, "cache_dir": str(tmp / "cache")},
        "results_dir": str(tmp / "results"),
    }))
    return sweep


def _run(tmp: Path, sweep: Path, name: str):
    marker = new_marker()
    res = run_cli(["run", str(sweep)], tmp, cli_env(marker, tmp), timeout_s=3000)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert wait_no_marked_processes(marker) == []
    return read_trials(tmp / "results", name)


@pytest.mark.timeout(3600)
def test_two_concurrent_tp1_trials_use_distinct_gpus(short_tmp):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    sweep = _sweep(short_tmp, "tp1pair", {"max-num-seqs": {"type": "categorical",
                                                           "choices": [16, 32]}}, 2, concurrent=2)
    trials = _run(short_tmp, sweep, "tp1pair")
    assert (trials["state"] == "COMPLETE").all(), trials[["fail_reason", "fail_detail"]]
    starts = [t.timestamp() for t in trials["started_at"]]
    ends = [s + float(d) for s, d in zip(starts, trials["trial_s"])]
    assert max(starts) < min(ends), "the two trials should have run at the same time"
    # The default start-up levers on a GPU: the weights read ahead, the shared compile cache.
    for levers in trials["startup_levers"]:
        assert {"page_cache", "compile_cache"} <= set(levers), levers


@pytest.mark.timeout(3600)
def test_fork_start_lets_vllm_fork(short_tmp):
    """In a Ray actor vLLM logs that it must spawn; in fork_start's child it does not."""
    levers = ["fork_start", "compile_cache"]
    trials = _run(short_tmp, _sweep(short_tmp, "forked", {"max-num-seqs": {
        "type": "categorical", "choices": [16]}}, 1, 1, startup_levers=levers), "forked")
    assert (trials["state"] == "COMPLETE").all(), trials[["fail_reason", "fail_detail"]]
    assert "fork_start" in list(trials["startup_levers"].iloc[0])
    log = next((short_tmp / "results" / "forked" / "logs").glob("trial-*.log")).read_text()
    assert "In a Ray actor and can only be spawned" not in log
    assert "Starting to load model" in log


@pytest.mark.timeout(3600)
def test_warm_start_on_a_gpu(short_tmp):
    """Forks of the zygote (which never touched CUDA) take the actor's CUDA_VISIBLE_DEVICES."""
    trials = _run(short_tmp, _sweep(short_tmp, "warm", {"max-num-seqs": {
        "type": "categorical", "choices": [16, 32]}}, 2, 1,
        startup_levers=["warm_start", "compile_cache"]), "warm")
    assert (trials["state"] == "COMPLETE").all(), trials[["fail_reason", "fail_detail"]]
    assert all("warm_start" in list(levers) for levers in trials["startup_levers"])
    assert trials["startup_s"].iloc[1] < trials["startup_s"].iloc[0]
    log = next((short_tmp / "results" / "warm" / "logs").glob("trial-*.log")).read_text()
    assert "Starting to load model" in log and "cuda" in log.lower()


@pytest.mark.timeout(3600)
def test_tp2_trial_runs(short_tmp):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    trials = _run(short_tmp, _sweep(short_tmp, "tp2", {"tensor-parallel-size": {
        "type": "categorical", "choices": [2]}}, 1, 1), "tp2")
    assert (trials["state"] == "COMPLETE").all(), trials[["fail_reason", "fail_detail"]]


@pytest.mark.timeout(3600)
def test_pp2_spans_two_nodes_only_when_no_node_has_room(short_tmp):
    """PP = 2 x TP = 1 is laid out PACK (cluster/placement.py): Ray keeps both stages on the
    node with the most room while it has two GPUs free, and spans two nodes only when no node
    has (#32 defect 3). On an idle cluster with a node of two or more GPUs the trial runs on
    one node; with every GPU but one of each node held aside (tests/reservations.py) it runs
    with a stage on each of two nodes."""
    import ray

    address = os.environ.get("RAY_ADDRESS")
    if not address:
        pytest.skip("PP across nodes needs a cluster: set RAY_ADDRESS")
    ray.init(address=address)
    try:
        gpu_nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) >= 1]
    finally:
        ray.shutdown()
    if len(gpu_nodes) < 2:
        pytest.skip("needs two GPU nodes")
    space = {"pipeline-parallel-size": {"type": "categorical", "choices": [2]}}
    if any(n["Resources"]["GPU"] >= 2 for n in gpu_nodes):
        packed = _run(short_tmp, _sweep(short_tmp, "pp2packed", space, 1, 1), "pp2packed")
        assert (packed["state"] == "COMPLETE").all(), packed[["fail_reason", "fail_detail"]]
        assert len(set(packed["placement"].iloc[0])) == 1, packed["placement"].iloc[0]
    with gpus_held(address, leave=1):
        across = _run(short_tmp, _sweep(short_tmp, "pp2across", space, 1, 1), "pp2across")
    assert (across["state"] == "COMPLETE").all(), across[["fail_reason", "fail_detail"]]
    assert len(set(across["placement"].iloc[0])) == 2, across["placement"].iloc[0]
