"""The replicas shape: one trial = N identical servers behind one router
(framework/engine/router.py), measured as one deployment.

`ReplicaLauncher` is a `ServerLauncher` (trial/run.py) over the trial's own launcher: it
launches the N servers through it, one after the other, each in its own placement group
(replica 0 logs at the trial's log path, replica i at `<stem>.replica<i><suffix>` beside it),
then starts the router on this (the driver's) loopback address and waits for its ready file.
A failed launch stops every server already started and raises, so nothing of the trial is
left. What it returns, `ReplicaSet`, is a `ServerHandle`: `run_trial` measures it unchanged,
through the router's URL. Only replica 0's start-up log is read for the start-up phases.

The servers are placed one group after the other, not gang scheduled: on a cluster too busy
for all N, the first replicas wait, placed, for the last (`fits` refuses up front a trial
whose N servers could never be placed together on the cluster).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

from framework.base.errors import TrialError
from framework.engine.router import router_argv
from framework.trial.run import ServerHandle
from framework.trial.run import ServerLauncher

ROUTER_READY_S = 120.0  # a failure guard: the router prints ready within a second or two
ROUTER_STOP_S = 10.0
DEFAULT_POLICY = "round_robin"


def replica_log(log_path: Path, index: int) -> Path:
    """Replica `index`'s log: the trial's own for replica 0, `<stem>.replica<i><suffix>` else."""
    if index == 0:
        return log_path
    return log_path.with_name(f"{log_path.stem}.replica{index}{log_path.suffix}")


class ReplicaSet:
    """N running servers and their router, as one ServerHandle: the router's URL; the first
    server's node and pid; every server's bundles; alive while all are; stopped together."""

    def __init__(self, servers: Sequence[ServerHandle], router: subprocess.Popen[bytes],
                 base_url: str, router_log: Path) -> None:
        self._servers = tuple(servers)
        self._router = router
        self._base_url = base_url
        self._router_log = router_log

    @property
    def servers(self) -> tuple[ServerHandle, ...]:
        return self._servers

    @property
    def base_url(self) -> str:
        return self._base_url

    @property
    def node_ip(self) -> str:
        return self._servers[0].node_ip

    @property
    def pid(self) -> int:
        return self._servers[0].pid

    @property
    def placement(self) -> tuple[str, ...]:
        return tuple(ip for s in self._servers for ip in s.placement)

    def is_alive(self) -> bool:
        return self._router.poll() is None and all(s.is_alive() for s in self._servers)

    def failure(self) -> TrialError | None:
        """The first server's failure; else the router's exit, with its log's last line."""
        for server in self._servers:
            if (failure := server.failure()) is not None:
                return failure
        code = self._router.poll()
        if code is not None:
            return TrialError("startup_crash", f"the replicas' router exited with {code}: "
                              f"{_last_line(self._router_log)}")
        return None

    def stop(self) -> list[int]:
        """The router first (no request reaches a stopping server), then every server; the
        pids that survived, all servers'."""
        left = _stop_router(self._router)
        for server in self._servers:
            left += server.stop()
        return left

    def command(self, name: str, timeout_s: float = 60.0) -> str:
        """`name` to every server; their answers joined by '; '."""
        return "; ".join(s.command(name, timeout_s) for s in self._servers)

    def startup_log(self) -> str:
        return self._servers[0].startup_log()

    def devices_held(self) -> str:
        return "; ".join(held for s in self._servers if (held := s.devices_held()))


class ReplicaLauncher:
    """Launches `replicas` servers through `inner` and a router in front of them (module
    docstring). `router_host`: where the router listens (the load generator's side)."""

    def __init__(self, inner: ServerLauncher, replicas: int, router_host: str = "127.0.0.1",
                 policy: str = DEFAULT_POLICY) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, not {replicas}")
        self.inner, self.replicas, self.router_host, self.policy = (inner, replicas, router_host,
                                                                    policy)

    def launch(self, argv_for_port: Callable[[str, int], list[str]], log_path: Path,
               wanted: Sequence[dict[str, float]],
               on_placed: Callable[[], None] = lambda: None, unit: int = 1) -> ReplicaSet:
        """`on_placed` is called once, when replica 0's devices are reserved (start-ahead's
        share gate waits there, before any server starts)."""
        servers: list[ServerHandle] = []
        try:
            for i in range(self.replicas):
                servers.append(self.inner.launch(argv_for_port, replica_log(log_path, i), wanted,
                                                 on_placed if i == 0 else lambda: None, unit))
            router, url = start_router(self.router_host, [s.base_url for s in servers],
                                       self.policy, log_path.with_name(log_path.stem
                                                                       + ".router.log"))
        except BaseException:
            for server in servers:
                server.stop()
            raise
        return ReplicaSet(servers, router, url, log_path.with_name(log_path.stem + ".router.log"))


def start_router(host: str, backends: Sequence[str], policy: str,
                 log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The router process (argv list, its own session) on a port the kernel picks, and its
    URL once it listens (its ready file appears); TrialError(startup_crash) if it exits or
    does not get ready."""
    folder = Path(tempfile.mkdtemp(prefix="vsweep-router-"))  # private (0700), ours alone
    ready = folder / "ready"
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(router_argv(host, 0, backends, policy, str(ready)),
                                    stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=dict(os.environ))
        deadline = time.monotonic() + ROUTER_READY_S
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop_router(proc)
                raise TrialError("startup_crash", "the replicas' router did not start: "
                                 f"{_last_line(log_path)}")
            time.sleep(0.05)
        return proc, ready.read_text(encoding="utf-8").strip()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _stop_router(proc: subprocess.Popen[bytes]) -> list[int]:
    """SIGTERM, then SIGKILL after ROUTER_STOP_S; [] once it is gone, else its pid."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=ROUTER_STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(timeout=ROUTER_STOP_S)
            except subprocess.TimeoutExpired:
                return [proc.pid]
    return []


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no router log)"
    return lines[-1][:500] if lines else "(empty router log)"
