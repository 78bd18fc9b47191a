"""Shared fixtures: the tiny model, a short temp dir, and a process check by env marker.

Server tests tag every process they start with a unique environment variable and look for it
afterwards with psutil: that finds the sweep's Ray and vLLM processes (and only those).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ROOT / "models" / "tiny-llama"
CLI = [sys.executable, "-m", "framework.cli"]
MARKER_VAR = "VLLM_SWEEP_TEST_MARKER"
HEAD_IP = "127.0.0.9"  # emulated heads: loopback, apart from the 127.0.0.2.. workers


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    if not (TINY_MODEL / "config.json").is_file():
        pytest.fail(f"{TINY_MODEL} is missing: run `make model` (make test does it)")
    return TINY_MODEL


@pytest.fixture
def short_tmp():
    """A short temp dir (Ray's unix socket paths must stay under ~107 characters)."""
    path = Path(tempfile.mkdtemp(prefix="vst-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


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


def cli_env(marker: str, tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({MARKER_VAR: marker, "TMPDIR": str(tmp), "RAY_AUTH_MODE": "disabled",
                "PYTHONUNBUFFERED": "1"})
    return env


def new_marker() -> str:
    return uuid.uuid4().hex


def run_cli(args: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


@contextlib.contextmanager
def emulated_cluster(tmp: Path, nodes: list[dict]):
    """A Ray cluster of several nodes on this machine (ray.cluster_utils; `nodes[0]` is the
    head, later ones should set distinct `node_ip_address`es like 127.0.0.2). The head gets
    HEAD_IP unless it names its own: every node has a loopback address (Ray would otherwise give
    the head the machine's address, and servers with `host: node` would bind it), asserted
    once the nodes are up. Every process is tagged with a fresh marker; yields (cluster, gcs
    address, marker) and, on exit, shuts the cluster down and asserts none of its processes is
    left."""
    from ray.cluster_utils import Cluster

    marker = new_marker()
    saved = {k: os.environ.get(k) for k in (MARKER_VAR, "RAY_TMPDIR", "VLLM_TARGET_DEVICE")}
    os.environ[MARKER_VAR] = marker
    os.environ["RAY_TMPDIR"] = str(tmp)  # Ray's address file and sessions stay in here
    os.environ.pop("VLLM_TARGET_DEVICE", None)  # it would bypass vLLM platform plugins
    cluster = Cluster(shutdown_at_exit=True)
    try:
        cluster.add_node(include_dashboard=False, **{"node_ip_address": HEAD_IP, **nodes[0]})
        for node in nodes[1:]:
            cluster.add_node(**node)
        cluster.wait_for_nodes(timeout=120)
        assert_loopback_nodes(cluster.address)
        yield cluster, cluster.address, marker
    finally:
        cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        left = wait_no_marked_processes(marker)
    assert left == [], left


def assert_loopback_nodes(address: str) -> None:
    """Every node of the cluster at `address` has a loopback address (checked from a child
    process, so this process joins no cluster)."""
    code = ("import ray; ray.init(address=%r, logging_level='ERROR'); "
            "print(' '.join(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))" % address)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, RAY_ADDRESS="")).stdout.split()
    assert out and all(ipaddress.ip_address(ip).is_loopback for ip in out), out


def joined_cli_env(marker: str, tmp: Path) -> dict[str, str]:
    """cli_env for a sweep that joins a cluster through `cluster.address` (no RAY_ADDRESS)."""
    env = cli_env(marker, tmp)
    env.pop("RAY_ADDRESS", None)
    return env


@contextlib.contextmanager
def cli_process(args: list[str], cwd: Path, env: dict[str, str]):
    """`vllm-sweep <args>` as a child process (stdout and stderr on one pipe, text); killed by
    PID if it is still running when the block ends."""
    proc = subprocess.Popen([*CLI, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def read_until(proc: subprocess.Popen, text: str, timeout_s: float) -> str:
    """Read a child's stdout lines until `text` appears (or EOF, or the deadline)."""
    seen = ""
    deadline = time.monotonic() + timeout_s
    while text not in seen and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    return seen
