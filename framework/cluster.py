"""Ray: the local cluster, one placement group and one server actor per trial. The only module
importing ray.

A trial's vLLM server runs in-process in a `ServerActor` scheduled on bundle 0 of the trial's
own placement group with `placement_group_capture_child_tasks=True`, so anything vLLM asks Ray
for lands inside that group (FIELD_NOTES). Stopping a trial kills the actor, then waits for every
process of its tree (found on the actor's node) to exit, SIGKILLing stragglers.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from framework import engine
from framework.errors import ClusterError, TrialError


@ray.remote(num_cpus=0)
class ServerActor:
    """Hosts one vLLM server. Call `prepare` first, then `serve` (blocks until the server ends)."""

    def prepare(self, host: str) -> dict:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        return {"pid": os.getpid(), "port": port, "node_ip": ray.util.get_node_ip_address(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def serve(self, argv: list[str], log_path: str) -> None:
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        engine.redirect_output(Path(log_path))
        engine.serve(argv)


def _tree(pid: int) -> list[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        return [pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def _reap(pids: list[int], grace_s: float) -> list[int]:
    """Wait up to grace_s for pids to exit, SIGKILL the rest; returns pids still alive after."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in alive]


_tree_remote = ray.remote(num_cpus=0)(_tree)
_reap_remote = ray.remote(num_cpus=0)(_reap)


@dataclass
class RayServer:
    """A running (or starting) server of one trial: implements trial.ServerHandle."""

    actor: ray.actor.ActorHandle
    group: PlacementGroup
    serve_ref: ray.ObjectRef
    base_url: str
    node_ip: str
    node_id: str
    pid: int
    _stopped: bool = field(default=False, repr=False)

    def _on_node(self, fn, *args):
        strategy = NodeAffinitySchedulingStrategy(self.node_id, soft=False)
        return ray.get(fn.options(scheduling_strategy=strategy).remote(*args), timeout=60)

    def is_alive(self) -> bool:
        done, _ = ray.wait([self.serve_ref], timeout=0)
        return not done

    def failure(self) -> TrialError | None:
        """Why the server ended (None while it runs or if it exited cleanly)."""
        if self.is_alive():
            return None
        try:
            ray.get(self.serve_ref, timeout=5)
        except TrialError as exc:
            return exc
        except ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            if isinstance(cause, TrialError):
                return cause
            return TrialError("startup_crash", str(exc).splitlines()[-1][:2000])
        except ray.exceptions.ActorDiedError as exc:
            return TrialError("server_died", f"server actor died: {str(exc).splitlines()[0]}")
        return TrialError("server_died", "server exited")

    def stop(self) -> list[int]:
        """Kill the actor and its process tree; returns pids that survived (should be [])."""
        if self._stopped:
            return []
        self._stopped = True
        try:
            pids = self._on_node(_tree_remote, self.pid)
        except Exception:  # noqa: BLE001 - the node may be gone; nothing left to find there
            pids = []
        ray.kill(self.actor, no_restart=True)
        try:
            left = self._on_node(_reap_remote, pids, 15.0) if pids else []
        except Exception:  # noqa: BLE001
            left = []
        remove_placement_group(self.group)
        return left


@dataclass(frozen=True)
class RayLauncher:
    """Starts trial servers on the connected Ray cluster: implements trial.ServerLauncher."""

    env: Mapping[str, str]
    host: str
    cpus_per_server: int
    placement_timeout_s: float = 600.0

    def launch(self, argv_for_port, log_path: Path) -> RayServer:
        """`argv_for_port(host, port)` builds the server argv once the port is known."""
        group = placement_group([{"CPU": self.cpus_per_server}], strategy="PACK")
        ready, _ = ray.wait([group.ready()], timeout=self.placement_timeout_s)
        if not ready:
            remove_placement_group(group)
            raise ClusterError(f"placement group of {self.cpus_per_server} CPU not placed within "
                               f"{self.placement_timeout_s:.0f} s")
        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True)
        actor = ServerActor.options(
            num_cpus=self.cpus_per_server, scheduling_strategy=strategy,
            runtime_env={"env_vars": dict(self.env)}).remote()
        try:
            info = ray.get(actor.prepare.remote(self.host), timeout=120)
        except Exception:
            ray.kill(actor, no_restart=True)
            remove_placement_group(group)
            raise
        argv = argv_for_port(self.host, info["port"])
        ref = actor.serve.remote(argv, str(log_path))
        return RayServer(actor=actor, group=group, serve_ref=ref,
                         base_url=f"http://{self.host}:{info['port']}", node_ip=info["node_ip"],
                         node_id=info["node_id"], pid=info["pid"])


@dataclass
class RaySession:
    """Connects to Ray for the sweep: joins `address` (or RAY_ADDRESS) if given, else starts a
    private local Ray in its own temp dir and stops it on close."""

    address: str | None
    num_cpus: int | None = None
    _temp_dir: str | None = None

    @property
    def is_local(self) -> bool:
        return self.address is None and not os.environ.get("RAY_ADDRESS")

    def __enter__(self) -> RaySession:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        if self.is_local:
            self._temp_dir = tempfile.mkdtemp(prefix="vsweep-ray-")
            try:
                ray.init(address="local", num_cpus=self.num_cpus or os.cpu_count(),
                         include_dashboard=False, _temp_dir=self._temp_dir, log_to_driver=False,
                         logging_level="WARNING")
            except Exception as exc:
                raise ClusterError(f"could not start a local Ray: {exc}") from None
        else:
            try:
                ray.init(address=self.address or "auto", log_to_driver=False,
                         logging_level="WARNING")
            except Exception as exc:
                raise ClusterError(f"could not join Ray at {self.address or os.environ.get('RAY_ADDRESS')}: "
                                   f"{exc}") from None
        return self

    def __exit__(self, *exc) -> None:
        ray.shutdown()
        if self._temp_dir:
            _wait_for_ray_exit(self._temp_dir)
            shutil.rmtree(self._temp_dir, ignore_errors=True)


def _wait_for_ray_exit(temp_dir: str, timeout_s: float = 20.0) -> None:
    """After ray.shutdown of a local Ray: wait for (then kill) processes still using temp_dir."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in psutil.process_iter(["cmdline"])
                if p.info["cmdline"] and any(temp_dir in a for a in p.info["cmdline"])]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
