"""Ray: the local cluster, one placement group and one server actor per trial. The only module
importing ray.

A trial's vLLM server runs in-process in a `ServerActor` scheduled on bundle 0 of the trial's
own placement group with `placement_group_capture_child_tasks=True`, so anything vLLM asks Ray
for lands inside that group (FIELD_NOTES). Stopping a trial kills the actor, then waits for every
process of its tree (found on the actor's node) to exit, SIGKILLing stragglers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from framework import engine, fake_engine
from framework.errors import ClusterError, TrialError
from framework.placement import Bundle
from framework.ports import claim_port, pick_port
from framework.session import SESSION_VAR, reap_session
from framework.vllm_plugin import ENV_FLAG


# Ray's GCS marks a node dead after ~5 missed health checks of 3 s; an actor on a dying node
# is reported dead before that.
NODE_DEATH_DETECTION_S = 45.0
# FakeEngine only: a JSON-lines file where each placeholder worker logs the device it claims
# and the launcher logs when the trial's group is released (scheduling tests read it).
OCCUPANCY_LOG_ENV = "FAKE_ENGINE_OCCUPANCY_LOG"


@ray.remote(num_cpus=0)
class ServerActor:
    """Hosts one vLLM server. Call `prepare` first, then `serve` (blocks until the server ends)."""

    def prepare(self, host: str, taken: list[int]) -> dict:
        """Pick a free port on this node that no other running trial holds."""
        node_ip = ray.util.get_node_ip_address()
        port = pick_port(node_ip if host == "node" else host, taken)
        return {"pid": os.getpid(), "port": port, "node_ip": node_ip,
                "node_id": ray.get_runtime_context().get_node_id()}

    def serve(self, argv: list[str], log_path: str, engine_name: str = "cpu",
              secret_env: dict[str, str] | None = None) -> None:
        """`secret_env` (e.g. VLLM_API_KEY) arrives as a call argument, not in the actor's
        runtime_env, which Ray records in its job and actor tables."""
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        os.environ.update(secret_env or {})
        engine.redirect_output(Path(log_path))
        if engine_name == "fake":
            self._workers: list = []
            fake_engine.serve(argv, on_ready=lambda args: self._start_fake_workers(args.port, log_path))
        else:
            engine.serve(argv)

    def _start_fake_workers(self, port: int, tag: str) -> None:
        """One placeholder per bundle of this trial's group, holding its GPU like a vLLM worker."""
        group = ray.util.get_current_placement_group()
        for index, bundle in enumerate(group.bundle_specs):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
            worker = FakeWorker.options(num_cpus=0, num_gpus=bundle.get("GPU", 0),
                                        scheduling_strategy=strategy).remote()
            self._workers.append(worker)
        events = ray.get([w.claim.remote(port, i, group.id.hex(), tag)
                          for i, w in enumerate(self._workers)], timeout=300)
        path = os.environ.get(OCCUPANCY_LOG_ENV)
        if path:
            with open(path, "a") as fh:
                fh.write("".join(json.dumps(e) + "\n" for e in events))


@ray.remote(num_cpus=0)
class FakeWorker:
    """FakeEngine's stand-in for a vLLM worker: reports where it landed and which GPUs it holds."""

    def claim(self, port: int, bundle: int, group_id: str, tag: str) -> dict:
        current = ray.util.get_current_placement_group()
        return {"t": time.time(), "tag": tag, "port": port, "bundle": bundle, "group": group_id,
                "in_group": current is not None and current.id.hex() == group_id,
                "node_ip": ray.util.get_node_ip_address(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


def _tree(pid: int) -> list[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        return [pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def _reap(pids: list[int], grace_s: float) -> list[int]:
    """SIGTERM pids (the server's tree, after its actor was killed: no need to wait for vLLM to
    notice its parent died), wait up to grace_s, SIGKILL the rest; returns pids still alive."""
    import psutil

    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            proc.send_signal(signal.SIGTERM)
            procs.append(proc)
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


def _stop_tree(pid: int, actor: ray.actor.ActorHandle, grace_s: float) -> list[int]:
    """The server actor's tree ended in one task on its node: the tree found while the actor
    (pid) still runs, the actor killed through Ray (so Ray records an intended death), then
    its descendants `_reap`ed; returns pids still alive."""
    tree = _tree(pid)
    ray.kill(actor, no_restart=True)
    return _reap(tree, grace_s)


_stop_tree_remote = ray.remote(num_cpus=0)(_stop_tree)


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
    port: int
    placement: tuple[str, ...]
    _on_stop: Callable[[RayServer], None] = field(default=lambda _: None, repr=False)
    _stopped: bool = field(default=False, repr=False)
    released_at: float | None = None  # wall clock just before the group was removed

    def _on_node(self, fn, *args):
        strategy = NodeAffinitySchedulingStrategy(self.node_id, soft=False)
        return ray.get(fn.options(scheduling_strategy=strategy).remote(*args), timeout=60)

    def is_alive(self) -> bool:
        done, _ = ray.wait([self.serve_ref], timeout=0)
        return not done

    def failure(self) -> TrialError | None:
        """Why the server ended (None while it runs)."""
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
        except ray.exceptions.RayActorError as exc:
            if self._stopped:
                return TrialError("server_died", "stopped by vllm-sweep")
            lost = self._await_lost_nodes(NODE_DEATH_DETECTION_S)
            if lost:
                return TrialError("node_lost", f"node(s) {', '.join(lost)} died")
            return TrialError("server_died", f"server actor died: {str(exc).splitlines()[0]}")
        return TrialError("server_died", "server exited")

    def _await_lost_nodes(self, timeout_s: float) -> list[str]:
        """The actor died: give Ray's health checks time to declare a dead node dead (not
        when the trial ran on the driver's own node only: that node is alive)."""
        if set(self.placement) | {self.node_ip} == {ray.util.get_node_ip_address()}:
            return []
        deadline = time.monotonic() + timeout_s
        while not (lost := self.lost_nodes()) and time.monotonic() < deadline:
            time.sleep(1.0)
        return lost

    def lost_nodes(self) -> list[str]:
        """IPs of this trial's nodes that Ray no longer sees alive."""
        alive = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        return sorted({ip for ip in (*self.placement, self.node_ip) if ip not in alive})

    def stop(self) -> list[int]:
        """End the actor's process tree (one task on its node: `_stop_tree`), then the actor
        and the group, so the devices are handed on only once every process that used them
        is gone; returns pids that survived (should be [])."""
        if self._stopped:
            return []
        self._stopped = True
        left: list[int] = []
        if self.node_ip not in self.lost_nodes():
            try:
                left = self._on_node(_stop_tree_remote, self.pid, self.actor, 10.0)
            except Exception:  # noqa: BLE001 - the node died meanwhile: nothing left to reap
                left = []
        ray.kill(self.actor, no_restart=True)
        self.released_at = time.time()
        remove_placement_group(self.group)
        self._on_stop(self)
        return left


def _bundle_nodes(group: PlacementGroup) -> tuple[str, ...]:
    """Node IP of each bundle, in bundle order (Ray does not order bundles by node)."""
    table = placement_group_table(group)
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    by_bundle = table["bundles_to_node_id"]
    return tuple(ips.get(by_bundle[i], "?") for i in sorted(by_bundle))


def node_resources() -> list[dict[str, float]]:
    """Total resources of each alive node (for `placement.fits`)."""
    return [dict(n["Resources"]) for n in ray.nodes() if n["Alive"]]


class RayLauncher:
    """Starts trial servers on the connected Ray cluster: implements trial.ServerLauncher.

    Thread-safe: several trials may launch at once. A port handed to a running server is never
    handed out again on the same node until that server stops.
    """

    def __init__(self, env: Mapping[str, str], host: str, engine: str,
                 placement_timeout_s: float = 3600.0,
                 secret_env: Mapping[str, str] | None = None) -> None:
        self.env, self.host, self.engine = dict(env), host, engine
        self._secret_env = dict(secret_env or {})
        self.placement_timeout_s = placement_timeout_s
        self._lock = threading.Lock()
        self._ports: set[tuple[str, int]] = set()
        self._servers: set[int] = set()
        self._active: dict[int, RayServer] = {}
        self._cancelled = threading.Event()

    def node_resources(self) -> list[dict[str, float]]:
        return node_resources()

    def free_devices(self) -> float:
        """GPUs no placement group holds right now, cluster-wide (0 on the CPU engine)."""
        return 0.0 if self.engine == "cpu" else float(ray.available_resources().get("GPU", 0.0))

    def _env_for(self, wanted: Sequence[Bundle]) -> dict[str, str]:
        env = {k: v for k, v in self.env.items() if k != "VLLM_TARGET_DEVICE"}
        if os.environ.get(SESSION_VAR):
            env[SESSION_VAR] = os.environ[SESSION_VAR]
        if len(wanted) > 1 and self.engine == "cpu":  # vLLM's Ray executor on CPU bundles
            env.update({ENV_FLAG: "1", "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "1",
                        "OMP_NUM_THREADS": str(int(wanted[0].get("CPU", 1)))})
        return env

    def _release(self, server: RayServer) -> None:
        with self._lock:
            self._ports.discard((server.node_id, server.port))
            self._active.pop(id(server), None)
        path = self.env.get(OCCUPANCY_LOG_ENV)
        if self.engine == "fake" and path:
            with open(path, "a") as fh:
                fh.write(json.dumps({"t": server.released_at, "group": server.group.id.hex(),
                                     "released": True}) + "\n")

    def launch(self, argv_for_port: Callable[[str, int], list[str]], log_path: Path,
               wanted: Sequence[Bundle], on_placed: Callable[[], None] = lambda: None) -> RayServer:
        """Reserve the trial's group (waits while the cluster is full), then start the server
        actor on bundle 0. `argv_for_port(host, port)` builds the argv once the port is known."""
        group = placement_group([dict(b) for b in wanted], strategy="PACK")
        ready_ref, deadline = group.ready(), time.monotonic() + self.placement_timeout_s
        try:
            ready: list = []
            while not ready and not self._cancelled.is_set() and time.monotonic() < deadline:
                ready, _ = ray.wait([ready_ref], timeout=1.0)
        finally:
            on_placed()
        if not ready:
            remove_placement_group(group)
            if self._cancelled.is_set():
                raise TrialError("interrupted", "the sweep stopped while the trial waited for placement")
            raise TrialError("unplaceable", f"placement group {list(wanted)} not placed within "
                             f"{self.placement_timeout_s:.0f} s")
        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True)
        actor = ServerActor.options(
            num_cpus=wanted[0].get("CPU", 0), scheduling_strategy=strategy,
            runtime_env={"env_vars": self._env_for(wanted)}).remote()
        try:
            info = claim_port(self._ports, self._lock, lambda taken: ray.get(
                actor.prepare.remote(self.host, taken), timeout=300))
            placement = _bundle_nodes(group)
        except BaseException:
            ray.kill(actor, no_restart=True)
            remove_placement_group(group)
            raise
        host = self.host if self.host != "node" else info["node_ip"]
        ref = actor.serve.remote(argv_for_port(host, info["port"]), str(log_path), self.engine,
                                 self._secret_env)
        server = RayServer(actor=actor, group=group, serve_ref=ref,
                           base_url=f"http://{host}:{info['port']}", node_ip=info["node_ip"],
                           node_id=info["node_id"], pid=info["pid"], port=info["port"],
                           placement=placement, _on_stop=self._release)
        with self._lock:
            self._active[id(server)] = server
        return server

    def stop_all(self) -> None:
        """Stop every server still running and every wait for placement (driver interrupted)."""
        self._cancelled.set()
        with self._lock:
            servers = list(self._active.values())
        for server in servers:
            server.stop()


@dataclass
class RaySession:
    """Connects to Ray for the sweep: joins `address` (or RAY_ADDRESS) if given, else starts a
    private local Ray in its own temp dir and stops it on close."""

    address: str | None
    num_cpus: int | None = None
    num_gpus: int | None = None
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
                         num_gpus=self.num_gpus,
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
            reap_session(os.environ.get(SESSION_VAR, ""), grace_s=20.0)
            shutil.rmtree(self._temp_dir, ignore_errors=True)
