"""The fake-GPU contract (#32): which physical GPU each process of a trial computes on, as vLLM
0.32 decides it (framework/cluster/devices.py, the rules FakeEngine's workers apply).

- the rules, table-tested: local rank r on node n of a group computes on
  `sorted(Ray's GPU ids of the group's bundles on n)[r]`;
- `physical_device` against vLLM's own `Platform.device_id_to_physical_device_id` and
  `logical_device_id_to_visible_device_id` (vllm/platforms/interface.py), which are pure enough
  to call here; the Ray executor's local ranks and assigned ids, which live inside
  `RayExecutorV2._init_executor`, against the lines of vLLM's source they are derived from;
- defect 2's layouts (mp at TP x PP > 1, ray at TP x PP = 1, and uni at TP x PP > 1) fed to
  the same mechanics break the contract, and are exactly the layouts
  `placement.executor_problem` refuses.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from framework.cluster.devices import NOSET_VAR
from framework.cluster.devices import Process
from framework.cluster.devices import local_ranks
from framework.cluster.devices import node_gpus
from framework.cluster.devices import physical_device
from framework.cluster.devices import problems
from framework.cluster.devices import rank_device
from framework.cluster.devices import trial_processes
from framework.cluster.placement import Shape
from framework.cluster.placement import executor_problem

CVD = "CUDA_VISIBLE_DEVICES"


@pytest.mark.parametrize("bundle_nodes, bundle_gpus, node, local_rank, device", [
    # one node, TP=2: Ray gave bundle 0 GPU 5 and bundle 1 GPU 2; local rank 0 takes the
    # smaller id, whichever bundle it sits in
    (["A", "A"], [[5], [2]], "A", 0, 2),
    (["A", "A"], [[5], [2]], "A", 1, 5),
    # PP=2 across two nodes: each node's only worker is its local rank 0
    (["A", "B"], [[3], [0]], "A", 0, 3),
    (["A", "B"], [[3], [0]], "B", 0, 0),
    # TP=2 x PP=2 on two nodes of 8: each node's pair, sorted
    (["A", "A", "B", "B"], [[7], [6], [1], [4]], "A", 0, 6),
    (["A", "A", "B", "B"], [[7], [6], [1], [4]], "A", 1, 7),
    (["A", "A", "B", "B"], [[7], [6], [1], [4]], "B", 0, 1),
    (["A", "A", "B", "B"], [[7], [6], [1], [4]], "B", 1, 4),
    # Ray's ids are strings
    (["A", "A"], [["10"], ["9"]], "A", 0, 9),
])
def test_local_rank_r_on_node_n_takes_the_nodes_sorted_group_gpus_r(
        bundle_nodes, bundle_gpus, node, local_rank, device):
    assert rank_device(local_rank, node, bundle_nodes, bundle_gpus) == device


@pytest.mark.parametrize("bundle_nodes, driver, local", [
    (["A", "A", "B", "B"], "A", [0, 1, 0, 1]),
    # vLLM's docstring example (vllm/v1/executor/ray_utils.py get_bundles_sorted_by_node):
    # ranks 4, 0, 2, 5, 1, 3; local ranks count each node's workers in rank order
    (["C", "A", "B", "C", "A", "B"], "A", [0, 0, 0, 1, 1, 1]),
    (["n2", "n1", "n1", "n2"], "n2", [0, 0, 1, 1]),
])
def test_local_ranks_count_a_nodes_workers_in_rank_order(bundle_nodes, driver, local):
    assert local_ranks(bundle_nodes, driver) == local


def test_a_ray_trials_workers_use_exactly_its_groups_gpus():
    nodes, gpus = ["B", "A", "B", "A"], [[3], [7], [2], [0]]
    got = trial_processes(None, nodes, gpus, driver_node="A")
    assert [(p.node, p.rank, p.local_rank, p.device) for p in got] == [
        ("A", 0, 0, 0), ("A", 1, 1, 7), ("B", 2, 0, 2), ("B", 3, 1, 3)]
    assert sorted((p.node, p.device) for p in got) == sorted(
        (n, g[0]) for n, g in zip(nodes, gpus))
    assert node_gpus(nodes, gpus, "B") == [2, 3]


def test_world_size_1_computes_on_the_gpu_ray_shows_the_actor():
    assert trial_processes(None, ["A"], [["4"]], "A") == [Process("A", 0, 0, 4)]


# vLLM's own code, where it is pure enough to call

@pytest.fixture
def vllm_cuda(monkeypatch):
    """vLLM's Platform with CUDA's device variable (vllm.platforms.cuda itself needs the CUDA
    build), and no assigned ids yet."""
    interface = pytest.importorskip("vllm.platforms.interface")
    monkeypatch.setattr(interface, "_assigned_physical_gpu_ids", None)

    class Cuda(interface.Platform):
        device_control_env_var = CVD  # vllm/platforms/cuda.py, checked in the source test

    return interface, Cuda


@pytest.mark.parametrize("local_rank, assigned, visible", [
    (0, [2, 5], None), (1, [2, 5], None),     # the Ray executor's workers (NOSET: no CVD)
    (1, [2, 5], "5,2"),                       # assigned ids win over CUDA_VISIBLE_DEVICES
    (0, None, "4"),                           # world size 1: the actor's CVD
    (1, None, "6,3"),
    (0, None, None), (3, None, None),         # mp, the actor holding no GPU: GPUs 0..N-1
    (2, None, ""),                            # empty counts as unset
])
def test_physical_device_is_vllms(vllm_cuda, monkeypatch, local_rank, assigned, visible):
    interface, cuda = vllm_cuda
    if visible is None:
        monkeypatch.delenv(CVD, raising=False)
    else:
        monkeypatch.setenv(CVD, visible)
    if assigned is not None:
        interface.set_assigned_physical_gpu_ids(assigned)
    expected = physical_device(local_rank, assigned, visible)
    assert cuda.device_id_to_physical_device_id(local_rank) == expected


def test_every_ray_worker_opens_the_device_vllm_would(vllm_cuda, monkeypatch):
    """Each worker of a TP=2 x PP=2 trial as vLLM's RayWorkerProc runs it: its node's sorted
    group GPUs assigned, CUDA_VISIBLE_DEVICES unset (NOSET); vLLM's worker then opens
    `cuda:<logical_device_id_to_visible_device_id(local rank)>` (gpu_worker.py init_device)."""
    interface, cuda = vllm_cuda
    nodes, gpus = ["A", "A", "B", "B"], [[5], [1], [6], [2]]
    monkeypatch.delenv(CVD, raising=False)
    for p in trial_processes("ray", nodes, gpus, "A"):
        monkeypatch.setattr(interface, "_assigned_physical_gpu_ids", None)
        interface.set_assigned_physical_gpu_ids(node_gpus(nodes, gpus, p.node))
        assert cuda.logical_device_id_to_visible_device_id(p.local_rank) == p.device


def test_without_noset_vllm_refuses_a_device_ray_hid(vllm_cuda, monkeypatch):
    """Why the workers must start with NOSET: had Ray set CUDA_VISIBLE_DEVICES to the bundle's
    own id, local rank 0 (assigned 1 of [1, 5]) in the bundle Ray gave GPU 5 sees only 5."""
    interface, cuda = vllm_cuda
    monkeypatch.setenv(CVD, "5")
    interface.set_assigned_physical_gpu_ids([1, 5])
    with pytest.raises(RuntimeError, match="is not visible"):
        cuda.logical_device_id_to_visible_device_id(0)


def _vllm_source(path: str) -> str:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    return (Path(list(spec.submodule_search_locations)[0]) / path).read_text()


@pytest.mark.parametrize("path, line", [
    # RayWorkerProc actors start with Ray's NOSET variables ...
    ("v1/executor/ray_executor_v2.py",
     'env_vars.update({v: "1" for v in current_platform.ray_noset_device_env_vars})'),
    ("platforms/cuda.py", f'"{NOSET_VAR}",'),
    ("platforms/cuda.py", f'device_control_env_var: str = "{CVD}"'),
    # ... report Ray's ids, gathered per node in rank order and sorted ...
    ("v1/executor/ray_executor_v2.py", "node_workers[node_id].append(i)"),
    ("v1/executor/ray_executor_v2.py", "node_physical_gpu_ids[node_id].extend(physical_gpu_ids)"),
    # ... and each takes its place among its node's workers as local rank, over those ids
    ("v1/executor/ray_executor_v2.py", "local_rank = node_workers[node_id].index(i)"),
    ("v1/executor/ray_executor_v2.py",
     "assigned_physical_gpu_ids = sorted(node_physical_gpu_ids[node_id])"),
    ("v1/executor/ray_utils.py", "return (0 if node_id == driver_node else 1, node_id)"),
    ("v1/worker/gpu_worker.py",
     "current_platform.logical_device_id_to_visible_device_id(self.local_rank)"),
    # the V2 executor is the default
    ("envs.py", 'os.getenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "1")'),
    # uni: rank 0 alone; mp: local ranks 0..N-1
    ("v1/executor/uniproc_executor.py", "self.driver_worker = WorkerWrapperBase(rpc_rank=0)"),
    ("v1/executor/multiproc_executor.py", "for local_rank in range(self.local_world_size):"),
])
def test_the_ray_executor_rule_is_derived_from_these_lines_of_vllm(path, line):
    assert line in _vllm_source(path), f"vllm/{path} no longer says {line!r}: re-derive devices.py"


# defect 2's layouts against the contract

GPUS_PER_NODE = 8


def _layout(shape: Shape, first_free: int) -> tuple[list[str], list[list[int]]]:
    """A group on a 2 x 8 cluster: PP = 1 on node A, stage s on A or B by parity; Ray's ids
    from `first_free` up on each node, handed out in reverse (so sorting matters)."""
    nodes = ["A" if shape.pp == 1 or (b // shape.tp) % 2 == 0 else "B"
             for b in range(shape.world_size)]
    free = {n: list(range(GPUS_PER_NODE - 1, first_free - 1, -1)) for n in "AB"}
    return nodes, [[free[n].pop(0)] for n in nodes]


SHAPES = [Shape(1, 1), Shape(2, 1), Shape(4, 1), Shape(1, 2), Shape(2, 2), Shape(4, 2)]


@pytest.mark.parametrize("backend", [None, "ray", "mp", "uni"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"tp{s.tp}pp{s.pp}")
def test_the_contract_breaks_exactly_on_the_refused_layouts(backend, shape):
    """Beside a TP=1 neighbour on GPU 0 of each node, a trial with this backend and shape:
    the contract holds exactly when placement.executor_problem lets the layout through."""
    neighbours = {f"neighbour-{n}": ([n], [[0]], trial_processes(None, [n], [[0]], n))
                  for n in "AB"}
    nodes, gpus = _layout(shape, first_free=1)
    trial = {"trial": (nodes, gpus, trial_processes(backend, nodes, gpus, nodes[0]))}
    broken = problems({**neighbours, **trial})
    refused = executor_problem(backend, shape)
    assert bool(broken) == (refused is not None), (broken, refused)


@pytest.mark.parametrize("backend, shape, found", [
    ("mp", Shape(2, 1), ["trial X rank 0 computes on GPU 0 of node A, which its placement group "
                         "does not hold", "GPU 0 of node A used by trial N rank 0, trial X rank 0"]),
    ("mp", Shape(1, 2), ["trial X rank 1 computes on GPU 1 of node A"]),
    ("ray", Shape(1, 1), ["it never starts"]),
    ("uni", Shape(2, 2), ["waits for the other 3 rank(s) forever"]),
])
def test_what_the_contract_says_of_each_refused_layout(backend, shape, found):
    neighbour = {"N": (["A"], [[0]], trial_processes(None, ["A"], [[0]], "A"))}
    nodes, gpus = _layout(shape, first_free=1)
    broken = problems({**neighbour, "X": (nodes, gpus,
                                              trial_processes(backend, nodes, gpus, nodes[0]))})
    for text in found:
        assert any(text in line for line in broken), broken


def test_a_backend_without_a_device_rule_is_refused():
    with pytest.raises(ValueError, match="external_launcher"):
        trial_processes("external_launcher", ["A"], [[0]], "A")
