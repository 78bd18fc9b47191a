"""A server's control channel: a Unix socket in the server's folder inside the run folder
(engine.run_folder: 0700, ours alone), owned by the server process, mode 0600. No Ray, no
network.

vLLM's own `POST /reset_prefix_cache` is a dev route: it exists only with
VLLM_SERVER_DEV_MODE=1, which also opens `/collective_rpc`, `/sleep` and `/server_info`
(vllm/entrypoints/serve/dev/), and vLLM's API-key check covers only `/v1`-style paths, so anyone
on the network could drive the workers. The server process hosts the engine itself, so it
resets the cache in-process instead: `ControlServer` answers one-line commands on the socket by
calling a handler, and the driver reaches the socket through a Ray task on the server's node
(`cluster`). Only processes of the same user on the same node can connect. The socket is bound
where nothing is: a name already taken (a socket or a symlink planted by someone else, an old
server's) fails the bind, and is never unlinked to make room (issue #33 item 2).

Protocol: the client sends `<command>\\n`; the server answers `ok\\n`, `no\\n` (the handler
returned False, e.g. vLLM refused the reset while blocks were held) or `error <text>\\n`.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path

SOCKET_VAR = "VLLM_SWEEP_CONTROL_SOCKET"


def socket_path(folder: Path) -> str:
    """Where the server whose private folder is `folder` listens (short: AF_UNIX paths end at
    107 bytes)."""
    return str(folder / "ctl.sock")


class ControlServer:
    """Answers commands on `path` in a daemon thread; `handlers` map a command to a callable
    returning True (done) or False (refused, retry later). OSError (EADDRINUSE) if something
    is at `path` already."""

    def __init__(self, path: str, handlers: Mapping[str, Callable[[], bool]]) -> None:
        self.path, self.handlers = path, dict(handlers)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self._sock.bind(path)
        except OSError as exc:
            self._sock.close()
            raise OSError(exc.errno, f"control socket {path}: {exc.strerror}; refused (never "
                                     "reused)") from None
        finally:
            os.umask(old)
        self._sock.listen(4)
        threading.Thread(target=self._loop, name="vllm-sweep-control", daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                command = conn.makefile("r").readline().strip()
                conn.sendall(self._answer(command).encode())

    def _answer(self, command: str) -> str:
        handler = self.handlers.get(command)
        if handler is None:
            return f"error unknown command {command!r}\n"
        try:
            return "ok\n" if handler() else "no\n"
        except Exception as exc:  # noqa: BLE001 - reported to the caller as data
            return f"error {type(exc).__name__}: {exc}".replace("\n", " ")[:500] + "\n"

    def close(self) -> None:
        self._sock.close()
        Path(self.path).unlink(missing_ok=True)


def send(path: str, command: str, timeout_s: float = 60.0) -> str:
    """One command to the server at `path`; its answer line ('' if it cannot be reached)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.sendall(f"{command}\n".encode())
            return sock.makefile("r").readline().strip()
    except OSError as exc:
        return f"error {exc}"


def serve_from_env(handlers: Mapping[str, Callable[[], bool]]) -> ControlServer | None:
    """Start the control server at $VLLM_SWEEP_CONTROL_SOCKET, if the launcher set it."""
    path = os.environ.get(SOCKET_VAR)
    return ControlServer(path, handlers) if path else None
