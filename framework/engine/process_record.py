"""A process as recorded (pid, start time, command line) and whether its pid still names it.

A pid read from a file, or kept from an earlier moment, may since have been given to another
process: on a shared node, any user's. Before such a pid is signalled, `still_recorded` must
hold: the process now behind the pid started at the recorded clock tick (/proc/<pid>/stat,
field 22, starttime) and runs the recorded command line. A reused pid is left alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

PROC = Path("/proc")
_STARTTIME_FIELD = 22  # proc(5): starttime, in clock ticks after boot
UNREADABLE = -1  # start_ticks of a process whose /proc entry cannot be read: never matches

State = Literal["same", "gone", "other"]


@dataclass(frozen=True)
class ProcessRecord:
    """One process as seen at one moment."""

    pid: int
    start_ticks: int
    cmdline: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps({"pid": self.pid, "start_ticks": self.start_ticks,
                           "cmdline": list(self.cmdline)})

    @staticmethod
    def from_json(text: str) -> ProcessRecord | None:
        """The record in `text`, or None if it is not one (e.g. a bare pid: unverifiable)."""
        try:
            data = json.loads(text)
            record = ProcessRecord(int(data["pid"]), int(data["start_ticks"]),
                                   tuple(str(a) for a in data["cmdline"]))
        except (ValueError, TypeError, KeyError):
            return None
        return record if record.pid > 0 else None


def stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/<pid>/stat line from field 3 (state) on. The command name (field
    2) is in parentheses and may hold spaces and ')', so fields are counted after the last
    ')'. Raises ValueError when there is none."""
    return stat[stat.rindex(")") + 1:].split()


def start_ticks(stat: str) -> int:
    """Field 22 (starttime) of a /proc/<pid>/stat line."""
    return int(stat_fields(stat)[_STARTTIME_FIELD - 3])


def read_record(pid: int, proc: Path = PROC) -> ProcessRecord | None:
    """The process `pid` now; None if there is none. One whose entry cannot be read (another
    user's, under hidepid) gets start_ticks UNREADABLE, so it never matches a record."""
    entry = proc / str(pid)
    try:
        ticks = start_ticks(entry.joinpath("stat").read_text(encoding="utf-8", errors="replace"))
        raw = entry.joinpath("cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except (OSError, ValueError, IndexError):
        return ProcessRecord(pid, UNREADABLE, ())
    args = raw.decode("utf-8", errors="surrogateescape").split("\0")
    return ProcessRecord(pid, ticks, tuple(args[:-1] if args and args[-1] == "" else args))


def state(recorded: ProcessRecord, now: ProcessRecord | None) -> State:
    """What `recorded`'s pid names `now` (its `read_record`): "same" (start time and command
    line match: it may be signalled), "gone" (no process, or the recorded one exiting: a
    zombie's command line reads empty), "other" (the pid was given to another process, or it
    cannot be read: leave it alone)."""
    if now is None:
        return "gone"
    if now.start_ticks != recorded.start_ticks or recorded.start_ticks == UNREADABLE:
        return "other"
    if now.cmdline == recorded.cmdline:
        return "same"
    return "gone" if not now.cmdline else "other"


def still_recorded(recorded: ProcessRecord, proc: Path = PROC) -> bool:
    """True only if `recorded`'s pid names the recorded process now (`state` "same")."""
    return state(recorded, read_record(recorded.pid, proc)) == "same"
