"""Ray's autoscaler on emulated nodes (#32, autoscaler-aware placement): a Ray node provider
whose nodes are isolated nodes (tests/isolated_nodes.py: each in its own mount and PID
namespace, on its own loopback address), and a cluster whose head runs Ray's own autoscaler
(the v1 monitor, ray/autoscaler/_private/monitor.py) with that provider.

The provider is Ray's "external" kind (ray/autoscaler/_private/providers.py, `module:`), loaded
by the head's monitor process: it lives in that process, not in the test's. It implements
ray/autoscaler/node_provider.py's NodeProvider as a cloud provider would: a node's id is its
address (the autoscaler matches Ray's nodes to the provider's by internal_ip), a node is
"running" from its launch, and the autoscaler waits for its raylet like for a cloud VM's.
No node updater runs (`disable_node_updaters`, as Ray's fake_multi_node provider does): the
node starts Ray itself, as a VM's start-up script would. Each launch is appended to
`<parent>/autoscaled.jsonl` (the `unshare` process's pid, the namespace's first process and its
PID namespace), which is how the test stops the nodes the autoscaler made.

`autoscaling_cluster` is a head (ray.cluster_utils) whose monitor runs on an autoscaling config
of the given worker node types; on exit the nodes the provider launched stop, then the head.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import NODE_KIND_HEAD
from ray.autoscaler.tags import NODE_KIND_WORKER
from ray.autoscaler.tags import STATUS_UP_TO_DATE
from ray.autoscaler.tags import TAG_RAY_NODE_KIND
from ray.autoscaler.tags import TAG_RAY_NODE_NAME
from ray.autoscaler.tags import TAG_RAY_NODE_STATUS
from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

from tests.clusters import HEAD_IP
from tests.clusters import _restore
from tests.clusters import emulated_cluster
from tests.clusters import free_ports
from tests.isolated_nodes import IsolatedNode
from tests.isolated_nodes import _first_process
from tests.isolated_nodes import namespace_argv
from tests.isolated_nodes import node_env
from tests.isolated_nodes import ray_worker_argv
from tests.isolated_nodes import stop_node
from tests.procs import MARKER_VAR

ROOT = Path(__file__).resolve().parents[1]
HEAD_TYPE = "head"
LAUNCHES = "autoscaled.jsonl"


class IsolatedNodeProvider(NodeProvider):
    """Launches each node the autoscaler asks for as an isolated node at the next address of
    `provider.ips`, joined to `provider.gcs_address`, under `provider.parent`."""

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        self._lock = threading.RLock()
        self._parent = Path(provider_config["parent"])
        self._free = list(provider_config["ips"])
        self._gcs = provider_config["gcs_address"]
        self._nodes: dict[str, dict[str, Any]] = {HEAD_IP: {"tags": {
            TAG_RAY_NODE_KIND: NODE_KIND_HEAD, TAG_RAY_USER_NODE_TYPE: HEAD_TYPE,
            TAG_RAY_NODE_NAME: HEAD_IP, TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE}}}

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        with self._lock:
            return [n for n, node in self._nodes.items()
                    if all(node["tags"].get(k) == v for k, v in tag_filters.items())]

    def is_running(self, node_id: str) -> bool:
        with self._lock:
            return node_id in self._nodes

    def is_terminated(self, node_id: str) -> bool:
        return not self.is_running(node_id)

    def node_tags(self, node_id: str) -> dict[str, str]:
        with self._lock:
            return dict(self._nodes[node_id]["tags"])

    def external_ip(self, node_id: str) -> str:
        return node_id

    def internal_ip(self, node_id: str) -> str:
        return node_id

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        with self._lock:
            self._nodes[node_id]["tags"].update(tags)

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str],
                    count: int) -> None:
        raise NotImplementedError("the autoscaler calls create_node_with_resources_and_labels")

    def create_node_with_resources_and_labels(
            self, node_config: dict[str, Any], tags: dict[str, str], count: int,
            resources: dict[str, float], labels: dict[str, str]) -> None:
        for _ in range(count):
            with self._lock:
                ip = self._free.pop(0)  # IndexError: the test gave too few addresses
            node = _launch(self._gcs, self._parent, ip, resources)
            with self._lock:
                self._nodes[ip] = {"tags": {
                    **tags, TAG_RAY_NODE_KIND: NODE_KIND_WORKER, TAG_RAY_NODE_NAME: ip,
                    TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE}, "node": node}

    def terminate_node(self, node_id: str) -> None:
        with self._lock:
            node = self._nodes.pop(node_id)
        stop_node(node["node"])

    @staticmethod
    def bootstrap_config(cluster_config: dict[str, Any]) -> dict[str, Any]:
        return cluster_config


def _launch(gcs: str, parent: Path, ip: str, resources: Mapping[str, float]) -> IsolatedNode:
    """Start an isolated node (tests.isolated_nodes.isolated_node's steps, without waiting for
    the GCS to list it: the autoscaler does) and record it in LAUNCHES."""
    folder = parent / f"n{ip.rsplit('.', 1)[1]}"
    folder.mkdir()
    log_path = parent / f"{folder.name}.out"
    rest = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    (agent_port,) = free_ports(1)
    argv = namespace_argv(parent, folder, ray_worker_argv(
        gcs, ip, folder, int(resources.get("CPU", 1)), int(resources.get("GPU", 0)), rest,
        agent_port))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=node_env(os.environ, os.environ[MARKER_VAR], folder),
                                cwd=folder, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    first_pid, pid_ns = _first_process(proc, 60.0)
    started = psutil.Process(proc.pid).create_time()
    with open(parent / LAUNCHES, "a") as out:
        out.write(json.dumps({"ip": ip, "pid": proc.pid, "first_pid": first_pid,
                              "pid_ns": pid_ns, "marker": os.environ[MARKER_VAR],
                              "started": started}) + "\n")
    return IsolatedNode(ip, folder, log_path, proc, first_pid, pid_ns, os.environ[MARKER_VAR])


@dataclass(frozen=True)
class Launched:
    """A node the provider launched, as LAUNCHES records it."""

    ip: str
    pid: int
    first_pid: int
    pid_ns: str
    marker: str
    started: float  # the `unshare` process's create time: its identity, with its pid


def launched(parent: Path) -> list[Launched]:
    path = parent / LAUNCHES
    if not path.exists():
        return []
    return [Launched(**json.loads(line)) for line in path.read_text().splitlines()]


def autoscaling_config(parent: Path, gcs_address: str, ips: list[str],
                       worker_types: Mapping[str, Mapping[str, Any]],
                       max_workers: int) -> dict[str, Any]:
    """A `ray up`-format config: the head type (no workers) and `worker_types`
    (`resources`, `min_workers`, `max_workers` each), the provider above; idle nodes are kept
    for the test's length."""
    return {
        "cluster_name": "vst-autoscaling", "max_workers": max_workers,
        "upscaling_speed": 1.0, "idle_timeout_minutes": 60,
        "provider": {"type": "external",
                     "module": "tests.autoscaling_provider.IsolatedNodeProvider",
                     "disable_node_updaters": True, "disable_launch_config_check": True,
                     "parent": str(parent), "ips": ips, "gcs_address": gcs_address},
        "head_node_type": HEAD_TYPE,
        "available_node_types": {
            HEAD_TYPE: {"resources": {}, "node_config": {}, "max_workers": 0},
            **{name: {"node_config": {}, **spec} for name, spec in worker_types.items()}},
        "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": []}


@contextlib.contextmanager
def autoscaling_cluster(parent: Path, head: Mapping[str, Any], ips: list[str],
                        worker_types: Mapping[str, Mapping[str, Any]],
                        max_workers: int) -> Iterator[tuple[str, str, Path]]:
    """A head (`head`: ray.cluster_utils add_node arguments) whose monitor runs Ray's
    autoscaler with IsolatedNodeProvider over `worker_types`; yields (GCS address, marker,
    the autoscaling config's path). On exit: every node launched stops (the autoscaler asks
    for none then: the sweeps are over and no type has min_workers), then the head."""
    (port,) = free_ports(1)
    gcs = f"{HEAD_IP}:{port}"
    config = parent / "autoscaling.json"
    config.write_text(json.dumps(autoscaling_config(parent, gcs, ips, worker_types, max_workers)))
    head_tmp = parent / "head"
    head_tmp.mkdir()
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "PYTHONPATH", "AUTOSCALER_UPDATE_INTERVAL_S")}
    # the monitor imports this module, takes its TMPDIR, and looks every second (default 5)
    os.environ.update(TMPDIR=str(head_tmp), AUTOSCALER_UPDATE_INTERVAL_S="1", PYTHONPATH=(
        f"{ROOT}{os.pathsep}{saved['PYTHONPATH']}" if saved["PYTHONPATH"] else str(ROOT)))
    try:
        with emulated_cluster(parent, [{**head, "gcs_server_port": port,
                                        "autoscaling_config": str(config)}]) as (_, address, marker):
            _restore(saved)  # the head's processes have theirs
            assert address == gcs, (address, gcs)
            try:
                yield address, marker, config
            finally:
                stopped = stop_launched(parent)
        assert stopped == [], stopped
    finally:
        _restore(saved)


def stop_launched(parent: Path) -> list[str]:
    """Stop every node LAUNCHES lists (tests.isolated_nodes.stop_node by its recorded pids);
    descriptions of processes left."""
    left: list[str] = []
    for node in launched(parent):
        record = IsolatedNode(node.ip, parent, parent / "x", _Pid(node.pid),  # type: ignore[arg-type]
                              node.first_pid, node.pid_ns, node.marker)
        if _same_process(node.pid, node.started):
            left += stop_node(record)  # `unshare` alive: its namespace and first pid are too
        else:  # ended (the autoscaler stopped it): its pids may be another's now, kill none
            left += [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in wait_gone(record)]
    return left


def _same_process(pid: int, started: float) -> bool:
    try:
        return psutil.Process(pid).create_time() == started
    except psutil.Error:
        return False


def wait_gone(node: IsolatedNode, timeout_s: float = 30.0) -> list[psutil.Process]:
    """The node's processes still there after waiting up to `timeout_s` for none."""
    deadline = time.monotonic() + timeout_s
    while (left := node.processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


class _Pid:
    """stop_node's view of a process this one did not start: its pid, a wait that polls."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(psutil.Error):
            psutil.Process(self.pid).wait(timeout)
