"""The Ray actors of a trial: `ServerActor` hosts the API server (vLLM's or FakeEngine's) on
bundle 0 of the trial's group; `FakeWorker` stands in for a vLLM worker in FakeEngine trials.

Devices, as vLLM 0.32 uses them (cluster/devices.py has the rules, with their sources):
- world size 1: vLLM's uniprocess executor runs the model in the EngineCore child of the API
  server process at local rank 0, on entry 0 of the CUDA_VISIBLE_DEVICES it inherits, so the
  server actor itself holds the bundle's GPU (`num_gpus=1`) and Ray sets that variable;
- world size > 1: vLLM's Ray executor puts one worker actor with `num_gpus=1` in each bundle,
  with RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES set so Ray leaves CUDA_VISIBLE_DEVICES
  unset, and each worker computes on `sorted(Ray's GPU ids of the group's bundles on its
  node)[its local rank]`; the server actor holds no GPU, so Ray 2.60 leaves its
  CUDA_VISIBLE_DEVICES unset too (vLLM treats unset and empty alike).
FakeEngine trials follow the same mechanics with the same functions: at world size 1 the actor
records the GPU it would compute on; above, one `FakeWorker` per bundle, started as vLLM starts
its workers, picks its device as vLLM's worker does and records it (`_start_fake_workers`).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Mapping
from collections.abc import MutableMapping
from pathlib import Path

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from framework.base.errors import TrialError
from framework.cluster.devices import NOSET_VAR
from framework.cluster.devices import local_ranks
from framework.cluster.devices import node_gpus
from framework.cluster.devices import physical_device
from framework.cluster.placement import ranks_by_node
from framework.cluster.ports import pick_port
from framework.engine import fake_engine
from framework.engine import run_folder
from framework.engine import serve_process
from framework.engine import vllm_server as engine
from framework.engine import zygote as warm
from framework.engine.control import SOCKET_VAR
from framework.engine.control import socket_path
from framework.engine.server_args import model_of
from framework.tools.tiny_model import ensure_tiny_model

# FakeEngine only: a JSON-lines file where each process holding a trial's devices logs what it
# sees, and the launcher logs when the trial's group is released (scheduling and device tests
# read it).
OCCUPANCY_LOG_ENV = "FAKE_ENGINE_OCCUPANCY_LOG"
# The server's node-local cache directory (sweep.cache_dir); `~` is expanded on the node.
CACHE_DIR_VAR = "VLLM_SWEEP_CACHE_DIR"
RPC_BASE_VAR = "VLLM_RPC_BASE_PATH"  # vllm/envs.py; vllm/utils/network_utils.py get_open_zmq_ipc_path
# torch/_inductor/runtime/cache_dir_utils.py cache_dir(); its default is
# `<temp dir>/torchinductor_<user>`, a name any local user can make first
INDUCTOR_CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"
# torch/_inductor/config.py `cpp_cache_precompile_headers`. Torch precompiles its C++ kernel
# header (~6 core-s) into `<temp dir>/torchinductor_<user>/precompiled_headers`
# (codecache.py `_HEADER_DIR`, not under TORCHINDUCTOR_CACHE_DIR) before it loads any cached
# CPU kernel (`CppCodeCache.load_async`), even one whose library is on disk; a server's temp
# dir is its private run folder, so every vLLM CPU server start paid it. Off, a cached kernel
# loads without it (its cache key is computed before the header is set: same libraries), and
# a kernel not yet cached compiles with the full header.
PRECOMPILE_HEADERS_VAR = "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"


def devices_seen() -> dict:
    """What this process holds and sees: Ray's GPU ids and CUDA_VISIBLE_DEVICES (None: unset),
    its node and its niceness."""
    return {"pid": os.getpid(), "node_ip": ray.util.get_node_ip_address(), "nice": os.nice(0),
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _log_occupancy(events: list[dict]) -> None:
    path = os.environ.get(OCCUPANCY_LOG_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write("".join(json.dumps(e) + "\n" for e in events))


def server_folder() -> Path:
    """A new private folder for this server actor's files on its node, `s<pid>-<random>` in
    the run folder (engine.run_folder: made or verified, 0700, ours): its log, control socket,
    vLLM's IPC sockets, TMPDIR, process-group record. The stop removes it; a TrialError
    (startup_crash) names the path when the run folder is not safe to use."""
    try:
        return run_folder.new_dir(run_folder.this_run(), f"s{os.getpid()}-")
    except OSError as exc:
        raise TrialError("startup_crash", f"run folder: {exc}") from None


def rpc_base(argv: list[str], environ: Mapping[str, str], folder: Path) -> str | None:
    """The RPC_BASE_VAR a server actor sets: `rpc` in its folder (ZeroMQ `ipc://` paths are
    files, which a killed server leaves behind; its stop removes the folder), unless the
    environment names one already (server.env) or argv asks for vLLM's Ray executor: vLLM
    0.32's (ray_executor_v2.py, `get_driver_env_vars`) hands EngineCore's whole environment to
    its workers on every node (filling what a worker lacks), where this folder does not
    exist."""
    if RPC_BASE_VAR in environ or serve_process.uses_ray_executor(argv):
        return None
    return str(folder / "rpc")


def private_tmp(argv: list[str], folder: Path) -> str | None:
    """The TMPDIR of the server's processes: `tmp` in its folder, so what vLLM, torch and the
    compilers they run put in the temp dir (gcc's cc*.o, Python's tempfiles) is private and
    goes with the server's stop. None for vLLM's Ray executor, for the reason `rpc_base`
    gives: a worker on another node would be handed a TMPDIR that does not exist there, or
    that another user there could make first."""
    return None if serve_process.uses_ray_executor(argv) else str(folder / "tmp")


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


def in_uploaded_working_dir() -> bool:
    """Whether this worker runs in a node's copy of a Ray job's uploaded --working-dir (a
    `gcs://` package; `local://` runs in place), where the git-ignored models/ is missing."""
    try:
        uri = ray.get_runtime_context().runtime_env.working_dir_uri()
    except Exception:  # noqa: BLE001 - no runtime env: not a job's copy
        return False
    return bool(uri) and str(uri).startswith("gcs://")


def use_cache_dir() -> None:
    """Point vLLM's and Hugging Face's caches at this node's cache directory (made if absent).
    torch inductor's comes in the runtime_env (cluster.launcher, INDUCTOR_CACHE_VAR)."""
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
        """Pick a free port on this node that no other running trial holds; make this server's
        private folder (`server_folder`, once) and name the node-local log file and control
        socket in it."""
        node_ip = ray.util.get_node_ip_address()
        port = pick_port(node_ip if host == "node" else host, taken)
        if getattr(self, "_folder", None) is None:
            self._folder = server_folder()
        return {"pid": os.getpid(), "port": port, "node_ip": node_ip,
                "node_id": ray.get_runtime_context().get_node_id(),
                "log_path": str(self._folder / "server.log"),
                "control": socket_path(self._folder), "folder": str(self._folder)}

    def serve(self, argv: list[str], log_path: str, engine_name: str = "cpu",
              secret_env: dict[str, str] | None = None, tag: str = "",
              fork_start: bool = False, zygote: str | None = None) -> None:
        """`log_path` is node-local (from `prepare`, in this server's folder; created here, new:
        run_folder.create). `secret_env` (e.g. VLLM_API_KEY) arrives
        as a call argument, not in the actor's runtime_env, which Ray records in its job and
        actor tables. `fork_start`: vLLM's server runs in a child process so that vLLM forks
        its processes (framework.engine.serve_process), unless it uses vLLM's Ray executor.
        `zygote`: the node's warm zygote (the `warm_start` lever, framework.engine.zygote) forks
        the server's processes; same exception."""
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        drop_inherited(os.environ)
        os.environ.update(secret_env or {})
        folder = self._folder
        os.environ[SOCKET_VAR] = socket_path(folder)
        base = rpc_base(argv, os.environ, folder)
        if base is not None:
            os.environ[RPC_BASE_VAR] = str(run_folder.make_dir(Path(base)))
        tmp = private_tmp(argv, folder)
        if tmp is not None:
            os.environ["TMPDIR"] = str(run_folder.make_dir(Path(tmp)))
            tempfile.tempdir = None  # this process's own temp files (the in-actor server) too
        use_cache_dir()
        engine.redirect_output(Path(log_path))
        model = model_of(argv)
        if model is not None and in_uploaded_working_dir() and ensure_tiny_model(model):
            print(f"built the project's tiny model at {model} in this node's copy of the "
                  "job's --working-dir (models/ is git-ignored, so not uploaded)", flush=True)
        if engine_name == "fake":
            fake_engine.serve(argv, on_ready=lambda args: self._start_fake_workers(args, tag))
        elif zygote and not serve_process.uses_ray_executor(argv):
            warm.serve_in_zygote(zygote, argv, warm.group_file(folder))
        elif fork_start and not serve_process.uses_ray_executor(argv):
            serve_process.serve_in_child(argv)
        else:
            engine.serve(argv)

    def _start_fake_workers(self, args: argparse.Namespace, tag: str) -> None:
        """FakeEngine's processes take their devices exactly as vLLM 0.32's would (the fake-GPU
        contract, cluster/devices.py) and record what they picked in the occupancy log
        (OCCUPANCY_LOG_ENV): `device` is the physical GPU id a process would compute on,
        `gpu_ids` what Ray gave it, `cuda_visible_devices` what it sees.
        - uni executor above world size 1: fails (vLLM's would wait forever);
        - uni / mp executor: every local rank r runs on this node at
          `devices.physical_device(r, None, CUDA_VISIBLE_DEVICES)` (this process stands for
          them; at world size 1 it holds the bundle's GPU, above it holds none, so an mp
          trial's ranks would take GPUs 0..N-1);
        - ray executor: one `FakeWorker` per bundle, `num_gpus` its bundle's and
          RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES set, as vLLM's RayWorkerProc; each reports
          Ray's ids; this process gives it its local rank and its node's sorted group GPUs, and
          it computes `physical_device(local rank, those ids, its CUDA_VISIBLE_DEVICES)`, i.e.
          `sorted(node's group GPUs)[local rank]`, which need not be its own bundle's id."""
        group = ray.util.get_current_placement_group()
        world = len(group.bundle_specs)
        backend = args.distributed_executor_backend or ("ray" if world > 1 else "uni")
        base = {"t": time.time(), "tag": tag, "port": args.port, "group": group.id.hex(),
                "in_group": True}
        me = {**base, **devices_seen(), "role": "api_server", "bundle": None, "rank": None,
              "local_rank": None, "device": None}
        if backend == "uni" and world > 1:
            raise RuntimeError(f"the uniprocess executor starts rank 0 alone; it would wait for "
                               f"the other {world - 1} rank(s) forever")
        if backend != "ray":
            ranks = [{**me, "rank": r, "local_rank": r,
                      "device": physical_device(r, None, me["cuda_visible_devices"])}
                     for r in range(world)]
            _log_occupancy([{**ranks[0], "bundle": 0}] if world == 1 else
                           [me] + [{**r, "role": "worker"} for r in ranks])
            return
        self._workers = []
        for index, bundle in enumerate(group.bundle_specs):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
            self._workers.append(FakeWorker.options(  # type: ignore[attr-defined]  # @ray.remote: an ActorClass
                num_cpus=0, num_gpus=bundle.get("GPU", 0), scheduling_strategy=strategy,
                runtime_env={"env_vars": {NOSET_VAR: "1"}}).remote())
        claims = ray.get([w.claim.remote() for w in self._workers], timeout=300)
        nodes, gpus = [c["node_id"] for c in claims], [c["gpu_ids"] for c in claims]
        driver = ray.get_runtime_context().get_node_id()
        rank, local = ranks_by_node(nodes, driver), local_ranks(nodes, driver)
        picked = ray.get([w.initialize.remote(local[i], node_gpus(nodes, gpus, nodes[i]))
                          for i, w in enumerate(self._workers)], timeout=300)
        _log_occupancy([me] + [{**base, **c, **picked[i], "role": "worker", "bundle": i,
                                "rank": rank[i], "in_group": c["group"] == base["group"]}
                               for i, c in enumerate(claims)])


@ray.remote(num_cpus=0)
class FakeWorker:
    """FakeEngine's stand-in for vLLM's RayWorkerProc: reports where it landed and what Ray gave
    it (`claim`, as `get_node_and_physical_gpu_ids`), then picks its device from its local rank
    and its node's assigned ids (`initialize`, as `initialize_worker` and `init_device`)."""

    def claim(self) -> dict:
        current = ray.util.get_current_placement_group()
        return {**devices_seen(), "group": current.id.hex() if current is not None else ""}

    def initialize(self, local_rank: int, assigned: list[int]) -> dict:
        return {"local_rank": local_rank, "assigned": list(assigned),
                "device": physical_device(local_rank, assigned,
                                          os.environ.get("CUDA_VISIBLE_DEVICES"))}
