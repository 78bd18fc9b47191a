"""What the next run removes on a node (cluster.run_cleanup.clean_node, issue #33 item 7): the
killed driver's run folder and processes, and this user's other run folders whose run is not
known alive and has been idle; never this run's, a live one's, one a live process carries, or a
folder that is not ours. Real folders and processes; no Ray is started."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from framework.cluster import run_cleanup
from framework.engine import run_folder
from framework.engine.run_folder import SESSION_VAR

SLEEPER = "import sys; print('up', flush=True); sys.stdin.read()"


def _sleeper(session: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env={**os.environ, SESSION_VAR: session})
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def _folder(base: Path, session: str, idle: bool) -> Path:
    path = run_folder.ensure(run_folder.run_folder(session, base))
    server = run_folder.new_dir(path, "s1-")
    run_folder.write_new(server / "server.log", "a log")
    if idle:
        then = time.time() - run_folder.IDLE_S - 60
        os.utime(path, (then, then))
    return path


@pytest.fixture
def node(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_next_run_removes_what_dead_runs_left_and_nothing_else(node):
    own, dead, live, carried, idle, fresh = (uuid.uuid4().hex for _ in range(6))
    folders = {name: _folder(node, session, idle=name not in ("dead", "fresh"))
               for name, session in (("own", own), ("dead", dead), ("live", live),
                                     ("carried", carried), ("idle", idle), ("fresh", fresh))}
    theirs = run_folder.run_folder(uuid.uuid4().hex, node)  # our name, another owner's folder
    theirs.mkdir(mode=0o700)
    (theirs / "their-file").write_text("x")
    if os.geteuid() == 0:
        os.chown(theirs, 4321, 4321)
    else:
        theirs.chmod(0o755)  # not ours to remove either way: verify refuses it
    then = time.time() - run_folder.IDLE_S - 60
    os.utime(theirs, (then, then))
    left_by_dead, holder = _sleeper(dead), _sleeper(carried)
    try:
        removed = run_cleanup.clean_node(own, dead, [run_folder.run_id(live)])
        assert left_by_dead.wait(timeout=15) is not None  # the dead driver's process: ended
        assert holder.poll() is None  # another run's process: untouched
    finally:
        for proc in (left_by_dead, holder):
            proc.kill()
            proc.communicate()
    assert sorted(removed) == sorted(folders[n].name for n in ("dead", "idle"))
    assert {n for n, p in folders.items() if p.exists()} == {"own", "live", "carried", "fresh"}
    assert (theirs / "their-file").exists()


def test_a_run_removes_its_folder_but_a_private_rays(node):
    session = uuid.uuid4().hex
    run = _folder(node, session, idle=False)
    (run / run_folder.RAY_DIR).mkdir()
    run_cleanup.remove_run(session, [run_folder.RAY_DIR])
    assert [p.name for p in run.iterdir()] == [run_folder.RAY_DIR]
    run_cleanup.remove_run(session)
    assert not run.exists()
