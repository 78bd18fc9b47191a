"""Run one vLLM OpenAI server in the current process (inside the trial's server actor).

In-process, not `vllm serve` as a subprocess: only in-process does vLLM's Ray executor see the
trial's placement group and reuse it (docs/ARCHITECTURE.md, "Why in-process vLLM in an actor").
The caller's main thread blocks in `serve()` until the server exits; vLLM installs signal
handlers, which needs the main thread.
No Ray import here: `cluster` wraps this in an actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import time
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from framework.base.errors import TrialError
from framework.engine import run_folder
from framework.engine.control import serve_from_env
from framework.engine.startup_log import SERVE_MARK

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient

# Exception types vLLM raises while validating its configuration (before any engine process
# starts): a failure of one of these means the arguments were rejected.
_CONFIG_ERRORS = ("ValueError", "TypeError", "ValidationError", "NotImplementedError")


def redirect_output(log_path: Path) -> None:
    """Point this process's stdout/stderr (fds 1, 2; inherited by vLLM's children) at the new
    file `log_path` (engine.run_folder.create: O_EXCL|O_NOFOLLOW, mode 0600; a name already
    taken, a symlink included, is run_folder.UnsafePath naming it)."""
    fd = run_folder.create(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


# --- start-up timing (framework.engine.startup_log reads what these write) ---
PREFIX_VAR = "VLLM_LOGGING_PREFIX"  # vllm/envs.py; vllm/logger.py puts it first in `_FORMAT`
# The log record's creation time, epoch seconds to the millisecond (a LogRecord attribute, so
# `%`-formatted by vLLM's own formatter); startup_log.EPOCH_PREFIX parses it.
EPOCH_PREFIX = "t=%(created).3f "
LOCAL_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def epoch_log_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that make vLLM stamp each line with its epoch time: PREFIX_VAR =
    EPOCH_PREFIX + the user's own prefix (kept), or {} when it already starts so.

    An environment variable, not a logging-config file: vLLM copies its variables to its Ray
    workers on every node (vllm/ray/ray_env.py) and passes a config file's path to them in
    VllmConfig.logging_config (vllm/v1/executor/ray_executor_v2.py configures logging from it),
    so a file written on the server's node fails every worker on another node ("File does not
    exist", vllm/logger.py); and a file in a shared temp dir is one another user can plant.
    vLLM reads the prefix when vllm.logger is first imported: it must be in the environment of
    the process that imports vLLM (the server actor's runtime_env, the zygote's), and reaches
    vLLM's child processes and Ray workers from there. A user's logging config
    (VLLM_LOGGING_CONFIG_PATH or `--log-config-file`) replaces vLLM's format, prefix included:
    start-up phases then read vLLM's second-resolution local times (startup_log)."""
    mine = environ.get(PREFIX_VAR, "")
    return {} if mine.startswith(EPOCH_PREFIX) else {PREFIX_VAR: EPOCH_PREFIX + mine}


def use_epoch_log() -> None:
    """Set `epoch_log_env` in this process's environment (before vLLM is imported)."""
    os.environ.update(epoch_log_env(os.environ))


def serve_mark(now: float) -> str:
    """The line `serve` prints first: the epoch time and the same instant in local time, so a
    log's local timestamps convert to epoch seconds whatever the node's time zone."""
    local = time.strftime(LOCAL_TIME_FORMAT, time.localtime(now))
    return f"{SERVE_MARK} epoch {now:.3f} local {local}.{int(now * 1000) % 1000:03d}"


def parse_server_args(argv: Sequence[str]):
    """Parse with the installed vLLM's own parser; a rejection is TrialError(invalid_args)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(list(argv))
            validate_parsed_serve_args(args)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        raise TrialError("invalid_args", lines[-1] if lines else "vLLM rejected the arguments") from None
    except (ValueError, TypeError) as exc:
        raise TrialError("invalid_args", str(exc)) from None
    return args


def serve(argv: Sequence[str]) -> None:
    """Parse, then run the OpenAI server until it exits. Blocks the calling (main) thread.

    With $VLLM_SWEEP_CONTROL_SOCKET set, the command `reset_prefix_cache` on that socket
    resets the engine's prefix cache in-process (framework.engine.control), without vLLM's dev mode.
    Raises TrialError(invalid_args) for rejected arguments or configuration, and
    TrialError(startup_crash) for anything else that ends the server.
    Prints `serve_mark` first; vLLM's lines carry their epoch time (`epoch_log_env`, set here
    too for a caller whose environment lacks it), for the start-up phases
    (framework.engine.startup_log).
    """
    print(serve_mark(time.time()), flush=True)
    use_epoch_log()
    _serve(argv)


def _serve(argv: Sequence[str]) -> None:
    import uvloop
    from vllm.entrypoints.launchers.api_server import entry

    args = parse_server_args(argv)
    engine: dict = {}
    build_and_serve = entry.build_and_serve

    async def capture(engine_client: EngineClient, *rest, **kwargs):
        engine.update(client=engine_client, loop=asyncio.get_running_loop())
        return await build_and_serve(engine_client, *rest, **kwargs)

    def reset_prefix_cache() -> bool:
        """vLLM's dev route's call (vllm/entrypoints/serve/dev/cache/api_router.py): False while
        blocks are held by running requests."""
        if "client" not in engine:
            return False
        done = asyncio.run_coroutine_threadsafe(engine["client"].reset_prefix_cache(),
                                                engine["loop"])
        ok = bool(done.result(timeout=30))
        print(f"vllm-sweep: prefix cache reset in-process: {'done' if ok else 'refused'}",
              flush=True)
        return ok

    entry.build_and_serve = capture  # run_server_worker looks it up in its module
    control = serve_from_env({"reset_prefix_cache": reset_prefix_cache})
    try:
        uvloop.run(entry.run_server(args))
    except TrialError:
        raise
    except BaseException as exc:  # noqa: BLE001 - classified and re-raised as data
        kind = "invalid_args" if type(exc).__name__ in _CONFIG_ERRORS else "startup_crash"
        raise TrialError(kind, f"{type(exc).__name__}: {exc}".strip()[:2000]) from None
    finally:
        if control is not None:
            control.close()


# Text of a server that died for want of memory while starting, in vLLM 0.32's wording
# (tests/unit/test_oom_markers.py holds each message with its source).
OOM_MARKERS = (
    "out of memory",  # torch and CUDA allocation failures, vLLM's warm-up RuntimeErrors
    "OutOfMemoryError",  # torch.OutOfMemoryError
    "not enough GPU memory",  # model load, auto-fit max_model_len
    "is less than desired GPU memory utilization",  # start-up free-memory check
    "is less than the engine's budget",  # the same check with externally held weights
    "exceed the desired GPU memory utilization",  # externally held weights alone
    "No available memory for the cache blocks",  # KV budget <= 0
    "larger than the available KV cache memory",  # KV cache below one max-model-len sequence
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS handle or workspace on a full device
    "Cannot allocate memory",  # host: errno 12
    "MemoryError",
)


def startup_failure(reason: str, detail: str, log: str) -> tuple[str, str]:
    """Refine a failure before ready: a crash (or a rejection raised by the engine's memory
    check) whose detail or log names a memory shortage is `oom_at_startup`, with that line
    as the detail; anything else is returned unchanged."""
    if reason not in ("startup_crash", "invalid_args"):
        return reason, detail
    for line in [detail, *reversed(log.splitlines())]:
        if any(marker in line for marker in OOM_MARKERS):
            return "oom_at_startup", line.strip()[:2000]
    return reason, detail


def log_tail(log_path: Path, lines: int = 50) -> str:
    """The last `lines` lines of a server log ('' if there is none)."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            data = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])
