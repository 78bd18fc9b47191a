"""Trial shapes -> placement-group bundles and their layout on nodes, and whether a shape can
ever fit a cluster. Pure.

A trial with tensor parallel size TP and pipeline parallel size PP gets TP x PP bundles, one
per vLLM worker. The TP ranks of one pipeline stage must share a node (vLLM only warns when
they do not, and TP across nodes is slow); stages may span nodes. vLLM's Ray executor gives
ranks to bundles sorted driver node first, then by node id (vllm/v1/executor/ray_utils.py,
`get_bundles_sorted_by_node`), so a stage stays on one node exactly when every node holds whole
stages: the group is laid out in units of TP bundles (`layout`):
- PP = 1: the whole group is one unit, placed with STRICT_PACK on one node;
- TP = 1: every bundle is a unit of its own, placed with PACK;
- TP > 1 and PP > 1: each stage is pinned to a node with a `ray.io/node-id` bundle label
  selector, nodes chosen best-fit from the free devices (`assign_units`).
Bundle 0 also holds the server actor (the API server and engine core), hence its extra CPU.

What this promises pipeline stages (#32 defect 3): they span nodes for lack of room, never by
request. With TP = 1, Ray's PACK places bundle 0 on the node with the most room free, fills that
node with every other bundle that fits there, and only the rest go on to other nodes (Ray's
src/ray/raylet/scheduling/policy/bundle_scheduling_policy.cc, BundlePackSchedulingPolicy, and
scorer.cc, LeastResourceScorer): a PP = 2 x TP = 1 trial on an idle 2 x 8 cluster runs on one
node, and spans two only when no node has two GPUs free. With TP > 1, stages go best-fit
(keeping large holes whole), so they may split between a node with just one stage's room and
another. Stages within a node are what the user usually wants (NVLink within a node, TCP or EFA
across); a test of PP across nodes leaves no node room for two stages (tests/reservations.py,
used by tests/gpu/test_real_gpu.py and tests/e2e/test_gpu_devices.py).
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

from framework.base.vocabulary import Scalar

Bundle = dict[str, float]


@dataclass(frozen=True)
class Shape:
    """A server's parallelism: TP x PP workers per engine (vLLM's world size), DP engines
    (vLLM's own data parallel: one API server in front, requests balanced between engines
    inside vLLM, vllm/v1/engine/core_client.py DPLBAsyncMPClient)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def devices(self) -> int:
        """Workers (GPUs, or CPU bundles) of the whole server: TP x PP x DP."""
        return self.tp * self.pp * self.dp

    @property
    def label(self) -> str:
        """`TP2xPP1`, with `xDP2` when data parallel: the report's shape column."""
        return f"TP{self.tp}xPP{self.pp}" + (f"xDP{self.dp}" if self.dp > 1 else "")


def shape_of(flags: Mapping[str, Scalar | None]) -> Shape:
    """TP, PP and DP from the trial's vLLM flags (absent = 1)."""
    return Shape(tp=int(flags.get("tensor-parallel-size") or 1),
                 pp=int(flags.get("pipeline-parallel-size") or 1),
                 dp=int(flags.get("data-parallel-size") or 1))


def data_parallel_problem(engine: str, shape: Shape) -> str | None:
    """Why a data-parallel server (DP > 1) cannot run in a trial's placement group (None: it
    can, or DP = 1). Pure.
    - CPU engine, TP x PP = 1: vLLM starts the DP engines as processes of the server's node
      (vllm/v1/engine/utils.py, CoreEngineProcManager; the default `data-parallel-backend
      mp`), so the group is DP bundles on one node (`node_unit`): supported;
    - TP x PP > 1 with DP: each engine would need a Ray executor of its own in the same group
      (vLLM's Ray DP backend makes placement groups of its own): not supported;
    - GPU engine: each DP engine takes CUDA_VISIBLE_DEVICES slices of the devices its parent
      sees (vllm/v1/engine/utils.py, set_device_control_env_var), and the server actor holds
      one bundle's GPU: not supported until cluster/devices.py models it (#36)."""
    if shape.dp <= 1:
        return None
    if shape.world_size > 1:
        return (f"data-parallel-size {shape.dp} with TP {shape.tp} x PP {shape.pp} > 1 is not "
                "supported: each data-parallel engine would need its own Ray executor "
                "(vLLM's Ray DP backend places groups of its own)")
    if engine != "cpu":
        return (f"data-parallel-size {shape.dp} is supported on the CPU engine only: on GPUs "
                "each engine slices CUDA_VISIBLE_DEVICES of a server actor that holds one "
                "bundle's GPU (#36)")
    return None


def executor_problem(backend: str | None, shape: Shape, data_parallel: int = 1) -> str | None:
    """Why a GPU trial with this distributed-executor-backend (None: vllm-sweep's choice, ray
    when TP x PP > 1), shape and data-parallel-size cannot run in its placement group (None:
    it can). Pure.
    - mp at TP x PP > 1: the server actor holds no GPU and CUDA_VISIBLE_DEVICES is unset, so
      vLLM's mp workers take physical GPUs 0..N-1, those of other trials;
    - ray at TP x PP = 1: the actor holds the bundle's only GPU (launcher.launch) and vLLM's
      Ray worker asks for a GPU in that same bundle: it never starts;
    - uni at TP x PP > 1: vLLM's uniprocess executor starts rank 0 alone, which waits for the
      other ranks of its process group forever;
    - data-parallel-size > 1: `data_parallel_problem` (GPU engine).
    cluster/devices.py `problems` shows what each refused layout would do (#32)."""
    world = shape.world_size
    if data_parallel > 1:
        return data_parallel_problem("gpu", Shape(shape.tp, shape.pp, data_parallel))
    if backend == "mp" and world > 1:
        return (f"the mp executor at TP {shape.tp} x PP {shape.pp} = {world} workers would take "
                f"physical GPUs 0..{world - 1}, other trials' (the server actor holds no GPU and "
                "CUDA_VISIBLE_DEVICES is unset): leave distributed-executor-backend out "
                "(vllm-sweep sets ray) or set ray")
    if backend == "uni" and world > 1:
        return (f"the uni executor at TP {shape.tp} x PP {shape.pp} = {world} starts rank 0 "
                "alone, which waits for the other ranks forever: leave "
                "distributed-executor-backend out (vllm-sweep sets ray) or set ray")
    if backend == "ray" and world == 1:
        return ("the ray executor at TP x PP = 1 never starts: the server actor holds the "
                "bundle's only GPU and vLLM's Ray worker asks for one in that same bundle; "
                "leave distributed-executor-backend out at TP x PP = 1")
    return None


def shape_problem(engine: str, backend: str | None, shape: Shape) -> str | None:
    """Why a server of this shape cannot run in a trial's placement group on `engine` (None:
    it can): executor_problem on GPUs (and on FakeEngine's fake GPUs), data_parallel_problem
    on the CPU engine, whose executor vllm-sweep chooses."""
    if engine == "cpu":
        return data_parallel_problem(engine, shape)
    return executor_problem(backend, Shape(shape.tp, shape.pp), shape.dp)


def bundles(shape: Shape, engine: str, cpus_per_worker: int) -> list[Bundle]:
    """One bundle per worker of every engine (TP x PP x DP). GPU engine: {GPU: 1} (+1 CPU in
    bundle 0 for the server actor); CPU engine: {CPU: cpus_per_worker} (the server actor shares
    bundle 0's CPUs)."""
    if engine == "cpu":
        return [{"CPU": float(cpus_per_worker)} for _ in range(shape.devices)]
    out: list[Bundle] = [{"GPU": 1.0} for _ in range(shape.devices)]
    out[0] = {"GPU": 1.0, "CPU": 1.0}
    return out


def node_unit(shape: Shape) -> int:
    """Consecutive bundles that must share a node: the whole group when PP = 1 (its TP ranks,
    or its DP engines: vLLM starts them on the server's node), one stage (TP bundles) when
    PP > 1."""
    return shape.devices if shape.pp == 1 else shape.tp


def _units(wanted: Sequence[Bundle], unit: int) -> list[Bundle]:
    """The summed resources of each run of `unit` consecutive bundles."""
    out = []
    for start in range(0, len(wanted), unit):
        total: Bundle = {}
        for bundle in wanted[start:start + unit]:
            for k, v in bundle.items():
                total[k] = total.get(k, 0.0) + v
        out.append(total)
    return out


def assign_units(wanted: Sequence[Bundle], unit: int,
                 nodes: Mapping[str, Mapping[str, float]]) -> list[str] | None:
    """A node for each bundle such that every unit of `unit` consecutive bundles shares one,
    from the resources `nodes` (node id -> resources) offer; None if there is none. Units are
    placed largest first, each on the node that fits it with the least left over (best fit,
    so large holes stay free for large shapes)."""
    left = {node: dict(res) for node, res in nodes.items()}
    units = _units(wanted, unit)
    chosen: dict[int, str] = {}
    for i in sorted(range(len(units)), key=lambda i: -sum(units[i].values())):
        need = units[i]
        fitting = [n for n, res in left.items() if all(res.get(k, 0.0) >= v for k, v in need.items())]
        if not fitting:
            return None
        best = min(fitting, key=lambda n: (sum(left[n].get(k, 0.0) - v for k, v in need.items()), n))
        for k, v in need.items():
            left[best][k] -= v
        chosen[i] = best
    return [chosen[b // unit] for b in range(len(wanted))]


def fits(wanted: Sequence[Bundle], nodes: Sequence[Mapping[str, float]], unit: int = 1) -> bool:
    """Whether the bundles could be placed, `unit` consecutive bundles per node, on nodes with
    these total resources (an idle cluster)."""
    return assign_units(wanted, unit, {str(i): n for i, n in enumerate(nodes)}) is not None


@dataclass(frozen=True)
class Layout:
    """How to ask Ray for a group: a strategy and, for pinned stages, one label selector per
    bundle (`ray.io/node-id`)."""

    strategy: str
    label_selector: tuple[dict[str, str], ...] | None = None


NODE_ID_LABEL = "ray.io/node-id"


def layout(wanted: Sequence[Bundle], unit: int, free: Mapping[str, Mapping[str, float]],
           total: Mapping[str, Mapping[str, float]], avoid: Collection[str] = ()) -> Layout:
    """STRICT_PACK for one unit, PACK for units of one bundle (Ray fills the node it picks
    first), else every stage pinned to a node: chosen from the `free` resources per node if
    they can take the group now, else from the `total` ones (the group then waits there; the
    launcher lays it out again later).
    `avoid`: node ids the group should not use (a decode server: its prefill servers' nodes).
    Kept when the other nodes' totals could hold the group: pinned stages are then chosen among
    them, else every bundle gets the selector `ray.io/node-id: !in(<ids>)`; dropped when they
    could not (the group is laid out as without it)."""
    if avoid:
        others_free = {n: r for n, r in free.items() if n not in avoid}
        others_total = {n: r for n, r in total.items() if n not in avoid}
        if assign_units(wanted, unit, others_total) is not None:
            pinned = layout(wanted, unit, others_free, others_total)
            if pinned.label_selector:
                return pinned
            away = {NODE_ID_LABEL: f"!in({','.join(sorted(avoid))})"}
            return Layout(pinned.strategy, tuple(dict(away) for _ in wanted))
    if unit >= len(wanted):
        return Layout("STRICT_PACK")
    if unit == 1:
        return Layout("PACK")
    nodes = assign_units(wanted, unit, free) or assign_units(wanted, unit, total)
    if nodes is None:
        return Layout("PACK")  # can never fit: the runner records it unplaceable first
    return Layout("PACK", tuple({NODE_ID_LABEL: n} for n in nodes))


def ranks_by_node(bundle_nodes: Sequence[str], driver_node: str) -> list[int]:
    """The rank vLLM's Ray executor gives each bundle: bundles sorted driver node first, then
    by node id, stable in bundle order (vllm/v1/executor/ray_utils.py,
    `get_bundles_sorted_by_node`); rank = position in that order."""
    order = sorted(range(len(bundle_nodes)),
                   key=lambda b: (0 if bundle_nodes[b] == driver_node else 1, bundle_nodes[b]))
    ranks = [0] * len(bundle_nodes)
    for rank, bundle in enumerate(order):
        ranks[bundle] = rank
    return ranks


def why_unplaceable(wanted: Sequence[Bundle], nodes: Sequence[Mapping[str, float]],
                    unit: int = 1) -> str:
    """A one-line reason naming the shortfall (call when `fits` is False)."""
    need: dict[str, float] = {}
    for b in wanted:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    have = {k: sum(n.get(k, 0.0) for n in nodes) for k in need}
    parts = [f"{k} {need[k]:g} needed, {have[k]:g} in the cluster" for k in need]
    if unit > 1 and all(have[k] >= need[k] for k in need):
        biggest = max((n.get(k, 0.0) for n in nodes for k in need), default=0.0)
        parts = [f"{unit} bundles must share a node (the TP ranks of a stage), and no node "
                 f"has room for {unit} (largest: {biggest:g})"]
    return (f"{len(wanted)} bundles {list(wanted)} cannot be placed on {len(nodes)} node(s): "
            + "; ".join(parts))


# Trials allowed to wait for placement at once. One waiting trial lets a large shape block the
# cluster while devices sit idle (head-of-line); a few let smaller trials backfill, while the
# study still never runs far ahead of the cluster. Beyond MAX_WAITING, a trial is asked for only
# while devices sit free that no waiting trial can use, up to MAX_BACKFILL waiting. Measured in
# docs/BENCHMARKS.md.
MAX_WAITING = 3
MAX_BACKFILL = 16


def ask_another(waiting: Sequence[int], free: float, max_waiting: int = MAX_WAITING,
                max_backfill: int = MAX_BACKFILL) -> bool:
    """Whether to ask the study for one more trial, given the device counts of the trials still
    waiting for placement and the devices no group holds: yes while len(waiting) < max_waiting;
    beyond that only while free >= 1 and every waiting trial needs more than `free` (so the free
    devices would sit idle), up to max_backfill waiting."""
    if len(waiting) < max_waiting:
        return True
    return len(waiting) < max_backfill and free >= 1 and min(waiting) > free
