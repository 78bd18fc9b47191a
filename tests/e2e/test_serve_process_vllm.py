"""The `fork_start` lever's child on a real vLLM CPU server (framework.engine.serve_process):
started from a parent standing in for the server actor, it serves; when that parent is
SIGKILLed (what `ray.kill` does to an actor), the child and vLLM's EngineCore and worker
below it end too, with nothing left. On CPU vLLM still spawns its processes (its platform
says so), so this checks the plumbing, not a faster start.

It guards vLLM processes orphaned by an actor's death (the child's PR_SET_PDEATHSIG): with the
prctl call removed, EngineCore and its worker outlive the SIGKILLed parent. One real vLLM
server, the least that shows it: FakeEngine has no EngineCore to orphan."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from framework.cluster.ports import pick_port
from framework.load.loadgen import wait_ready
from tests.procs import MARKER_VAR
from tests.procs import new_marker
from tests.procs import wait_no_marked_processes

HOST = "127.0.0.1"


@pytest.mark.timeout(420)
def test_the_child_serves_and_ends_with_its_actor(tiny_model, tmp_path):
    port = pick_port(HOST, [])
    marker = new_marker()
    argv = ["--model", str(tiny_model), "--host", HOST, "--port", str(port),
            "--max-model-len", "512", "--max-num-seqs", "4", "--enforce-eager"]
    code = "import sys; from framework.engine.serve_process import serve_in_child; " \
           "serve_in_child(sys.argv[1:])"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", **{MARKER_VAR: marker})
    with open(tmp_path / "server.log", "wb") as log:
        actor = subprocess.Popen([sys.executable, "-c", code, *argv], env=env, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready = asyncio.run(wait_ready(f"http://{HOST}:{port}", 300,
                                       is_alive=lambda: actor.poll() is None))
        text = (tmp_path / "server.log").read_text(errors="replace")
        assert ready, text[-3000:]
        tree = psutil.Process(actor.pid).children(recursive=True)
        commands = [" ".join(p.cmdline()) for p in tree]
        # the API server child, and vLLM's EngineCore and worker below it (titled by vLLM)
        assert any("framework.engine.serve_process" in c for c in commands), commands
        titles = {c.split()[0] for c in commands if c.startswith("VLLM::")}
        assert {"VLLM::EngineCore", "VLLM::Worker"} <= titles, commands
        actor.send_signal(signal.SIGKILL)
        actor.wait(timeout=30)
        # a zombie counts as ended (its parent is gone or going); 60 s: a safety net
        deadline = time.monotonic() + 60
        while alive := [p for p in tree if _running(p)]:
            assert time.monotonic() < deadline, f"vLLM's processes outlived their actor: {alive}"
            time.sleep(0.5)
    finally:
        if actor.poll() is None:
            os.killpg(actor.pid, signal.SIGKILL)
            actor.wait(timeout=30)
        assert wait_no_marked_processes(marker) == []


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
