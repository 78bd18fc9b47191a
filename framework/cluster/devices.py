"""Which physical GPU each process of a trial computes on, given its placement group: vLLM
0.32's device mechanics as pure functions (the fake-GPU contract, #32). FakeEngine's placeholder
workers pick their device with these functions (cluster/actors.py); the contract tests run them
against vLLM's own code where it is pure (tests/unit/cluster/test_devices.py).

vLLM 0.32, per executor (paths relative to site-packages):
- every executor: local rank r computes on physical GPU `physical_device(r, assigned, visible)`:
  the node's assigned physical ids if the executor set them, else entry r of
  CUDA_VISIBLE_DEVICES, else r itself (vllm/platforms/interface.py,
  `Platform.device_id_to_physical_device_id`; vllm/v1/worker/gpu_worker.py `init_device`);
- uniprocess (world size 1; vllm-sweep passes no backend there): the model runs at local rank
  0 in EngineCore, a child of the API server (vllm/v1/executor/uniproc_executor.py
  `_distributed_args`); the server actor holds the bundle's GPU (cluster/launcher.py `launch`,
  `num_gpus=1` at world size 1), so Ray sets the actor's CUDA_VISIBLE_DEVICES to that GPU's id
  and the child inherits it;
- ray (vllm-sweep's choice at world size > 1; vllm/v1/executor/ray_executor_v2.py
  `RayExecutorV2._init_executor`): rank = position in `get_bundles_sorted_by_node` (driver node
  first, then node id: placement.ranks_by_node); one RayWorkerProc with `num_gpus=1` in each
  bundle, its runtime_env setting RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1
  (`_build_runtime_env`, from vllm/platforms/cuda.py `ray_noset_device_env_vars`), so Ray
  leaves its CUDA_VISIBLE_DEVICES unset; each reports the ids Ray gave its bundle
  (`get_node_and_physical_gpu_ids`); worker i's local rank is its position among its node's
  workers in rank order (`node_workers[node_id].index(i)`) and its node's assigned ids are the
  sorted ids of all the group's workers on that node (`sorted(node_physical_gpu_ids[node_id])`,
  passed to `initialize_worker`). So a worker computes on `sorted(node's group GPUs)[local
  rank]`: a GPU of its group on its node, not necessarily the one Ray gave its own bundle;
- uni at world size > 1: rank 0 alone (uniproc_executor.py), waiting for the others forever;
- mp: local ranks 0..N-1 on the API server's node with no assigned ids
  (vllm/v1/executor/multiproc_executor.py), under the server actor's CUDA_VISIBLE_DEVICES,
  which is unset at world size > 1 (the actor holds no GPU, and Ray 2.60 leaves the variable
  alone at zero GPUs: ray/_private/accelerators/accelerator.py), so they take GPUs 0..N-1.
vLLM's older Ray executor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0; 1 is the default, vllm/envs.py)
sets the same variable and computes on the same `sorted(...)[local rank]`
(vllm/v1/executor/ray_executor.py). `placement.executor_problem` refuses the layouts these rules
make unsafe (mp or uni at world size > 1, ray at world size 1); `problems` says what goes wrong
if one were let through.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

from framework.cluster.placement import ranks_by_node

NOSET_VAR = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"  # vllm/platforms/cuda.py


def physical_device(local_rank: int, assigned: Sequence[int] | None, visible: str | None) -> int:
    """The physical GPU local rank `local_rank` computes on: `assigned[local_rank]` when the
    executor assigned ids, else entry `local_rank` of CUDA_VISIBLE_DEVICES (`visible`; empty
    counts as unset), else `local_rank` (vLLM's Platform.device_id_to_physical_device_id, for
    integer ids)."""
    if assigned is not None:
        return int(assigned[local_rank])
    if visible:
        return int(visible.split(",")[local_rank])
    return local_rank


def local_ranks(bundle_nodes: Sequence[str], driver_node: str) -> list[int]:
    """Each bundle's worker's local rank under vLLM's Ray executor: its position among the
    workers on its node, in rank order."""
    ranks = ranks_by_node(bundle_nodes, driver_node)
    seen: dict[str, int] = defaultdict(int)
    out = [0] * len(bundle_nodes)
    for bundle in sorted(range(len(bundle_nodes)), key=ranks.__getitem__):
        out[bundle] = seen[bundle_nodes[bundle]]
        seen[bundle_nodes[bundle]] += 1
    return out


def node_gpus(bundle_nodes: Sequence[str], bundle_gpus: Sequence[Sequence[int | str]],
              node: str) -> list[int]:
    """The sorted physical ids Ray gave the group's bundles on `node`: vLLM's Ray executor's
    assigned ids for every worker there."""
    return sorted(int(g) for b, n in enumerate(bundle_nodes) if n == node for g in bundle_gpus[b])


def rank_device(local_rank: int, node: str, bundle_nodes: Sequence[str],
                bundle_gpus: Sequence[Sequence[int | str]]) -> int:
    """The physical GPU local rank `local_rank` on `node` uses under vLLM's Ray executor, given
    the node of each of the group's bundles and the GPU ids Ray gave each:
    `sorted(node's group GPUs)[local_rank]`."""
    return physical_device(local_rank, node_gpus(bundle_nodes, bundle_gpus, node), None)


@dataclass(frozen=True)
class Process:
    """One process of a trial that computes on a GPU: where it runs, its ranks, its physical
    GPU on `node` (None: it never starts, `why`)."""

    node: str
    rank: int
    local_rank: int
    device: int | None
    why: str = ""


def trial_processes(backend: str | None, bundle_nodes: Sequence[str],
                    bundle_gpus: Sequence[Sequence[int | str]], driver_node: str) -> list[Process]:
    """The processes vLLM starts for a trial whose group has these bundles (node and Ray's GPU
    ids of each; the server actor on bundle 0, on `driver_node`), with `backend` as the
    distributed-executor-backend flag (None: vllm-sweep's choice, ray at world size > 1)."""
    world = len(bundle_nodes)
    backend = backend or ("ray" if world > 1 else "uni")
    actor_holds_gpu = world == 1  # cluster/launcher.py launch: num_gpus=1 at world size 1 only
    if backend == "ray":
        if actor_holds_gpu:
            return [Process(bundle_nodes[0], 0, 0, None, "its Ray worker asks for a GPU in "
                            "bundle 0, whose only GPU the server actor holds: it never starts")]
        ranks, locals_ = ranks_by_node(bundle_nodes, driver_node), local_ranks(bundle_nodes, driver_node)
        return [Process(bundle_nodes[b], ranks[b], locals_[b],
                        rank_device(locals_[b], bundle_nodes[b], bundle_nodes, bundle_gpus))
                for b in sorted(range(world), key=ranks.__getitem__)]
    if backend not in ("uni", "mp"):
        raise ValueError(f"no device rule for distributed-executor-backend {backend!r}")
    if backend == "uni" and world > 1:
        return [Process(driver_node, 0, 0, None, f"the uniprocess executor starts rank 0 alone, "
                        f"which waits for the other {world - 1} rank(s) forever")]
    visible = ",".join(str(g) for g in bundle_gpus[0]) if actor_holds_gpu else None
    return [Process(driver_node, r, r, physical_device(r, None, visible)) for r in range(world)]


def problems(trials: Mapping[str, tuple[Sequence[str], Sequence[Sequence[int | str]],
                                        Sequence[Process]]]) -> list[str]:
    """What breaks the contract among trials live at once, each given as (its bundles' nodes,
    Ray's GPU ids of each bundle, its processes): a process that never starts, one computing
    on a GPU its group does not hold, two processes on one GPU (empty: none)."""
    out: list[str] = []
    users: dict[tuple[str, int], list[str]] = defaultdict(list)
    for name, (nodes, gpus, processes) in trials.items():
        held = {(n, int(g)) for n, ids in zip(nodes, gpus) for g in ids}
        for p in processes:
            who = f"trial {name} rank {p.rank}"
            if p.device is None:
                out.append(f"{who}: {p.why}")
                continue
            users[(p.node, p.device)].append(who)
            if (p.node, p.device) not in held:
                out.append(f"{who} computes on GPU {p.device} of node {p.node}, which its "
                           "placement group does not hold")
    out += [f"GPU {gpu} of node {node} used by {', '.join(who)}"
            for (node, gpu), who in sorted(users.items()) if len(who) > 1]
    return out
