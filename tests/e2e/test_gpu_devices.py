"""The device contract, proven without a GPU: an emulated 3-node Ray cluster whose two worker
nodes declare 4 fake GPUs each. Ray assigns GPU ids and sets CUDA_VISIBLE_DEVICES for fake GPUs
as it does for real ones, so FakeEngine servers and their per-bundle workers (named stand-ins,
framework/engine/fake_engine.py) record what each process holds and sees, in the occupancy log.

Across concurrent mixed-shape trials (TP=1, TP=2, TP=2 x PP=2, and TP=4 x PP=2 when both nodes
are free) the test asserts:
- each process sees exactly its bundle's device: a world-size-1 server process holds its
  bundle's GPU (vLLM's uniprocess executor runs the model under it, on `cuda:0` of what it
  sees); above, every worker holds its bundle's GPU and the API server holds none;
- no device is seen by two live trials;
- the TP ranks of a pipeline stage share a node (ranks in vLLM's order, placement.ranks_by_node);
- a group is released only after its processes are gone (a poller here watches every recorded
  pid, every 20 ms).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil
import pytest
import yaml

from tests.helpers import NO_REMEASURE
from tests.helpers import cli_joined
from tests.helpers import emulated_cluster
from tests.helpers import occupancy_events
from tests.helpers import read_trials

pytestmark = pytest.mark.server


GPUS_PER_NODE = 4


POLL_S = 0.02


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class PidWatch:
    """Polls the occupancy log for recorded pids; notes for each the latest moment it was seen
    running (`alive_at`: a clock read before a check that found it running, so the process
    surely ran then) and when it was first seen gone (`gone_at`). A slow poll only sees fewer
    moments: it can miss a process running too long, never invent one."""

    def __init__(self, occupancy: Path) -> None:
        self.occupancy, self._stop = occupancy, threading.Event()
        self.gone_at: dict[int, float] = {}
        self.alive_at: dict[int, float] = {}
        self._seen: set[int] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def all_gone(self, timeout_s: float) -> bool:
        """Wait until every pid seen in the log has been seen gone."""
        deadline = time.monotonic() + timeout_s
        while set(self._seen) - set(self.gone_at) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return not set(self._seen) - set(self.gone_at)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.occupancy.exists():
                for line in self.occupancy.read_text().splitlines():
                    try:
                        pid = json.loads(line).get("pid")
                    except json.JSONDecodeError:
                        continue
                    if pid:
                        self._seen.add(pid)
            for pid in self._seen - set(self.gone_at):
                before = time.time()
                if _running(pid):
                    self.alive_at[pid] = before
                else:
                    self.gone_at[pid] = time.time()
            time.sleep(POLL_S)

    def __enter__(self) -> PidWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture
def fake_gpu_cluster(short_tmp):
    nodes = [{"num_cpus": 1, "num_gpus": 0}] + [
        {"num_cpus": GPUS_PER_NODE, "num_gpus": GPUS_PER_NODE, "node_ip_address": f"127.0.0.{i + 2}"}
        for i in range(2)]
    with emulated_cluster(short_tmp, nodes) as (_, address, marker):
        yield address, marker


def write_sweep(tmp: Path, model: Path, address: str, occupancy: Path) -> Path:
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "tensor-parallel-size": {"type": "categorical", "choices": [1, 2, 4]},
        "pipeline-parallel-size": {"type": "categorical", "choices": [1, 2]},
        "max-num-seqs": {"type": "categorical", "choices": [4, 8, 16]},
    }}))
    sweep = tmp / "devices.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "devices", "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"host": "node", "startup_timeout_s": 300, "reuse": False,
                   "env": {"FAKE_ENGINE_STARTUP_S": "2", "FAKE_ENGINE_TTFT_MS": "20",
                           "FAKE_ENGINE_TPOT_MS": "10", "FAKE_ENGINE_OCCUPANCY_LOG": str(occupancy)}},
        "workload": {"num_prompts": 24, "input_len": 16, "output_len": 16, "max_concurrency": 8,
                     "warmup_requests": 0},
        "search": {**NO_REMEASURE, "sampler": "random", "n_trials": 12, "baseline": False, "seed": 11},
        "cluster": {"address": address, "cache_dir": str(tmp / "cache")},
        "results_dir": str(tmp / "results"),
    }))
    return sweep


@pytest.mark.timeout(600)
def test_every_process_sees_exactly_its_bundles_devices(tiny_model, short_tmp, fake_gpu_cluster):
    address, marker = fake_gpu_cluster
    occupancy = short_tmp / "occupancy.jsonl"
    sweep = write_sweep(short_tmp, tiny_model, address, occupancy)
    with PidWatch(occupancy) as watch:
        res = cli_joined(["run", str(sweep)], short_tmp, marker, short_tmp)
        assert watch.all_gone(timeout_s=30), "a recorded process outlived the sweep"
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]

    trials = read_trials(short_tmp / "results", "devices")
    placed = trials[trials["fail_reason"].isna()]
    assert len(placed) >= 8, trials[["trial_number", "state", "fail_reason", "fail_detail"]]
    released, by_trial = occupancy_events(occupancy)

    held: dict[tuple[str, str], list[tuple[float, float, int]]] = defaultdict(list)
    shapes = set()
    for _, row in placed.iterrows():
        number = int(row["trial_number"])
        tp, pp = int(row["param_tensor_parallel_size"]), int(row["param_pipeline_parallel_size"])
        shapes.add((tp, pp))
        evs = by_trial[number]
        api = [e for e in evs if e["role"] == "api_server"]
        holders = sorted((e for e in evs if e["bundle"] is not None), key=lambda e: e["bundle"])
        assert len(api) == 1 and len({e["group"] for e in evs}) == 1, evs
        assert [e["bundle"] for e in holders] == list(range(tp * pp)), evs
        for e in holders + api:  # at the driver's priority, not Ray workers' niceness 15
            assert e["nice"] == os.nice(0), e
        for e in holders:  # Ray's id for the bundle's fake GPU, and exactly it is visible
            assert len(e["gpu_ids"]) == 1 and e["cuda_visible_devices"] == e["gpu_ids"][0], e
        if tp * pp == 1:
            assert holders == api, "a world-size-1 server process must hold its bundle's GPU"
        else:
            assert api[0]["gpu_ids"] == [], "the API server of a multi-worker trial holds no GPU"
            assert all(e["role"] == "worker" and e["in_group"] for e in holders)
        rank_nodes = {e["rank"]: e["node_ip"] for e in holders}
        for stage in range(pp):
            nodes = {rank_nodes[r] for r in range(stage * tp, (stage + 1) * tp)}
            assert len(nodes) == 1, f"trial {number}: stage {stage}'s TP ranks span {nodes}"
        end = released[evs[0]["group"]]
        for e in holders + api:
            alive = watch.alive_at.get(e["pid"], 0.0)
            assert e["pid"] in watch.gone_at and alive <= end, (
                f"trial {number}: pid {e['pid']} ({e['role']}) still ran "
                f"{alive - end:.3f} s after its group was released")
        for e in holders:
            held[(e["node_ip"], e["gpu_ids"][0])].append((e["t"], end, number))
    assert {(1, 1), (2, 1)} <= shapes and any(pp > 1 and tp > 1 for tp, pp in shapes), shapes
    for device, spans in held.items():
        spans.sort()
        for (_, e0, n0), (s1, _, n1) in zip(spans, spans[1:]):
            assert s1 >= e0, f"device {device} seen by trial {n1} while trial {n0} held it"
