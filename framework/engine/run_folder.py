"""The run folder: one private folder per user and run on each node, `<tmp>/vsweep-<uid>-<run>/`,
that holds every temp artifact of the run there (issue #33 items 2 and 7). No Ray here: the
server actor, the zygote keeper, the stop's node tasks and the private Ray's session use it.

Why: names in a shared temp dir (/tmp, mode 1777) are predictable, so another local user can
make them first: a folder we then write into, a symlink that sends a log into another file, a
socket in our place that answers for the server. Inside a folder that only we can enter and
write, no other user can plant, swap or read anything; the checks below make sure the folder
is that one.

Contracts:
- `run_folder(session)` names this node's folder of the run; `ensure` makes it with mode 0700
  (os.mkdir, which never follows a symlink), or, when another process of the run on this node
  made it first, accepts it only if it is a real directory (lstat: not a symlink) owned by this
  process's effective uid with mode exactly 0700. Anything else is `UnsafePath`, one line
  naming the path: nothing is written there and nothing is removed.
- Inside it every name is made new: folders with os.mkdir or mkdtemp (fail if present), files
  with O_CREAT|O_EXCL|O_NOFOLLOW (`create`), sockets by bind (fails if present). Nothing is
  reused or unlinked to make room.
- The run's id is the driver's session id (SESSION_VAR, set by cluster.driver_session before
  Ray starts and passed to every actor in its runtime_env), cut to RUN_ID_CHARS hex digits so
  that AF_UNIX paths below the folder stay under 108 bytes: a private Ray's deepest socket,
  `<tmp>/vsweep-<uid>-<run>/ray/session_<date>_<pid>/sockets/plasma_store`, is
  len(<tmp>) + 80 + digits(uid) + digits(driver pid) long, so `<tmp>` may have 21 characters
  for root with pids below 100000 (/tmp has 4; the tests' /tmp/vst-XXXXXXXX 17).
- Removal (`remove`) re-checks the folder first and never follows a symlink (shutil.rmtree).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Collection
from collections.abc import Mapping
from pathlib import Path

SESSION_VAR = "VLLM_SWEEP_SESSION"
PREFIX = "vsweep-"
RUN_ID_CHARS = 10
RAY_DIR = "ray"  # a private Ray's temp dir, in the driver's node's run folder
IDLE_S = 600.0  # a run folder of a run not known alive is stale once unchanged this long


class UnsafePath(OSError):
    """A temp path that is not ours alone: its message is one line naming the path."""


def _is_run_id(text: str) -> bool:
    return len(text) == RUN_ID_CHARS and all(c in "0123456789abcdef" for c in text)


def run_id(session: str) -> str:
    """The run's id in folder names: the session id's first RUN_ID_CHARS characters. A session
    id that is not hex (it names a path) is UnsafePath."""
    short = session[:RUN_ID_CHARS]
    if not _is_run_id(short):
        raise UnsafePath(f"{SESSION_VAR}={session!r}: not a session id (hex)")
    return short


def folder_prefix(uid: int | None = None) -> str:
    """`vsweep-<uid>-`: the start of every run folder of user `uid` (default: this process's
    effective uid)."""
    return f"{PREFIX}{os.geteuid() if uid is None else uid}-"


def run_folder(session: str, base: Path | None = None) -> Path:
    """This node's run folder of `session` (not made): in `base`, by default the temp dir."""
    return Path(base or tempfile.gettempdir()) / (folder_prefix() + run_id(session))


def current_session() -> str:
    """The session id this process was started with (SESSION_VAR); UnsafePath if none."""
    session = os.environ.get(SESSION_VAR, "")
    if not session:
        raise UnsafePath(f"{SESSION_VAR} is not set: no run folder to use")
    return session


def check_parent(path: Path) -> None:
    """The folder that holds a run folder must not let another user rename or remove it: not
    writable by group or others, unless sticky (as /tmp). UnsafePath if it does."""
    st = os.stat(path.parent)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UnsafePath(f"{path.parent}: writable by other users without the sticky bit "
                         f"(mode {stat.S_IMODE(st.st_mode):o}); set TMPDIR to a private folder")


def verify(path: Path, uid: int | None = None) -> None:
    """`path` is a directory (not a symlink) owned by `uid` (default: the effective uid) with
    mode 0700; else UnsafePath naming it and what is wrong."""
    want = os.geteuid() if uid is None else uid
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UnsafePath(f"{path}: missing") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{path}: a symlink, not our run folder; refused")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path}: not a directory; refused")
    if st.st_uid != want:
        raise UnsafePath(f"{path}: owned by uid {st.st_uid}, not {want} (made by another user?); "
                         "refused")
    if stat.S_IMODE(st.st_mode) != 0o700:
        raise UnsafePath(f"{path}: mode {stat.S_IMODE(st.st_mode):o}, not 700; refused")


def ensure(path: Path, uid: int | None = None) -> Path:
    """Make the run folder `path` (mode 0700), or accept the one another process of the run made
    (`verify`); returns `path`. UnsafePath if the temp dir or the folder is not safe."""
    check_parent(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(path, 0o700)  # ours, just made, in a folder others cannot rename it in
    verify(path, uid)
    return path


def this_run(base: Path | None = None) -> Path:
    """This node's run folder of the session this process carries, made or verified."""
    return ensure(run_folder(current_session(), base))


def make_dir(path: Path) -> Path:
    """A new private folder (0700) inside a run folder; FileExistsError if the name is taken
    (never reused)."""
    os.mkdir(path, 0o700)
    return path


def new_dir(run: Path, prefix: str) -> Path:
    """A new private folder in the run folder `run` named `prefix` + random characters
    (tempfile.mkdtemp: mode 0700, a name never taken before)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=run))


def create(path: Path, flags: int = os.O_WRONLY, mode: int = 0o600) -> int:
    """A new file at `path`, opened with `flags` | O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC; returns
    its fd. A file, socket or symlink already there is UnsafePath naming it (never reused)."""
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileExistsError:
        raise UnsafePath(f"{path}: exists already (made by someone else?); refused") from None


def write_new(path: Path, text: str) -> None:
    """`create` `path` and write `text` (UTF-8)."""
    with os.fdopen(create(path), "w", encoding="utf-8") as fh:
        fh.write(text)


def remove(path: Path, keep: Collection[str] = ()) -> None:
    """Remove a run folder (`verify`ed first; missing: nothing to do) with everything in it but
    the entries named in `keep`, then the folder itself if that left it empty. Never follows a
    symlink."""
    try:
        verify(path)
    except UnsafePath:
        if not os.path.lexists(path):
            return
        raise
    for entry in os.scandir(path):
        if entry.name in keep:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            Path(entry.path).unlink(missing_ok=True)
    try:
        os.rmdir(path)
    except OSError:
        pass  # a kept entry, or something made meanwhile: its owner removes it


def stale(entries: Mapping[str, float], own: str, dead: str, live: Collection[str],
          now: float, idle_s: float = IDLE_S) -> list[str]:
    """Of a temp dir's entries (name -> mtime), this user's run folders (`folder_prefix`) to
    remove: the one of `dead` (a killed driver's run id, '' for none) whatever its age, and
    those of any other run but `own` that is not in `live` (runs known alive) and has not
    changed for idle_s: a live run of another Ray cluster that no process on the node carries
    at the moment (between two servers) makes or removes a folder in its run folder for each
    server, so a fresh mtime keeps it."""
    prefix = folder_prefix()
    found = []
    for name, mtime in sorted(entries.items()):
        run = name[len(prefix):]
        if not name.startswith(prefix) or not _is_run_id(run) or run == own:
            continue
        if run == dead or (run not in live and now - mtime >= idle_s):
            found.append(name)
    return found
