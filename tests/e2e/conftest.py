"""Every test under tests/e2e/ starts real servers (vLLM on CPU or FakeEngine) or a Ray cluster:
each is marked `server`, so `-m "not server"` leaves them all out.

Shared fixtures: look here before starting a server of your own.

`vllm_server` (session scope) is ONE real vLLM CPU server of the tiny model for every test that
only needs "a running vLLM server": load generators, `bench`, /metrics and histogram readers,
probes, the engine contract, trace replay, multi-turn. It runs
`framework.engine.vllm_server.serve` (what a trial's server actor runs) as a child process in
its own session on 127.0.0.1; the first test that asks for it starts it (within that test's
timeout, SHARED_STARTUP_S at most) and the session's end stops it by process group, asserting
that no process of it is left. Its configuration, `SharedServer` describes it:
- argv SHARED_ARGV: `--max-num-seqs 8 --max-model-len 1024 --enforce-eager`, prefix caching on
  (vLLM's default), VLLM_CPU_KVCACHE_SPACE=1 (GiB);
- VLLM_API_KEY = `api_key`: /v1 routes answer 401 without it; send it
  (`run_load(..., api_key=server.api_key)`, `OPENAI_API_KEY` for `vllm-sweep bench`).
  /health and /metrics are open;
- the control socket `control_socket` (framework.engine.control) for in-process prefix-cache
  resets; vLLM's dev routes stay closed.
`make test` runs the suite in pytest-xdist lanes, a whole file per lane: each lane has its own
session, so its own shared server (started by the lane's first test that asks for it), and the
tests of one lane use it one after another but share its prefix cache and counters: assert on
deltas of counters, reset the cache first if a test needs it cold, leave nothing in flight,
never stop it. A test that needs other flags or a server it may kill starts its own.

`shared_ray` (session scope) is ONE emulated Ray node (8 logical CPUs, 8 fake GPUs, on a
loopback address) that every sweep joins unless the test is about Ray's own start, stop or
failure, or about the process boundary (a signal, kill -9, a child's exit code): those keep a
private Ray or their own emulated cluster. Such sweeps run in-process (tests.cli.
run_joined: vLLM's parser is imported once per session, not once per command) and must leave
no trial process behind; `join_shared` moves a sweep document onto it, keeping at most as many
trials side by side as the private Ray it replaces allowed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from framework.cluster.ports import pick_port
from framework.engine import control
from framework.load.loadgen import wait_ready
from tests.clusters import SharedRay
from tests.clusters import emulated_cluster
from tests.engines import VLLM_ENGINE
from tests.engines import SharedServer
from tests.engines import start_engine
from tests.engines import stop_engine
from tests.procs import MARKER_VAR
from tests.procs import new_marker
from tests.procs import wait_no_marked_processes

SHARED_HOST = "127.0.0.1"
SHARED_ARGV = ("--max-num-seqs", "8", "--max-model-len", "1024", "--enforce-eager")
SHARED_API_KEY = "e2e-shared-server-key"
SHARED_STARTUP_S = 240.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/e2e/" in str(item.path):
            item.add_marker(pytest.mark.server)


@pytest.fixture(scope="session")
def vllm_server(tiny_model, tmp_path_factory) -> Iterator[SharedServer]:
    folder = tmp_path_factory.mktemp("shared-vllm")
    port = pick_port(SHARED_HOST, [])
    marker = new_marker()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_API_KEY=SHARED_API_KEY,
               **{MARKER_VAR: marker, control.SOCKET_VAR: str(folder / "ctl.sock")})
    env.pop("VLLM_SERVER_DEV_MODE", None)
    argv = ["--model", str(tiny_model), "--host", SHARED_HOST, "--port", str(port), *SHARED_ARGV]
    proc = start_engine(VLLM_ENGINE, argv, env, folder / "server.log")
    server = SharedServer(f"http://{SHARED_HOST}:{port}", tiny_model, SHARED_API_KEY,
                          env[control.SOCKET_VAR], folder / "server.log", proc)
    try:
        ready = asyncio.run(wait_ready(server.base_url, SHARED_STARTUP_S, is_alive=server.is_alive))
        if not ready:
            tail = server.log_path.read_text(errors="replace")[-3000:]
            pytest.fail(f"the shared vLLM server is not ready within {SHARED_STARTUP_S:.0f} s "
                        f"(exit code {proc.poll()}):\n{tail}")
        yield server
    finally:
        left = stop_engine(proc)
        left_marked = wait_no_marked_processes(marker)
    assert left == [] and left_marked == [], (left, left_marked)


@pytest.fixture(scope="session")
def shared_ray() -> Iterator[SharedRay]:
    """ONE emulated one-node Ray for every sweep that is not about Ray's own start, stop or
    failure (FakeEngine and vLLM CPU sweeps alike, driven in-process: tests.cli.run_joined):
    8 logical CPUs and 8 fake GPUs on HEAD_IP (a loopback address). A sweep joins it through
    `cluster.address` (tests.clusters.join_shared) instead of starting a private Ray of its own
    (~10-20 s each). One per xdist lane; a lane's sweeps run one after another; each must leave
    no trial process behind (run_joined asserts it), and the session's end asserts that no
    process of it is left. CPU-engine trials run one at a time whatever the cluster holds
    (SweepSpec.concurrent_trials)."""
    folder = Path(tempfile.mkdtemp(prefix="vst-ray-"))  # short: Ray's socket paths
    try:
        with emulated_cluster(folder, [{"num_cpus": 8, "num_gpus": 8}], keep_env=False) as (
                _, address, marker):
            yield SharedRay(address, marker, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
