"""The interpreter multiprocessing's `spawn` runs inside a warm-started server
(framework/engine/zygote.py): it has the zygote fork the process instead of starting Python.

Standard library only: `install` copies this file, behind a `#!<python> -S` line, to an
executable the zygote hands to `multiprocessing.set_executable`. Called as
`<shim> [flags] -c '...spawn_main(tracker_fd=T, pipe_handle=P)' --multiprocessing-fork`
(Lib/multiprocessing/spawn.py, `get_command_line`), it sends its open fds (0, 1, 2, P, T and
the others spawn passed, each to keep its number), its environment, working directory,
process group, niceness and CPU affinity, with the read end of a pipe only it holds, to the
zygote at $VLLM_SWEEP_ZYGOTE; then forwards the signals it gets to the child and exits as
the child did (a signal's death by the same signal). Any other command line, or no zygote,
runs the real interpreter in its place (exec: same pid, same fds).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import struct
import sys
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

SOCKET_VAR = "VLLM_SWEEP_ZYGOTE"
SHIM_NAME = "python-zygote-shim"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)
_SPAWN = re.compile(r"spawn_main\(([^)]*)\)")


def spawn_args(argv: Sequence[str]) -> dict | None:
    """{"pipe_handle": P, "tracker_fd": T or None} from a spawn command line (the arguments
    after the interpreter), else None."""
    if len(argv) < 3 or argv[-1] != "--multiprocessing-fork" or argv[-3] != "-c":
        return None
    found = _SPAWN.search(argv[-2])
    if found is None:
        return None
    args = dict(part.strip().split("=", 1) for part in found.group(1).split(",") if "=" in part)
    if "pipe_handle" not in args:
        return None
    tracker = args.get("tracker_fd", "None").strip()
    return {"pipe_handle": int(args["pipe_handle"]),
            "tracker_fd": None if tracker == "None" else int(tracker)}


def open_fds(exclude: Sequence[int] = ()) -> list[int]:
    """This process's open fds: a spawned process gets more than its command line names
    (`duplicate_for_child`, e.g. vLLM's death pipes), and each keeps its number."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            os.fstat(fd)
        except OSError:
            continue  # the directory listdir read
        if fd not in exclude:
            found.append(fd)
    return sorted(found)


def traits() -> dict:
    """What a forked process takes from its requester besides env and fds: niceness and CPU
    affinity (a fork would keep the zygote's)."""
    return {"nice": os.getpriority(os.PRIO_PROCESS, 0),
            "affinity": sorted(os.sched_getaffinity(0))}


def send_request(sock: socket.socket, header: dict, fds: Sequence[int]) -> None:
    """The protocol's request: the body's 4-byte length sent with the fds, then the body."""
    body = json.dumps(header).encode()
    socket.send_fds(sock, [struct.pack("!I", len(body))], list(fds))
    sock.sendall(body)


def read_replies(sock: socket.socket, on_pid: Callable[[int], object] = lambda pid: None) -> int:
    """Read "pid N" (passed to `on_pid`) then "exit CODE"; returns CODE. A zygote that dies
    first is -SIGKILL: its child died with it or is ended by its life pipe."""
    buf = b""
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            word, value = line.decode().split()
            if word == "pid":
                on_pid(int(value))
            elif word == "exit":
                return int(value)
        chunk = sock.recv(256)
        if not chunk:
            return -int(signal.SIGKILL)
        buf += chunk


def exit_as(code: int) -> None:
    """End this process as the child ended: its exit code, or death by its signal."""
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def install(directory: Path) -> str:
    """Write the shim as an executable in `directory`; returns its path."""
    path = directory / SHIM_NAME
    path.write_text(f"#!{sys.executable} -S\n" + Path(__file__).read_text(encoding="utf-8"),
                    encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def main(argv: Sequence[str]) -> None:
    args = spawn_args(argv)
    path = os.environ.get(SOCKET_VAR)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if args is None or not path:
            raise OSError("not a spawn, or no zygote")
        sock.connect(path)
    except OSError:
        sock.close()
        os.execv(sys.executable, [sys.executable, *argv])
    child: list[int] = []
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if child:
            os.kill(child[0], signum)
        else:
            pending.append(signum)

    def started(pid: int) -> None:
        child.append(pid)
        for signum in pending:
            os.kill(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    fds = open_fds(exclude=(sock.fileno(),))
    life_r, life_w = os.pipe()
    send_request(sock, {"kind": "spawn", "argv": list(argv), "env": dict(os.environ),
                        "cwd": os.getcwd(), "pgid": os.getpgrp(), "targets": fds, **traits(),
                        **args},
                 [*fds, life_r])
    os.close(life_r)
    exit_as(read_replies(sock, started))


if __name__ == "__main__":
    main(sys.argv[1:])
