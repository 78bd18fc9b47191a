"""The replicas shape: one trial = N identical servers behind one router
(framework/engine/router.py), measured as one deployment.

`ReplicaLauncher` is a `ServerLauncher` (trial/run.py) over the trial's own launcher: it
launches the N servers through it, one after the other, each in its own placement group
(replica 0 logs at the trial's log path, replica i at `<stem>.replica<i><suffix>` beside it),
then starts the router on this (the driver's) loopback address and waits for its ready file.
A failed launch stops every server already started and raises, so nothing of the trial is
left. Prefill/decode (`prefill` > 0) is the same seam: the prefill servers launched first, all
with the trial's KV connector, and the router in P/D mode (each request prefilled on a prefill
server, then decoded, streamed, on a replica). What it returns, `ReplicaSet`, is a
`ServerHandle`: `run_trial` measures it unchanged, through the router's URL. Only the first
server's start-up log is read for the start-up phases.

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
from dataclasses import replace
from pathlib import Path

from framework.base.errors import TrialError
from framework.engine.kv_transfer import CONNECTORS
from framework.engine.kv_transfer import kv_transfer_args
from framework.engine.router import router_argv
from framework.trial.run import ServerHandle
from framework.trial.run import ServerLauncher
from framework.trial.run import TrialOutcome

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
                 base_url: str, router_log: Path, kv_folder: Path | None = None) -> None:
        self._servers = tuple(servers)
        self._router = router
        self._base_url = base_url
        self._router_log = router_log
        self._kv_folder = kv_folder

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
        left = stop_router(self._router)
        for server in self._servers:
            left += server.stop()
        if self._kv_folder is not None:  # the KV the prefill servers saved
            shutil.rmtree(self._kv_folder, ignore_errors=True)
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
    docstring); with `prefill` > 0, that many prefill servers first (logs `.prefill<i>`), every
    server given KV connector `connector` (engine.kv_transfer; where the connector needs a
    folder both servers see, a private one made for the trial in `kv_parent`, a folder every
    node shares (cluster.shared_folder), else in the driver's temp dir, and removed with it),
    and the router in P/D mode. The decode servers are asked to avoid the prefill servers'
    nodes (the launcher's `avoid`, honoured where the cluster has room elsewhere).
    `router_host`: where the router listens (the load generator's side)."""

    def __init__(self, inner: ServerLauncher, replicas: int, router_host: str = "127.0.0.1",
                 policy: str = DEFAULT_POLICY, prefill: int = 0,
                 connector: str | None = None, kv_parent: str | None = None) -> None:
        if replicas < 1 or prefill < 0:
            raise ValueError(f"replicas must be >= 1 and prefill >= 0, not {replicas}, {prefill}")
        if prefill and connector is None:
            raise ValueError("prefill/decode needs a KV connector")
        self.inner, self.replicas, self.router_host, self.policy = (inner, replicas, router_host,
                                                                    policy)
        self.prefill, self.connector, self.kv_parent = prefill, connector, kv_parent
        self._server_args: list[str] = []

    def server_args(self) -> list[str]:
        """What every server of the deployment gets after its own flags: the KV connector's
        `--kv-transfer-config` (prefill/decode; its folder made as the launch starts), else
        nothing. The trial's `argv_for_port` appends it, so the row records it."""
        return list(self._server_args)

    def launch(self, argv_for_port: Callable[[str, int], list[str]], log_path: Path,
               wanted: Sequence[dict[str, float]],
               on_placed: Callable[[], None] = lambda: None, unit: int = 1,
               avoid: frozenset[str] = frozenset()) -> ReplicaSet:
        """`on_placed` is called once, when the first server's devices are reserved
        (start-ahead's share gate waits there, before any server starts). `avoid` goes to
        every server's launch (the decode servers' adds the prefill servers' nodes)."""
        servers: list[ServerHandle] = []
        folder = None
        if self.prefill:
            assert self.connector is not None
            if CONNECTORS[self.connector].shared_folder:
                folder = Path(tempfile.mkdtemp(prefix="vsweep-kv-", dir=self.kv_parent))  # 0700
            self._server_args = kv_transfer_args(self.connector,
                                                 None if folder is None else str(folder))
        logs = ([log_path.with_name(f"{log_path.stem}.prefill{i}{log_path.suffix}")
                 for i in range(self.prefill)]
                + [replica_log(log_path, i) for i in range(self.replicas)])
        router_log = log_path.with_name(log_path.stem + ".router.log")
        try:
            for i, log in enumerate(logs):
                away = (frozenset(ip for s in servers[:self.prefill] for ip in s.placement)
                        if i >= self.prefill else frozenset())
                servers.append(self.inner.launch(argv_for_port, log, wanted,
                                                 on_placed if i == 0 else lambda: None, unit,
                                                 avoid=avoid | away))
            prefill, decode = servers[:self.prefill], servers[self.prefill:]
            router, url = start_router(self.router_host, [s.base_url for s in decode],
                                       self.policy, router_log,
                                       prefill=[s.base_url for s in prefill])
        except BaseException:
            for server in servers:
                server.stop()
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        return ReplicaSet(servers, router, url, router_log, kv_folder=folder)


def start_router(host: str, backends: Sequence[str], policy: str, log_path: Path,
                 prefill: Sequence[str] = ()) -> tuple[subprocess.Popen[bytes], str]:
    """The router process (argv list, its own session) on a port the kernel picks, and its
    URL once it listens (its ready file appears); TrialError(startup_crash) if it exits or
    does not get ready."""
    folder = Path(tempfile.mkdtemp(prefix="vsweep-router-"))  # private (0700), ours alone
    ready = folder / "ready"
    try:
        # the router runs on the driver, whose copy of the logs folder may not exist yet: the
        # servers' logs are written on their nodes and fetched when they stop (found on
        # isolated nodes, which share no folder with the driver)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(router_argv(host, 0, backends, policy, str(ready),
                                                prefill=prefill),
                                    stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=dict(os.environ))
        deadline = time.monotonic() + ROUTER_READY_S
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_router(proc)
                raise TrialError("startup_crash", "the replicas' router did not start: "
                                 f"{_last_line(log_path)}")
            time.sleep(0.05)
        return proc, ready.read_text(encoding="utf-8").strip()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def stop_router(proc: subprocess.Popen[bytes]) -> list[int]:
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


def check_transfer(outcome: TrialOutcome) -> TrialOutcome:
    """A measured prefill/decode trial whose decode servers loaded no KV through the connector
    (`kv_transfer_tokens` 0 or unreported) as FAIL(kv_not_transferred): its servers computed
    every prompt themselves, so it measured two aggregated servers, not the shape it names."""
    if not outcome.ok or outcome.server_metrics.get("kv_transfer_tokens"):
        return outcome
    seen = outcome.server_metrics.get("kv_transfer_tokens")
    return replace(outcome, fail_reason="kv_not_transferred",
                   fail_detail=f"the decode servers loaded {seen if seen is not None else 'no'} "
                               "prompt tokens through the KV connector "
                               "(vllm:prompt_tokens_by_source_total, external_kv_transfer): "
                               "the connector moved nothing")
