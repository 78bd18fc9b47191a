"""An API server forked by the zygote whose requester died (its life pipe reads EOF) ends
with vLLM's own shutdown, then SIGKILL of what is left of its group, resource trackers spared
(framework/engine/zygote.py `_watch_life`, `_exit`; engine/process_group.py; #33 item 6).

A stand-in API server runs in a process group of its own (as a zygote fork does) with two
members: a straggler that must end and a resource tracker that must be spared, each holding
the write end of a pipe whose EOF tells the test it ended."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys

import pytest

from tests.paths import ROOT

SERVER = """
import os, signal, subprocess, sys, threading
from framework.engine import zygote

life, gone, spared, mode, grace = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                   sys.argv[4], float(sys.argv[5]))
subprocess.Popen(["sleep", "600"], pass_fds=[gone], stdout=subprocess.DEVNULL)
tracker = subprocess.Popen([sys.executable, "-c", "import select  # multiprocessing."
                            "resource_tracker stand-in\\nselect.select([], [], [])"],
                           pass_fds=[spared], stdout=subprocess.DEVNULL)
os.close(gone)
os.close(spared)

def shut_down(signum, frame):  # vLLM's handler: a clean shutdown returns from serve
    print("shutdown", flush=True)
    if mode == "clean":
        raise SystemExit(0)

if mode != "starting":  # no handler yet while vLLM starts
    signal.signal(signal.SIGTERM, shut_down)
try:  # as zygote._child: the SIGTERM may come as soon as "ready" is out, so inside the try
    zygote._watch_life(life, whole_group=True, grace_s=grace)
    print("ready", tracker.pid, flush=True)
    threading.Event().wait()
finally:
    zygote._exit(0)
"""


def _ended(fd: int) -> bool:
    """Whether every holder of the pipe's write end has exited (EOF), waiting for it."""
    assert select.select([fd], [], [], 60)[0], "hang guard: the process did not end"
    return os.read(fd, 1) == b""


@pytest.mark.parametrize(("mode", "grace_s", "code", "shut_down"), [
    ("clean", 60.0, 0, True),                  # vLLM shuts down and returns; the rest is ended
    ("hung", 0.1, -signal.SIGKILL, True),      # vLLM's shutdown hangs: SIGKILL after the grace
    ("starting", 60.0, -signal.SIGKILL, False),  # no handler yet: SIGKILL at once
])
def test_a_dead_requester_ends_the_server_group_vllm_first(mode, grace_s, code, shut_down):
    life_r, life_w = os.pipe()
    gone_r, gone_w = os.pipe()
    spared_r, spared_w = os.pipe()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(life_r), str(gone_w), str(spared_w), mode,
         str(grace_s)], cwd=ROOT, pass_fds=[life_r, gone_w, spared_w], start_new_session=True,
        stdout=subprocess.PIPE, text=True)
    for fd in (life_r, gone_w, spared_w):
        os.close(fd)
    tracker = None
    try:
        word, pid = server.stdout.readline().split()
        tracker = int(pid)
        assert word == "ready"
        os.close(life_w)  # the requester dies
        life_w = -1
        assert server.wait(timeout=60) == code
        assert ("shutdown" in server.stdout.read()) is shut_down
        assert _ended(gone_r)  # the straggler was SIGKILLed
        assert not select.select([spared_r], [], [], 0)[0]  # the tracker runs on
        os.kill(tracker, signal.SIGKILL)
        assert _ended(spared_r)
    finally:
        if life_w >= 0:
            os.close(life_w)
        # the group outlives its leader while a member lives: a failed check leaves the
        # straggler and the tracker in it, so it is ended whatever happened
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        for fd in (gone_r, spared_r):
            os.close(fd)
        server.stdout.close()
