"""Results on an object store: `results_dir: s3://bucket/prefix` (or `gs://...`, any URI that
`pyarrow.fs.FileSystem.from_uri` opens), the same layout as a local results_dir (store.py).

How: the driver works in a private staging folder (tempfile.mkdtemp: mode 0700, a new name)
laid out as a local results_dir, and `Mirror` publishes every file the store commits there to
`<uri>/<sweep>/<same relative path>` (one PUT of the whole object: S3 and GCS make an object
visible only once its upload completes, so a reader never sees a partial object). Opening the
store (`open_store`) first downloads the sweep's objects into the new staging folder (but the
request rows and server logs, which no command reads back; `compact` takes them all), so a run
resumes from the bucket on any machine, and `status`, `report`, `best` read what the bucket
holds.

The Optuna journal (store.ResultStore.journal_path) is published before every other object
whenever it has grown, and after every tell (runner): the bucket never holds a trial's rows
without the evaluation the study stored before writing them (tuner.Tuner.remember), so what a
fresh driver downloads is a state a driver killed at some earlier moment could have left, and
resume after kill -9 keeps its guarantees (no lost, no duplicated trial). Publishing is one
upload at a time (a lock), each reading the file as it is then: the journal in the bucket only
grows.

Credentials and endpoint: pyarrow's, from the environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL for an S3-compatible store, AWS_DEFAULT_REGION; GCS
application default credentials), or the URI's query (`?endpoint_override=host:port&scheme=http`,
arrow/cpp/src/arrow/filesystem/s3fs.cc S3Options::FromUri). One driver per sweep at a time: the
driver lock (cluster.driver_session) guards one machine's staging, not the bucket.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import pyarrow.fs as pafs

from framework.base.errors import StoreError
from framework.config.results_location import URI

STAGING_PREFIX = "vllm-sweep-results-"
NOT_READ_BACK = ("requests/", "logs/")  # written by a run, read by analysts, never by a command
MANIFEST_NAME = "compaction.json"  # results/compaction.py MANIFEST (which imports this module)


def join_uri(uri: str, *parts: str) -> str:
    """`uri` with `parts` appended to its path, its query (if any) kept at the end."""
    m = URI.match(uri)
    if m is None:
        raise ValueError(f"not a URI: {uri!r}")
    path = "/".join([m["rest"].rstrip("/"), *(p.strip("/") for p in parts)])
    return f"{m['scheme']}://{path}{m['query'] or ''}"


@dataclass
class Mirror:
    """Publishes a staging folder's files to `<uri>/<sweep>/` and restores them from there."""

    uri: str
    sweep: str
    staging: Path  # the local results_dir; the sweep's files are under staging / sweep
    _fs: pafs.FileSystem = field(init=False, repr=False)
    _base: str = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _published: dict[str, int] = field(default_factory=dict, repr=False)  # rel -> size sent
    keep: bool = False  # a publish failed: the staging folder holds results the store lacks

    def __post_init__(self) -> None:
        try:
            self._fs, base = pafs.FileSystem.from_uri(self.uri)
        except (OSError, ValueError) as exc:
            raise StoreError(f"{self.uri}: {one_line(exc)}") from None
        self._base = f"{base.rstrip('/')}/{self.sweep}"

    def cleanup(self) -> None:
        """Remove the staging folder, unless a publish failed (its files are then the only
        copy of what the store lacks)."""
        if not self.keep:
            shutil.rmtree(self.staging, ignore_errors=True)

    @property
    def sweep_dir(self) -> Path:
        return self.staging / self.sweep

    def where(self, path: Path) -> str:
        """The object URI of the staged file `path`."""
        rel = self._relative(path)
        return join_uri(self.uri, self.sweep, *([] if rel == "." else [rel]))

    def _relative(self, path: Path) -> str:
        return path.resolve().relative_to(self.sweep_dir.resolve()).as_posix()

    def publish(self, path: Path, before: Path | None = None) -> None:
        """Upload the staged file `path` (whole, one object); first `before` (the journal), if
        it exists and changed since it was last sent, up to its last whole line (it is read
        without the writers' lock: a record being appended is left for the next upload, so a
        driver that resumes from the object never appends to a torn line)."""
        with self._lock:
            if before is not None and before.is_file():
                rel = self._relative(before)
                if before.stat().st_size != self._published.get(rel):
                    self._upload(before, rel, whole_lines=True)
            if path != before:
                self._upload(path, self._relative(path))

    def publish_changed(self, folder: Path) -> int:
        """Upload every file of the staged `folder` whose size differs from what was sent
        (server logs, which grow after their trial's row); how many."""
        sent = 0
        with self._lock:
            for path in sorted(folder.glob("*")) if folder.is_dir() else []:
                rel = self._relative(path)
                if path.is_file() and path.stat().st_size != self._published.get(rel):
                    self._upload(path, rel)
                    sent += 1
        return sent

    def _upload(self, path: Path, rel: str, whole_lines: bool = False) -> None:
        data = path.read_bytes()
        if whole_lines:
            data = data[:data.rfind(b"\n") + 1]
        try:
            with self._fs.open_output_stream(f"{self._base}/{rel}") as out:
                out.write(data)
        except OSError as exc:
            self.keep = True
            raise StoreError(f"{self.where(path)}: {one_line(exc)}; the results so far are "
                             f"kept in {self.sweep_dir}") from None
        self._published[rel] = len(data)

    def delete(self, path: Path) -> None:
        """Delete the object of the staged file `path` (absent: nothing)."""
        rel = self._relative(path)
        with self._lock:
            try:
                self._fs.delete_file(f"{self._base}/{rel}")
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StoreError(f"{self.where(path)}: {one_line(exc)}") from None
            self._published.pop(rel, None)

    def restore(self, skip: tuple[str, ...] = ()) -> int:
        """Download the objects under `<uri>/<sweep>/` into the staging folder, but those whose
        path starts with one of `skip` (unless a compaction manifest is there: its files are
        all needed); the count."""
        count = 0
        with self._lock:
            try:
                infos = [i for i in self._fs.get_file_info(pafs.FileSelector(
                    self._base, recursive=True, allow_not_found=True))
                    if i.type == pafs.FileType.File]
                rels = [info.path[len(self._base) + 1:] for info in infos]
                if MANIFEST_NAME in rels:
                    skip = ()
                for info, rel in zip(infos, rels):
                    if skip and rel.startswith(skip):
                        continue
                    target = self.sweep_dir / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with self._fs.open_input_stream(info.path) as src:
                        target.write_bytes(src.read())
                    self._published[rel] = target.stat().st_size
                    count += 1
            except OSError as exc:
                raise StoreError(f"{join_uri(self.uri, self.sweep)}: {one_line(exc)}") from None
        return count

    def write_probe(self) -> str | None:
        """Write, read back and delete one small object under the sweep's prefix; why not (one
        line), or None when the store takes writes (doctor)."""
        key = f"{self._base}/.doctor-probe"
        try:
            with self._fs.open_output_stream(key) as out:
                out.write(b"ok")
            with self._fs.open_input_stream(key) as src:
                if src.read() != b"ok":
                    return "the probe object read back differs"
            self._fs.delete_file(key)
        except OSError as exc:
            return one_line(exc)
        return None


def open_mirror(uri: str, sweep: str, full: bool = False) -> Mirror:
    """A new mirror of sweep `sweep` at `uri`: a new private staging folder (removed when the
    process exits), restored from the store: all of it with `full`, else without the request
    rows and server logs (NOT_READ_BACK), which no command reads back and which are most of a
    large sweep's bytes."""
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX))
    try:
        mirror = Mirror(uri, sweep, staging)
        mirror.restore(() if full else NOT_READ_BACK)
    except StoreError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    atexit.register(mirror.cleanup)
    return mirror


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's text on one line, at most `limit` characters."""
    return " ".join(str(exc).split())[:limit]
