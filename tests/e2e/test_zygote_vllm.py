"""The warm_start lever on a real zygote (framework/engine/zygote.py) with vLLM imported:
multiprocessing's spawn through the shim gives a fork of the zygote that behaves as a spawned
process (exit codes, signals); a real vLLM CPU server forked from it answers as the session's
spawned server does, runs as vLLM's three processes, all forks, in one process group that
cluster/server.py's stop finds; and killing its requester (the actor) ends all of it.

It guards the warm_start lever's vLLM-specific failures: a fork that exits or dies unlike a
spawned process (vLLM reads its children's exit codes), a forked server that answers unlike a
spawned one, forks outside the group the stop ends, and forks that outlive their actor. One
zygote and one forked server, the least that show them (the spawned server compared with is
the session's `vllm_server`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from framework.cluster.node_reap import process_tree
from framework.cluster.ports import pick_port
from framework.engine.zygote import FOLDER_PREFIX
from framework.engine.zygote import group_file
from framework.engine.zygote import served_group
from framework.engine.zygote_shim import SHIM_NAME
from framework.engine.zygote_shim import SOCKET_VAR
from framework.load.loadgen import wait_ready
from tests.paths import ROOT
from tests.procs import MARKER_VAR
from tests.procs import new_marker
from tests.procs import wait_no_marked_processes

pytestmark = pytest.mark.timeout(600)
HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def zygote(tmp_path_factory) -> Iterator[tuple[str, dict[str, str], int]]:
    """A zygote as a node keeper starts one; yields its socket, the env its users get, its pid."""
    folder = tmp_path_factory.mktemp(FOLDER_PREFIX)
    path = str(folder / "zygote.sock")
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", **{MARKER_VAR: new_marker()})
    log = open(folder / "zygote.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "framework.engine.zygote", path], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while not os.path.exists(path):
            assert proc.poll() is None and time.monotonic() < deadline, \
                (folder / "zygote.log").read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        yield path, env, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
    assert not folder.exists()  # the zygote removed its folder (socket, shim)
    assert wait_no_marked_processes(env[MARKER_VAR]) == []


SPAWNER = """
import multiprocessing, os, sys, time
sys.path.insert(0, {root!r})
multiprocessing.set_executable({shim!r})

def report(q):
    q.put((os.getpid(), os.getppid(), "vllm.v1.engine.core" in sys.modules))

def leave(code):
    sys.exit(code)

def wait(q):
    q.put("up")
    time.sleep(120)

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=report, args=(q,)); p.start()
    print("report", *q.get(timeout=60)); p.join(60); print("exitcode", p.exitcode)
    p = ctx.Process(target=leave, args=(7,)); p.start(); p.join(60); print("exitcode", p.exitcode)
    p = ctx.Process(target=wait, args=(q,)); p.start(); q.get(timeout=60); p.terminate()
    p.join(60)
    print("exitcode", p.exitcode)
"""


def test_spawn_through_the_shim_is_a_warm_fork_that_exits_as_spawned(zygote, tmp_path):
    path, env, zygote_pid = zygote
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER.format(root=str(ROOT), shim=str(Path(path).parent / SHIM_NAME)))
    done = subprocess.run([sys.executable, str(script)], env={**env, SOCKET_VAR: path},
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    _, pid, ppid, warm = lines[0].split()
    assert int(ppid) == zygote_pid and warm == "True"  # a fork of the zygote, vLLM already in
    assert lines[1:4] == ["exitcode 0", "exitcode 7", f"exitcode {-signal.SIGTERM}"]


def _complete(base_url: str, model: str, prompt: str, key: str | None = None) -> str:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body.encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())["choices"][0]["text"]


ACTOR = """
import sys
from pathlib import Path
from framework.engine.zygote import serve_in_zygote
serve_in_zygote(sys.argv[1], sys.argv[3:], Path(sys.argv[2]))
"""


def test_a_forked_server_answers_as_a_spawned_one_and_dies_with_its_actor(
        zygote, vllm_server, tmp_path):
    import asyncio

    path, env, zygote_pid = zygote
    port = pick_port(HOST, [])
    argv = ["--model", str(vllm_server.model), "--host", HOST,
            "--port", str(port), "--max-num-seqs", "8", "--max-model-len", "1024",
            "--enforce-eager"]
    members: list[psutil.Process] = []
    with open(tmp_path / "server.log", "wb") as log:
        record = group_file(tmp_path)
        actor = subprocess.Popen([sys.executable, "-c", ACTOR, path, str(record), *argv],
                                 cwd=ROOT, env=env,
                                 stdout=log, stderr=subprocess.STDOUT)
    try:
        # as the shared server's SHARED_STARTUP_S: a start on a loaded machine, not a speed
        ready = asyncio.run(wait_ready(f"http://{HOST}:{port}", 240,
                                       is_alive=lambda: actor.poll() is None))
        assert ready, (tmp_path / "server.log").read_text(errors="replace")[-3000:]
        prompts = ["The capital of France is", "def fib(n):", "Once upon a time"]
        model = str(vllm_server.model)
        shared = [_complete(vllm_server.base_url, model, p, vllm_server.api_key) for p in prompts]
        # same model and flags as the session's spawned server, greedy: the same text
        assert [_complete(f"http://{HOST}:{port}", model, p) for p in prompts] == shared

        group = served_group(record)
        members = [p for p in psutil.process_iter() if _pgid(p.pid) == group]
        forks = [p for p in members if p.ppid() == zygote_pid]
        shims = [p for p in members if any(a.endswith(SHIM_NAME) for a in _cmdline(p))]
        # vLLM's three processes, each a fork of the zygote and titled as vLLM titles them
        # (the API server keeps the zygote's command line, as it keeps the actor's in-process),
        # and the two shims standing in for the spawned ones, children of their spawners
        assert sorted(_cmdline(p)[0] for p in forks) == [
            sys.executable, "VLLM::EngineCore", "VLLM::Worker"]
        assert len(shims) == 2 and {p.ppid() for p in shims} <= {p.pid for p in forks}
        assert set(process_tree(actor.pid, record)) >= {actor.pid, *(p.pid for p in members)}
    finally:
        actor.send_signal(signal.SIGKILL)
        actor.wait(timeout=30)
    alive = psutil.wait_procs(members, timeout=30)[1]
    assert members and alive == []  # the life pipe closed: the whole group ended


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
