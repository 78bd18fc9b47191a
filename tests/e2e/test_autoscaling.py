"""A sweep on a cluster that Ray's autoscaler grows (#32 defect 6, "autoscaler-aware
placement"): the head holds no GPU, and the only GPU nodes are those the autoscaler adds
(tests/autoscaling_provider.py: Ray's own v1 autoscaler, its nodes isolated nodes on their own
loopback addresses). FakeEngine servers (the named stand-in: what is under test is the fit
check, Ray's placement and its autoscaler)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import psutil
import pytest
import yaml

from framework.base.exit_codes import EXIT_NO_FEASIBLE
from tests.autoscaling_provider import Launched
from tests.autoscaling_provider import autoscaling_cluster
from tests.autoscaling_provider import launched
from tests.cli import cli_joined
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_trials

pytestmark = pytest.mark.server

# The autoscaler keeps one node at most (max_workers 1); the other addresses are for the nodes
# that replace a node whose `ray start` failed: on a slowed machine (s18a, s18b: two CPU burners)
# an emulated node's raylet missed Ray's fixed 30 s registration wait ("The current node timed
# out during startup") and exited; Ray's autoscaler then ends it (no heartbeat within
# AUTOSCALER_HEARTBEAT_TIMEOUT_S, 30 s) and launches another, as it would a cloud node that
# failed to start. A fourth launch would be an error (the provider runs out of addresses).
IPS = ["127.0.0.41", "127.0.0.42", "127.0.0.43"]
GPU2 = {"resources": {"CPU": 2, "GPU": 2}, "min_workers": 0, "max_workers": 1}


def _running(node: Launched) -> bool:
    """The node's `unshare` process still runs (the same process, not a zombie: a node whose
    `ray start` failed exits, and stays a zombie until the autoscaler's monitor reaps it)."""
    try:
        proc = psutil.Process(node.pid)
        return proc.create_time() == node.started and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def write_sweep(tmp: Path, model: Path, address: str, name: str, autoscaling: Path | None) -> Path:
    space = tmp / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 4]}}}))
    sweep = tmp / f"{name}.yaml"
    cluster = {"address": address, "cache_dir": str(tmp / "cache"), "max_concurrent_trials": 2}
    if autoscaling is not None:
        cluster["autoscaling_config"] = str(autoscaling)
    sweep.write_text(yaml.safe_dump({
        "name": name, "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"host": "node", "startup_timeout_s": 300, "reuse": False,
                   "args": {"tensor-parallel-size": 2},
                   "env": {"FAKE_ENGINE_STARTUP_S": "0", "FAKE_ENGINE_TPOT_MS": "10"}},
        "workload": {"num_prompts": 8, "input_len": 16, "output_len": 16, "max_concurrency": 4,
                     "warmup_requests": 0},
        "sla": {"p99_ttft_ms": 60000},
        "search": {**NO_REMEASURE, "sampler": "grid", "n_trials": 2, "baseline": False},
        "cluster": cluster,
        "results_dir": str(tmp / "results"),
    }))
    return sweep


@pytest.mark.timeout(600)
def test_a_shape_only_scale_up_can_hold_waits_for_the_nodes_the_autoscaler_adds(tiny_model):
    """Guards #32 defect 6: the fit check counted only the nodes alive, so on a cluster that
    scales from zero every GPU shape was refused as unplaceable and no node was ever asked for.
    Here a TP = 2 sweep first runs without the autoscaling config (the old behaviour: both
    trials unplaceable, no node launched), then with it: both trials are measured on nodes the
    autoscaler added (one node of two GPUs, at most: the trials take turns on it)."""
    parent = Path(tempfile.mkdtemp(prefix="vst-as-"))  # short: Ray's socket paths
    try:
        with autoscaling_cluster(parent, {"num_cpus": 1, "num_gpus": 0}, IPS, {"gpu2": GPU2},
                                 max_workers=1) as (address, marker, config):
            drivers = parent / "drivers"
            drivers.mkdir()
            blind = cli_joined(["run", str(write_sweep(drivers, tiny_model, address, "blind",
                                                       None))], drivers, marker, parent)
            assert blind.returncode == EXIT_NO_FEASIBLE, blind.stdout[-3000:] + blind.stderr[-3000:]
            refused = read_trials(drivers / "results", "blind")
            assert list(refused["fail_reason"]) == ["unplaceable"] * 2
            assert launched(parent) == []

            res = cli_joined(["run", str(write_sweep(drivers, tiny_model, address, "grown",
                                                     config))], drivers, marker, parent)
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            assert "autoscaler may add: gpu2 x1 {CPU: 2, GPU: 2}" in res.stdout, res.stdout[-3000:]
            trials = read_trials(drivers / "results", "grown")
            assert trials["fail_reason"].isna().all(), trials[["fail_reason", "fail_detail"]]
            nodes = launched(parent)
            added = {node.ip for node in nodes}
            # one node at a time: every node but the last launched has ended (a replaced one)
            assert [_running(n) for n in nodes] == [False] * (len(nodes) - 1) + [True], nodes
            for _, row in trials.iterrows():
                assert row["node_ip"] in added and list(row["placement"]) == [row["node_ip"]] * 2
                assert row["placement_wait_s"] >= 0
    finally:
        shutil.rmtree(parent, ignore_errors=True)
