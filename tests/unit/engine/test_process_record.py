"""Whether a recorded pid still names the recorded process (engine.process_record): the one
check before any pid read from a file or kept from earlier is signalled (issue #33 item 3)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from framework.engine.process_record import UNREADABLE
from framework.engine.process_record import ProcessRecord
from framework.engine.process_record import read_record
from framework.engine.process_record import start_ticks
from framework.engine.process_record import state

SERVER = ProcessRecord(4242, 1000, ("/usr/bin/python3", "-m", "framework.engine.zygote", "z.sock"))


@pytest.mark.parametrize(("now", "expected"), [
    (SERVER, "same"),
    (None, "gone"),                                                     # no process
    (ProcessRecord(4242, 1000, ()), "gone"),                            # it is a zombie now
    # `setsid sleep` given the recorded pid after the server ended: pid matches, start does not
    (ProcessRecord(4242, 5000, ("sleep", "600")), "other"),
    (ProcessRecord(4242, 5000, SERVER.cmdline), "other"),               # same program, reused pid
    (ProcessRecord(4242, 1000, ("sleep", "600")), "other"),             # same tick, other program
    (ProcessRecord(4242, UNREADABLE, ()), "other"),                     # hidden from us
])
def test_state_of_a_recorded_pid(now, expected) -> None:
    assert state(SERVER, now) == expected


def test_an_unreadable_record_matches_nothing() -> None:
    unreadable = ProcessRecord(4242, UNREADABLE, ())
    assert state(unreadable, unreadable) == "other"


@pytest.mark.parametrize(("stat", "ticks"), [
    ("4242 (python3) S 1 4242 4242 0 -1 4194560 9 0 0 0 1 2 0 0 20 0 3 0 1000 10 20 -1", 1000),
    # the command name may hold spaces and ')': fields are counted after the last ')'
    ("4242 (a) b) c) S 1 4242 4242 0 -1 4194560 9 0 0 0 1 2 0 0 20 0 3 0 77 10 20", 77),
])
def test_start_ticks_is_field_22(stat, ticks) -> None:
    assert start_ticks(stat) == ticks


@pytest.mark.parametrize(("text", "expected"), [
    (SERVER.to_json(), SERVER),
    ("4242", None),                       # a bare pid, as files before this change held
    ('{"pid": 0, "start_ticks": 1, "cmdline": []}', None),
    ('{"pid": 7}', None),
    ("not json", None),
])
def test_a_record_round_trips_and_nothing_else_is_one(text, expected) -> None:
    assert ProcessRecord.from_json(text) == expected


def test_a_live_process_reads_as_itself_then_gone(tmp_path) -> None:
    # it says when it runs: right after a fork and exec its command line can still read empty
    argv = [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"up\n"
        seen = read_record(child.pid)
        assert seen is not None and seen.cmdline == tuple(argv)
        assert state(seen, read_record(child.pid)) == "same"
        assert seen.start_ticks >= read_record(os.getpid()).start_ticks
    finally:
        child.kill()
        child.communicate()
    assert state(seen, read_record(child.pid)) in ("gone", "other")  # "other": reused already
    assert read_record(child.pid, proc=tmp_path) is None
