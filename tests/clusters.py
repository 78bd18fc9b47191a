"""Emulated Ray clusters on this machine's loopback addresses: ray.cluster_utils nodes
(emulated_cluster), the session's shared one (SharedRay, join_shared), `ray start` argv and
ports."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from framework.cluster.ports import pick_port
from framework.cluster.ray_session import START_ATTEMPTS
from framework.cluster.ray_session import STARTUP_TIMEOUT
from tests.procs import MARKER_VAR
from tests.procs import new_marker
from tests.procs import wait_no_marked_processes

HEAD_IP = "127.0.0.9"  # emulated heads: loopback, apart from the 127.0.0.2.. workers
SHUTDOWN_GUARD_S = 180.0  # how long a shut-down cluster's processes may take to end


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextlib.contextmanager
def emulated_cluster(tmp: Path, nodes: list[dict], keep_env: bool = True):
    """A Ray cluster of several nodes on this machine (ray.cluster_utils; `nodes[0]` is the
    head, later ones should set distinct `node_ip_address`es like 127.0.0.2). The head gets
    HEAD_IP unless it names its own: every node has a loopback address (Ray would otherwise give
    the head the machine's address, and servers with `host: node` would bind it), asserted
    once the nodes are up. Every process is tagged with a fresh marker; yields (cluster, gcs
    address, marker) and, on exit, shuts the cluster down and asserts none of its processes is
    left. This process's environment carries the marker and RAY_TMPDIR=`tmp` while the block
    runs, or (keep_env=False) only while the nodes start."""
    from ray.cluster_utils import Cluster

    marker = new_marker()
    saved = {k: os.environ.get(k) for k in (MARKER_VAR, "RAY_TMPDIR", "VLLM_TARGET_DEVICE")}
    os.environ[MARKER_VAR] = marker
    os.environ["RAY_TMPDIR"] = str(tmp)  # Ray's address file and sessions stay in here
    os.environ.pop("VLLM_TARGET_DEVICE", None)  # it would bypass vLLM platform plugins
    cluster = Cluster(shutdown_at_exit=True)
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                _add_nodes(cluster, nodes)
                break
            except Exception as exc:
                # Ray's own fixed 30 s for a raylet to register, missed on a loaded machine:
                # started again, as the product's private Ray is (cluster/ray_session.py)
                if attempt == START_ATTEMPTS or STARTUP_TIMEOUT not in str(exc):
                    raise
                cluster.shutdown()
                wait_no_marked_processes(marker, timeout_s=0)  # what the failed start left
                cluster = Cluster(shutdown_at_exit=True)
        cluster.wait_for_nodes(timeout=120)
        assert_loopback_nodes(cluster.address)
        if not keep_env:
            _restore(saved)
        yield cluster, cluster.address, marker
    finally:
        cluster.shutdown()
        _restore(saved)
        # a failure guard: Ray's idle workers end on their own once their raylet is gone,
        # which a starved CPU can make take longer than 45 s (s20burn: a head's ray::IDLE)
        left = wait_no_marked_processes(marker, timeout_s=SHUTDOWN_GUARD_S)
    assert left == [], left


def _add_nodes(cluster: Any, nodes: list[dict]) -> None:
    """`nodes` added to `cluster` (ray.cluster_utils.Cluster), the first as its head."""
    # no log monitor: nothing here forwards worker logs to a driver (the product's drivers
    # say log_to_driver=False), and a long-lived head's monitor polling every log file
    # cost ~94 core-s over the suite (docs/BENCHMARKS.md, session 13); later nodes have
    # none already (ray.cluster_utils: one per physical host)
    cluster.add_node(include_dashboard=False, include_log_monitor=False,
                     **{"node_ip_address": HEAD_IP, **nodes[0]})
    for node in nodes[1:]:
        cluster.add_node(**node)


def assert_loopback_nodes(address: str) -> None:
    """Every node of the cluster at `address` has a loopback address (checked from a child
    process, so this process joins no cluster)."""
    code = (f"import ray; ray.init(address={address!r}, logging_level='ERROR'); "
            "print(' '.join(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, RAY_ADDRESS="")).stdout.split()
    assert out and all(ipaddress.ip_address(ip).is_loopback for ip in out), out


# The actor table as GCS holds it, dead actors included: the source of `ray list actors
# --detail` (ray/util/state/common.py ActorState.serialized_runtime_env), read without a
# dashboard, which the state API needs and the test clusters do not run.
_ACTOR_TABLE = """
import json, sys, ray
from ray.core.generated import gcs_pb2
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
rows = [gcs_pb2.ActorTableData.FromString(b)
        for b in ray._private.state.state._connect_and_get_accessor().get_actor_table(None, None)]
print(json.dumps([{"class_name": r.class_name, "state": gcs_pb2.ActorTableData.ActorState.Name(
    r.state), "serialized_runtime_env": r.serialized_runtime_env} for r in rows]))
"""


def actor_table(address: str) -> list[dict[str, str]]:
    """Every actor the cluster at `address` has held (class name, state, serialized runtime
    env), from a child process, so this process joins no cluster."""
    res = subprocess.run([sys.executable, "-c", _ACTOR_TABLE, address], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, RAY_ADDRESS=""))
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class SharedRay:
    """The session's emulated one-node Ray (tests/e2e/conftest.py `shared_ray`): its GCS
    address, the marker every process of it carries, and the folder of its session files."""

    address: str
    marker: str
    folder: Path


def join_shared(doc: dict[str, Any], ray: SharedRay,
                max_concurrent_trials: int | None = 1) -> dict[str, Any]:
    """A sweep document moved from a private Ray onto the shared one: `cluster.address` set,
    the private Ray's resources dropped, and (unless None) at most `max_concurrent_trials`
    side by side, as the private Ray's resources allowed."""
    cluster = {k: v for k, v in (doc.get("cluster") or {}).items()
               if k not in ("num_cpus", "num_gpus")}
    cluster["address"] = ray.address
    if max_concurrent_trials is not None:
        cluster.setdefault("max_concurrent_trials", max_concurrent_trials)
    return {**doc, "cluster": cluster}


def free_ports(n: int) -> list[int]:
    """n distinct ports outside the kernel's ephemeral range (ports.pick_port), so the Ray
    processes' own port-0 binds cannot take them before `ray start` binds them."""
    ports: list[int] = []
    for _ in range(n):
        ports.append(pick_port("127.0.0.1", ports))
    return ports


def ray_head_argv(ray: str, node_ip: str, ports: list[int], temp_dir: Path, num_cpus: int) -> list[str]:
    """`ray start --head --block` on a loopback `node_ip` (never 127.0.0.1, which `ray start`
    swaps for the machine's address) with every port given: `ports` = gcs, dashboard,
    dashboard agent, ray client; the dashboard listens on 127.0.0.1."""
    gcs_port, dash_port, agent_port, client_port = ports
    return [ray, "start", "--head", "--block", "--disable-usage-stats",
            "--node-ip-address", node_ip, "--port", str(gcs_port),
            "--temp-dir", str(temp_dir), "--num-cpus", str(num_cpus),
            "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(dash_port),
            "--dashboard-agent-listen-port", str(agent_port),
            "--ray-client-server-port", str(client_port)]
