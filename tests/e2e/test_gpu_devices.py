"""The fake-GPU contract (#32), proven without a GPU: an emulated 3-node Ray cluster whose two
worker nodes declare 3 fake GPUs each, shared by this module's tests (module scope: they test
devices and placement, not the cluster's own start or stop). Ray assigns fake GPU ids, and sets
or leaves CUDA_VISIBLE_DEVICES, as it does for real ones; FakeEngine's processes (named
stand-ins, framework/engine/fake_engine.py) pick their device exactly as vLLM 0.32's do
(framework/cluster/devices.py, checked against vLLM's code in tests/unit/cluster/test_devices.py)
and record it in the occupancy log.

Across concurrent mixed-shape trials (one of each of TP=1, TP=2, PP=2, TP=2 x PP=2; the last
cannot fit on one 3-GPU node, so its stages always span the two nodes) the test asserts vLLM's
mechanism, not Ray's CUDA_VISIBLE_DEVICES:
- world size 1: the server process holds its bundle's GPU, Ray shows it in its
  CUDA_VISIBLE_DEVICES, and it computes on that GPU (vLLM's uniprocess executor, local rank 0);
- above: the API server holds no GPU; every worker holds its bundle's GPU, Ray left its
  CUDA_VISIBLE_DEVICES alone (RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES), its rank and
  local rank are vLLM's, and it computes on `sorted(its node's group GPUs)[local rank]`;
- no physical GPU is used by two live trials, nor twice in one (trials do run side by side on
  one node: asserted, so this check has something to catch);
- the TP ranks of a pipeline stage share a node (ranks in vLLM's order, placement.ranks_by_node);
- a group is released only after its processes are gone (a poller here watches every recorded
  pid, every 20 ms).
The layouts vLLM would break this way (mp or uni at TP x PP > 1, ray at TP x PP = 1) are
refused by `validate`; tests/unit/cluster/test_devices.py shows this contract fails on them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from framework.cluster.devices import rank_device
from framework.cluster.devices import trial_processes
from tests.cli import cli_joined
from tests.clusters import emulated_cluster
from tests.reservations import gpus_held
from tests.sweeps import NO_REMEASURE
from tests.sweeps import occupancy_events
from tests.sweeps import read_trials

pytestmark = pytest.mark.server


GPUS_PER_NODE = 3  # odd: a TP=2 x PP=2 trial cannot fit on one node, its stages span two


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


@pytest.fixture(scope="module")
def fake_gpu_cluster() -> Iterator[tuple[str, str, Path]]:
    """The module's cluster: a head with no GPU (the driver's node) and two workers of
    GPUS_PER_NODE fake GPUs; yields its GCS address, its processes' marker and its folder.
    Each sweep must leave it idle (its groups released): the PP = 2 test needs an idle node."""
    folder = Path(tempfile.mkdtemp(prefix="vst-gpu-"))  # short: Ray's socket paths
    nodes = [{"num_cpus": 1, "num_gpus": 0}] + [
        {"num_cpus": GPUS_PER_NODE, "num_gpus": GPUS_PER_NODE, "node_ip_address": f"127.0.0.{i + 2}"}
        for i in range(2)]
    try:
        with emulated_cluster(folder, nodes, keep_env=False) as (_, address, marker):
            yield address, marker, folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# One trial of each shape (the grid sampler walks them all): world size 1, TP ranks on one node,
# PP stages, and both (TP=2 x PP=2: two stages that cannot share a 3-GPU node).
MIXED_SHAPES = {
    "tensor-parallel-size": {"type": "categorical", "choices": [1, 2]},
    "pipeline-parallel-size": {"type": "categorical", "choices": [1, 2]},
}


def write_sweep(tmp: Path, model: Path, address: str, occupancy: Path, name: str = "devices",
                parameters: dict | None = None, n_trials: int = 4,
                env: dict[str, str] | None = None) -> Path:
    space = tmp / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"parameters": parameters or MIXED_SHAPES}))
    sweep = tmp / f"{name}.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": name, "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"host": "node", "startup_timeout_s": 300, "reuse": False,
                   "env": {"FAKE_ENGINE_STARTUP_S": "2", "FAKE_ENGINE_TTFT_MS": "20",
                           "FAKE_ENGINE_TPOT_MS": "10", "FAKE_ENGINE_OCCUPANCY_LOG": str(occupancy),
                           **(env or {})}},
        "workload": {"num_prompts": 24, "input_len": 16, "output_len": 16, "max_concurrency": 8,
                     "warmup_requests": 0},
        "search": {**NO_REMEASURE, "sampler": "grid", "n_trials": n_trials, "baseline": False,
                   "seed": 11},
        "cluster": {"address": address, "cache_dir": str(tmp / "cache")},
        "results_dir": str(tmp / "results"),
    }))
    return sweep


def assert_vllms_devices(number: int, api: dict, holders: list[dict]) -> None:
    """The devices a trial's processes recorded are the ones vLLM 0.32 would use
    (cluster/devices.py), and its group's own GPUs."""
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")  # what a process Ray leaves alone sees
    nodes, gpus = [e["node_id"] for e in holders], [e["gpu_ids"] for e in holders]
    if len(holders) == 1:
        e = holders[0]
        assert e is api, f"trial {number}: a world-size-1 server process must hold its GPU"
        assert e["cuda_visible_devices"] == e["gpu_ids"][0], e  # Ray set it for the actor
        assert (e["local_rank"], e["device"]) == (0, int(e["gpu_ids"][0])), e
        return
    assert api["gpu_ids"] == [] and api["device"] is None, api
    assert all(e["role"] == "worker" and e["in_group"] for e in holders), holders
    expected = {p.rank: p for p in trial_processes(None, nodes, gpus, api["node_id"])}
    for e in holders:
        assert e["cuda_visible_devices"] == inherited, f"trial {number}: Ray set it: {e}"
        p = expected[e["rank"]]
        assert (e["node_id"], e["local_rank"], e["device"]) == (p.node, p.local_rank, p.device), (
            f"trial {number}: rank {e['rank']} used {e['device']}, vLLM's rule gives {p}")
        assert e["device"] == rank_device(e["local_rank"], e["node_id"], nodes, gpus), e
    used = [(e["node_id"], e["device"]) for e in holders]
    assert len(set(used)) == len(used), f"trial {number} uses one GPU twice: {used}"
    assert sorted(used) == sorted((n, int(g[0])) for n, g in zip(nodes, gpus)), used


@pytest.mark.timeout(600)
def test_every_process_uses_the_device_vllm_would(tiny_model, short_tmp, fake_gpu_cluster):
    """Guards the fake-GPU contract of #32 (defects 2 and 3): a process computing on a GPU
    other than the one vLLM would pick (Ray's id, or its local rank, instead of sorted(group
    GPUs)[local rank]), two live trials on one GPU (mp's 0..N-1), a stage's TP ranks split
    across nodes, a group released while its processes run (#32 defect 5), server processes at
    Ray workers' niceness 15 (dd8c491). Four trials (one per shape) on 2 x 3 GPUs: fewer shapes
    leave a rule unexercised, and trials share nodes side by side: the grid's first three (2 +
    1 + 2 GPUs) fit the 6 at once, the (2, 2) waits for them, and FakeEngine's ready barrier
    (FAKE_ENGINE_READY_TOGETHER) makes the three serve only once all three are ready, so their
    spans overlap whatever the machine's speed (s24d: they did not, on a loaded machine), and
    two of them share a node (5 GPUs of two 3-GPU nodes)."""
    address, marker, ray_tmp = fake_gpu_cluster
    occupancy = short_tmp / "occupancy.jsonl"
    ready = short_tmp / "ready"
    ready.mkdir()
    sweep = write_sweep(short_tmp, tiny_model, address, occupancy,
                        env={"FAKE_ENGINE_READY_TOGETHER": f"{ready}:3"})
    with PidWatch(occupancy) as watch:
        res = cli_joined(["run", str(sweep)], short_tmp, marker, ray_tmp)
        assert watch.all_gone(timeout_s=30), "a recorded process outlived the sweep"
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]

    trials = read_trials(short_tmp / "results", "devices")
    placed = trials[trials["fail_reason"].isna()]
    assert len(placed) == 4, trials[["trial_number", "state", "fail_reason", "fail_detail"]]
    released, by_trial = occupancy_events(occupancy)

    held: dict[tuple[str, int], list[tuple[float, float, int]]] = defaultdict(list)
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
        for e in holders:  # Ray gave the bundle one fake GPU
            assert len(e["gpu_ids"]) == 1, e
        assert_vllms_devices(number, api[0], holders)
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
            held[(e["node_ip"], e["device"])].append((e["t"], end, number))
    assert {(1, 1), (2, 1)} <= shapes and any(pp > 1 and tp > 1 for tp, pp in shapes), shapes
    for device, spans in held.items():
        spans.sort()
        for (_, e0, n0), (s1, _, n1) in zip(spans, spans[1:]):
            assert s1 >= e0, f"GPU {device} used by trial {n1} while trial {n0} used it"
    assert side_by_side(held), held  # the check above had live neighbours to catch


def side_by_side(held: dict[tuple[str, int], list[tuple[float, float, int]]]) -> bool:
    """Whether two trials held GPUs of one node at the same time (spans: start, release,
    trial number, per (node, GPU))."""
    by_node: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for (node, _), spans in held.items():
        by_node[node] += spans
    return any(s0 < e1 and s1 < e0 and n0 != n1
               for spans in by_node.values() for s0, e0, n0 in spans for s1, e1, n1 in spans)


@pytest.mark.timeout(600)
def test_pp2_tp1_shares_a_node_with_room_and_spans_nodes_without(tiny_model, short_tmp,
                                                                  fake_gpu_cluster):
    """What placement promises a PP = 2 x TP = 1 trial (#32 defect 3; placement.py): PACK, which
    fills the node Ray picks first, so both stages share a node that has room for them; they
    span two nodes when no node has (here: every GPU but one of each node held aside, as
    tests/gpu/test_real_gpu.py's PP-across-nodes test does on real GPUs)."""
    address, marker, ray_tmp = fake_gpu_cluster
    pp2 = {"pipeline-parallel-size": {"type": "categorical", "choices": [2]}}

    def nodes_of_one_trial(name: str) -> set[str]:
        occupancy = short_tmp / f"{name}.jsonl"
        sweep = write_sweep(short_tmp, tiny_model, address, occupancy, name, pp2, n_trials=1)
        res = cli_joined(["run", str(sweep)], short_tmp, marker, ray_tmp)
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
        trials = read_trials(short_tmp / "results", name)
        assert (trials["state"] == "COMPLETE").all(), trials[["fail_reason", "fail_detail"]]
        number = int(trials["trial_number"].iloc[0])
        evs = occupancy_events(occupancy)[1][number]
        holders = sorted((e for e in evs if e["bundle"] is not None), key=lambda e: e["bundle"])
        assert_vllms_devices(number, next(e for e in evs if e["role"] == "api_server"), holders)
        return set(trials["placement"].iloc[0])

    assert len(nodes_of_one_trial("idle")) == 1
    with gpus_held(address, leave=1) as held:
        assert held == 2
        assert len(nodes_of_one_trial("held")) == 2
