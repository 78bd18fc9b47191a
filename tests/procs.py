"""Processes found by an environment marker (every process a server test starts carries
MARKER_VAR=<a fresh marker>, found afterwards with psutil: the sweep's Ray and vLLM processes
and only those), process groups, and waiting until none is left."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import psutil

MARKER_VAR = "VLLM_SWEEP_TEST_MARKER"


def marked_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER_VAR) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_no_marked_processes(marker: str, timeout_s: float = 45.0) -> list[str]:
    """Poll until no process carries the marker; returns descriptions of any left."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = marked_processes(marker)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    described = []
    for proc in left:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return described


def marked_commands(marker: str, marks: tuple[str, ...]) -> dict[int, str]:
    """pid -> command line of the processes that carry the marker and whose command line
    holds one of `marks`."""
    found = {}
    for p in marked_processes(marker):
        try:
            line = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if any(mark in line for mark in marks):
            found[p.pid] = line
    return found


def engine_cores(marker: str) -> set[int]:
    """The pids of vLLM's EngineCore processes that carry the marker."""
    return set(marked_commands(marker, ("EngineCore",)))


def new_engine_core(marker: str, before: set[int], timeout_s: float) -> bool:
    """Wait for an EngineCore that is not in `before` (a server's vLLM has started its engine:
    the server is starting, not ready); whether one appeared in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine_cores(marker) - before:
            return True
        time.sleep(0.2)
    return False


def new_marker() -> str:
    return uuid.uuid4().hex


# What a trial leaves running if its stop failed: the server actor and FakeEngine's placeholder
# workers (Ray worker processes named after their actor class), the warm-start keeper, and the
# servers themselves (`framework.engine.*` children, vLLM's EngineCore and workers).
TRIAL_PROCESS_MARKS = ("ServerActor", "FakeWorker", "ZygoteKeeper", "framework.engine",
                       "EngineCore", "VLLM::")


def trial_processes(marker: str) -> list[str]:
    """The processes of a cluster (by its marker) that belong to a trial, described."""
    return [f"{pid} {line[:120]}"
            for pid, line in marked_commands(marker, TRIAL_PROCESS_MARKS).items()]


def wait_no_trial_processes(marker: str, timeout_s: float = 45.0) -> list[str]:
    """Poll until no trial process of the cluster is left (a sweep on a shared cluster leaves
    the cluster's own processes, Ray's idle workers among them, running); returns any left."""
    deadline = time.monotonic() + timeout_s
    while (left := trial_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def group_pids(pgid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                found.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


def stop_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the process group of a `ray start --block`, wait, then SIGKILL what is left."""
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()
        if not group_pids(pgid):
            break
        time.sleep(0.5)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    psutil.wait_procs(group_pids(pgid), timeout=10)
