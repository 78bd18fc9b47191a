"""The `fork_start` start-up lever: vLLM's API server in a child process of the server actor,
so that vLLM forks its EngineCore and workers instead of spawning them.

Why: inside a Ray actor vLLM forces the `spawn` start method (vllm/utils/system_utils.py,
`_maybe_force_spawn`, reason "In a Ray actor and can only be spawned", checked by
vllm/ray/lazy_utils.py `is_in_ray_actor`: Ray initialized and an actor id), so the EngineCore
process and each worker start a new interpreter and import torch and vLLM again. A child
started from the actor with an argv list is a plain process: Ray is not initialized in it, so
vLLM keeps its own default, VLLM_WORKER_MULTIPROC_METHOD=fork (vllm/envs.py), the start method
`vllm serve` uses outside Ray. The process structure stays vLLM's (API server -> EngineCore ->
workers); what changes is one import of vLLM per server instead of one per process.
vLLM still spawns where it must: CUDA initialized in the parent, WSL, `--numa-bind`, or the
user's VLLM_WORKER_MULTIPROC_METHOD=spawn (the child inherits the actor's environment).

Not with vLLM's Ray executor (`--distributed-executor-backend ray`): a child is a new Ray
driver and cannot see the trial's placement group (docs/ARCHITECTURE.md, "Why in-process vLLM
in an actor"); those servers stay in-process (`uses_ray_executor`).

Contract of the child (`python -m framework.engine.serve_process ARGV...`): it runs
`vllm_server.serve(ARGV)`; a TrialError is written as JSON {"reason", "detail"} to the file
named by $VLLM_SWEEP_SERVE_RESULT and the exit code is 3. It asks the kernel to SIGTERM it when
the actor's thread that started it dies (prctl PR_SET_PDEATHSIG, Linux), so no server outlives
its actor. The actor's stop (cluster/server.py `_stop_tree`) ends the whole tree by PID.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

from framework.base.errors import TrialError
from framework.engine.run_folder import write_new

RESULT_VAR = "VLLM_SWEEP_SERVE_RESULT"
PARENT_VAR = "VLLM_SWEEP_SERVE_PARENT"
FAILED_EXIT = 3
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def uses_ray_executor(argv: Sequence[str]) -> bool:
    """True when `argv` asks for vLLM's Ray executor (`--distributed-executor-backend ray` or
    `--distributed-executor-backend=ray`): such a server must run in the actor's own process."""
    for i, arg in enumerate(argv):
        if arg == "--distributed-executor-backend" and i + 1 < len(argv):
            return argv[i + 1] == "ray"
        if arg.startswith("--distributed-executor-backend="):
            return arg.split("=", 1)[1] == "ray"
    return False


def child_argv(argv: Sequence[str]) -> list[str]:
    """The child's command line: this interpreter, this module, vLLM's server argv."""
    return [sys.executable, "-m", "framework.engine.serve_process", *argv]


def failure_of(returncode: int, result: str) -> TrialError | None:
    """What a child's exit means: None for 0; the TrialError it wrote (exit FAILED_EXIT);
    otherwise a `startup_crash` naming the exit code or the signal."""
    if returncode == 0:
        return None
    if returncode == FAILED_EXIT and result.strip():
        data = json.loads(result)
        return TrialError(str(data["reason"]), str(data["detail"]))
    how = f"signal {signal.Signals(-returncode).name}" if returncode < 0 else f"exit code {returncode}"
    return TrialError("startup_crash", f"vLLM's API server process ended with {how}")


def serve_with(start: Callable[[dict[str, str]], int]) -> None:
    """Run a server process through `start(env)` (returns its exit code when it has ended),
    with a result file named in `env`; raise the process's TrialError, if any. The file exists
    only once a failing server wrote it, so an actor killed mid-serve leaves nothing behind;
    it is in the temp dir, which a server actor points at its private folder
    (cluster.actors.private_tmp), and is made new (O_EXCL|O_NOFOLLOW)."""
    result = Path(tempfile.gettempdir()) / f"vsweep-serve-{uuid.uuid4().hex}.json"
    try:
        returncode = start({**os.environ, RESULT_VAR: str(result)})
        failure = failure_of(returncode, result.read_text(encoding="utf-8")
                             if result.exists() else "")
    finally:
        result.unlink(missing_ok=True)
    if failure is not None:
        raise failure


def serve_in_child(argv: Sequence[str]) -> None:
    """Run the server in a child process (argv list, stdout/stderr inherited: the actor's
    redirected log) and block until it exits; raise its TrialError, if any."""
    serve_with(lambda env: subprocess.Popen(
        child_argv(argv), env={**env, PARENT_VAR: str(os.getpid())}).wait())


def die_with_parent() -> None:
    """SIGTERM this process when its parent's thread ends (Linux; elsewhere a no-op); exit at
    once if the parent is already gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.environ.get(PARENT_VAR) and os.getppid() != int(os.environ[PARENT_VAR]):
        sys.exit(1)


def run(argv: Sequence[str]) -> int:
    """Serve `argv`; 0, or FAILED_EXIT with the TrialError written to $VLLM_SWEEP_SERVE_RESULT."""
    from framework.engine.vllm_server import serve

    try:
        serve(argv)
    except TrialError as exc:
        write_new(Path(os.environ[RESULT_VAR]),
                  json.dumps({"reason": exc.reason, "detail": exc.detail}))
        return FAILED_EXIT
    return 0


def main(argv: Sequence[str]) -> int:
    die_with_parent()
    return run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
