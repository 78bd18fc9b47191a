"""The run folder (framework/engine/run_folder.py, issue #33 item 2): one private folder per user
and run on each node, refused when someone else could have made or reached it, and files in it
made new, never reused. Real files in tmp_path, the way another local user would plant them
(another owner: a uid that is not ours, by chown where the test runs as root, else by asking
`verify` for another uid)."""

from __future__ import annotations

import os
import socket
import stat
import uuid
from pathlib import Path

import pytest

from framework.base.errors import TrialError
from framework.cluster import actors
from framework.engine import run_folder
from framework.engine.control import ControlServer
from framework.engine.run_folder import SESSION_VAR
from framework.engine.run_folder import UnsafePath
from framework.engine.vllm_server import redirect_output
from framework.engine.zygote import group_file
from framework.engine.zygote import record_served

SESSION = "0123456789abcdef" * 2
OTHER_UID = 4321


def _premade_other_owner(path: Path) -> int | None:
    """A folder made by another user (chown as root); else the uid `verify` must expect so
    that ours counts as another's."""
    path.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID)
        return None
    return OTHER_UID


def _premade_symlink(path: Path) -> None:
    target = path.parent / "elsewhere"
    target.mkdir(mode=0o700)
    path.symlink_to(target)


def _premade_open(path: Path) -> None:
    path.mkdir(mode=0o700)
    path.chmod(0o755)


def _premade_file(path: Path) -> None:
    path.write_text("planted")


@pytest.mark.parametrize(("plant", "says"), [
    (_premade_other_owner, "owned by uid"),
    (_premade_symlink, "a symlink"),
    (_premade_open, "mode 755, not 700"),
    (_premade_file, "not a directory"),
])
def test_a_run_folder_someone_else_could_have_made_or_reached_is_refused(tmp_path, plant, says):
    path = run_folder.run_folder(SESSION, tmp_path)
    uid = plant(path)
    with pytest.raises(UnsafePath) as refused:
        run_folder.ensure(path, uid)
    message = str(refused.value)
    assert says in message and str(path) in message and "\n" not in message
    if path.is_dir() and not path.is_symlink() and uid is None:
        assert list(path.iterdir()) == []  # nothing written into it


def test_a_new_run_folder_is_ours_mode_700_and_a_second_process_accepts_it(tmp_path):
    old = os.umask(0o002)
    try:
        path = run_folder.ensure(run_folder.run_folder(SESSION, tmp_path))
    finally:
        os.umask(old)
    st = os.lstat(path)
    assert path.name == f"vsweep-{os.geteuid()}-{SESSION[:run_folder.RUN_ID_CHARS]}"
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    assert run_folder.ensure(path) == path  # made by another process of the run: accepted


def test_a_temp_dir_others_may_rename_in_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone could rename our folder away and put theirs
    with pytest.raises(UnsafePath, match="without the sticky bit"):
        run_folder.ensure(run_folder.run_folder(SESSION, shared))
    shared.chmod(0o1777)  # as /tmp
    assert run_folder.ensure(run_folder.run_folder(SESSION, shared)).is_dir()


@pytest.mark.parametrize("session", ["", "../../etc", "0123"])
def test_a_session_id_that_is_not_one_names_no_folder(session):
    with pytest.raises(UnsafePath):
        run_folder.run_id(session)


@pytest.mark.parametrize("planted", ["file", "symlink", "dangling"])
def test_a_file_already_at_a_new_files_name_is_refused_and_left_as_it_was(tmp_path, planted):
    """A log path taken before the server starts: by a file, a symlink to another file (a
    redirected log would overwrite it), or a dangling symlink (it would create the target)."""
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    log = tmp_path / "server.log"
    if planted == "file":
        log.write_text("planted")
    else:
        log.symlink_to(victim if planted == "symlink" else tmp_path / "made-through-the-link")
    with pytest.raises(UnsafePath, match="exists already") as refused:
        redirect_output(log)
    assert str(log) in str(refused.value)
    assert victim.read_text() == "keep me"
    assert not (tmp_path / "made-through-the-link").exists()


def test_a_new_file_is_private(tmp_path):
    run_folder.write_new(tmp_path / "f", "x")
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == 0o600
    with pytest.raises(UnsafePath):
        run_folder.write_new(tmp_path / "f", "again")  # never reused


def test_a_planted_group_record_is_not_overwritten(tmp_path):
    record = group_file(tmp_path)
    record.write_text("planted")
    with pytest.raises(UnsafePath):
        record_served(record, os.getpid())
    assert record.read_text() == "planted"


def test_the_control_socket_is_never_taken_over_from_whoever_made_it(tmp_path):
    """Another socket already listening at the path (an impostor that would answer "ok"): the
    bind fails, naming the path, and the impostor's socket stays."""
    path = str(tmp_path / "ctl.sock")
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.bind(path)
    impostor.listen(1)
    try:
        with pytest.raises(OSError, match="control socket .*ctl.sock"):
            ControlServer(path, {"reset_prefix_cache": lambda: True})
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        impostor.close()


def test_a_server_gets_a_new_private_folder_in_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(SESSION_VAR, SESSION)
    monkeypatch.setattr(run_folder.tempfile, "tempdir", str(tmp_path))
    first, second = actors.server_folder(), actors.server_folder()
    run = run_folder.run_folder(SESSION, tmp_path)
    assert first.parent == second.parent == run and first != second
    assert first.name.startswith(f"s{os.getpid()}-")
    assert {stat.S_IMODE(os.stat(p).st_mode) for p in (run, first, second)} == {0o700}


def test_a_server_on_a_node_whose_run_folder_was_planted_fails_its_trial_in_one_line(
        tmp_path, monkeypatch):
    monkeypatch.setenv(SESSION_VAR, SESSION)
    monkeypatch.setattr(run_folder.tempfile, "tempdir", str(tmp_path))
    run = run_folder.run_folder(SESSION, tmp_path)
    _premade_symlink(run)
    with pytest.raises(TrialError) as failed:
        actors.server_folder()
    assert failed.value.reason == "startup_crash" and str(run) in failed.value.detail
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_removal_keeps_what_it_is_told_and_follows_no_symlink(tmp_path):
    run = run_folder.ensure(run_folder.run_folder(SESSION, tmp_path))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("x")
    (run / "link").symlink_to(outside)
    (run / "s1-abc").mkdir()
    (run / "s1-abc" / "link").symlink_to(outside)
    (run / "ray").mkdir()
    run_folder.remove(run, keep=["ray"])
    assert sorted(p.name for p in run.iterdir()) == ["ray"]
    run_folder.remove(run)
    assert not run.exists() and (outside / "precious").read_text() == "x"
    run_folder.remove(run)  # gone already: nothing to do


def test_removal_of_a_folder_that_is_not_ours_is_refused(tmp_path):
    run = run_folder.run_folder(SESSION, tmp_path)
    _premade_symlink(run)
    (tmp_path / "elsewhere" / "theirs").write_text("x")
    with pytest.raises(UnsafePath):
        run_folder.remove(run)
    assert (tmp_path / "elsewhere" / "theirs").exists()


def _name(run: str) -> str:
    return run_folder.folder_prefix() + run


OWN, DEAD, LIVE, IDLE, FRESH = ("a" * 10, "b" * 10, "c" * 10, "d" * 10, "e" * 10)
NOW = 10_000.0
OLD, RECENT = NOW - run_folder.IDLE_S, NOW - 1.0


@pytest.mark.parametrize(("entries", "expected"), [
    ({_name(OWN): OLD}, []),                              # this run's, however old
    ({_name(DEAD): RECENT}, [_name(DEAD)]),               # the killed driver's, even fresh
    ({_name(LIVE): OLD}, []),                             # known alive
    ({_name(IDLE): OLD}, [_name(IDLE)]),                  # not known alive, unchanged IDLE_S
    ({_name(FRESH): RECENT}, []),                         # not known alive, changed lately
    ({f"vsweep-{os.geteuid() + 1}-{IDLE}": OLD}, []),     # another user's name
    ({_name("ray-abcdef"): OLD, "vsweep-logs": OLD, "x": OLD}, []),  # not run folders
])
def test_stale_run_folders(entries, expected):
    assert run_folder.stale(entries, OWN, DEAD, {LIVE}, NOW) == expected


def test_a_session_id_from_uuid_names_a_short_folder():
    session = uuid.uuid4().hex
    assert run_folder.run_id(session) == session[:run_folder.RUN_ID_CHARS]


def test_a_private_rays_deepest_socket_fits_in_the_run_folder_of_the_tests_temp_dir():
    """AF_UNIX paths end at 107 bytes; Ray's session folder is `session_<date>_<pid>`
    (ray/_private/node.py), its plasma store socket the longest name in it."""
    ray_dir = run_folder.run_folder(SESSION, Path("/tmp/vst-abcdefgh")) / run_folder.RAY_DIR
    socket_path = ray_dir / "session_2026-11-27_20-02-23_123456_99999" / "sockets" / "plasma_store"
    assert len(str(socket_path).encode()) == 17 + 80 + len(str(os.geteuid())) + 5 <= 107
