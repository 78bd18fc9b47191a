"""A node dies during a trial: that trial ends as FAIL(node_lost) and the sweep goes on with the
remaining nodes (emulated cluster, FakeEngine servers so the trial is long enough to kill)."""

from __future__ import annotations

import json
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
            assert wait_for_trial_on(occupancy, "127.0.0.2", proc, timeout_s=240)
            time.sleep(2)  # the trial is under load
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
        "workload": {"num_prompts": 16, "input_len": 8, "output_len": 100,
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


def worker_ips(text: str) -> set[str]:
    """Node IPs of the trial workers in an occupancy log; release events (no node) and a last
    line still being written are skipped."""
    ips = set()
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "node_ip" in event:
            ips.add(event["node_ip"])
    return ips


def wait_for_trial_on(occupancy: Path, node_ip: str, proc: subprocess.Popen, timeout_s: float) -> bool:
    """True once FakeEngine's occupancy log shows a trial worker on `node_ip`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if occupancy.exists() and node_ip in worker_ips(occupancy.read_text()):
            return True
        time.sleep(0.5)
    return False


def test_worker_ips_skips_release_events_and_a_partial_line():
    log = ('{"t": 1.0, "node_ip": "127.0.0.3", "bundle": 0}\n'
           '{"t": 2.0, "group": "ab", "released": true}\n'
           '{"t": 3.0, "node_ip": "127.0.0.2", "bun')
    assert worker_ips(log) == {"127.0.0.3"}
