"""Whom a server's stop asks to shut down (cluster.node_reap.shutdown_targets): vLLM's top
process below the server actor, never every process alike, and never a process a stale group
file names (issue #33 item 3); and where the server's vLLM IPC sockets and temp files go
(cluster.actors.rpc_base, private_tmp: its folder, issue #33 item 2), so that the stop can
remove them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from framework.cluster.actors import RPC_BASE_VAR
from framework.cluster.actors import private_tmp
from framework.cluster.actors import rpc_base
from framework.cluster.node_reap import end_tree
from framework.cluster.node_reap import shut_down
from framework.cluster.node_reap import shutdown_targets
from framework.engine.process_record import ProcessRecord
from framework.engine.process_record import read_record
from framework.engine.zygote import group_file
from framework.engine.zygote import served_group
from framework.engine.zygote import served_record

ACTOR = 100


@pytest.mark.parametrize(("parents", "group", "expected"), [
    # API server in the actor: EngineCore (its child) stops its worker itself
    ({200: ACTOR, 300: 200}, None, [200]),
    # fork_start: the API server is the actor's child; EngineCore and worker below it
    ({200: ACTOR, 300: 200, 400: 300}, None, [200]),
    # warm_start: API server, EngineCore and worker are all forks of the zygote (pid 50);
    # only the API server, the leader of the served group, gets the signal
    ({150: 50, 160: 50, 170: 50, 161: 160}, 150, [150]),
    # nothing below the actor (the fake engine, or a server already gone)
    ({}, None, []),
])
def test_only_the_top_vllm_process_is_signalled(parents, group, expected) -> None:
    assert shutdown_targets(ACTOR, parents, group) == expected


@pytest.mark.parametrize(("argv", "environ", "rpc", "tmp"), [
    (["serve", "m"], {}, "rpc", "tmp"),
    # vLLM's Ray executor hands EngineCore's environment to workers on other nodes
    (["serve", "m", "--distributed-executor-backend", "ray"], {}, None, None),
    (["serve", "m", "--distributed-executor-backend=ray"], {}, None, None),
    (["serve", "m", "--distributed-executor-backend", "mp"], {}, "rpc", "tmp"),
    (["serve", "m"], {RPC_BASE_VAR: "/srv/ipc"}, None, "tmp"),               # server.env's own
])
def test_vllm_ipc_sockets_and_tmpdir_go_in_the_servers_folder_unless_the_ray_executor_runs(
        argv, environ, rpc, tmp) -> None:
    folder = Path("/tmp/vsweep-0-0123456789/s7-abc")
    base, private = rpc_base(argv, environ, folder), private_tmp(argv, folder)
    assert (base if base is None else Path(base).relative_to(folder).as_posix()) == rpc
    assert (private if private is None else Path(private).relative_to(folder).as_posix()) == tmp


# A sleeper in a session (and process group) of its own, as `setsid sleep` is, that says when
# it runs: read right after a fork and exec, /proc/<pid>/cmdline can still be empty.
SLEEPER = "import sys; print('asleep', flush=True); sys.stdin.read()"


@pytest.mark.parametrize(("ticks_shift", "cmdline", "ours"), [
    (0, None, True),                                   # the recorded process: shut down
    (-1, None, False),                                 # its pid was reused: left alone
    (0, ("python3", "-m", "framework.engine.zygote"), False),
])
def test_a_stale_group_file_signals_no_other_process_group(ticks_shift, cmdline, ours,
                                                           tmp_path) -> None:
    """A real unrelated process group (a `setsid` sleeper, as in the issue) whose leader's pid
    a group file records: the stop sends SIGTERM only when start time and command line match
    the record. The sleeper's exit status says whether it got SIGTERM before our SIGKILL (the
    kernel keeps the first fatal signal as the exit status)."""
    actor = os.getpid()  # stands in for the server actor that wrote the file
    sleeper = subprocess.Popen([sys.executable, "-c", SLEEPER], start_new_session=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    record = group_file(tmp_path)
    try:
        assert sleeper.stdout.readline() == b"asleep\n"
        now = read_record(sleeper.pid)
        assert now is not None and os.getpgid(sleeper.pid) == sleeper.pid
        recorded = ProcessRecord(now.pid, now.start_ticks + ticks_shift, cmdline or now.cmdline)
        record.write_text(recorded.to_json(), encoding="utf-8")
        assert served_group(record) == (sleeper.pid if ours else None)
        shut_down(actor, [], served_record(record), grace_s=0)
    finally:
        record.unlink(missing_ok=True)
        sleeper.kill()
        sleeper.communicate()
    assert sleeper.returncode == -(signal.SIGTERM if ours else signal.SIGKILL)


SIGNALS = ("import os, signal, sys, time\n"
           "out = sys.argv[1]\n"
           "def note(n, _):\n"
           "    open(out, 'a').write(f'{n}\\n'); sys.exit(1)\n"
           "signal.signal(signal.SIGTERM, note)\n"
           "open(out, 'a').write('up\\n')\n"
           "while True: time.sleep(0.05)\n")


def _noting(tmp_path: Path, name: str) -> tuple[subprocess.Popen, Path]:
    """A child that writes 'up' once its SIGTERM handler is set, then the number of any
    signal it catches."""
    out = tmp_path / name
    proc = subprocess.Popen([sys.executable, "-c", SIGNALS, str(out)])
    while not (out.exists() and "up" in out.read_text()):
        assert proc.poll() is None
        time.sleep(0.01)
    return proc, out


def test_the_stop_never_signals_the_actor_itself_only_waits_for_its_exit(tmp_path) -> None:
    """Guards the console's "A worker died or was killed ... unexpected system error" after a
    trial (seen twice a `make demo`): the stop SIGTERMed the actor's process while Ray was
    ending it. The tree's other processes get SIGTERM; the actor gets none, and is SIGKILLed
    once grace_s has passed without its exit (here Ray never ends it)."""
    actor, actor_out = _noting(tmp_path, "actor")
    child, child_out = _noting(tmp_path, "child")
    try:
        left = end_tree([actor.pid, child.pid], actor.pid, grace_s=0.5)
        assert left == []
        assert child_out.read_text().split() == ["up", str(int(signal.SIGTERM))]
        assert actor_out.read_text().split() == ["up"]  # no SIGTERM caught: SIGKILLed
        assert actor.wait(timeout=30) == -signal.SIGKILL
    finally:
        for proc in (actor, child):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
