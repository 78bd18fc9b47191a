"""One warm zygote per node (framework/engine/zygote.py) for the `warm_start` lever: a Ray
actor pinned to the node starts it as its child (argv list) and keeps it until `Zygotes.close`
stops it (SIGTERM, then the actor is killed) or the actor dies with the driver; the zygote
dies with it (PR_SET_PDEATHSIG).

The zygote's folder (socket, shim, log), new in the run folder (engine.run_folder), holds
KEEPER_FILE, its keeper's pid. A zygote killed outright cannot remove its folder, so each
keeper's start removes the run's folders whose keeper is gone (`stale_folders`); those of a
killed run go with its run folder (cluster.run_cleanup).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path

import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from framework.base.errors import TrialError
from framework.cluster.actors import drop_inherited
from framework.cluster.actors import use_cache_dir
from framework.engine import run_folder
from framework.engine.serve_process import PARENT_VAR
from framework.engine.zygote import FOLDER_PREFIX

WARM_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 10.0
KEEPER_FILE = "keeper.pid"


def stale_folders(tmp: Path, alive: Callable[[int], bool]) -> list[Path]:
    """The zygote folders in `tmp` whose keeper (KEEPER_FILE) is not `alive`; a folder without
    a readable KEEPER_FILE is not judged (it may be starting)."""
    stale = []
    for folder in sorted(tmp.glob(FOLDER_PREFIX + "*")):
        try:
            pid = int((folder / KEEPER_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not alive(pid):
            stale.append(folder)
    return stale


@ray.remote(num_cpus=0)
class ZygoteKeeper:
    def start(self) -> str:
        """Start the zygote; return its socket path once it is warm (vLLM imported). Its
        folder is new in the run folder, and its TMPDIR."""
        use_cache_dir()
        run = run_folder.this_run()
        for stale in stale_folders(run, psutil.pid_exists):
            shutil.rmtree(stale, ignore_errors=True)
        folder = self._folder = run_folder.new_dir(run, FOLDER_PREFIX)
        run_folder.write_new(folder / KEEPER_FILE, str(os.getpid()))
        path = str(folder / "zygote.sock")
        log = os.fdopen(run_folder.create(folder / "zygote.log", os.O_WRONLY | os.O_APPEND), "ab")
        env = {**os.environ, PARENT_VAR: str(os.getpid()), "TMPDIR": str(folder)}
        drop_inherited(env)  # each fork takes its server actor's environment; vLLM is imported here
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "framework.engine.zygote", path], stdout=log, stderr=log,
            env=env)
        deadline = time.monotonic() + WARM_TIMEOUT_S
        while not os.path.exists(path):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = (folder / "zygote.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the zygote did not get warm: {tail}")
            time.sleep(0.1)
        self._path = path
        return path

    def stop(self) -> None:
        """End the zygote (SIGTERM; SIGKILL after STOP_TIMEOUT_S) and remove its folder."""
        if getattr(self, "_proc", None) is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if getattr(self, "_folder", None) is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def alive(self) -> bool:
        """The zygote still runs and listens (the OOM killer, or a user, may have ended it)."""
        return self._proc.poll() is None and os.path.exists(self._path)


class Zygotes:
    """The launcher's zygotes, one per node, started on first use. Thread-safe: a trial waits
    only for its own node's zygote."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = dict(env)
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[ray.actor.ActorHandle, ray.ObjectRef]] = {}

    def _start(self, node_id: str) -> tuple[ray.actor.ActorHandle, ray.ObjectRef]:
        """`node_id`'s keeper and the ref of its socket path, the zygote started if need be
        (call with the lock held)."""
        if node_id not in self._nodes:
            keeper = ZygoteKeeper.options(  # type: ignore[attr-defined]  # @ray.remote: an ActorClass
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                runtime_env={"env_vars": self._env}).remote()
            self._nodes[node_id] = (keeper, keeper.start.remote())
        return self._nodes[node_id]

    def on(self, node_id: str) -> str:
        """The socket path of `node_id`'s zygote, once it is warm; a zygote found dead (or its
        keeper) is started again, once. A zygote that cannot get warm fails the trial
        (TrialError startup_crash)."""
        why = ""
        for attempt in (1, 2):
            with self._lock:
                keeper, ref = self._start(node_id)
            try:
                path = ray.get(ref, timeout=WARM_TIMEOUT_S + 30)
            except Exception as exc:  # noqa: BLE001 - reported as the trial's failure
                self._forget(node_id, keeper)
                raise TrialError("startup_crash", f"warm_start: {exc}"[:2000]) from None
            try:
                if ray.get(keeper.alive.remote(), timeout=60):
                    return path
                why = "the zygote had died"
            except Exception as exc:  # noqa: BLE001 - the keeper died: start both again
                why = f"its keeper had died ({type(exc).__name__})"
            self._forget(node_id, keeper)
            if attempt == 1:
                print(f"warm_start: node {node_id[:8]}: {why}; starting another", flush=True)
        raise TrialError("startup_crash", f"warm_start: {why}, twice")

    def _forget(self, node_id: str, keeper: ray.actor.ActorHandle) -> None:
        """Drop and end `keeper` (unless another trial already replaced it)."""
        with self._lock:
            if self._nodes.get(node_id, (None,))[0] is keeper:
                del self._nodes[node_id]
        _end([keeper])

    def close(self) -> None:
        """Stop every zygote (its folder removed) and kill its keeper."""
        with self._lock:
            keepers, self._nodes = [k for k, _ in self._nodes.values()], {}
        _end(keepers)


def _end(keepers: list[ray.actor.ActorHandle]) -> None:
    """Stop each keeper's zygote (so it removes its folder), then kill the keepers; a keeper
    already dead is just killed."""
    try:
        ray.get([k.stop.remote() for k in keepers], timeout=STOP_TIMEOUT_S + 20)
    except Exception:  # noqa: BLE001 - dead or stuck keepers: killed below all the same
        pass
    for keeper in keepers:
        ray.kill(keeper, no_restart=True)
