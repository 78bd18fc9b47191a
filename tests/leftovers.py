"""What a run left behind that it should not: vllm-sweep's and vLLM's files in its temp dir
(vsweep_leftovers, vllm_leftovers), and what its own processes left in /dev/shm when other
tests (another pytest-xdist lane, another user's run) share it (ShmWatch).

/dev/shm is one folder for the whole machine: a vLLM server of another lane creates and removes
its shm_broadcast rings (`psm_*`) and multiprocessing semaphores (`sem.mp-*`) while a sweep of
this lane runs, and a test of another lane that kills a server leaves its entries behind, so
comparing all of /dev/shm before and after a run blames this run for them. Nor does "new and
mapped by no live process" single out this run: beside other test sessions, a run of
test_sweep_e2e saw two new `sem.mp-*` that no process mapped, made within seconds of the rings
of another session's live server (kept by name for it, or left by a killed one). What a
run leaked is narrower: an entry that one of the run's own processes (by the test's marker)
mapped or held open while the run went on (ShmWatch, sampling /proc/<pid>/maps and
/proc/<pid>/fd) and that is still there, used by no live process, once they are gone.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

from tests.procs import MARKER_VAR

SHM = Path("/dev/shm")
PREFIXES = ("psm_", "sem.mp-")
PROC = Path("/proc")


def shm_entries() -> set[str]:
    """Our user's Python multiprocessing shared memory and semaphores in /dev/shm (`psm_*`,
    `sem.mp-*`): vLLM's shm_broadcast rings among them."""
    uid = os.getuid()
    names = set()
    for path in SHM.glob("*"):
        if not path.name.startswith(PREFIXES):
            continue
        try:
            if path.lstat().st_uid == uid:
                names.add(path.name)
        except FileNotFoundError:  # removed since the listing
            continue
    return names


def _shm_name(target: str) -> str | None:
    """The /dev/shm entry a mapping's path or an fd's link names, if it names one."""
    prefix = f"{SHM}/"
    if not target.startswith(prefix):
        return None
    return target[len(prefix):].removesuffix(" (deleted)")


def _maps_of(pid_dir: Path) -> set[str]:
    try:
        text = (pid_dir / "maps").read_text()
    except OSError:  # gone, or not ours to read
        return set()
    names = set()
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and (name := _shm_name(fields[5])):
            names.add(name)
    return names


def _open_by(pid_dir: Path) -> set[str]:
    try:
        fds = list((pid_dir / "fd").iterdir())
    except OSError:
        return set()
    names = set()
    for fd in fds:
        try:
            name = _shm_name(os.readlink(fd))
        except OSError:
            continue
        if name:
            names.add(name)
    return names


def in_use_shm() -> set[str]:
    """The /dev/shm entries some live process maps or holds open (by /proc)."""
    used: set[str] = set()
    for pid_dir in PROC.iterdir():
        if pid_dir.name.isdigit():
            used |= _maps_of(pid_dir) | _open_by(pid_dir)
    return used


def marked_pids(marker: str) -> list[int]:
    """The pids whose environment carries MARKER_VAR=`marker` (tests.procs.marked_processes,
    read from /proc directly: it is polled)."""
    tag = f"{MARKER_VAR}={marker}".encode()
    found = []
    for pid_dir in PROC.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            env = (pid_dir / "environ").read_bytes()
        except OSError:
            continue
        if tag in env.split(b"\0"):
            found.append(int(pid_dir.name))
    return found


class ShmWatch:
    """While the block runs, every `period_s`: the /dev/shm entries (`shm_entries`' kinds) that
    the processes carrying `marker` map or hold open: the rings and semaphores of the test's
    own servers (a server maps its rings for its whole life). `leaked()` afterwards: those of
    them still in /dev/shm that no live process uses."""

    def __init__(self, marker: str, period_s: float = 1.0) -> None:
        self.marker = marker
        self.period_s = period_s
        self.used: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="shm-watch", daemon=True)

    def sample(self) -> None:
        for pid in marked_pids(self.marker):
            pid_dir = PROC / str(pid)
            self.used |= {n for n in _maps_of(pid_dir) | _open_by(pid_dir)
                          if n.startswith(PREFIXES)}

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.period_s)

    def __enter__(self) -> ShmWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def leaked(self, timeout_s: float = 20.0) -> set[str]:
        """What the marked processes used and left: still in /dev/shm, used by no live
        process. Call it once they are gone; a leak stays, so only a failing check polls for
        `timeout_s` (an entry whose last user just exited may be unlinked a moment later)."""
        deadline = time.monotonic() + timeout_s
        while True:
            present = self.used & shm_entries()
            leaked = present - in_use_shm() if present else set()
            if not leaked or time.monotonic() > deadline:
                return leaked
            time.sleep(0.5)


def vsweep_leftovers(tmp: Path) -> list[str]:
    """What vllm-sweep's processes left in the temp dir `tmp` (cli_env's TMPDIR) after a run:
    every `vsweep-*` entry (a run folder, `vsweep-<uid>-<run>`, framework/engine/run_folder.py,
    or a name of older versions) and what a run folder holds, relative to `tmp`."""
    return sorted(p.relative_to(tmp).as_posix()
                  for p in [*tmp.glob("vsweep-*"), *tmp.glob("vsweep-*/*")])


VLLM_IPC_FILE = re.compile(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}|vllm_dist_[0-9a-f]{32}")


# torch inductor's default cache (`<temp dir>/torchinductor_<user>`) and what gcc leaves of a
# compile it did not finish (cc*.o, cc*.s): a server's TMPDIR is its private folder
# (cluster.actors.private_tmp) and inductor's cache the node's cache dir (use_cache_dir)
COMPILER_FILE = re.compile(r"torchinductor_.*|cc\w{6}\.(o|s|res|c|i|ii)")


def vllm_leftovers(tmp: Path) -> list[str]:
    """What vLLM's processes left in the temp dir `tmp`: ZeroMQ `ipc://` sockets (uuid4 names,
    vllm/utils/network_utils.py get_open_zmq_ipc_path), FileStore files (`vllm_dist_<hex>`,
    get_file_store_init_method), torch inductor's cache and compilers' files (COMPILER_FILE);
    a server's own folder of them is one of `vsweep_leftovers`."""
    return sorted(p.name for p in tmp.glob("*")
                  if VLLM_IPC_FILE.fullmatch(p.name) or COMPILER_FILE.fullmatch(p.name))
