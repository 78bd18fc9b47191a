"""What is left of a process group ended from inside it: every other member SIGKILLed but
multiprocessing's resource trackers (engine/zygote.py, an API server whose requester died).

Members are read from /proc, not signalled with killpg, so that the trackers are spared: a
tracker unlinks the shared memory its clients left (vLLM's /dev/shm rings) once they are gone.
"""

from __future__ import annotations

import os
import signal

from framework.engine.process_record import stat_fields


def live_group(pid: int) -> int | None:
    """The process group of `pid`; None when it is gone or a zombie. Read from
    /proc/<pid>/stat (fields 3 state and 5 pgrp, counted after the command name's last ')')."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            stat = fh.read()
        fields = stat_fields(stat)
        return None if fields[0] == "Z" else int(fields[2])
    except (OSError, ValueError, IndexError):
        return None


def members(group: int, me: int) -> list[int]:
    """Live processes (not zombies) of process group `group` but `me`."""
    pids = (int(name) for name in os.listdir("/proc") if name.isdigit())
    return [pid for pid in pids if pid != me and live_group(pid) == group]


def is_resource_tracker(pid: int) -> bool:
    """multiprocessing's resource tracker (`-c 'from multiprocessing.resource_tracker ...'`)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"multiprocessing.resource_tracker" in fh.read()
    except OSError:
        return False


def end_group() -> None:
    """SIGKILL every other process of this process's group but multiprocessing's resource
    trackers: once the processes holding a tracker's pipe are gone, it unlinks the shared
    memory they left (vLLM's /dev/shm rings) and exits. Each is pinned by a pidfd and checked
    again before the signal, so a pid reused meanwhile is left alone; repeated while a pass
    finds any (a fork may join the group meanwhile)."""
    me, group = os.getpid(), os.getpgrp()
    for _ in range(3):
        found = [pid for pid in members(group, me) if not is_resource_tracker(pid)]
        for pid in found:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if live_group(pid) == group:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(pidfd)
        if not found:
            return
