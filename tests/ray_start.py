"""Ray nodes started with `ray start --block` for the tests that need Ray's own CLI and job
server (tests/e2e/test_ray_job_submit.py, tests/e2e/test_cluster_yaml.py): each node a child in
its own session, its output in a file, stopped by process group (stop_nodes).

A node is up when its `ray start` prints "Ray runtime started.": `ray start` prints it only once
the node's raylet is registered with the GCS (ray/_private/node.py waits for the node's info
there), so the line is the event, and no test needs a driver that joins the cluster to count
nodes. Ray's log monitor is left out (`--include-log-monitor=false`): it only forwards worker
output to drivers that join; a job's own log is the job driver's output file, which the job
server reads without it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from framework.cluster.ray_session import START_ATTEMPTS
from framework.cluster.ray_session import STARTUP_TIMEOUT
from tests.procs import group_pids

NODE_STARTED = "Ray runtime started."
NO_LOG_MONITOR = "--include-log-monitor=false"


def start_node(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """`argv` (a `ray start --block ...`) without Ray's log monitor, in its own session,
    stdout and stderr into `log_path`."""
    with log_path.open("w") as log:
        return subprocess.Popen([*argv, NO_LOG_MONITOR], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _started(node: subprocess.Popen, log_path: Path, timeout_s: float) -> bool:
    """True once the node printed NODE_STARTED; False if it exits first or at the deadline."""
    deadline = time.monotonic() + timeout_s
    while NODE_STARTED not in log_path.read_text(errors="replace"):
        if node.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def start_up(argv: list[str], env: dict[str, str], log_path: Path,
             timeout_s: float) -> subprocess.Popen:
    """`start_node`, then wait until it printed NODE_STARTED (its raylet is in the GCS; the
    test fails if it exits first or the safety-net timeout passes). A `ray start` that missed
    Ray's own fixed 30 s for its raylet to register (STARTUP_TIMEOUT, which a loaded machine
    can miss) is stopped and started again, up to START_ATTEMPTS, as the product's private Ray
    is (framework/cluster/ray_session.py): slower, never red."""
    for attempt in range(1, START_ATTEMPTS + 1):
        node = start_node(argv, env, log_path)
        if _started(node, log_path, timeout_s):
            return node
        stop_nodes([node])
        if attempt == START_ATTEMPTS or STARTUP_TIMEOUT not in log_path.read_text(errors="replace"):
            break
    pytest.fail(f"`ray start` not up (exit code {node.poll()}): "
                f"{log_path.read_text(errors='replace')[-3000:]}")


def stop_nodes(nodes: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM the process group of every node at once (each `ray start --block` then stops its
    own processes), wait until the groups are empty (up to `grace_s`), SIGKILL what is left:
    tests.procs.stop_group for several nodes side by side, not one after another. The grace
    is short: no test here is about Ray's own stop, and some of its processes outlast a 20 s
    SIGTERM grace; the callers then wait until no process of theirs is left."""
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(node.poll() is None or group_pids(node.pid) for node in nodes):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.wait(timeout=30)
        psutil.wait_procs(group_pids(node.pid), timeout=10)
