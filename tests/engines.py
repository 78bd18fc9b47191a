"""Servers started directly (not by a sweep): framework.engine.vllm_server or fake_engine
as a child in its own session, stopped as Ctrl-C would or killed; the shared server's record."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ENGINES = ["framework.engine.vllm_server", "framework.engine.fake_engine"]


VLLM_ENGINE = ENGINES[0]


def start_engine(module: str, argv: list[str], env: dict[str, str],
                 log_path: Path) -> subprocess.Popen:
    """`module.serve(argv)` (framework.engine.vllm_server or fake_engine) as a child process in
    its own session, stdout and stderr into `log_path`."""
    code = f"import sys; from {module} import serve; serve(sys.argv[1:])"
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-c", code, *argv], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_engine(proc: subprocess.Popen, wait_s: float = 30.0) -> list[int]:
    """SIGKILL the server's process group, wait for it; returns the pids of its process tree
    (taken before the kill) still running `wait_s` later (none, for a clean stop)."""
    tree = [proc.pid]
    try:
        tree += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    deadline = time.monotonic() + wait_s
    while any(_running(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [p for p in tree if _running(p)]


def stop_engine(proc: subprocess.Popen, grace_s: float = 15.0) -> list[int]:
    """vLLM's own shutdown, as Ctrl-C gives it: SIGTERM to the API server only (it stops its
    EngineCore, which stops its workers, each unlinking its /dev/shm ring), up to grace_s;
    then `kill_engine` for whatever is left."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    return kill_engine(proc)


@dataclass(frozen=True)
class SharedServer:
    """The session's vLLM server (see the module docstring): where it listens, what it serves,
    the key its /v1 routes want, its control socket and log."""

    base_url: str
    model: Path
    api_key: str
    control_socket: str
    log_path: Path
    proc: subprocess.Popen

    def is_alive(self) -> bool:
        return self.proc.poll() is None
