"""`vllm-sweep compact`: a finished sweep's per-trial files merged into a few large ones, for
queries over thousands of trials (issue #35 item 4; docs/BENCHMARKS.md "Results at scale").

A sweep writes one file per trial and table (store.py), which is what makes a rewrite replace and
a crash leave nothing half-written; a query over 10,000 trials then opens 10,000 files per table.
Compaction rewrites the trials, requests and workloads files of every trial that has its trial
row into `part-NNNNN.parquet` files of the same table and partition folder (same columns and
types; rows sorted by trial number, then as they were; at most `rows_per_part` rows each, in row
groups of ROW_GROUP rows), then removes the per-trial files. The layout, the partition column
and every documented query stay valid: they read `**/*.parquet`.

Crash safety (roll forward): the parts are written under hidden temporary names (and published
under them), then a manifest (MANIFEST: the parts and the per-trial files they replace) is
committed, then each part is renamed into place and each replaced file removed, then the
manifest. A compaction killed before the manifest leaves only hidden files; one killed after it
is finished by the next `compact` or opening of the object store (store.open_store); a manifest
whose parts cannot all be found is undone instead, the per-trial files kept. Between a part's
rename and the last removal a reader may count a trial's rows twice: compact a sweep no driver
is writing (refused while its driver runs).

On an object store, the same happens in the staging folder and each part is published, then the
replaced objects are deleted (object_store.Mirror.delete).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from framework.results.object_store import MANIFEST_NAME
from framework.results.store import ResultStore
from framework.results.store import commit_file

MANIFEST = MANIFEST_NAME  # "compaction.json"
PART_PREFIX = "part-"
ROW_GROUP = 128 * 1024
ROWS_PER_PART = 4_000_000
TABLES = ("trials", "requests", "workloads")


@dataclass(frozen=True)
class Compacted:
    """One table's compaction: how many per-trial files became how many parts, and rows."""

    table: str
    files: int
    parts: int
    rows: int


def _number(path: Path) -> int:
    return int(path.stem.split("-")[1])


def _folder(store: ResultStore, table: str) -> Path:
    return store.sweep_dir / table / f"sweep={store.sweep}"


def _next_part(folder: Path) -> int:
    taken = [int(p.stem.removeprefix(PART_PREFIX)) for p in folder.glob(PART_PREFIX + "*.parquet")]
    return max(taken, default=-1) + 1


def plan_parts(counts: list[int], rows_per_part: int) -> list[list[int]]:
    """Consecutive files (by index) grouped into parts of at most `rows_per_part` rows (a file
    larger than that is a part of its own); every file in exactly one part, order kept. Pure."""
    parts: list[list[int]] = []
    size = 0
    for i, count in enumerate(counts):
        if not parts or size + count > rows_per_part:
            parts.append([])
            size = 0
        parts[-1].append(i)
        size += count
    return parts


def _write_parts(store: ResultStore, table: str, rows_per_part: int
                 ) -> tuple[list[tuple[str, str]], list[str], Compacted] | None:
    """The table's parts written under hidden names: ([(hidden, final)], replaced files,
    summary) relative to the sweep folder; None when there is nothing to compact."""
    folder = _folder(store, table)
    finished = {_number(p) for p in _folder(store, "trials").glob("trial-*.parquet")}
    files = sorted((p for p in folder.glob("trial-*.parquet") if _number(p) in finished),
                   key=_number)
    if not files:
        return None
    counts = [pq.read_metadata(f).num_rows for f in files]
    first = _next_part(folder)
    renames: list[tuple[str, str]] = []
    rows = 0
    for k, members in enumerate(plan_parts(counts, rows_per_part)):  # one part in memory at once
        merged = pa.concat_tables([pq.read_table(files[i]) for i in members],
                                  promote_options="permissive")
        final = folder / f"{PART_PREFIX}{first + k:05d}.parquet"
        hidden = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        pq.write_table(merged, hidden, row_group_size=ROW_GROUP)
        renames.append((_rel(store, hidden), _rel(store, final)))
        rows += merged.num_rows
    return renames, [_rel(store, f) for f in files], Compacted(table, len(files), len(renames), rows)


def _rel(store: ResultStore, path: Path) -> str:
    return path.relative_to(store.sweep_dir).as_posix()


def compact(store: ResultStore, rows_per_part: int = ROWS_PER_PART) -> list[Compacted]:
    """Compact every table of `store` (a manifest left by a killed compaction is finished
    first); what each table became (tables with nothing to compact left out)."""
    finish(store)
    done: list[Compacted] = []
    renames: list[tuple[str, str]] = []
    replaced: list[str] = []
    for table in TABLES:
        written = _write_parts(store, table, rows_per_part)
        if written is not None:
            renames += written[0]
            replaced += written[1]
            done.append(written[2])
    if not renames:
        return done
    for hidden, _ in renames:  # in the object store before the manifest that names them
        store.publish(store.sweep_dir / hidden)
    manifest = store.sweep_dir / MANIFEST
    tmp = manifest.with_name(f".{MANIFEST}.tmp")
    tmp.write_text(json.dumps({"renames": renames, "replaced": replaced}))
    commit_file(tmp, manifest)
    store.publish(manifest)  # a driver elsewhere finishes it if this one dies midway
    finish(store)
    return done


def finish(store: ResultStore) -> bool:
    """Roll a committed compaction forward: parts renamed into place and published, replaced
    files removed (here and in the object store), then the manifest. False if there was none."""
    manifest = store.sweep_dir / MANIFEST
    try:
        plan = json.loads(manifest.read_text())
    except FileNotFoundError:
        return False
    pairs = [(store.sweep_dir / hidden, store.sweep_dir / final)
             for hidden, final in plan["renames"]]
    if not all(source.exists() or target.exists() for source, target in pairs):
        _abandon(store, pairs, manifest)  # a part is lost: keep the per-trial files
        return True
    for source, target in pairs:
        if source.exists():
            commit_file(source, target)
        store.publish(target)
        store.unpublish(source)
    for rel in plan["replaced"]:
        (store.sweep_dir / rel).unlink(missing_ok=True)
        store.unpublish(store.sweep_dir / rel)
    store.unpublish(manifest)
    manifest.unlink()
    return True


def _abandon(store: ResultStore, pairs: list[tuple[Path, Path]], manifest: Path) -> None:
    """Undo a compaction whose parts are not all there: its parts and hidden files removed,
    the per-trial files (all still there: none is removed before every part is) kept."""
    for source, target in pairs:
        for path in (source, target):
            path.unlink(missing_ok=True)
            store.unpublish(path)
    store.unpublish(manifest)
    manifest.unlink()
