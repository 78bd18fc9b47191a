"""One contract for every results location (issue #35): a local folder and an S3 bucket on a real
S3 API server (moto's server mode on 127.0.0.1, tests/storage_servers.py), reached through
pyarrow's S3 filesystem like a user's bucket. What is written reads back, through the store and
through DuckDB over the location itself; rewriting replaces; a new opening of the location (a
driver on another machine) finds everything; the journal reaches the bucket before the rows
that depend on it; an unreachable store is one line naming the URI, and nothing is lost."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest

from framework.base.errors import StoreError
from framework.config.search_space import load_search_space
from framework.results import compaction
from framework.results.object_store import STAGING_PREFIX
from framework.results.rows import REQUEST_COLUMNS
from framework.results.rows import trial_columns
from framework.results.store import ResultStore
from framework.results.store import open_store
from tests.paths import ROOT as REPO
from tests.storage_servers import BUCKET
from tests.storage_servers import S3
from tests.storage_servers import s3_server
from tests.unit.results.test_store import make_row

SWEEP = "demo-sweep"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with s3_server() as server:
        yield server


@pytest.fixture(scope="module")
def columns():
    return trial_columns(load_search_space(REPO / "search_spaces" / "tiny_cpu.yaml"), (50, 99))


@pytest.fixture(params=["local", "s3"])
def location(request, tmp_path, monkeypatch) -> Path | str:
    """A results_dir: a local folder, or a new prefix of the S3 server's bucket."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # staging folders: this test's own
    if request.param == "local":
        return tmp_path / "results"
    s3: S3 = request.getfixturevalue("s3")
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/results"


def dataset_rows(location: Path | str, s3: S3 | None, table: str) -> list[tuple]:
    """(trial_number, sweep) of every row of `table`, read from the location itself (pyarrow's
    dataset over the folder or the bucket, hive partitions, then DuckDB)."""
    if isinstance(location, Path):
        source, fs = str(location / SWEEP / table), None
    else:
        assert s3 is not None
        source, fs = location.removeprefix("s3://") + f"/{SWEEP}/{table}", s3.filesystem()
    data = ds.dataset(source, filesystem=fs, format="parquet", partitioning="hive")  # noqa: F841
    return duckdb.sql("SELECT trial_number, sweep FROM data ORDER BY trial_number").fetchall()


def test_rows_read_back_from_the_location_and_a_rewrite_replaces(location, columns, request):
    store = open_store(location, SWEEP)
    store.write_trial(make_row(columns, 0), columns)
    store.write_trial(make_row(columns, 1, objective=5.0), columns)
    store.write_trial(make_row(columns, 1, objective=7.0), columns)  # trial 1 written again
    s3 = request.getfixturevalue("s3") if isinstance(location, str) else None
    assert dataset_rows(location, s3, "trials") == [(0, SWEEP), (1, SWEEP)]
    again = open_store(location, SWEEP)  # a new driver, a new staging copy for a bucket
    trials = again.read_trials()
    assert list(trials["trial_number"]) == [0, 1]
    assert list(trials["objective"]) == [100.0, 7.0]


def test_a_new_opening_finds_every_file(location, columns, tmp_path):
    store = open_store(location, SWEEP)
    store.write_origin(tmp_path / "sweep.yaml")
    store.journal_path.parent.mkdir(parents=True, exist_ok=True)
    store.journal_path.write_bytes(b'{"op_code": 0}\n')
    store.write_requests(3, [], REQUEST_COLUMNS)
    store.write_trial(make_row(columns, 3), columns)
    store.log_path(3).parent.mkdir(parents=True, exist_ok=True)
    store.log_path(3).write_text("server log\n")
    store.publish(store.log_path(3))

    again = open_store(location, SWEEP, full=True)
    assert again.trial_numbers() == {3}
    assert again.journal_path.read_bytes() == b'{"op_code": 0}\n'
    assert again.log_path(3).read_text() == "server log\n"
    assert again.requests_path(3).is_file()
    assert (again.sweep_dir / "origin.json").is_file()
    if isinstance(location, str):  # the bucket's copy, not the first driver's folder
        assert again.root != store.root and again.root.name.startswith(STAGING_PREFIX)
        assert again.where(again.log_path(3)) == f"{location}/{SWEEP}/logs/trial-00003.log"
        assert again.location == f"{location}/{SWEEP}"
        # what every command but `compact` opens: no request rows or logs, which none reads
        light = open_store(location, SWEEP)
        assert light.trial_numbers() == {3} and light.journal_path.is_file()
        assert not light.requests_path(3).exists() and not light.log_path(3).exists()
    else:
        assert again.where(again.log_path(3)) == str(store.log_path(3))


def test_the_journal_reaches_the_bucket_before_the_rows_that_need_it(s3, columns, tmp_path,
                                                                    monkeypatch):
    """The runner stores a trial's evaluation in the journal, then writes its rows: a driver
    killed between two uploads must leave the bucket no row whose evaluation it lacks."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    location = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"
    store = open_store(location, SWEEP)
    fs, journal_key = s3.filesystem(), location.removeprefix("s3://") + f"/{SWEEP}/optuna.journal"
    store.journal_path.parent.mkdir(parents=True, exist_ok=True)
    store.journal_path.write_bytes(b"remembered\n")
    sizes = []
    real_upload = store.mirror._upload

    def upload(path: Path, rel: str, whole_lines: bool = False) -> None:  # the journal's size
        info = fs.get_file_info(journal_key)  # in the bucket at each upload
        sizes.append((rel, info.size if info.type == pafs.FileType.File else None))
        real_upload(path, rel, whole_lines)

    monkeypatch.setattr(store.mirror, "_upload", upload)
    store.write_trial(make_row(columns, 0), columns)
    assert sizes == [("optuna.journal", None), ("trials/sweep=demo-sweep/trial-00000.parquet", 11)]
    store.publish_journal()  # unchanged: not sent again
    assert len(sizes) == 2
    store.journal_path.write_bytes(b"remembered\ntold\n")
    store.publish_journal()
    assert sizes[2:] == [("optuna.journal", 11)]
    assert fs.open_input_stream(journal_key).read() == b"remembered\ntold\n"
    # a record half appended when the journal is read: the bucket gets the whole lines only
    store.journal_path.write_bytes(b"remembered\ntold\n{\"op_code\": 5, \"tri")
    store.publish_journal()
    assert fs.open_input_stream(journal_key).read() == b"remembered\ntold\n"


def test_an_unreachable_store_is_one_line_naming_it_and_leaves_no_staging(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard: nothing listens
    for key, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"
                       }.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(StoreError) as err:
        open_store("s3://nowhere/prefix", SWEEP)
    assert str(err.value).startswith(f"s3://nowhere/prefix/{SWEEP}: ") and "\n" not in str(err.value)
    assert list(tmp_path.glob(STAGING_PREFIX + "*")) == []


def test_a_failed_upload_keeps_the_staging_folder_and_says_where(s3, columns, tmp_path,
                                                                 monkeypatch):
    """A bucket that is gone mid-run: the write's error names the object and the folder that
    now holds the only copy, and that folder is not removed at exit."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    store = open_store("s3://no-such-bucket/p", SWEEP)
    with pytest.raises(StoreError) as err:
        store.write_trial(make_row(columns, 0), columns)
    text = str(err.value)
    assert text.startswith(f"s3://no-such-bucket/p/{SWEEP}/trials/sweep={SWEEP}/trial-00000.parquet")
    assert f"kept in {store.sweep_dir}" in text and "\n" not in text
    store.mirror.cleanup()  # what the exit runs
    assert store.trial_path(0).is_file()


def test_the_doctor_probe_writes_reads_and_deletes_one_object(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    store = open_store(f"s3://{BUCKET}/doctor", SWEEP)
    assert store.mirror.write_probe() is None
    listed = s3.filesystem().get_file_info(pafs.FileSelector(f"{BUCKET}/doctor", recursive=True,
                                                             allow_not_found=True))
    assert [i.path for i in listed if i.type == pafs.FileType.File] == []
    missing = open_store("s3://no-such-bucket/p", SWEEP).mirror
    assert "no-such-bucket" in (missing.write_probe() or "")


def test_a_local_store_has_no_mirror_and_publishing_is_nothing(tmp_path):
    store = open_store(tmp_path, SWEEP)
    assert store == ResultStore(tmp_path, SWEEP) and store.mirror is None
    store.publish(tmp_path / "missing")  # nothing to send, nothing raised
    assert store.location == str((tmp_path / SWEEP).resolve())


def test_compaction_in_a_bucket_and_one_killed_midway_finished_by_the_next_opening(
        s3, columns, tmp_path, monkeypatch):
    """`compact` on an S3 sweep: the bucket ends with the parts alone; a compaction whose driver
    died after its manifest reached the bucket is finished by the next driver that opens it."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    location = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"
    store = open_store(location, SWEEP)
    for n in range(4):
        store.write_requests(n, [], REQUEST_COLUMNS)
        store.write_trial(make_row(columns, n, objective=float(n)), columns)
    before = store.read_trials().to_json(orient="records", date_format="iso")
    real, calls = compaction.commit_file, []

    def dies_after_the_manifest(tmp: Path, path: Path) -> None:
        calls.append(path.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(tmp, path)

    monkeypatch.setattr(compaction, "commit_file", dies_after_the_manifest)
    with pytest.raises(KeyboardInterrupt):
        compaction.compact(store)
    monkeypatch.setattr(compaction, "commit_file", real)

    again = open_store(location, SWEEP)  # another machine: finishes what the manifest says
    assert again.read_trials().to_json(orient="records", date_format="iso") == before
    listed = s3.filesystem().get_file_info(pafs.FileSelector(
        location.removeprefix("s3://") + f"/{SWEEP}/trials", recursive=True))
    assert [Path(i.path).name for i in listed if i.type == pafs.FileType.File] == [
        "part-00000.parquet"]
    assert not (again.sweep_dir / compaction.MANIFEST).exists()
    assert compaction.compact(open_store(location, SWEEP)) == []  # nothing left to do


def test_a_log_that_grows_after_its_row_reaches_the_bucket(s3, tmp_path, monkeypatch):
    """A server's log is fetched from its node when the server stops, after the trial's row:
    publish_logs (after each trial, at the run's end) sends what grew, and only that."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    location = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"
    store = open_store(location, SWEEP)
    store.log_path(0).parent.mkdir(parents=True)
    store.log_path(0).write_text("started\n")
    store.publish_logs()
    key = location.removeprefix("s3://") + f"/{SWEEP}/logs/trial-00000.log"
    fs = s3.filesystem()
    assert fs.open_input_stream(key).read() == b"started\n"
    with store.log_path(0).open("a") as log:
        log.write("stopped\n")
    sent = []
    real = store.mirror._upload
    monkeypatch.setattr(store.mirror, "_upload", lambda p, rel: (sent.append(rel), real(p, rel)))
    store.publish_logs()
    store.publish_logs()  # nothing grew: nothing sent
    assert sent == ["logs/trial-00000.log"]
    assert fs.open_input_stream(key).read() == b"started\nstopped\n"
