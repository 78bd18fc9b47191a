"""A second local user on the node of a live sweep (issue #33's acceptance): a process of
another uid, started by the test (CI runs as root; uid 65534, `nobody`, needs no account to be
made), tries what #33 found against the sweep's shared temp dir (mode 1777, as /tmp):

1. a logging config that runs code (`"()": "os.system"`), at the name older versions read
   (`vsweep-logging-<uid>-<sha256 of their config>.json`, computed as they computed it);
2. the shared names older versions wrote into: `vsweep-logs/` made first, mode 0777, its log
   names symlinked to a file of the attacker's, a `vsweep-rpc-*` folder and a control socket;
3. a stale served-group record there naming the attacker's own process group (a `setsid
   sleep`), which a stop trusting it would SIGTERM;
then, once the run's folder appears, every way into it: list, create, rename, remove, chmod.
It writes what happened to `report.json` in its own folder and exits. `Attacker.result()`
waits for that report (the event), and kills the sleeper by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534

ATTACK = r'''
import hashlib, json, os, socket, subprocess, sys, time
from pathlib import Path

shared, mine, victim, deadline_s = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
report = {"uid": os.getuid()}

# 1. the logging config older versions read, named as they named it (vllm_server.py before 84950ce)
fmt = ("(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s.%(msecs)03d "
       "[%(fileinfo)s:%(lineno)d] %(message)s")
quiet = {"handlers": ["vllm"], "level": "INFO", "propagate": False}
theirs = {"version": 1, "disable_existing_loggers": False,
          "formatters": {"vllm": {"()": "vllm.logging_utils.NewLineFormatter",
                                  "datefmt": "%Y-%m-%d %H:%M:%S", "format": fmt}},
          "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm",
                                "level": "INFO", "stream": "ext://sys.stdout"}},
          "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False},
                      "uvicorn": quiet, "uvicorn.access": quiet}}
digest = hashlib.sha256(json.dumps(theirs, sort_keys=True).encode()).hexdigest()[:16]
ran = mine / "code-ran"
evil = {"version": 1, "handlers": {"h": {"()": "os.system", "command": f"touch {ran}"}},
        "root": {"handlers": ["h"]}}
planted = shared / f"vsweep-logging-{victim}-{digest}.json"
planted.write_text(json.dumps(evil))
os.chmod(planted, 0o644)

# 2. the shared names older versions wrote into
stolen = mine / "stolen"
stolen.touch()
logs = shared / "vsweep-logs"
logs.mkdir()
os.chmod(logs, 0o777)
for n in range(4):
    os.symlink(stolen, logs / f"server-{n}.log")
(shared / "vsweep-rpc-1").mkdir(mode=0o777)
sock = socket.socket(socket.AF_UNIX)
sock.bind(str(shared / "vsweep-ctl-1.sock"))

# 3. a stale served-group record naming the attacker's own process group
sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # not our pipe
(logs / "served-group").write_text(json.dumps({"pid": sleeper.pid}))
report["sleeper"] = sleeper.pid
report["planted"] = sorted(p.name for p in shared.iterdir())

# then the run's own folder, once it appears: every way in
deadline = time.monotonic() + deadline_s
runs = []
while not runs and time.monotonic() < deadline:
    runs = [p for p in shared.glob(f"vsweep-{victim}-*") if p.is_dir() and not p.is_symlink()]
    time.sleep(0.05)
attempts = {}
if runs:
    run = runs[0]
    report["run_folder"] = run.name
    def attempt(name, act):
        try:
            act()
            attempts[name] = "done"
        except OSError as exc:
            attempts[name] = type(exc).__name__
    attempt("list", lambda: os.listdir(run))
    attempt("create", lambda: (run / "planted").write_text("x"))
    attempt("rename", lambda: os.rename(run, shared / "moved"))
    attempt("remove", lambda: os.rmdir(run))
    attempt("chmod", lambda: os.chmod(run, 0o777))
report["attempts"] = attempts
(mine / "report.json").write_text(json.dumps(report))
'''


@dataclass(frozen=True)
class Report:
    """What the second user planted and tried, and what came of it."""

    attempts: dict[str, str]  # way into the run folder -> "done" or the OSError's name
    run_folder: str | None
    code_ran: bool  # the planted logging config ran its command
    stolen: str  # what reached the attacker's file through the symlinked log names
    sleeper_alive: bool  # the attacker's process group, named by the stale record
    planted: list[str]


class Attacker:
    """The second user's process (module docstring), started before the sweep."""

    def __init__(self, shared: Path, mine: Path, victim_uid: int, deadline_s: float = 600) -> None:
        """`shared`: the sweep's temp dir, made mode 1777 here; `mine`: a new folder for the
        attacker's own files, made its alone (0700). Both in a test folder that others may
        pass through (0711) but not list."""
        self.shared, self.mine = shared, mine
        os.chmod(shared.parent, 0o711)
        os.chmod(shared, 0o1777)
        mine.mkdir(mode=0o700)
        os.chown(mine, NOBODY, NOBODY)
        python = python_for_others()
        if python is None:
            raise OSError("no Python interpreter that another user may run")
        self.proc = subprocess.Popen(
            [python, "-c", ATTACK, str(shared), str(self.mine), str(victim_uid),
             str(deadline_s)],
            user=NOBODY, group=NOBODY, extra_groups=[], cwd=self.mine,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.mine)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.sleeper: int | None = None

    def result(self, timeout_s: float = 600) -> Report:
        """Wait for the attacker to finish (its report), then read what came of it."""
        out, _ = self.proc.communicate(timeout=timeout_s)
        assert self.proc.returncode == 0, out
        raw = json.loads((self.mine / "report.json").read_text())
        assert raw["uid"] == NOBODY, raw
        self.sleeper = raw["sleeper"]
        return Report(raw["attempts"], raw.get("run_folder"), (self.mine / "code-ran").exists(),
                      (self.mine / "stolen").read_text(), _alive(raw["sleeper"]), raw["planted"])

    def stop(self) -> None:
        """The attacker's processes ended by PID (its sleeper's group), whatever happened."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if self.sleeper is not None and _alive(self.sleeper):
            os.killpg(self.sleeper, signal.SIGKILL)

    def remove_plants(self) -> None:
        """What the attacker made in the shared temp dir (owned by NOBODY), so that a later
        leftover check sees the sweep's own files only."""
        for path in self.shared.iterdir():
            if path.lstat().st_uid == NOBODY:
                subprocess.run(["rm", "-rf", "--", str(path)], check=True)


def python_for_others() -> str | None:
    """A Python interpreter that uid NOBODY can run (the project's venv may live where only
    its owner can enter), tried as that user; None if there is none. The attack needs only
    the standard library."""
    for candidate in dict.fromkeys((sys.executable, "/usr/bin/python3", "/usr/local/bin/python3")):
        try:
            done = subprocess.run([candidate, "-c", "pass"], user=NOBODY, group=NOBODY,
                                  extra_groups=[], cwd="/", capture_output=True, timeout=60)
        except OSError:
            continue
        if done.returncode == 0:
            return candidate
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
