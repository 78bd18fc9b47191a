"""The `fork_start` lever's child process (framework.engine.serve_process): when a server must
stay in the actor, what a child's exit means, that a rejected argv comes back as the same
TrialError vLLM's parser gives in-process, and that the child dies with its parent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from framework.base.errors import TrialError
from framework.engine.serve_process import FAILED_EXIT
from framework.engine.serve_process import PARENT_VAR
from framework.engine.serve_process import RESULT_VAR
from framework.engine.serve_process import failure_of
from framework.engine.serve_process import serve_in_child
from framework.engine.serve_process import serve_with
from framework.engine.serve_process import uses_ray_executor
from framework.engine.server_args import server_argv
from framework.engine.server_args import trial_flags
from framework.engine.startup_levers import LEVERS
from framework.engine.startup_levers import plan_levers


@pytest.mark.parametrize(("argv", "ray"), [
    ([], False),
    (["--model", "m", "--distributed-executor-backend", "ray"], True),
    (["--distributed-executor-backend=ray"], True),
    (["--distributed-executor-backend", "mp"], False),
    (["--distributed-executor-backend=uni", "--port", "1"], False),
    (["--distributed-executor-backend"], False),
])
def test_uses_ray_executor(argv, ray):
    assert uses_ray_executor(argv) is ray


@pytest.mark.parametrize("params", [
    {}, {"tensor-parallel-size": 2}, {"pipeline-parallel-size": 2},
    {"tensor-parallel-size": 2, "distributed-executor-backend": "mp"}, {"max-num-seqs": 8},
])
@pytest.mark.parametrize(("lever", "engine"), [
    ("fork_start", "gpu"), ("warm_start", "gpu"), ("warm_start", "cpu")])
def test_the_row_names_a_process_lever_exactly_when_the_actor_uses_it(params, lever, engine):
    """plan_levers (the row) and the actor (the argv) decide alike for every trial shape."""
    flags = trial_flags({}, params, is_baseline=False)
    named = lever in plan_levers((lever,), engine=engine, flags=flags).names
    assert named is not uses_ray_executor(server_argv("m", flags, "127.0.0.1", 8000))


def test_warm_start_takes_precedence_over_fork_start():
    names = plan_levers(LEVERS, engine="gpu", flags={}).names
    assert "warm_start" in names and "fork_start" not in names


@pytest.mark.parametrize(("code", "result", "reason", "detail"), [
    (FAILED_EXIT, json.dumps({"reason": "oom_at_startup", "detail": "out of memory"}),
     "oom_at_startup", "out of memory"),
    (1, "", "startup_crash", "exit code 1"),
    (FAILED_EXIT, "", "startup_crash", "exit code 3"),
    (-9, "", "startup_crash", "signal SIGKILL"),
])
def test_failure_of(code, result, reason, detail):
    failure = failure_of(code, result)
    assert failure is not None and failure.reason == reason and detail in failure.detail


def test_failure_of_a_clean_exit_is_none():
    assert failure_of(0, "") is None


def test_the_result_file_exists_only_when_a_failing_server_wrote_it():
    """A served process that ends well (or is killed with its actor) leaves no file; one that
    failed writes its TrialError, which comes back raised, and the file is removed."""
    named: list[Path] = []

    def ok(env: dict[str, str]) -> int:
        named.append(Path(env[RESULT_VAR]))
        assert not named[-1].exists()
        return 0

    serve_with(ok)

    def failing(env: dict[str, str]) -> int:
        named.append(Path(env[RESULT_VAR]))
        named[-1].write_text(json.dumps({"reason": "oom_at_startup", "detail": "KV"}))
        return FAILED_EXIT

    with pytest.raises(TrialError) as info:
        serve_with(failing)
    assert (info.value.reason, info.value.detail) == ("oom_at_startup", "KV")
    assert named[0] != named[1] and not any(p.exists() for p in named)
    with pytest.raises(TrialError, match=f"exit code {FAILED_EXIT}"):
        serve_with(lambda env: FAILED_EXIT)  # failed without a word: its exit code


def test_a_rejected_argv_comes_back_as_invalid_args():
    """The child parses with vLLM's own parser (real vLLM import in the child)."""
    with pytest.raises(TrialError) as err:
        serve_in_child(["--model", "models/none", "--max-num-seqs", "many"])
    assert err.value.reason == "invalid_args" and "max-num-seqs" in err.value.detail


def test_the_child_dies_with_its_parent():
    """A parent that dies without stopping its child (a killed actor) leaves no server."""
    child = ("import time; from framework.engine.serve_process import die_with_parent; "
             "die_with_parent(); print('armed', flush=True); time.sleep(120)")
    parent = ("import os, subprocess, sys; "
              f"p = subprocess.Popen([sys.executable, '-c', {child!r}], "
              f"env={{**os.environ, {PARENT_VAR!r}: str(os.getpid())}}, stdout=subprocess.PIPE); "
              "p.stdout.readline(); print(p.pid, flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()}, check=True)
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.05)
