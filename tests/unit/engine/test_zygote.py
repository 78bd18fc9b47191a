"""The warm_start lever's parts that need no vLLM (framework/engine/zygote.py, zygote_shim.py):
reading spawn's command line, the request and reply protocol over a real Unix socket pair,
fd placement, exiting as the child did, which processes a served group may hold, the CPU
engine's default levers, and the environment a fork gets (what `import vllm` set kept)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from multiprocessing import spawn
from pathlib import Path

import psutil
import pytest
import yaml

from framework.cluster.zygote_keeper import KEEPER_FILE
from framework.cluster.zygote_keeper import stale_folders
from framework.config.specs import GPU_LEVERS
from framework.config.specs import SweepSpec
from framework.engine import zygote
from framework.engine.zygote import FORCED_BY_IMPORT
from framework.engine.zygote import fork_env
from framework.engine.zygote import import_env
from framework.engine.zygote import is_zygote_process
from framework.engine.zygote import place_fds
from framework.engine.zygote import recv_request
from framework.engine.zygote_shim import SHIM_NAME
from framework.engine.zygote_shim import open_fds
from framework.engine.zygote_shim import read_replies
from framework.engine.zygote_shim import send_request
from framework.engine.zygote_shim import spawn_args
from tests.paths import ROOT


def _spawn_line(**kwargs) -> list[str]:
    """What multiprocessing's spawn runs, minus the interpreter (Lib/multiprocessing/spawn.py)."""
    return spawn.get_command_line(**kwargs)[1:]


@pytest.mark.parametrize(("argv", "expected"), [
    (_spawn_line(tracker_fd=5, pipe_handle=7), {"pipe_handle": 7, "tracker_fd": 5}),
    (_spawn_line(pipe_handle=9), {"pipe_handle": 9, "tracker_fd": None}),
    (["-B", *_spawn_line(tracker_fd=4, pipe_handle=6)], {"pipe_handle": 6, "tracker_fd": 4}),
    # the resource tracker (Lib/multiprocessing/resource_tracker.py): run by the real Python
    (["-c", "from multiprocessing.resource_tracker import main;main(5)"], None),
    (["-m", "framework.engine.zygote", "/tmp/x.sock"], None),
    ([], None),
])
def test_spawn_args(argv, expected):
    assert spawn_args(argv) == expected


def test_request_round_trip_carries_fds_and_a_large_header():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    header = {"kind": "spawn", "env": {f"V{i}": "x" * 100 for i in range(500)}, "targets": [9]}
    try:
        send_request(a, header, [r])
        got, fds = recv_request(b)
        assert got == header and len(fds) == 1
        os.write(w, b"ok")
        assert os.read(fds[0], 2) == b"ok"  # the same pipe, under another number
        os.close(fds[0])
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


@pytest.mark.parametrize(("chunks", "code", "pids"), [
    ([b"pid 42\nexit 3\n"], 3, [42]),
    ([b"pi", b"d 42\nex", b"it -15\n"], -15, [42]),
    ([b"pid 42\n"], -int(signal.SIGKILL), [42]),  # the zygote died first
    ([], -int(signal.SIGKILL), []),
])
def test_read_replies(chunks, code, pids):
    a, b = socket.socketpair()
    for chunk in chunks:
        a.sendall(chunk)
    a.close()
    seen: list[int] = []
    assert read_replies(b, seen.append) == code and seen == pids
    b.close()


def test_place_fds_survives_a_target_that_is_another_source():
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    # r1 must become r2's number and r2 must become 200: a naive dup2 would clobber r2 first
    place_fds([r1, r2], [r2, 200])
    try:
        os.write(w1, b"1")
        os.write(w2, b"2")
        assert os.read(r2, 1) == b"1" and os.read(200, 1) == b"2"
        assert os.get_inheritable(200)
        with pytest.raises(OSError):
            os.fstat(r1)
    finally:
        for fd in (r2, 200, w1, w2):
            os.close(fd)


def test_open_fds_lists_fds_a_spawned_process_was_given_and_leaves_out_exclusions():
    r, w = os.pipe()
    try:
        found = open_fds(exclude=(w,))
        assert {0, 1, 2, r} <= set(found) and w not in found
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("code", [0, 3, -int(signal.SIGTERM), -int(signal.SIGKILL)])
def test_the_shim_exits_as_its_child_did(code):
    done = subprocess.run([sys.executable, "-c", "from framework.engine.zygote_shim import "
                           f"exit_as; exit_as({code})"], cwd=ROOT, timeout=60, check=False)
    assert done.returncode == code


@pytest.mark.parametrize(("cmdline", "ours"), [
    ([sys.executable, "-m", "framework.engine.zygote", "/tmp/vsweep-zygote-1/zygote.sock"], True),
    (["/usr/bin/python3", f"/tmp/vsweep-zygote-1/{SHIM_NAME}", "-c", "x",
      "--multiprocessing-fork"], True),
    (["VLLM::EngineCore", "", ""], True),  # vLLM's title over the fork's argv
    (["VLLM::Worker"], True),
    (["sleep", "100"], False),
    (["python", "VLLM::x"], False),
    ([sys.executable, "-m", "framework.engine.serve_process", "--model", "m"], False),
    ([], False),
])
def test_a_served_group_holds_only_zygote_forks_and_shims(cmdline, ours):
    assert is_zygote_process(cmdline) is ours


@pytest.mark.parametrize(("engine", "server", "levers"), [
    ("cpu", {}, ("warm_start",)),
    ("cpu", {"startup_levers": []}, ()),
    ("gpu", {}, GPU_LEVERS),
    ("gpu", {"startup_levers": ["warm_start"]}, ("warm_start",)),
])
def test_default_levers_follow_the_engine(engine, server, levers):
    doc = yaml.safe_load((ROOT / "sweeps" / "quickstart.yaml").read_text())
    doc["engine"] = engine
    doc["server"] = {**doc["server"], **server}
    assert SweepSpec.model_validate(doc).server.startup_levers == levers


def test_stale_folders_are_those_whose_keeper_is_gone(tmp_path):
    """A zygote killed outright leaves its folder; the next keeper removes the folders whose
    keeper pid is dead, and leaves live ones, foreign names and folders still starting."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for name, pid in (("zygote-live", os.getpid()), ("zygote-dead", dead.pid),
                      ("zygote-garbled", "x"), ("other-dead", dead.pid)):
        (tmp_path / name).mkdir()
        (tmp_path / name / KEEPER_FILE).write_text(str(pid))
    (tmp_path / "zygote-starting").mkdir()
    assert stale_folders(tmp_path, psutil.pid_exists) == [tmp_path / "zygote-dead"]


NVML, INDUCTOR = FORCED_BY_IMPORT


def _assigned_at_import() -> tuple[set[str], set[str]]:
    """The names vllm/env_override.py sets at module level (run by `import vllm`), read from
    the installed source without importing it: (assigned outright, setdefault'ed)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    source = Path(spec.submodule_search_locations[0]) / "env_override.py"
    assigned: set[str] = set()
    defaulted: set[str] = set()
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
                and ast.unparse(node.targets[0].value) == "os.environ"):
            assigned.add(ast.literal_eval(node.targets[0].slice))
        elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
              and ast.unparse(node.value.func) == "os.environ.setdefault"):
            defaulted.add(ast.literal_eval(node.value.args[0]))
    return assigned, defaulted


def test_the_forced_names_are_those_vllm_assigns_at_import():
    """A vLLM that forces another name at import fails here, not on a GPU node."""
    assigned, defaulted = _assigned_at_import()
    assert assigned == set(FORCED_BY_IMPORT)
    assert defaulted and not defaulted & assigned


@pytest.mark.parametrize(("before", "after", "imported"), [
    # what the import added or changed; what it left alone is not its
    ({"HOME": "/h", "X": "1"}, {"HOME": "/h", "X": "2", NVML: "1", "TRITON_CACHE_AUTOTUNING": "1"},
     {"X": "2", NVML: "1", "TRITON_CACHE_AUTOTUNING": "1"}),
    # a zygote that had vLLM's forced values already still hands them on
    ({NVML: "1", INDUCTOR: "1"}, {NVML: "1", INDUCTOR: "1"}, {NVML: "1", INDUCTOR: "1"}),
    ({}, {}, {}),
])
def test_import_env_is_what_the_import_set(before, after, imported):
    assert import_env(before, after) == imported


IMPORTED = {NVML: "1", INDUCTOR: "1", "TRITON_CACHE_AUTOTUNING": "1"}


@pytest.mark.parametrize(("requested", "env"), [
    # the actor's environment holds none of them: all put back (the defect: NVML dropped)
    ({"HOME": "/h"}, {"HOME": "/h", **IMPORTED}),
    # a setdefault'ed name the user set keeps the user's value, as a fresh import keeps it
    ({"TRITON_CACHE_AUTOTUNING": "0"}, {**IMPORTED, "TRITON_CACHE_AUTOTUNING": "0"}),
    # a forced name is vLLM's whatever the requester says, as a fresh import makes it
    ({NVML: "0", INDUCTOR: "8"}, IMPORTED),
])
def test_a_fork_environment_is_a_fresh_import_of_the_requesters(requested, env):
    assert fork_env(requested, IMPORTED) == env


def test_a_forked_child_holds_what_the_import_set(tmp_path, monkeypatch):
    """The real `_child`, its run replaced by a dump of its environment: the requester's
    variables, and vLLM's import's put back over a cleared environment."""
    out = tmp_path / "env.json"

    def dump(req: dict) -> int:
        out.write_text(json.dumps(dict(os.environ)), encoding="utf-8")
        return 7

    monkeypatch.setattr(zygote, "_run", dump)
    monkeypatch.setenv("VSWEEP_ONLY_IN_THE_ZYGOTE", "1")
    life_r, life_w = os.pipe()
    req = {"kind": "spawn", "env": {"HOME": str(tmp_path), INDUCTOR: "8"}, "cwd": str(tmp_path),
           "pgid": None, "targets": []}
    pid = os.fork()
    if pid == 0:
        os.close(life_w)
        zygote._child(req, [life_r], [], "/zygote.sock", IMPORTED)  # never returns
    os.close(life_r)
    try:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
    finally:
        os.close(life_w)
    env = json.loads(out.read_text(encoding="utf-8"))
    assert env == {"HOME": str(tmp_path), **IMPORTED, zygote.SOCKET_VAR: "/zygote.sock"}
