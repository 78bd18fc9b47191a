"""A committed result file survives a power loss (#33 item 11): its temp file is fsynced, whole,
before the rename onto the final name, and the directory after it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from framework.results.rows import REQUEST_COLUMNS
from framework.results.store import ResultStore

TRIAL_COLUMNS = [("trial_number", "int"), ("state", "str")]


def _trial(store: ResultStore) -> Path:
    return store.write_trial({"trial_number": 3, "state": "COMPLETE"}, TRIAL_COLUMNS)


def _requests(store: ResultStore) -> Path:
    return store.write_requests(3, [], REQUEST_COLUMNS)


def _origin(store: ResultStore) -> Path:
    store.write_origin(Path("sweep.yaml"))
    return store.sweep_dir / "origin.json"


Event = tuple[str, ...]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    """os.fsync and os.replace, recorded in order: ("fsync", path, size), ("replace", src,
    dst)."""
    seen: list[Event] = []
    fsync, replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), str(os.fstat(fd).st_size)))
        fsync(fd)

    def spy_replace(src: str | Path, dst: str | Path) -> None:
        seen.append(("replace", str(src), str(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    return seen


@pytest.mark.parametrize("write", [_trial, _requests, _origin])
def test_the_temp_file_is_fsynced_whole_before_the_rename_and_the_directory_after(
        tmp_path: Path, events: list[Event], write: Callable[[ResultStore], Path]) -> None:
    store = ResultStore(tmp_path, "s")
    final = write(store)
    replaced = [e for e in events if e[0] == "replace"]
    assert len(replaced) == 1 and replaced[0][2] == str(final)
    tmp = replaced[0][1]
    size = str(final.stat().st_size)
    assert events == [("fsync", tmp, size), replaced[0],
                      ("fsync", str(final.parent), str(final.parent.stat().st_size))]
    assert int(size) > 0


def test_a_directory_that_cannot_be_fsynced_still_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fsync = os.fsync

    def files_only(fd: int) -> None:  # some filesystems refuse a directory's fsync (EINVAL)
        if Path(os.readlink(f"/proc/self/fd/{fd}")).is_dir():
            raise OSError(22, "Invalid argument")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", files_only)
    final = _trial(ResultStore(tmp_path, "s"))
    assert final.is_file() and final.stat().st_size > 0
    assert [p.name for p in final.parent.iterdir()] == [final.name]  # no temp left behind
