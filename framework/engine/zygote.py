"""The `warm_start` start-up lever: a per-node process with vLLM already imported (the zygote)
forks every vLLM process of a trial, instead of each one starting a new interpreter.

Why: a vLLM server is three processes, API server -> EngineCore -> worker, and where vLLM
spawns (always on its CPU platform, vllm/platforms/cpu.py `check_and_update_config`; inside a
Ray actor, vllm/utils/system_utils.py `_maybe_force_spawn`) each one imports torch and vLLM
again: ~9 s each on this project's 2-core machine (docs/BENCHMARKS.md, import split).
The process structure stays vLLM's; each process is a fork of a process that has imported
what it would import, as `vllm serve` itself forks its processes outside Ray on GPUs.

How, with nothing of vLLM changed:
- the trial's server actor asks the zygote (`serve_in_zygote`) to fork the API server; the
  child takes the actor's environment (with what `import vllm` sets put back: `fork_env`),
  working directory, stdin/stdout/stderr, and runs `serve_process.run(argv)` in a process
  group of its own;
- vLLM starts its EngineCore and workers with multiprocessing's `spawn`, whose interpreter
  is `multiprocessing.set_executable` (Lib/multiprocessing/spawn.py): here the shim
  (framework/engine/zygote_shim.py). The shim hands its fds, environment and the spawn's
  `pipe_handle`/`tracker_fd` to the zygote over a Unix socket (SCM_RIGHTS), the zygote forks,
  and the child runs `multiprocessing.spawn.spawn_main` as a spawned interpreter would. The
  shim stands in for the child toward vLLM: it forwards signals and exits with the child's
  exit code. Any other command line (the resource tracker) is exec'd by the real interpreter.

Lifetimes: each forked process holds the read end of a pipe whose write end only its
requester holds (the actor, or the shim). When it closes (the requester died, even by
SIGKILL) an EngineCore or worker SIGKILLs itself; the API server gets vLLM's own shutdown
(SIGTERM to itself), and what of its process group is left after LIFE_GRACE_S is SIGKILLed
(`end_group`). EngineCore and workers join the API server's group, so the group
(`served_group`, read by cluster/server.py) is the whole server. The zygote dies with its
keeper (PR_SET_PDEATHSIG).

Protocol (one request per connection): 4-byte big-endian length sent with the fds, then a
JSON header {"kind": "serve"|"spawn", "argv", "env", "cwd", "pgid", "targets", "nice",
"affinity", and for "spawn" "pipe_handle", "tracker_fd"}; fds[i] becomes fd targets[i] in the child, the last
fd is the life pipe. Replies: "pid N\n", later "exit CODE\n" (CODE as Popen.returncode).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

from framework.engine.process_group import end_group
from framework.engine.process_record import ProcessRecord
from framework.engine.process_record import read_record
from framework.engine.process_record import state
from framework.engine.run_folder import write_new
from framework.engine.zygote_shim import SHIM_NAME
from framework.engine.zygote_shim import SOCKET_VAR
from framework.engine.zygote_shim import read_replies
from framework.engine.zygote_shim import send_request
from framework.engine.zygote_shim import traits

MAX_FDS = 64
FOLDER_PREFIX = "zygote-"  # a zygote's folder, made in the run folder (engine.run_folder)
# How long an API server whose requester died may take over vLLM's own shutdown before what is
# left of its process group is SIGKILLed.
LIFE_GRACE_S = 10.0
_orphaned = threading.Event()  # this API server's requester died (its life pipe read EOF)
_HIGH_FD = 256
# What the three processes import, in the order a fresh spawn would; the worker's module is
# the platform's (`worker_modules`).
PRELOAD = ("vllm.entrypoints.launchers.api_server.entry", "vllm.v1.engine.core",
           "vllm.v1.executor.multiproc_executor", "framework.engine.vllm_server")
# What `import vllm` assigns whatever the environment holds (vllm/env_override.py, at module
# level; its other names are setdefault's). PYTORCH_NVML_BASED_CUDA_CHECK=1 is what keeps
# `torch.cuda.is_available()` from initialising CUDA (vLLM PR 15951): without it, a fork's
# first such call would create a CUDA context in the API server before EngineCore forks.
FORCED_BY_IMPORT = ("PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_COMPILE_THREADS")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the zygote's peer closed the connection mid-request")
        data += chunk
    return data


def recv_request(sock: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(sock, 4, MAX_FDS)
    if len(head) < 4:
        head += _recv_exact(sock, 4 - len(head))
    return json.loads(_recv_exact(sock, struct.unpack("!I", head)[0])), list(fds)


def place_fds(received: Sequence[int], targets: Sequence[int]) -> None:
    """Make fd targets[i] a copy of received[i] (inheritable, as a spawned process's fds are),
    then close `received`: moved above every target first, so no target clobbers a source."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD) for fd in received]
    for fd in received:
        os.close(fd)
    for fd, target in zip(high, targets):
        os.dup2(fd, target, inheritable=True)
    for fd in high:
        os.close(fd)


def _watch_life(fd: int, whole_group: bool, grace_s: float = LIFE_GRACE_S) -> None:
    """End this process once `fd` reads EOF (its requester died, as an actor's in-process
    server dies with it): SIGKILL at once, unless `whole_group` (the API server). Then vLLM's
    own shutdown first, as a stop gives it (SIGTERM to the API server alone, which stops
    EngineCore and workers in order, each unlinking its shared memory), and after grace_s
    what is left of the group is SIGKILLed (`end_group`; at once if the server returns
    first: `_exit`). While vLLM has no SIGTERM handler yet (starting), the group is SIGKILLed
    at once: the default action would end the API server alone."""
    def wait() -> None:
        try:
            while os.read(fd, 64):
                pass
        except OSError:
            pass
        if whole_group:
            _orphaned.set()
            if callable(signal.getsignal(signal.SIGTERM)):
                os.kill(os.getpid(), signal.SIGTERM)
                threading.Event().wait(grace_s)  # this process ends first if the shutdown does
            end_group()
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, daemon=True, name="vsweep-life").start()


def import_env(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, str]:
    """What importing vLLM (the preload) set in the zygote's environment: every name it added or
    changed, and FORCED_BY_IMPORT as it left them even where the zygote had them already."""
    return {name: value for name, value in after.items()
            if before.get(name) != value or name in FORCED_BY_IMPORT}


def fork_env(requested: Mapping[str, str], imported: Mapping[str, str]) -> dict[str, str]:
    """A fork's environment: what a fresh interpreter given `requested` holds once it has run
    `import vllm`, as a spawn would. A fork does not import vLLM again, and its environment is
    replaced by the requester's, so the import's names are put back: those `imported` holds
    where the requester sets nothing (a user's TRITON_CACHE_AUTOTUNING=0 stays, as vLLM's
    setdefault keeps it), FORCED_BY_IMPORT as the import set them whatever the requester says."""
    return {**imported, **requested,
            **{name: imported[name] for name in FORCED_BY_IMPORT if name in imported}}


def _take_traits(req: dict) -> None:
    """The requester's niceness and CPU affinity (`zygote_shim.traits`), where allowed."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, int(req["nice"]))
    except (OSError, KeyError):
        pass
    try:
        os.sched_setaffinity(0, req["affinity"])
    except (OSError, KeyError, ValueError):
        pass


def _run(req: dict) -> int:
    if req["kind"] == "spawn":
        from multiprocessing.spawn import spawn_main

        sys.argv = ["-c", "--multiprocessing-fork"]  # what spawn_main asserts (is_forking)
        spawn_main(req["pipe_handle"], tracker_fd=req["tracker_fd"])  # exits
        return 0
    from framework.engine import serve_process

    return serve_process.run(req["argv"])


def _child(req: dict, fds: list[int], close: Sequence[socket.socket], zygote_path: str,
           imported: Mapping[str, str]) -> None:
    """Become the requested process, its environment `fork_env(req["env"], imported)`; never
    returns."""
    code = 1
    try:
        for sock in close:
            sock.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            os.setpgid(0, req.get("pgid") or 0)
        except OSError:
            os.setpgid(0, 0)
        life = fcntl.fcntl(fds[-1], fcntl.F_DUPFD_CLOEXEC, _HIGH_FD + MAX_FDS)
        os.close(fds[-1])
        place_fds(fds[:-1], req["targets"])
        os.environ.clear()
        os.environ.update(fork_env(req["env"], imported))
        os.environ[SOCKET_VAR] = zygote_path
        tempfile.tempdir = None  # the requester's TMPDIR (its server's folder), not the zygote's
        os.chdir(req["cwd"])
        _take_traits(req)
        _watch_life(life, whole_group=req["kind"] == "serve")
        code = _run(req)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - printed to the trial's log, then the exit code
        traceback.print_exc()
    finally:
        _exit(code)


def _exit(code: int) -> None:
    """Leave a fork: streams flushed; if its requester died, what of its group outlived vLLM's
    own shutdown ended (`end_group`). Never returns."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if _orphaned.is_set():
        end_group()
    os._exit(code)


def _claim_process_title() -> None:
    """Let setproctitle find argv's memory now, while `environ` still lies after it: it gives
    up once the environment has been rewritten (as each fork's is), and vLLM names its
    processes through it (vllm/utils/system_utils.py `set_process_title`: VLLM::EngineCore)."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(setproctitle.getproctitle())


def worker_modules() -> tuple[str, ...]:
    from vllm.platforms import current_platform

    return {"cpu": ("vllm.v1.worker.cpu_worker",),
            "cuda": ("vllm.v1.worker.gpu_worker",)}.get(current_platform.device_type, ())


def preload(modules: Sequence[str]) -> None:
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"vllm-sweep zygote: not preloaded: {name}: {exc}", flush=True)


def serve_forever(path: str) -> None:
    """Import what vLLM's processes import, then answer fork requests on the socket `path`
    (created only once the imports are done: a connect succeeds only when warm). The shim is
    written beside it; a folder named FOLDER_PREFIX* is removed on SIGTERM."""
    from framework.engine import vllm_server
    from framework.engine import zygote_shim

    _claim_process_title()
    vllm_server.use_epoch_log()
    before = dict(os.environ)
    preload(PRELOAD)
    preload(worker_modules())
    imported = import_env(before, os.environ)
    import multiprocessing

    folder = Path(path).parent
    multiprocessing.set_executable(zygote_shim.install(folder))
    os.environ[SOCKET_VAR] = path
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    print(f"vllm-sweep zygote: ready on {path} (pid {os.getpid()})", flush=True)
    waiting: dict[int, socket.socket] = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            if select.select([listener], [], [], 0.2)[0]:
                conn, _ = listener.accept()
                _answer(conn, listener, waiting, imported)
            _reap(waiting)
    finally:
        Path(path).unlink(missing_ok=True)
        if folder.name.startswith(FOLDER_PREFIX):
            shutil.rmtree(folder, ignore_errors=True)


def _answer(conn: socket.socket, listener: socket.socket, waiting: dict[int, socket.socket],
            imported: Mapping[str, str]) -> None:
    conn.settimeout(30)
    try:
        req, fds = recv_request(conn)
    except (OSError, ValueError, ConnectionError) as exc:
        print(f"vllm-sweep zygote: bad request: {exc}", flush=True)
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(req, fds, [listener, conn, *waiting.values()], os.environ[SOCKET_VAR], imported)
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(f"pid {pid}\n".encode())
    except OSError:
        pass
    waiting[pid] = conn


def _reap(waiting: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass
            conn.close()


def group_file(folder: Path) -> Path:
    """Where a server actor records its warm-started server's process group: in the server's
    private folder `folder` (engine.run_folder), read by the stop's task on the node."""
    return folder / "served-group"


def is_zygote_process(cmdline: Sequence[str]) -> bool:
    """A fork of a zygote (its command line, or the title vLLM gave it: `VLLM::EngineCore`,
    vllm/utils/system_utils.py `set_process_title`) or a shim: what a served group may hold.
    A stale group file then cannot name another program's processes."""
    prefix = os.environ.get("VLLM_PROCESS_NAME_PREFIX", "VLLM") + "::"
    return ("framework.engine.zygote" in cmdline
            or bool(cmdline) and cmdline[0].startswith(prefix)
            or any(arg.endswith(SHIM_NAME) for arg in cmdline))


def record_served(record: Path, leader: int) -> None:
    """Record in the new file `record` (a `group_file`; O_EXCL, run_folder.write_new) the API
    server `leader` (its group's leader) as it runs now: pid, start time and command line
    (engine.process_record); nothing if it is gone already."""
    found = read_record(leader)
    if found is not None:
        write_new(record, found.to_json())


def served_record(record: Path) -> ProcessRecord | None:
    """The leader recorded in the `group_file` `record`, if any (a file in another format,
    e.g. a bare pid, is no record: it cannot be verified)."""
    try:
        return ProcessRecord.from_json(record.read_text(encoding="utf-8"))
    except OSError:
        return None


def served_group(record: Path) -> int | None:
    """The process group of the server whose `group_file` is `record`, if any; None when its
    leader's pid now names another process (a stale file: that group is someone else's)."""
    leader = served_record(record)
    if leader is None or state(leader, read_record(leader.pid)) == "other":
        return None
    return leader.pid


def serve_in_zygote(path: str, argv: Sequence[str], record: Path) -> None:
    """Have the zygote at `path` fork the API server with this process's environment and
    stdin/stdout/stderr; block until it exits; raise its TrialError, if any. The server
    ends if this process dies (its life pipe). Its process group is recorded in `record` (a
    new file, `group_file` of the server's folder) while it runs."""
    from framework.engine.serve_process import serve_with

    def start(env: dict[str, str]) -> int:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        life_r, life_w = os.pipe()
        os.set_inheritable(life_w, False)
        try:
            send_request(sock, {"kind": "serve", "argv": list(argv), "env": env,
                                "cwd": os.getcwd(), "pgid": None, "targets": [0, 1, 2],
                                **traits()},
                         [0, 1, 2, life_r])
            os.close(life_r)
            return read_replies(sock, lambda pid: record_served(record, pid))
        finally:
            sock.close()
            os.close(life_w)
            record.unlink(missing_ok=True)

    serve_with(start)


if __name__ == "__main__":
    from framework.engine.serve_process import die_with_parent

    die_with_parent()
    serve_forever(sys.argv[1])
