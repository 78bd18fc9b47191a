"""One driver per sweep, and nothing left behind by a driver that died.

Every process a run starts (its private Ray, the server actors, vLLM and its children) carries
`VLLM_SWEEP_SESSION=<id>` in its environment: the driver sets it before starting Ray and passes
it to the servers. `results/<sweep>/driver.json` records the running driver (pid, start time,
session id). The next run of the same sweep refuses to start while that driver lives, and, if
it died (kill -9), ends the processes that still carry its session id before starting anew.
Processes are found by that id, never by name, so no other user's Ray or vLLM is touched.

Two runs started at the same instant cannot both get in: a driver holds an exclusive POSIX
record lock (`fcntl.lockf`) on `results/<sweep>/driver.lock` for its whole run, taken before
driver.json is read and written. The kernel releases it when the driver dies (kill -9
included); a child the driver forked does not hold it; the lock file itself stays. Record
locks do not exclude each other within one process, so this process's own sessions are
tracked apart.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import psutil

from framework.base.errors import ClusterError
from framework.engine.run_folder import SESSION_VAR  # the run folders' run id too

LOCK_WAIT_S = 30.0

_held: set[Path] = set()  # lock files this process holds
_held_guard = threading.Lock()


def session_processes(session_id: str) -> list[psutil.Process]:
    """Live processes carrying this session id (the caller's own process excluded)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        try:
            if proc.pid != me and proc.environ().get(SESSION_VAR) == session_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def reap_session(session_id: str, grace_s: float = 10.0) -> int:
    """Wait up to grace_s for the session's processes to exit, then SIGKILL the rest; returns
    how many had to be killed."""
    if not session_id:
        return 0
    deadline = time.monotonic() + grace_s
    while (left := session_processes(session_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=10)
    return len(left)


def _read_state(state_file: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _alive(state: dict[str, Any]) -> bool:
    """True if the process recorded in `state` is still the one recorded (pid and start time)."""
    try:
        return psutil.Process(state["pid"]).create_time() == state["create_time"]
    except (psutil.NoSuchProcess, KeyError, TypeError, ValueError):
        return False


def _live_driver(state_file: Path) -> dict[str, Any] | None:
    """driver.json's record if the driver it names is alive, else None."""
    state = _read_state(state_file)
    return state if state is not None and _alive(state) else None


@dataclass
class DriverSession:
    """Context manager around one `run`: locks results/<sweep>/driver.lock for the whole run,
    claims driver.json, cleans up after a dead predecessor, exports the session id, and on
    exit reaps this session's processes. Entering raises ClusterError while another driver of
    the sweep runs (or is starting), also when both start at the same instant."""

    state_file: Path
    session_id: str = ""
    reaped_stale: int = 0
    stale_session: str = ""  # the dead predecessor's session id ('' if none): its run folders
    lock_wait_s: float = LOCK_WAIT_S
    _lock_fd: int | None = field(default=None, init=False, repr=False)

    @property
    def lock_file(self) -> Path:
        return self.state_file.with_suffix(".lock")

    def __enter__(self) -> DriverSession:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._lock()
        try:
            self._take_over()
            self.session_id = uuid.uuid4().hex
            me = psutil.Process()
            tmp = self.state_file.with_name(f".{self.state_file.name}.tmp")
            tmp.write_text(json.dumps({"pid": me.pid, "create_time": me.create_time(),
                                       "session": self.session_id}))
            os.replace(tmp, self.state_file)
        except BaseException:
            self._unlock()
            raise
        os.environ[SESSION_VAR] = self.session_id
        return self

    def _busy(self, state: dict[str, Any] | None) -> ClusterError:
        """The refusal: names the live driver's pid, else the held lock file."""
        if state is not None:
            return ClusterError(f"{self.state_file.parent.name}: another driver (pid "
                                f"{state['pid']}) is running this sweep; see {self.state_file}")
        return ClusterError(f"{self.state_file.parent.name}: another driver is starting or "
                            f"running this sweep (it holds {self.lock_file})")

    def _lock(self) -> int:
        """The lock file's descriptor, exclusively locked. While another process holds it:
        ClusterError at once if driver.json names a live driver, else (a driver between
        taking the lock and writing driver.json) retry for up to lock_wait_s. A session of
        this process on the same sweep is ClusterError at once."""
        path = self.lock_file.resolve()
        with _held_guard:
            if path in _held:
                raise self._busy(_live_driver(self.state_file))
            _held.add(path)
        try:
            return self._lock_file_of_process()
        except BaseException:
            with _held_guard:
                _held.discard(path)
            raise

    def _lock_file_of_process(self) -> int:
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.lock_wait_s
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    os.close(fd)
                    raise
            live = _live_driver(self.state_file)
            if live is not None or time.monotonic() >= deadline:
                os.close(fd)
                raise self._busy(live)
            time.sleep(0.05)

    def _unlock(self) -> None:
        if self._lock_fd is None:
            return
        fcntl.lockf(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)
        self._lock_fd = None
        with _held_guard:
            _held.discard(self.lock_file.resolve())

    def _take_over(self) -> None:
        """With the lock held: a driver.json of a live driver (one that predates the lock)
        is ClusterError; one of a dead driver is replaced once its session's processes are
        reaped."""
        if (live := _live_driver(self.state_file)) is not None:
            raise self._busy(live)
        state = _read_state(self.state_file)
        if state is not None:
            self.stale_session = str(state.get("session", ""))
            self.reaped_stale = reap_session(self.stale_session, grace_s=0)

    def __exit__(self, *exc: object) -> None:
        try:
            reap_session(self.session_id)
            os.environ.pop(SESSION_VAR, None)
            self.state_file.unlink(missing_ok=True)
        finally:
            self._unlock()
