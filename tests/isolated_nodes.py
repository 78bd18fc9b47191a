"""Emulated Ray nodes as apart as real hosts (#32): a worker node that cannot see another node's
files or processes.

ray.cluster_utils' nodes (tests.clusters.emulated_cluster) share this machine's /tmp, HOME and
process table, so a file one node writes and another reads is found anyway: vLLM's Ray workers
read a logging config that only the server actor's node had, and the multi-node tests passed
where real nodes failed. `isolated_node` runs `ray start --block` for a worker node in a mount
and PID namespace of its own (`unshare`, as root; in a user namespace otherwise):

- every node's folder lies under one parent P (a test's short_tmp, which also holds the head's
  Ray folder and the driver's files); inside the namespace a tmpfs covers P and the node's own
  folder is bound back in place, so the node sees its folder and nothing else of P (a path under
  P that is not its own is an empty, writable tmpfs there, as another host's path would be);
- TMPDIR, HOME and RAY_TMPDIR are the node's folder, and the caches that follow from them
  (Hugging Face, vLLM, torch's) with them: node-private, as a real node's are;
- the PID namespace leaves the node only its own processes: a process that starts its own Ray
  driver there (vLLM's EngineCore) finds the raylet by scanning the process table
  (ray/_private/services.py find_node_ids), and would otherwise take the head's;
- the folder is the same path inside and outside: the host reads what the node left in its
  TMPDIR (tests.leftovers.vsweep_leftovers / vllm_leftovers) as on any node.

Outside P everything is shared, as on one machine: /tmp itself (never mounted over: a clone and
its venv may live there), /dev/shm, the network (every node on its own loopback address) and the
repository (the tiny model, the code). The head of `isolated_cluster` stays ray.cluster_utils in
this process's namespaces (with the driver, as on a real head node) with its processes' TMPDIR
under P; it sees the isolated nodes' folders, they do not see its files.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import psutil

from framework.cluster.ray_session import START_ATTEMPTS
from framework.cluster.ray_session import STARTUP_TIMEOUT
from tests.clusters import emulated_cluster
from tests.clusters import free_ports
from tests.procs import MARKER_VAR

RAY = str(Path(sys.executable).parent / "ray")
OBJECT_STORE_BYTES = 150 * 1024 * 1024  # ray.cluster_utils' default for emulated nodes
# Variables that would point a node at another node's (or this machine's shared) directories;
# left out, their defaults follow the node's HOME and TMPDIR. VLLM_SWEEP_CACHE_DIR reaches a
# server from the driver (sweep/loader.py server_env), not from the node.
SHARED_DIR_VARS = ("HF_HOME", "VLLM_CACHE_ROOT", "VLLM_SWEEP_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                   "TRITON_CACHE_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
                   "XDG_RUNTIME_DIR")
# Not for a worker node: the driver's cluster, and a device that bypasses vLLM's platform plugins.
DRIVER_VARS = ("RAY_ADDRESS", "VLLM_TARGET_DEVICE")


@dataclass(frozen=True)
class IsolatedNode:
    """A running isolated node: its loopback address, its folder (TMPDIR and HOME, the same path
    for this process), its console log, the `unshare` process and its PID namespace."""

    ip: str
    folder: Path
    log: Path
    proc: subprocess.Popen = field(repr=False)
    first_pid: int  # the namespace's first process (its PID 1), as this namespace numbers it
    pid_ns: str  # /proc/<pid>/ns/pid of its processes, e.g. "pid:[4026532301]"
    marker: str  # the test marker every process of the node carries

    def processes(self) -> list[psutil.Process]:
        return namespace_processes(self.pid_ns, self.marker)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def node_env(base: Mapping[str, str], marker: str, folder: Path) -> dict[str, str]:
    """The environment of an isolated node's `ray start` (so of every process on the node):
    `base` tagged with the test marker, TMPDIR, HOME and RAY_TMPDIR the node's folder, and
    neither a shared directory nor the driver's cluster inherited."""
    env = {k: v for k, v in base.items() if k not in SHARED_DIR_VARS + DRIVER_VARS}
    env.update({MARKER_VAR: marker, "TMPDIR": str(folder), "HOME": str(folder),
                "RAY_TMPDIR": str(folder), "RAY_USAGE_STATS_ENABLED": "0"})
    return env


def ray_worker_argv(address: str, ip: str, folder: Path, num_cpus: int, num_gpus: int,
                    resources: Mapping[str, float], agent_port: int) -> list[str]:
    """`ray start --block` joining the GCS at `address` as a worker node at `ip`, its Ray folder
    in `folder`; the dashboard agent's HTTP port given (its default, 52365, is one per machine),
    worker ports picked by the OS and no log monitor (as ray.cluster_utils does for its worker
    nodes: vllm-sweep's drivers take no worker output, log_to_driver=False, and fetch a
    server's log from its node)."""
    return [RAY, "start", "--block", "--disable-usage-stats", "--address", address,
            "--node-ip-address", ip, "--temp-dir", str(folder / "ray"),
            "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus),
            "--resources", json.dumps(dict(resources)),
            "--object-store-memory", str(OBJECT_STORE_BYTES),
            "--dashboard-agent-listen-port", str(agent_port),
            "--min-worker-port", "0", "--max-worker-port", "0",
            "--include-log-monitor=false"]


def namespace_argv(parent: Path, folder: Path, command: list[str]) -> list[str]:
    """`command` in a new mount and PID namespace where `parent` shows only `folder`.

    The mounts must be made inside the new namespaces, after `unshare` and before `command`,
    and `unshare` runs one program: a shell does that sequence. Its script is built here from
    argv lists, each word through shlex.quote, so no path is parsed by the shell. The steps:
    hold the real folder open (fd 3), cover `parent` with a tmpfs, bind the held folder back
    at its own path (`--no-canonicalize`: mount(8) would resolve /proc/self/fd/3 to the path,
    now the tmpfs's), close fd 3. No folder aside is needed, and nothing is made outside
    `parent`. The shell stays the namespace's first process (`command` runs as its child, not
    exec'd, hence `; exit $?`): it reaps the orphans the kernel gives it, as a real host's init
    does; Ray's `ray start` would leave them zombies. `--kill-child`: the namespace ends when
    `unshare` dies. As root, mount and PID namespaces; otherwise in a user namespace too."""
    held = shlex.quote(str(folder))
    steps = [f"exec 3< {held}",
             shlex.join(["mount", "-t", "tmpfs", "tmpfs", str(parent)]),
             shlex.join(["mkdir", "-p", str(folder)]),
             shlex.join(["mount", "--no-canonicalize", "--bind", "/proc/self/fd/3", str(folder)]),
             "exec 3<&-",
             shlex.join(command)]
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--pid", "--fork", "--mount-proc",
            "--propagation", "private", "--kill-child", "sh", "-c", " && ".join(steps) + "; exit $?"]


def namespace_processes(pid_ns: str, marker: str) -> list[psutil.Process]:
    """The live (not zombie) processes of the PID namespace `pid_ns` (as /proc/<pid>/ns/pid
    reads), seen from this one, that carry `marker`. The marker matters once the namespace has
    ended: the kernel may give its number to a namespace made later, another test's node (a
    concurrent test's node was once taken for this one's leftovers)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/pid") == pid_ns and \
                    proc.status() != psutil.STATUS_ZOMBIE and \
                    proc.environ().get(MARKER_VAR) == marker:
                found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def _first_process(proc: subprocess.Popen, timeout_s: float) -> tuple[int, str]:
    """`unshare`'s child, the namespace's first process: its pid here and its PID namespace."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(psutil.Error, OSError):
            children = psutil.Process(proc.pid).children()
            if children:
                return children[0].pid, os.readlink(f"/proc/{children[0].pid}/ns/pid")
        time.sleep(0.05)
    raise RuntimeError(f"`unshare` made no namespace within {timeout_s:.0f} s (exit code {proc.poll()})")


def alive_node_ips(address: str) -> set[str]:
    """The addresses of the alive nodes the GCS at `address` knows, read from the GCS without
    joining the cluster (as ray.cluster_utils' wait_for_nodes does)."""
    import ray._private.state
    from ray._raylet import GcsClientOptions

    state = ray._private.state.GlobalState()
    state._initialize_global_state(GcsClientOptions.create(
        address, None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False))
    try:
        return {n["NodeManagerAddress"] for n in state.node_table() if n["Alive"]}
    finally:
        state.disconnect()


def wait_for_node(address: str, node: IsolatedNode, timeout_s: float) -> None:
    """Until the GCS lists `node` alive; fails at once if its `ray start` ends, or at the
    deadline, with the node's console log."""
    deadline = time.monotonic() + timeout_s
    while node.ip not in alive_node_ips(address):
        if node.proc.poll() is not None:
            raise RuntimeError(f"isolated node {node.ip} exited ({node.proc.returncode}):\n"
                               f"{node.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"isolated node {node.ip} not alive in the GCS within "
                               f"{timeout_s:.0f} s:\n{node.log_tail()}")
        time.sleep(0.2)


def stop_node(node: IsolatedNode, timeout_s: float = 30.0) -> list[str]:
    """SIGKILL the namespace's first process by PID (while `unshare`, its parent, is alive, so
    the PID cannot have been reused): its death ends every process of the namespace. Then
    SIGKILL `unshare`'s process group (`unshare` itself, and whatever of the node's `ray start`
    kept that group). Waits for the namespace to empty; returns descriptions of any process
    still in it at the deadline."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(node.first_pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(node.proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        node.proc.wait(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while (left := node.processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    described = []
    for proc in left:
        with contextlib.suppress(psutil.Error):
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
    return described


def _start_node(address: str, parent: Path, folder: Path, ip: str, marker: str, num_cpus: int,
                num_gpus: int, resources: Mapping[str, float], timeout_s: float,
                base_env: Mapping[str, str]) -> IsolatedNode:
    """One `ray start` of the node in a fresh `folder`, alive in the GCS; on any failure its
    namespace is emptied and the error raised (its message has the node's console log)."""
    folder.mkdir()  # an existing one: two nodes at one address
    log_path = parent / f"{folder.name}.out"
    (agent_port,) = free_ports(1)
    argv = namespace_argv(parent, folder, ray_worker_argv(
        address, ip, folder, num_cpus, num_gpus, resources, agent_port))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, env=node_env(base_env, marker, folder), cwd=folder,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    node = None
    try:
        node = IsolatedNode(ip, folder, log_path, proc, *_first_process(proc, timeout_s), marker)
        wait_for_node(address, node, timeout_s)
        return node
    except BaseException:
        if node is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
        else:
            stop_node(node)
        raise


@contextlib.contextmanager
def isolated_node(address: str, parent: Path, ip: str, marker: str, num_cpus: int = 1,
                  num_gpus: int = 0, resources: Mapping[str, float] | None = None,
                  timeout_s: float = 120.0,
                  base_env: Mapping[str, str] | None = None) -> Iterator[IsolatedNode]:
    """A worker node at loopback `ip` joined to the running head at `address` (GCS), in its own
    mount and PID namespace, its folder `parent`/n<last octet of ip> (see the module's
    docstring); every process tagged with `marker`; its environment `node_env` of `base_env`
    (default: this process's). Yields once the GCS lists it alive; on exit, stops it
    (`stop_node`) and asserts none of its processes is left. A `ray start` that misses Ray's
    own fixed 30 s for a raylet to register (STARTUP_TIMEOUT, as the product's private Ray:
    framework/cluster/ray_session.py) is started again in an emptied folder, up to
    START_ATTEMPTS: a loaded machine is slower, never red."""
    folder = parent / f"n{ip.rsplit('.', 1)[1]}"
    env = os.environ if base_env is None else base_env
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            node = _start_node(address, parent, folder, ip, marker, num_cpus, num_gpus,
                               resources or {}, timeout_s, env)
            break
        except RuntimeError as exc:
            if attempt == START_ATTEMPTS or STARTUP_TIMEOUT not in str(exc):
                raise
            shutil.rmtree(folder)
            # a raylet that registered after its `ray start` gave up stays alive in the GCS
            # until its health checks fail: the next start must not be taken for it
            deadline = time.monotonic() + timeout_s
            while ip in alive_node_ips(address) and time.monotonic() < deadline:
                time.sleep(0.5)
    try:
        yield node
    finally:
        left = stop_node(node)
    assert left == [], left


@dataclass(frozen=True)
class IsolatedCluster:
    address: str  # the GCS's
    marker: str
    nodes: list[IsolatedNode]


@contextlib.contextmanager
def isolated_cluster(parent: Path, head: Mapping, nodes: list[Mapping]) -> Iterator[IsolatedCluster]:
    """emulated_cluster's head (`head`: ray.cluster_utils' add_node arguments; its processes'
    TMPDIR `parent`/head, hidden from the other nodes) and one `isolated_node` per entry of
    `nodes` (its arguments: `ip`, and `num_cpus`, `num_gpus`, `resources`), all under `parent`,
    every process tagged with one marker. On exit the nodes stop first, then the head, and
    emulated_cluster asserts no process of any of them is left."""
    head_tmp = parent / "head"
    head_tmp.mkdir()
    with contextlib.ExitStack() as stack:
        saved = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(head_tmp)  # the head's processes take it as they start
        try:
            _, address, marker = stack.enter_context(emulated_cluster(parent, [dict(head)]))
        finally:
            if saved is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = saved
        started = [stack.enter_context(isolated_node(address, parent, marker=marker, **node))
                   for node in nodes]
        yield IsolatedCluster(address, marker, started)
