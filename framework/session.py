"""One driver per sweep, and nothing left behind by a driver that died.

Every process a run starts (its private Ray, the server actors, vLLM and its children) carries
`VLLM_SWEEP_SESSION=<id>` in its environment: the driver sets it before starting Ray and passes
it to the servers. `results/<sweep>/driver.json` records the running driver (pid, start time,
session id). The next run of the same sweep refuses to start while that driver lives, and, if
it died (kill -9), ends the processes that still carry its session id before starting anew.
Processes are found by that id, never by name, so no other user's Ray or vLLM is touched.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from framework.errors import ClusterError

SESSION_VAR = "VLLM_SWEEP_SESSION"


def session_processes(session_id: str) -> list[psutil.Process]:
    """Live processes carrying this session id (the caller's own process excluded)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        try:
            if proc.pid != me and proc.environ().get(SESSION_VAR) == session_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def reap_session(session_id: str, grace_s: float = 10.0) -> int:
    """Wait up to grace_s for the session's processes to exit, then SIGKILL the rest; returns
    how many had to be killed."""
    if not session_id:
        return 0
    deadline = time.monotonic() + grace_s
    while (left := session_processes(session_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=10)
    return len(left)


@dataclass
class DriverSession:
    """Context manager around one `run`: claims results/<sweep>/driver.json, cleans up after a
    dead predecessor, exports the session id, and on exit reaps this session's processes."""

    state_file: Path
    session_id: str = ""
    reaped_stale: int = 0

    def __enter__(self) -> DriverSession:
        self._take_over()
        self.session_id = uuid.uuid4().hex
        os.environ[SESSION_VAR] = self.session_id
        me = psutil.Process()
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(f".{self.state_file.name}.tmp")
        tmp.write_text(json.dumps({"pid": me.pid, "create_time": me.create_time(),
                                   "session": self.session_id}))
        os.replace(tmp, self.state_file)
        return self

    def _take_over(self) -> None:
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return
        try:
            alive = psutil.Process(state["pid"]).create_time() == state["create_time"]
        except (psutil.NoSuchProcess, KeyError):
            alive = False
        if alive:
            raise ClusterError(f"{self.state_file.parent.name}: another driver (pid {state['pid']}) "
                               f"is running this sweep; see {self.state_file}")
        self.reaped_stale = reap_session(state.get("session", ""), grace_s=0)

    def __exit__(self, *exc) -> None:
        reap_session(self.session_id)
        os.environ.pop(SESSION_VAR, None)
        self.state_file.unlink(missing_ok=True)
