"""Parquet result tables (with object_store.py, the modules importing pyarrow).

Layout under `results/<sweep>/`:
    trials/sweep=<sweep>/trial-00007.parquet      one row per trial
    requests/sweep=<sweep>/trial-00007.parquet    one row per measured request
    workloads/sweep=<sweep>/trial-00007.parquet   one row per workload (`workloads:` sweeps)
    probes/trial-00007.parquet                    the quality probe's answers (probed trials)
    logs/trial-00007.log                          full server log
    optuna.journal                                the Optuna study (resume state)
    origin.json                                   the sweep file and working directory it ran from

Contract: one file per trial number, written to a hidden temp name, fsynced and renamed into
place (the directory fsynced after), so a reader never sees a partial file nor a power loss
leaves an empty one, and writing the same trial again replaces it (no duplicates on resume).
Columns are typed by an explicit schema, never inferred. With a `mirror` (a results_dir on
an object store, object_store.py) the folder is a private staging copy, and each committed
file is published to the store as one object, the journal ahead of it when it changed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from framework.results.object_store import Mirror
from framework.results.object_store import open_mirror

if TYPE_CHECKING:
    import pandas as pd

KINDS: dict[str, pa.DataType] = {
    "int": pa.int64(),
    "float": pa.float64(),
    "str": pa.string(),
    "bool": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "list<str>": pa.list_(pa.string()),
    "list<float>": pa.list_(pa.float64()),
    "list<int>": pa.list_(pa.int64()),
}

Columns = Sequence[tuple[str, str]]
ORIGIN = "origin.json"


def read_origin(sweep_dir: Path) -> tuple[Path, Path] | None:
    """(sweep file, working directory) a results directory was written from; None if unknown."""
    try:
        data = json.loads((sweep_dir / ORIGIN).read_text())
        return Path(data["sweep_file"]), Path(data["cwd"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def arrow_schema(columns: Columns) -> pa.Schema:
    """(name, kind) pairs -> an Arrow schema; kinds are the keys of KINDS."""
    names = [name for name, _ in columns]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"duplicate column names: {dup}")
    return pa.schema([pa.field(name, KINDS[kind]) for name, kind in columns])


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_file(tmp: Path, path: Path) -> None:
    """Rename the written `tmp` onto `path`, durably: its bytes are on disk before the rename
    (a power loss can't leave an empty or partial committed file), and the directory is
    flushed after it, so the rename survives too (skipped where the filesystem can't)."""
    _fsync(tmp)
    os.replace(tmp, path)
    try:
        _fsync(path.parent)
    except OSError:
        pass


def _atomic_write(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp)
        commit_file(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_rows(path: Path, rows: Sequence[Mapping[str, Any]], columns: Columns) -> Path:
    """Write (or replace) the table of `rows` (may be empty) at `path`."""
    _atomic_write(pa.Table.from_pylist([dict(r) for r in rows], schema=arrow_schema(columns)), path)
    return path


@dataclass(frozen=True)
class ResultStore:
    """Where one sweep's results live; see the module docstring for the layout. `root`: the
    local results_dir, or the staging folder of `mirror`."""

    root: Path
    sweep: str
    mirror: Mirror | None = field(default=None, compare=False, repr=False)

    @property
    def location(self) -> str:
        """Where the results are, for people: the sweep's folder (absolute), or its object
        store URI."""
        return (str(self.sweep_dir.resolve()) if self.mirror is None
                else self.mirror.where(self.sweep_dir))

    def where(self, path: Path) -> str:
        """Where the file `path` of this store lives: the path, or its object's URI."""
        return str(path) if self.mirror is None else self.mirror.where(path)

    def publish(self, path: Path) -> None:
        """Send the committed file `path` to the object store (the journal first when it
        changed); nothing for a local results_dir."""
        if self.mirror is not None and path.is_file():
            self.mirror.publish(path, before=self.journal_path)

    def unpublish(self, path: Path) -> None:
        """Delete the object of the staged file `path` (removed here); nothing when local."""
        if self.mirror is not None:
            self.mirror.delete(path)

    def publish_logs(self) -> None:
        """Send the server logs that grew since they were sent (a log is fetched from its node
        when its server stops, after the trial's row); nothing when local."""
        if self.mirror is not None:
            self.mirror.publish_changed(self.sweep_dir / "logs")

    def publish_journal(self) -> None:
        """Send the Optuna journal if it changed (after a tell); nothing when local."""
        self.publish(self.journal_path)

    @property
    def sweep_dir(self) -> Path:
        return self.root / self.sweep

    def trial_path(self, number: int) -> Path:
        return self.sweep_dir / "trials" / f"sweep={self.sweep}" / f"trial-{number:05d}.parquet"

    def requests_path(self, number: int) -> Path:
        return self.sweep_dir / "requests" / f"sweep={self.sweep}" / f"trial-{number:05d}.parquet"

    def workloads_path(self, number: int) -> Path:
        return self.sweep_dir / "workloads" / f"sweep={self.sweep}" / f"trial-{number:05d}.parquet"

    def probe_path(self, number: int) -> Path:
        return self.sweep_dir / "probes" / f"trial-{number:05d}.parquet"

    def log_path(self, number: int) -> Path:
        return self.sweep_dir / "logs" / f"trial-{number:05d}.log"

    @property
    def journal_path(self) -> Path:
        return self.sweep_dir / "optuna.journal"

    def write_origin(self, sweep_file: Path) -> None:
        """Record which sweep file (absolute) ran from which working directory, so that a
        results directory leads back to its sweep (`compare results/<sweep>`)."""
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.sweep_dir / ".origin.json.tmp"
        tmp.write_text(json.dumps({"sweep_file": str(sweep_file.resolve()),
                                   "cwd": str(Path.cwd())}))
        commit_file(tmp, self.sweep_dir / ORIGIN)
        self.publish(self.sweep_dir / ORIGIN)

    def write_trial(self, row: Mapping[str, Any], columns: Columns) -> Path:
        """Write (or replace) the row of trial `row['trial_number']`."""
        return self._publish_rows(self.trial_path(int(row["trial_number"])), [row], columns)

    def write_requests(self, number: int, rows: Sequence[Mapping[str, Any]], columns: Columns) -> Path:
        """Write (or replace) the request rows of trial `number` (may be empty)."""
        return self._publish_rows(self.requests_path(number), rows, columns)

    def write_workloads(self, number: int, rows: Sequence[Mapping[str, Any]],
                        columns: Columns) -> Path:
        """Write (or replace) the workload rows of trial `number`."""
        return self._publish_rows(self.workloads_path(number), rows, columns)

    def write_probe(self, number: int, rows: Sequence[Mapping[str, Any]], columns: Columns) -> Path:
        """Write (or replace) the quality probe rows of trial `number`."""
        return self._publish_rows(self.probe_path(number), rows, columns)

    def _publish_rows(self, path: Path, rows: Sequence[Mapping[str, Any]], columns: Columns
                      ) -> Path:
        _write_rows(path, rows, columns)
        self.publish(path)
        return path

    def read_probes(self) -> list[dict[str, Any]]:
        """Every stored probe row (plain Python values), by trial number; [] if none."""
        files = sorted(self.probe_path(0).parent.glob("trial-*.parquet"))
        return [row for f in files for row in pq.read_table(f).to_pylist()]

    def trial_numbers(self) -> set[int]:
        """The numbers of the trials that have their row (per-trial files, compacted parts)."""
        folder = self.trial_path(0).parent
        if not folder.is_dir():
            return set()
        numbers = {int(p.stem.split("-")[1]) for p in folder.glob("trial-*.parquet")}
        for part in folder.glob("part-*.parquet"):
            numbers.update(pq.read_table(part, columns=["trial_number"])["trial_number"].to_pylist())
        return numbers

    def read_workloads(self) -> pd.DataFrame:
        """All workload rows (`workloads:`, a load curve) ordered by trial number, then in the
        order measured within a trial (empty if none)."""
        return _read_folder(self.workloads_path(0).parent)

    def read_trials(self) -> pd.DataFrame:
        """All trial rows as a pandas DataFrame ordered by trial number (empty if none)."""
        return _read_folder(self.trial_path(0).parent)


def open_store(results_dir: Path | str, sweep: str, full: bool = False) -> ResultStore:
    """The store of sweep `sweep` under `results_dir`: a local folder, or an object store URI
    whose sweep is first downloaded into a new staging folder (object_store.open_mirror: with
    `full`, its request rows and logs too)."""
    if isinstance(results_dir, Path):
        return ResultStore(results_dir, sweep)
    mirror = open_mirror(results_dir, sweep, full)
    store = ResultStore(mirror.staging, sweep, mirror)
    from framework.results import compaction  # imports this module

    compaction.finish(store)  # a compaction killed midway: finished, so no row counts twice
    return store


def _read_folder(folder: Path) -> pd.DataFrame:
    """Every file of `folder` (per-trial files and compacted parts, compaction.py) as one
    DataFrame ordered by trial number, a trial's rows kept in their order (empty if none)."""
    import pandas as pd

    files = sorted(folder.glob("*.parquet"))
    if not files:
        return pd.DataFrame()
    table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="permissive")
    return table.to_pandas().sort_values("trial_number", kind="stable").reset_index(drop=True)
