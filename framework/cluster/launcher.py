"""Starting trial servers on the connected Ray cluster: `RayLauncher` (trial.ServerLauncher).

One placement group per trial, laid out by `placement.layout` (a stage's TP ranks on one node),
and a `ServerActor` on bundle 0 with `placement_group_capture_child_tasks=True`, so whatever
vLLM asks Ray for lands inside that group. At world size 1 the actor holds the bundle's GPU
(Ray sets its CUDA_VISIBLE_DEVICES); above, vLLM's workers hold them (cluster/actors.py).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

import ray
from ray._private.ray_constants import RAY_WORKER_NICENESS
from ray.util.placement_group import PlacementGroup
from ray.util.placement_group import placement_group
from ray.util.placement_group import placement_group_table
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from framework.base.errors import TrialError
from framework.cluster.actors import CACHE_DIR_VAR
from framework.cluster.actors import INDUCTOR_CACHE_VAR
from framework.cluster.actors import OCCUPANCY_LOG_ENV
from framework.cluster.actors import PRECOMPILE_HEADERS_VAR
from framework.cluster.actors import ServerActor
from framework.cluster.autoscaling import ScaleUp
from framework.cluster.autoscaling import autoscaler_status
from framework.cluster.autoscaling import possible_nodes
from framework.cluster.autoscaling import running_counts
from framework.cluster.driver_session import SESSION_VAR
from framework.cluster.page_cache import start_read_ahead
from framework.cluster.placement import Bundle
from framework.cluster.placement import Layout
from framework.cluster.placement import layout
from framework.cluster.ports import claim_port
from framework.cluster.run_cleanup import alive_nodes
from framework.cluster.run_cleanup import clean_stale
from framework.cluster.run_cleanup import remove_runs
from framework.cluster.server import HeldDevices
from framework.cluster.server import RayServer
from framework.cluster.server import Survivors
from framework.cluster.server import still_running
from framework.cluster.vllm_plugin import ENV_FLAG
from framework.cluster.zygote_keeper import Zygotes
from framework.engine.run_folder import RAY_DIR
from framework.engine.serve_process import uses_ray_executor
from framework.engine.vllm_server import epoch_log_env

# While a group with pinned stages waits, how often its layout is chosen again from the
# devices free by then (another trial may have taken the nodes it was pinned to).
RELAYOUT_S = 5.0


def node_resources() -> list[dict[str, float]]:
    """Total resources of each alive node (for `placement.fits`)."""
    return [dict(n["Resources"]) for n in ray.nodes() if n["Alive"]]


def _bundle_nodes(group: PlacementGroup) -> tuple[str, ...]:
    """Node IP of each bundle, in bundle order (Ray does not order bundles by node)."""
    table = placement_group_table(group)
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    by_bundle = table["bundles_to_node_id"]
    return tuple(ips.get(by_bundle[i], "?") for i in sorted(by_bundle))


def _layout_now(wanted: Sequence[Bundle], unit: int, avoid: frozenset[str] = frozenset()
                ) -> Layout:
    """`placement.layout` from the resources free on each alive node now (Ray's per-node
    availability, ray/_private/state.py `available_resources_per_node`) and their totals;
    `avoid`: node IPs, as the nodes at those addresses."""
    alive = [n for n in ray.nodes() if n["Alive"]]
    total = {n["NodeID"]: dict(n["Resources"]) for n in alive}
    free = {k: v for k, v in ray._private.state.available_resources_per_node().items()
            if k in total}
    ids = [n["NodeID"] for n in alive if n["NodeManagerAddress"] in avoid]
    return layout(wanted, unit, free, total, ids)


def _create(wanted: Sequence[Bundle], plan: Layout) -> PlacementGroup:
    selector = [dict(s) for s in plan.label_selector] if plan.label_selector else None
    return placement_group([dict(b) for b in wanted], strategy=plan.strategy,
                           bundle_label_selector=selector)


class RayLauncher:
    """Starts trial servers on the connected Ray cluster: implements trial.ServerLauncher.

    Thread-safe: several trials may launch at once. A port handed to a running server is never
    handed out again on the same node until that server stops.
    """

    def __init__(self, env: Mapping[str, str], host: str, engine: str,
                 placement_timeout_s: float = 3600.0,
                 secret_env: Mapping[str, str] | None = None,
                 read_ahead: str | None = None, fork_start: bool = False,
                 warm_start: bool = False, scale_up: ScaleUp | None = None) -> None:
        """`read_ahead`: a model directory each server's node reads into its page cache while
        the server starts (the `page_cache` start-up lever, framework.cluster.page_cache).
        `fork_start`: the `fork_start` lever (framework.engine.serve_process).
        `warm_start`: the `warm_start` lever: a warm zygote per node forks each server's
        processes (framework.engine.zygote, cluster/zygote_keeper.py).
        `scale_up`: the node types the cluster's autoscaler may add (cluster.autoscaling), which
        `placeable_nodes` counts."""
        self.env, self.host, self.engine = dict(env), host, engine
        self.read_ahead, self.fork_start, self.scale_up = read_ahead, fork_start, scale_up
        self._secret_env = dict(secret_env or {})
        self.placement_timeout_s = placement_timeout_s
        # the run's id on every node (its run folders, engine.run_folder): the driver's session
        # (driver_session), or one of the launcher's own when it runs without one
        self.session = os.environ.get(SESSION_VAR) or uuid.uuid4().hex
        self._nodes: set[str] = set()  # node ids where this run made its run folder
        self._dead = ""  # a killed predecessor's session (clean_stale): its folders go at close too
        self._lock = threading.Lock()
        self._ports: set[tuple[str, int]] = set()
        self._active: dict[int, RayServer] = {}
        self._held = HeldDevices()  # stopped servers' processes not seen gone (cluster.server)
        self._cancelled = threading.Event()
        self._zygotes = Zygotes(self._env_for([{}])) if warm_start and engine != "fake" else None

    def node_resources(self) -> list[dict[str, float]]:
        return node_resources()

    def placeable_nodes(self) -> list[dict[str, float]]:
        """The alive nodes and those the autoscaler may still add (cluster.autoscaling): what a
        trial may wait for."""
        if self.scale_up is None:
            return node_resources()
        return possible_nodes(node_resources(), self.scale_up, running_counts(autoscaler_status()))

    def free_devices(self) -> float:
        """GPUs no placement group holds right now, cluster-wide (0 on the CPU engine)."""
        return 0.0 if self.engine == "cpu" else float(ray.available_resources().get("GPU", 0.0))

    def _env_for(self, wanted: Sequence[Bundle]) -> dict[str, str]:
        """The server actor's environment (inherited by vLLM's workers): the sweep's, the
        session id (the run folders' run id, engine.run_folder), vLLM's epoch-stamped log lines
        (engine.vllm_server.epoch_log_env), and the cache directory with `~` left for each
        node's $HOME (Ray expands `${HOME}` in runtime_env env_vars on the node), torch
        inductor's cache in it."""
        env = {k: v for k, v in self.env.items() if k != "VLLM_TARGET_DEVICE"}
        env.update(epoch_log_env(env))
        # Ray starts worker processes at niceness 15; a server runs at 0, as `vllm serve` does
        # and as Ray runs its own job supervisor (ray/dashboard/modules/job/job_manager.py).
        # vLLM's Ray workers get this runtime_env too: EngineCore, a new Ray driver, passes the
        # actor's to its ray.init (vllm/engine/arg_utils.py, create_engine_config; vllm/v1/
        # executor/ray_utils.py, initialize_ray_cluster), and its workers are that job's actors.
        env[RAY_WORKER_NICENESS] = "0"
        if env.get(CACHE_DIR_VAR, "").startswith("~"):
            env[CACHE_DIR_VAR] = "${HOME}" + env[CACHE_DIR_VAR][1:]
        # torch inductor's cache beside vLLM's, on every node (Ray expands ${HOME} on each,
        # and vLLM's Ray workers get this runtime_env too), not in a shared temp dir
        if env.get(CACHE_DIR_VAR) and INDUCTOR_CACHE_VAR not in env:
            env[INDUCTOR_CACHE_VAR] = env[CACHE_DIR_VAR].rstrip("/") + "/inductor"
        env.setdefault(PRECOMPILE_HEADERS_VAR, "0")  # not once per server (actors.py)
        env[SESSION_VAR] = self.session
        if len(wanted) > 1 and self.engine == "cpu":  # vLLM's Ray executor on CPU bundles
            env.update({ENV_FLAG: "1", "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "1",
                        "OMP_NUM_THREADS": str(int(wanted[0].get("CPU", 1)))})
        return env

    def _release(self, server: RayServer) -> None:
        """A stopped server's group was removed: its port is free, its survivors recorded."""
        if server.survivors:
            ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
            for node_id, pids in server.survivors.items():
                self._held.add(Survivors(node_id, ips.get(node_id, "?"),
                                         tuple(dict.fromkeys(pids)),
                                         server.released_at or time.time(), server.log_path.name))
        with self._lock:
            self._ports.discard((server.node_id, server.port))
            self._active.pop(id(server), None)
        path = self.env.get(OCCUPANCY_LOG_ENV)
        if self.engine == "fake" and path:
            with open(path, "a") as fh:
                fh.write(json.dumps({"t": server.released_at, "group": server.group.id.hex(),
                                     "released": True}) + "\n")

    def devices_held(self, server: RayServer) -> str:
        """Why `server`'s devices may have been held when it started ('' if not): earlier
        servers' processes still running on its nodes when their groups were removed before
        its own was placed. Each is checked again on its node: once gone, it is forgotten
        (named this once more: it may have ended only after this server's start-up check)."""
        found = []
        for held in self._held.before({*server.placement, server.node_ip}, server.placed_at):
            if not still_running(held):
                self._held.forget(held)
            found.append(held.describe())
        return "; ".join(found)

    def _place(self, wanted: Sequence[Bundle], unit: int, avoid: frozenset[str] = frozenset()
               ) -> PlacementGroup | None:
        """Reserve the group, laid out again every RELAYOUT_S while pinned stages wait; None
        when cancelled or past the placement timeout."""
        plan = _layout_now(wanted, unit, avoid)
        group = _create(wanted, plan)
        ready_ref = group.ready()  # one wait per group, not one per poll
        deadline = time.monotonic() + self.placement_timeout_s
        laid_out = time.monotonic()
        while not self._cancelled.is_set() and time.monotonic() < deadline:
            ready, _ = ray.wait([ready_ref], timeout=1.0)
            if ready:
                return group
            if plan.label_selector and time.monotonic() - laid_out > RELAYOUT_S:
                laid_out = time.monotonic()
                again = _layout_now(wanted, unit, avoid)
                if again != plan:
                    remove_placement_group(group)
                    plan, group = again, _create(wanted, again)
                    ready_ref = group.ready()
        remove_placement_group(group)
        return None

    def launch(self, argv_for_port: Callable[[str, int], list[str]], log_path: Path,
               wanted: Sequence[Bundle], on_placed: Callable[[], None] = lambda: None,
               unit: int = 1, avoid: frozenset[str] = frozenset()) -> RayServer:
        """Reserve the trial's group (waits while the cluster is full; `unit` consecutive
        bundles share a node; not on the nodes at the IPs in `avoid` where the others could
        hold it), then start the server actor on bundle 0.
        `argv_for_port(host, port)` builds the argv once the port is known."""
        try:
            group = self._place(wanted, unit, avoid)
            placed_at = time.time()
        finally:
            on_placed()
        if group is None:
            if self._cancelled.is_set():
                raise TrialError("interrupted", "the sweep stopped while the trial waited for placement")
            raise TrialError("unplaceable", f"placement group {list(wanted)} not placed within "
                             f"{self.placement_timeout_s:.0f} s")
        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True)
        holds_gpu = len(wanted) == 1 and wanted[0].get("GPU", 0) > 0
        actor = ServerActor.options(  # type: ignore[attr-defined]  # @ray.remote: an ActorClass
            num_cpus=wanted[0].get("CPU", 0), num_gpus=wanted[0]["GPU"] if holds_gpu else 0,
            scheduling_strategy=strategy,
            runtime_env={"env_vars": self._env_for(wanted)}).remote()
        try:
            info = claim_port(self._ports, self._lock, lambda taken: ray.get(
                actor.prepare.remote(self.host, taken), timeout=300))
            with self._lock:
                self._nodes.add(info["node_id"])
            placement = _bundle_nodes(group)
            if self.read_ahead:
                start_read_ahead(self.read_ahead, info["node_id"])
            host = self.host if self.host != "node" else info["node_ip"]
            argv = argv_for_port(host, info["port"])
            zygote = (self._zygotes.on(info["node_id"])
                      if self._zygotes is not None and not uses_ray_executor(argv) else None)
        except BaseException:
            ray.kill(actor, no_restart=True)
            remove_placement_group(group)
            raise
        ref = actor.serve.remote(argv, info["log_path"], self.engine, self._secret_env,
                                 str(log_path), self.fork_start, zygote)
        server = RayServer(actor=actor, group=group, serve_ref=ref,
                           base_url=f"http://{host}:{info['port']}", node_ip=info["node_ip"],
                           node_id=info["node_id"], pid=info["pid"], port=info["port"],
                           placement=placement, log_path=log_path, node_log=info["log_path"],
                           control_path=info["control"], folder=info["folder"],
                           _on_stop=self._release, _held=self.devices_held,
                           placed_at=placed_at)
        with self._lock:
            self._active[id(server)] = server
        return server

    def clean_stale(self, dead_session: str = "") -> list[str]:
        """Before the first trial: on every alive node, end what still carries `dead_session`
        (a killed driver's, driver_session's `stale_session`) and remove the run folders that
        runs no longer alive left (cluster.run_cleanup); returns them as `<ip>: <name>`."""
        self._dead = dead_session
        return clean_stale(self.session, dead_session)

    def close(self) -> None:
        """End the node zygotes (`warm_start`), then remove this run's folder on every node it
        used, but a private Ray's (RAY_DIR: RaySession's, once Ray is down); servers still
        running are `stop_all`'s. A killed predecessor's folders (`clean_stale`) are removed
        again on every alive node: one its process was still writing in while it ended, or
        that a slow node's clean did not reach in time, is gone by now."""
        try:
            if self._zygotes is not None:
                self._zygotes.close()
        finally:
            with self._lock:
                nodes = set(self._nodes)
            remove_runs(self.session, nodes, keep=[RAY_DIR])
            if self._dead:
                remove_runs(self._dead, alive_nodes())

    def stop_all(self) -> None:
        """Stop every server still running and every wait for placement (driver interrupted).
        Every server's stop is tried, whatever an earlier one raised; then the first error is
        raised, naming how many stops failed in all."""
        self._cancelled.set()
        with self._lock:
            servers = list(self._active.values())
        errors: list[Exception] = []
        for server in servers:
            try:
                server.stop()
            except Exception as exc:  # noqa: BLE001 - the others are stopped first
                errors.append(exc)
        if errors:
            errors[0].add_note(f"{len(errors)} of {len(servers)} server stops failed")
            raise errors[0]
