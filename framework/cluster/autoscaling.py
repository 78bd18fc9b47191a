"""The nodes an autoscaling cluster can still add (#32 defect 6): a trial whose shape fits only
once the autoscaler adds a node is queued, not refused as unplaceable.

The fit check (sweep/trial_plan.py `rejection`) asks whether a shape could ever be placed; on
the nodes alive now alone, a `ray up` cluster whose GPU workers are still joining, or one that
scales from zero, refuses every GPU shape and never asks for a node. Here the nodes a trial may
wait for are the alive ones plus, per worker node type, `max_workers` minus those of the type
running (`possible_nodes`); a trial placed on them waits in the launcher for its placement group,
whose pending demand is what makes Ray's autoscaler add the node.

Where the node types come from (`find_scale_up`), first found wins:
1. `cluster.autoscaling_config` of the sweep: a `ray up` cluster config (this repository's
   cluster.yaml, say), its `available_node_types`, `head_node_type` and `max_workers`;
2. Ray's record of the cluster's node groups in the GCS (ray/_private/state.py
   `get_cluster_config`, the source Ray Data's autoscaler reads; KubeRay reports it);
3. `~/ray_bootstrap_config.yaml` on the driver's node: the copy of the config `ray up` leaves on
   the head (ray/autoscaler/_private/commands.py), where `ray job submit` runs drivers; its node
   types carry the CPU, GPU and memory Ray's provider filled in.
Only on a joined cluster (a private local Ray has no autoscaler). A node type that declares no
CPU (Ray's cloud providers fill it in from the instance type at launch) counts as having CPUs
for any bundle; any other resource it leaves out counts as none.

How many of a type run: the autoscaler's own status record in the GCS (`__autoscaling_status`,
written by ray/autoscaler/_private/monitor.py: `autoscaler_report.active_nodes` and
`idle_nodes`, type -> count), else none (every node of the type counted as addable: a trial may
then wait until the launcher's placement timeout, never be refused wrongly).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

BOOTSTRAP_CONFIG = Path("~/ray_bootstrap_config.yaml")
STATUS_KEY = "__autoscaling_status"  # ray/_private/ray_constants.py DEBUG_AUTOSCALING_STATUS
UNLIMITED = 64  # nodes counted for a type without a limit (-1): more than one trial spans


class AutoscalingConfigError(ValueError):
    """An autoscaling config that cannot be read: one line naming the file and the key."""


@dataclass(frozen=True)
class NodeType:
    """A worker node type: its resources (per node) and how many the autoscaler may run."""

    name: str
    resources: Mapping[str, float]
    max_workers: int


@dataclass(frozen=True)
class ScaleUp:
    """The worker node types an autoscaler may add, the cluster-wide cap on worker nodes (None:
    no cap) and where they were read (for the run's console)."""

    types: tuple[NodeType, ...]
    max_workers: int | None
    source: str

    def describe(self) -> str:
        kinds = ", ".join(f"{t.name} x{t.max_workers} {_resources(t.resources)}"
                          for t in self.types)
        cap = "" if self.max_workers is None else f", at most {self.max_workers} worker nodes"
        return f"autoscaler may add: {kinds or 'no worker node type'}{cap} ({self.source})"


def _resources(resources: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


def _node_resources(declared: Mapping[str, Any]) -> dict[str, float]:
    resources = {str(k): float(v) for k, v in declared.items()}
    resources.setdefault("CPU", math.inf)  # filled in from the instance type by the provider
    return resources


def parse_config(config: Mapping[str, Any], source: str) -> ScaleUp:
    """The worker node types of a `ray up` config (`available_node_types`, less
    `head_node_type`), with `max_workers` per type and cluster-wide. Raises
    AutoscalingConfigError naming `source` and the key for a config without node types or with
    a malformed one."""
    types = config.get("available_node_types")
    if not isinstance(types, Mapping) or not types:
        raise AutoscalingConfigError(f"{source}: available_node_types: none found (a `ray up` "
                                     "cluster config names its node types there)")
    head = config.get("head_node_type")
    found = []
    for name, spec in types.items():
        if name == head:
            continue
        where = f"{source}: available_node_types.{name}"
        if not isinstance(spec, Mapping):
            raise AutoscalingConfigError(f"{where}: {spec!r} is not a mapping")
        resources = spec.get("resources") or {}
        count = spec.get("max_workers", config.get("max_workers", 0))
        if not isinstance(resources, Mapping) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in resources.values()):
            raise AutoscalingConfigError(f"{where}.resources: {resources!r} is not a mapping "
                                         "of resource names to numbers")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise AutoscalingConfigError(f"{where}.max_workers: {count!r} is not a count")
        found.append(NodeType(str(name), _node_resources(resources), count))
    cap = config.get("max_workers")
    return ScaleUp(tuple(found), cap if isinstance(cap, int) and cap >= 0 else None, source)


def read_config(path: Path) -> ScaleUp:
    """`parse_config` of a YAML (or JSON) file; AutoscalingConfigError for one that cannot be
    read or parsed, naming the file."""
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise AutoscalingConfigError(f"{path}: cannot be read as a cluster config: "
                                     f"{str(exc).splitlines()[0]}") from None
    if not isinstance(config, Mapping):
        raise AutoscalingConfigError(f"{path}: not a mapping (a `ray up` cluster config)")
    return parse_config(config, str(path))


def from_cluster_config(groups: Sequence[Any]) -> ScaleUp:
    """Node types from Ray's ClusterConfig proto's `node_group_configs` (name, resources,
    max_count; -1, no limit, counts as UNLIMITED)."""
    types = tuple(NodeType(g.name, _node_resources(dict(g.resources)),
                           g.max_count if g.max_count >= 0 else UNLIMITED)
                  for g in groups if g.max_count != 0 and g.resources)
    return ScaleUp(types, None, "Ray's cluster config in the GCS")


def running_counts(status: Mapping[str, Any] | None) -> dict[str, int]:
    """Nodes running per node type, from the autoscaler's status record (active and idle);
    empty without one."""
    report = (status or {}).get("autoscaler_report") or {}
    counts: dict[str, int] = {}
    for key in ("active_nodes", "idle_nodes"):
        for name, n in (report.get(key) or {}).items():
            counts[name] = counts.get(name, 0) + int(n)
    return counts


def possible_nodes(alive: Sequence[Mapping[str, float]], scale: ScaleUp | None,
                   running: Mapping[str, int]) -> list[dict[str, float]]:
    """The alive nodes' resources, then one entry per node the autoscaler may still add: of each
    type, max_workers - running[type] (not below 0), in the types' order, at most
    scale.max_workers - (the running worker nodes) in all."""
    nodes = [dict(n) for n in alive]
    if scale is None:
        return nodes
    room = math.inf if scale.max_workers is None else max(
        0, scale.max_workers - sum(running.get(t.name, 0) for t in scale.types))
    for node_type in scale.types:
        for _ in range(max(0, node_type.max_workers - running.get(node_type.name, 0))):
            if room <= 0:
                return nodes
            nodes.append(dict(node_type.resources))
            room -= 1
    return nodes


def find_scale_up(configured: Path | None, joined: bool) -> ScaleUp | None:
    """The node types the cluster's autoscaler may add, from the first source of the module's
    docstring that has them; None on a private local Ray or where no source has any.
    Needs a connected Ray for the GCS source."""
    if configured is not None:
        return read_config(configured)
    if not joined:
        return None
    from ray._private.state import state

    try:
        config = state.get_cluster_config()
    except Exception:  # noqa: BLE001 - an older GCS without the record: the next source
        config = None
    if config is not None and config.node_group_configs:
        return from_cluster_config(config.node_group_configs)
    bootstrap = BOOTSTRAP_CONFIG.expanduser()
    return read_config(bootstrap) if bootstrap.is_file() else None


def autoscaler_status() -> dict[str, Any] | None:
    """The autoscaler's status record from the GCS (None without an autoscaler); needs a
    connected Ray."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(STATUS_KEY)
    return json.loads(raw) if raw else None
