"""The Ray actors of a trial: `ServerActor` hosts the API server (vLLM's or FakeEngine's) on
bundle 0 of the trial's group; `FakeWorker` stands in for a vLLM worker in FakeEngine trials.

Devices, as vLLM 0.32 uses them:
- world size 1: vLLM's uniprocess executor runs the model in the EngineCore child of the API
  server process on `cuda:0` of what that process sees (vllm/v1/executor/uniproc_executor.py),
  so the server actor itself holds the bundle's GPU (`num_gpus=1`) and Ray sets its
  CUDA_VISIBLE_DEVICES, which the child inherits;
- world size > 1: vLLM's Ray executor puts one worker actor with `num_gpus=1` in each bundle
  (vllm/v1/executor/ray_executor_v2.py, `_get_actor_resource_kwargs`) and maps each worker to
  the physical ids Ray assigned to its node's bundles (`get_node_and_physical_gpu_ids`), so the
  server actor holds no GPU. It cannot be given an empty CUDA_VISIBLE_DEVICES either: vLLM's
  CUDA platform refuses that (vllm/platforms/cuda.py, "CUDA_VISIBLE_DEVICES is set to empty
  string").
FakeEngine trials mirror this: at world size 1 the actor records what it holds; above, one
`FakeWorker` per bundle does, in vLLM's rank order (`placement.ranks_by_node`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from collections.abc import MutableMapping
from pathlib import Path

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from framework.cluster.placement import ranks_by_node
from framework.cluster.ports import pick_port
from framework.engine import fake_engine
from framework.engine import serve_process
from framework.engine import vllm_server as engine
from framework.engine import zygote as warm
from framework.engine.control import SOCKET_VAR
from framework.engine.control import socket_path

# FakeEngine only: a JSON-lines file where each process holding a trial's devices logs what it
# sees, and the launcher logs when the trial's group is released (scheduling and device tests
# read it).
OCCUPANCY_LOG_ENV = "FAKE_ENGINE_OCCUPANCY_LOG"
# The server's node-local cache directory (sweep.cache_dir); `~` is expanded on the node.
CACHE_DIR_VAR = "VLLM_SWEEP_CACHE_DIR"
RPC_BASE_VAR = "VLLM_RPC_BASE_PATH"  # vllm/envs.py; vllm/utils/network_utils.py get_open_zmq_ipc_path


def devices_seen() -> dict:
    """What this process holds and sees: Ray's GPU ids and CUDA_VISIBLE_DEVICES (None: unset),
    and its niceness."""
    return {"pid": os.getpid(), "node_ip": ray.util.get_node_ip_address(), "nice": os.nice(0),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _log_occupancy(events: list[dict]) -> None:
    path = os.environ.get(OCCUPANCY_LOG_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write("".join(json.dumps(e) + "\n" for e in events))


def rpc_dir(pid: int) -> str:
    """The folder of the server actor `pid`'s vLLM IPC sockets (RPC_BASE_VAR; not set for
    vLLM's Ray executor): ZeroMQ `ipc://` paths are files, which a killed server leaves
    behind; its stop removes the folder."""
    return str(Path(tempfile.gettempdir()) / f"vsweep-rpc-{pid}")


def rpc_base(argv: list[str], environ: Mapping[str, str], pid: int) -> str | None:
    """The RPC_BASE_VAR a server actor sets: `rpc_dir(pid)`, unless the environment names one
    already (server.env) or argv asks for vLLM's Ray executor, which copies vLLM's variables
    to its workers on every node (vllm/ray/ray_env.py get_env_vars_to_copy), where this node's
    folder does not exist."""
    if RPC_BASE_VAR in environ or serve_process.uses_ray_executor(argv):
        return None
    return rpc_dir(pid)


# Never inherited by a server (a private Ray's workers inherit the driver's environment): the API
# key comes from `secret_env` or not at all, and vLLM's dev mode opens routes (/collective_rpc,
# /sleep, ...) that skip the API-key check (docs/RELIABILITY.md; config.specs refuses it in
# server.env). The server's processes (fork_start's child, the zygote's forks) take this
# process's environment.
DROPPED_ENV = ("VLLM_API_KEY", "VLLM_SERVER_DEV_MODE")


def drop_inherited(environ: MutableMapping[str, str]) -> None:
    """Remove DROPPED_ENV from `environ` (os.environ of a server actor or of the zygote)."""
    for name in DROPPED_ENV:
        environ.pop(name, None)


def use_cache_dir() -> None:
    """Point vLLM's and Hugging Face's caches at this node's cache directory (made if absent)."""
    base = os.environ.get(CACHE_DIR_VAR)
    if not base:
        return
    root = Path(os.path.expanduser(base))
    (root / "vllm").mkdir(parents=True, exist_ok=True)
    (root / "hf").mkdir(parents=True, exist_ok=True)
    os.environ["VLLM_CACHE_ROOT"] = str(root / "vllm")
    os.environ["HF_HOME"] = str(root / "hf")


@ray.remote(num_cpus=0)
class ServerActor:
    """Hosts one server. Call `prepare` first, then `serve` (blocks until the server ends)."""

    def prepare(self, host: str, taken: list[int]) -> dict:
        """Pick a free port on this node that no other running trial holds; name the node-local
        log file and control socket."""
        node_ip = ray.util.get_node_ip_address()
        port = pick_port(node_ip if host == "node" else host, taken)
        logs = Path(tempfile.gettempdir()) / "vsweep-logs"
        logs.mkdir(parents=True, exist_ok=True)
        return {"pid": os.getpid(), "port": port, "node_ip": node_ip,
                "node_id": ray.get_runtime_context().get_node_id(),
                "log_path": str(logs / f"server-{os.getpid()}-{port}.log"),
                "control": socket_path(os.getpid()), "rpc_dir": rpc_dir(os.getpid())}

    def serve(self, argv: list[str], log_path: str, engine_name: str = "cpu",
              secret_env: dict[str, str] | None = None, tag: str = "",
              fork_start: bool = False, zygote: str | None = None) -> None:
        """`log_path` is node-local (from `prepare`). `secret_env` (e.g. VLLM_API_KEY) arrives
        as a call argument, not in the actor's runtime_env, which Ray records in its job and
        actor tables. `fork_start`: vLLM's server runs in a child process so that vLLM forks
        its processes (framework.engine.serve_process), unless it uses vLLM's Ray executor.
        `zygote`: the node's warm zygote (the `warm_start` lever, framework.engine.zygote) forks
        the server's processes; same exception."""
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        drop_inherited(os.environ)
        os.environ.update(secret_env or {})
        os.environ[SOCKET_VAR] = socket_path(os.getpid())
        base = rpc_base(argv, os.environ, os.getpid())
        if base is not None:
            Path(base).mkdir(mode=0o700, exist_ok=True)
            os.environ[RPC_BASE_VAR] = base
        use_cache_dir()
        engine.redirect_output(Path(log_path))
        if engine_name == "fake":
            fake_engine.serve(argv, on_ready=lambda args: self._start_fake_workers(args.port, tag))
        elif zygote and not serve_process.uses_ray_executor(argv):
            warm.serve_in_zygote(zygote, argv)
        elif fork_start and not serve_process.uses_ray_executor(argv):
            serve_process.serve_in_child(argv)
        else:
            engine.serve(argv)

    def _start_fake_workers(self, port: int, tag: str) -> None:
        """As vLLM: world size 1 runs in this process (which holds the GPU); above, one
        placeholder worker per bundle holds its GPU and this process holds none."""
        group = ray.util.get_current_placement_group()
        base = {"t": time.time(), "tag": tag, "port": port, "group": group.id.hex(),
                "in_group": True}
        me = {**base, **devices_seen(), "role": "api_server", "bundle": 0 if len(
            group.bundle_specs) == 1 else None, "rank": 0 if len(group.bundle_specs) == 1 else None}
        if len(group.bundle_specs) == 1:
            _log_occupancy([me])
            return
        self._workers = []
        for index, bundle in enumerate(group.bundle_specs):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
            self._workers.append(FakeWorker.options(  # type: ignore[attr-defined]  # @ray.remote: an ActorClass
                num_cpus=0, num_gpus=bundle.get("GPU", 0), scheduling_strategy=strategy).remote())
        claims = ray.get([w.claim.remote() for w in self._workers], timeout=300)
        ranks = ranks_by_node([c["node_id"] for c in claims],
                              ray.get_runtime_context().get_node_id())
        _log_occupancy([me] + [{**base, **c, "role": "worker", "bundle": i, "rank": ranks[i],
                                "in_group": c["group"] == base["group"]}
                               for i, c in enumerate(claims)])


@ray.remote(num_cpus=0)
class FakeWorker:
    """FakeEngine's stand-in for a vLLM worker: reports where it landed and what it holds."""

    def claim(self) -> dict:
        current = ray.util.get_current_placement_group()
        return {**devices_seen(), "node_id": ray.get_runtime_context().get_node_id(),
                "group": current.id.hex() if current is not None else ""}
