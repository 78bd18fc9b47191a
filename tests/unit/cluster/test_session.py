"""DriverSession: one driver per sweep, taken atomically, and kill -9 survived.

Contenders are real processes locking the same file; every process a test starts is ended by
the test, and every test has a timeout.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from framework.base.errors import ClusterError
from framework.cluster.driver_session import SESSION_VAR
from framework.cluster.driver_session import DriverSession
from tests.paths import ROOT

# ends a wait for what must happen, reached only when it never does: spawned children import
# the framework (Ray among it), which on two busy cores took over 30 s (session 13, load ~18)
WAIT_S = 300.0


def _contend(state_file: str, slow_s: float, start: Any, release: Any, out: Any) -> None:
    """Child: wait for the other contenders, enter the session, report, hold it until released.
    `slow_s` stretches the step between reading driver.json and writing it (uuid4)."""
    fast = uuid.uuid4

    def slow_uuid4() -> uuid.UUID:
        time.sleep(slow_s)
        return fast()

    uuid.uuid4 = slow_uuid4
    start.wait(timeout=WAIT_S)
    try:
        with DriverSession(Path(state_file)):
            out.put(("in", os.getpid(), ""))
            release.wait(timeout=WAIT_S)
    except ClusterError as exc:
        out.put(("refused", os.getpid(), str(exc)))


@pytest.fixture
def started() -> Iterator[list[Any]]:
    """Processes a test starts (Popen, multiprocessing or psutil); any left are killed."""
    procs: list[Any] = []
    yield procs
    for proc in procs:
        if isinstance(proc, subprocess.Popen):
            proc.kill()
            proc.wait(timeout=10)
        elif isinstance(proc, psutil.Process):
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        else:
            proc.kill()
            proc.join(timeout=10)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("slow_s", [0.0, 0.0, 0.3], ids=["as-is", "as-is-again", "slow-claim"])
def test_drivers_started_at_the_same_instant_exactly_one_gets_in(tmp_path, started, slow_s):
    state_file = tmp_path / "results" / "s" / "driver.json"
    ctx = multiprocessing.get_context("spawn")
    contenders = 3
    start, release, out = ctx.Barrier(contenders), ctx.Event(), ctx.Queue()
    for _ in range(contenders):
        proc = ctx.Process(target=_contend, args=(str(state_file), slow_s, start, release, out))
        proc.start()
        started.append(proc)
    outcomes = sorted(out.get(timeout=WAIT_S) for _ in range(contenders))
    release.set()
    for proc in started:
        proc.join(timeout=WAIT_S)
        assert proc.exitcode == 0
    assert [what for what, _, _ in outcomes] == ["in"] + ["refused"] * (contenders - 1), outcomes
    winner = outcomes[0][1]
    for _, loser, message in outcomes[1:]:
        assert loser != winner
        assert message == (f"s: another driver (pid {winner}) is running this sweep; "
                           f"see {state_file}")
    assert not state_file.exists()


@pytest.mark.timeout(60)
def test_a_live_driver_in_the_same_process_refuses_a_second_and_keeps_its_lock(tmp_path):
    state_file = tmp_path / "driver.json"
    with DriverSession(state_file) as outer:
        with pytest.raises(ClusterError, match=rf"another driver \(pid {os.getpid()}\)"):
            with DriverSession(state_file):
                pass
        other = subprocess.run(  # the refused entry left this process's lock in place
            [sys.executable, "-c", "import sys; from pathlib import Path; "
             "from framework.cluster.driver_session import DriverSession; "
             "DriverSession(Path(sys.argv[1]), lock_wait_s=0.2).__enter__()", str(state_file)],
            cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
        assert other.returncode == 1
        assert f"ClusterError: {tmp_path.name}: another driver (pid {os.getpid()})" in other.stderr
        assert os.environ[SESSION_VAR] == outer.session_id
        assert json.loads(state_file.read_text())["session"] == outer.session_id
    assert SESSION_VAR not in os.environ and not state_file.exists()
    with DriverSession(state_file):  # released on exit
        pass


def _held_session(state_file: Path, fork_child: bool) -> subprocess.Popen:
    """A driver in a subprocess that enters the session, optionally forks a child (which
    shares its descriptors but not its record lock), and then sleeps."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from framework.cluster.driver_session import DriverSession
        session = DriverSession(Path({str(state_file)!r})).__enter__()
        if {fork_child!r} and os.fork() == 0:
            time.sleep(120)
            os._exit(0)
        print("in", flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "in"
    return proc


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fork_child", [False, True], ids=["driver", "driver-and-forked-child"])
def test_a_driver_killed_with_sigkill_is_taken_over(tmp_path, started, fork_child):
    state_file = tmp_path / "driver.json"
    dead = _held_session(state_file, fork_child)
    started.append(dead)
    started.extend(psutil.Process(dead.pid).children())  # a fork does not inherit the lock
    stale = json.loads(state_file.read_text())
    with pytest.raises(ClusterError, match=rf"another driver \(pid {dead.pid}\)"):
        with DriverSession(state_file):
            pass
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait(timeout=10)
    with DriverSession(state_file, lock_wait_s=5) as session:
        assert session.session_id != stale["session"]
        assert json.loads(state_file.read_text())["pid"] == os.getpid()
    assert not state_file.exists()


@pytest.mark.timeout(60)
def test_a_stale_driver_json_is_taken_over_and_its_session_reaped(tmp_path, started):
    state_file = tmp_path / "driver.json"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=10)
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            env={**os.environ, SESSION_VAR: "stale-session"})
    started.append(left)
    state_file.write_text(json.dumps({"pid": gone.pid, "create_time": 1.0,
                                      "session": "stale-session"}))
    with DriverSession(state_file) as session:
        assert session.reaped_stale == 1
        left.wait(timeout=10)  # ended, long before its sleep (its status may be psutil's)
        assert json.loads(state_file.read_text())["session"] == session.session_id
    assert not state_file.exists()
