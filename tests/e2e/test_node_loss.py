"""A node dies during a trial: that trial ends as FAIL(node_lost) and the sweep goes on with the
remaining nodes (emulated cluster, FakeEngine servers so the trial is long enough to kill)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.helpers import CLI
from tests.helpers import NO_REMEASURE
from tests.helpers import emulated_cluster
from tests.helpers import joined_cli_env
from tests.helpers import read_trials
from tests.helpers import read_until
from tests.helpers import trials_on

pytestmark = pytest.mark.server


@pytest.mark.timeout(600)
def test_node_lost_mid_trial_fails_that_trial_and_the_sweep_completes(tiny_model, short_tmp):
    nodes = [{"num_cpus": 1, "num_gpus": 0},
             {"num_cpus": 1, "num_gpus": 1, "node_ip_address": "127.0.0.2"},
             {"num_cpus": 1, "num_gpus": 1, "node_ip_address": "127.0.0.3"}]
    proc = None
    with emulated_cluster(short_tmp, nodes) as (cluster, address, marker):
        doomed = next(n for n in cluster.worker_nodes if n.node_ip_address == "127.0.0.2")
        occupancy = short_tmp / "occupancy.jsonl"
        sweep = write_sweep(short_tmp, tiny_model, address, occupancy)
        try:
            proc = subprocess.Popen([*CLI, "run", str(sweep)], cwd=short_tmp,
                                    env=joined_cli_env(marker, short_tmp), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            number = wait_for_trial_on(occupancy, "127.0.0.2", proc, timeout_s=240)
            assert number is not None
            # the trial is under load (2 s of start-up, then ~8 s of load): the node dies now
            seen = read_until(proc, f"trial {number}: under load", timeout_s=120)
            assert f"trial {number}: under load" in seen, seen
            kill_node(cluster, doomed)
            out, _ = proc.communicate(timeout=400)
            assert proc.returncode == 0, out[-4000:]
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    trials = read_trials(short_tmp / "results", "loss")
    assert len(trials) == 4  # 3 trials + the lost one's configuration run once more
    lost = trials[trials["fail_reason"] == "node_lost"]
    assert len(lost) == 1, trials[["trial_number", "state", "fail_reason", "fail_detail",
                                   "placement"]].to_string()
    assert "127.0.0.2" in lost.iloc[0]["fail_detail"]
    rest = trials[trials["fail_reason"] != "node_lost"]
    assert (rest["state"] == "COMPLETE").all()
    later = rest[rest["trial_number"] > lost.iloc[0]["trial_number"]]
    assert all(list(p) == ["127.0.0.3"] for p in later["placement"])
    retry = trials[trials["trial_number"] == lost.iloc[0]["trial_number"] + 1].iloc[0]
    assert retry["param_max_num_seqs"] == lost.iloc[0]["param_max_num_seqs"]
    assert retry["state"] == "COMPLETE"


def write_sweep(tmp: Path, model: Path, address: str, occupancy: Path) -> Path:
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 4]}}}))
    sweep = tmp / "loss.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "loss", "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"host": "node", "env": {"FAKE_ENGINE_STARTUP_S": "2",
                                            "FAKE_ENGINE_TPOT_MS": "40",
                                            "FAKE_ENGINE_OCCUPANCY_LOG": str(occupancy)}},
        # ~8 s of load a trial (4 waves of 2 s): the node dies right after the trial's
        # "under load" line, long before its load could end
        "workload": {"num_prompts": 8, "input_len": 8, "output_len": 50,
                     "max_concurrency": 2, "warmup_requests": 0, "request_timeout_s": 30},
        "sla": {"p99_ttft_ms": 60000},
        "search": {**NO_REMEASURE, "sampler": "random", "n_trials": 3, "baseline": False},
        "cluster": {"address": address, "max_concurrent_trials": 1, "retry_node_lost": True},
        "results_dir": str(tmp / "results"),
    }))
    return sweep


def kill_node(cluster, node) -> None:
    """What a machine failure does: the node's raylet and every process under it vanish at
    once (remove_node alone leaves the node's worker processes running for a while)."""
    doomed = []
    for infos in node.all_processes.values():
        for info in infos:
            try:
                root = psutil.Process(info.process.pid)
                doomed += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
    cluster.remove_node(node, allow_graceful=False)
    for proc in doomed:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def wait_for_trial_on(occupancy: Path, node_ip: str, proc: subprocess.Popen,
                      timeout_s: float) -> int | None:
    """The number of the first trial whose worker FakeEngine's occupancy log shows on
    `node_ip`, once it does (None if the driver ended or the time is up first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if occupancy.exists():
            found = trials_on(occupancy.read_text()).get(node_ip)
            if found is not None:
                return found
        time.sleep(0.5)
    return None
