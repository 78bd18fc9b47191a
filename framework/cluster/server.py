"""A running trial server on Ray (`RayServer`, trial.ServerHandle) and the tasks that act on
its node: stop and reap (cluster.node_reap), fetch its log, send it a control command.

Release contract: a trial's group (its devices) is handed on only once every process of its
server has exited, on every node: the server actor's own process tree (API server, EngineCore,
and with world size 1 the model) and every actor placed in the group, i.e. vLLM's Ray workers,
which `ray.kill` of the server actor does not wait for (they are owned by EngineCore and die
after it, asynchronously). Ray's public API names no group's actors without the dashboard, so
they are read from the GCS actor table (`placement_group_id`, `pid`, node), the same table
`ray._private.state` parses.

When a process outlives that (SIGKILLed, still running 5 s later: stuck in the kernel, e.g. a
GPU driver's teardown), the group is removed all the same, and the next trial on those devices
may fail vLLM's start-up free-memory check (vllm/v1/worker/utils.py, "is less than desired GPU
memory utilization"): an `oom_at_startup` that says nothing of its configuration. Such
survivors are recorded (`Survivors`, kept by the launcher in `HeldDevices`) and a start-up OOM
of a server placed after them on their node (by node: Ray does not say which GPUs a removed
group held) is `devices_held`, a failure the search does not learn from
(trial.run.held_failure; search.tuner.CONFIG_FAILURES lacks it).
Why not wait longer instead: a process that SIGKILL has not ended in the stop's ~30 s is
stuck where more waiting may never help, and a stop that does not return holds its trial's
thread, so the sweep, for good; keeping the group until they are gone would need a watcher of
every such group for the rest of the run. The record costs a trial on those devices at most
once they are free again: its check finds them gone and forgets them (`HeldDevices.forget`).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from collections.abc import Collection
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import ray
from ray.core.generated import gcs_pb2
from ray.util.placement_group import PlacementGroup
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from framework.base.errors import TrialError
from framework.cluster.node_reap import await_exit
from framework.cluster.node_reap import stop_tree
from framework.engine import control

# Ray's GCS marks a node dead after ~5 missed health checks of 3 s; an actor on a dying node
# is reported dead before that.
NODE_DEATH_DETECTION_S = 45.0
# How long the workers of a stopped server may take to exit before they are SIGKILLed.
WORKER_GRACE_S = 20.0
_DEAD = gcs_pb2.ActorTableData.ActorState.Value("DEAD")


@dataclass(frozen=True)
class GroupProcess:
    """A live actor process placed in a trial's group."""

    node_id: str
    pid: int


@dataclass(frozen=True)
class Survivors:
    """Processes of a stopped server still running on one node when its group was removed."""

    node_id: str
    node_ip: str
    pids: tuple[int, ...]
    released_at: float  # wall clock, just before the group was removed
    server: str  # whose: its log's name on the driver (trial-00007.log)

    def describe(self) -> str:
        at = time.strftime("%H:%M:%S", time.localtime(self.released_at))
        return (f"devices on {self.node_ip} were handed on at {at} while pids "
                f"{list(self.pids)} of the server of {self.server} still ran")


class HeldDevices:
    """The launcher's record of `Survivors` (thread-safe): which of them a server placed at
    `placed_at` on `nodes` may have found holding its devices."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[Survivors] = []

    def add(self, survivors: Survivors) -> None:
        with self._lock:
            self._held.append(survivors)

    def before(self, nodes: Collection[str], placed_at: float) -> list[Survivors]:
        """Survivors on one of `nodes` (IPs) whose group was removed before `placed_at`: a
        group placed earlier held other devices than theirs while they ran."""
        with self._lock:
            return [s for s in self._held if s.node_ip in nodes and s.released_at <= placed_at]

    def forget(self, survivors: Survivors) -> None:
        """Seen gone: no later server can find them holding its devices."""
        with self._lock:
            if survivors in self._held:
                self._held.remove(survivors)


def _running(pids: list[int]) -> list[int]:
    """Those of `pids` still running on this node (zombies hold no device: not running)."""
    import psutil

    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def group_processes(group: PlacementGroup) -> list[GroupProcess]:
    """Actors of `group` that GCS does not yet list as DEAD (pid 0: not started yet)."""
    accessor = ray._private.state.state._connect_and_get_accessor()
    found = []
    for raw in accessor.get_actor_table(None, None):
        data = gcs_pb2.ActorTableData.FromString(raw)
        if data.placement_group_id == group.id.binary() and data.state != _DEAD:
            found.append(GroupProcess(node_id=data.address.node_id.hex(), pid=data.pid))
    return found


def _read_tail(path: str, start: int) -> tuple[bytes, int]:
    """The bytes of a node-local file from `start` (b'' if absent) and its size."""
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read()
        return data, start + len(data)
    except OSError:
        return b"", start


def _remove_files(*paths: str) -> None:
    """Node-local files of a stopped server: its folder in the run folder (cluster.actors
    `server_folder`: its log, copied to the driver by then, control socket, vLLM's IPC sockets,
    TMPDIR, group record), which a server killed outright cannot remove. Never follows a
    symlink."""
    for path in paths:
        if Path(path).is_dir() and not Path(path).is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            Path(path).unlink(missing_ok=True)


_stop_tree_remote = ray.remote(num_cpus=0)(stop_tree)
_await_exit_remote = ray.remote(num_cpus=0)(await_exit)
_read_tail_remote = ray.remote(num_cpus=0)(_read_tail)
_remove_files_remote = ray.remote(num_cpus=0)(_remove_files)
_send_remote = ray.remote(num_cpus=0)(control.send)
_running_remote = ray.remote(num_cpus=0)(_running)


def on_node(node_id: str, fn: ray.remote_function.RemoteFunction, *args, timeout_s: float = 60.0):
    """Run the remote function `fn(*args)` on one node and wait for its result."""
    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return ray.get(fn.options(scheduling_strategy=strategy).remote(*args), timeout=timeout_s)


def still_running(survivors: Survivors) -> list[int]:
    """Those of `survivors`' pids still running on their node (all, when it cannot be asked)."""
    try:
        return on_node(survivors.node_id, _running_remote, list(survivors.pids))
    except Exception:  # noqa: BLE001 - the node or Ray did not answer: not known to be gone
        return list(survivors.pids)


@dataclass
class RayServer:
    """A running (or starting) server of one trial: implements trial.ServerHandle.

    Its log is written on its node (`node_log`); `stop()` copies it to `log_path` on the
    driver, so the tail and the full log reach the results from any node."""

    actor: ray.actor.ActorHandle
    group: PlacementGroup
    serve_ref: ray.ObjectRef
    base_url: str
    node_ip: str
    node_id: str
    pid: int
    port: int
    placement: tuple[str, ...]
    log_path: Path
    node_log: str
    control_path: str
    folder: str  # the server's own folder on its node (cluster.actors.server_folder)
    _on_stop: Callable[[RayServer], None] = field(default=lambda _: None, repr=False)
    _held: Callable[[RayServer], str] = field(default=lambda _: "", repr=False)
    _stopped: bool = field(default=False, repr=False)
    _log_offset: int = field(default=0, repr=False)
    placed_at: float = 0.0  # wall clock once its group was placed
    released_at: float | None = None  # wall clock just before the group was removed
    # node id -> pids of this server still running there when its group was removed
    survivors: dict[str, list[int]] = field(default_factory=dict)

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

    def command(self, name: str, timeout_s: float = 60.0) -> str:
        """A control command (framework.engine.control) to the server, through a task on its node."""
        try:
            return on_node(self.node_id, _send_remote, self.control_path, name, timeout_s,
                           timeout_s=timeout_s + 30)
        except Exception as exc:  # noqa: BLE001 - the node or the server is gone: data
            return f"error {type(exc).__name__}: {exc}"

    def devices_held(self) -> str:
        """'' unless an earlier server's processes still ran on this server's nodes when its
        group was placed (`Survivors.describe`, asked of the launcher)."""
        return self._held(self)

    def fetch_log(self) -> None:
        """Append what the server logged since the last fetch to `log_path` (driver side)."""
        try:
            data, self._log_offset = on_node(self.node_id, _read_tail_remote, self.node_log,
                                             self._log_offset)
        except Exception:  # noqa: BLE001 - the node died: what was fetched stays
            return
        if data:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as fh:
                fh.write(data)

    def startup_log(self) -> str:
        """The log so far: fetched from the node (`fetch_log`), then read on the driver."""
        self.fetch_log()
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stop(self) -> list[int]:
        """End every process of the server on every node (`_stop_tree` on the actor's node,
        then `_await_exit` for the group's other actors on theirs), fetch the log, then
        remove the group: its devices are handed on only once every process that used them
        is gone. Returns pids that survived (should be []). Whatever fails on the way (a log
        append's OSError, Ray), the group is removed and the launcher told (`_on_stop`)
        before the error propagates: a group left behind would keep its devices for the rest
        of the sweep. A second call does nothing."""
        if self._stopped:
            return []
        self._stopped = True
        try:
            return self._end_processes()
        finally:
            self._release()

    def _end_processes(self) -> list[int]:
        # GCS may list an actor DEAD (its owner died) before its process has exited: the
        # group's processes are listed now, while they live, and each is waited for below
        members = group_processes(self.group)
        if self.node_ip not in self.lost_nodes():
            try:
                left = on_node(self.node_id, _stop_tree_remote, self.pid, self.actor, 10.0,
                               self.folder)
            except Exception:  # noqa: BLE001 - the node died meanwhile: nothing left to reap
                left = []
            if left:
                self.survivors.setdefault(self.node_id, []).extend(left)
        ray.kill(self.actor, no_restart=True)
        for node_id, pids in self._reap_group(members).items():
            self.survivors.setdefault(node_id, []).extend(pids)
        self.fetch_log()
        try:
            on_node(self.node_id, _remove_files_remote, self.folder)
        except Exception:  # noqa: BLE001 - the node died: its temp dir goes with it
            pass
        return sorted({pid for pids in self.survivors.values() for pid in pids})

    def _release(self) -> None:
        """Remove the group (Ray kills what still runs in it), then tell the launcher, even if
        the removal raised."""
        self.released_at = time.time()
        try:
            remove_placement_group(self.group)
        finally:
            self._on_stop(self)

    def _reap_group(self, members: list[GroupProcess]) -> dict[str, list[int]]:
        """Wait until each process of `members` (the group's actors before the stop) has exited
        on its node, and until GCS lists no live actor in the group (and theirs have exited
        too); returns the pids that could not be ended, by node id."""
        alive_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        left: dict[str, list[int]] = {}
        deadline = time.monotonic() + WORKER_GRACE_S + 10
        procs = [p for p in members if p.node_id in alive_nodes]
        while procs:
            by_node: dict[str, list[int]] = {}
            for p in procs:
                if p.pid:
                    by_node.setdefault(p.node_id, []).append(p.pid)
            for node_id, pids in by_node.items():
                try:
                    still = on_node(node_id, _await_exit_remote, pids, WORKER_GRACE_S,
                                    timeout_s=WORKER_GRACE_S + 30)
                except Exception:  # noqa: BLE001 - that node died: its processes with it
                    still = []
                if still:
                    left.setdefault(node_id, []).extend(p for p in still
                                                        if p not in left.get(node_id, []))
            if time.monotonic() > deadline:
                break
            procs = [p for p in group_processes(self.group) if p.node_id in alive_nodes]
            if procs:
                time.sleep(0.2)
        return left
