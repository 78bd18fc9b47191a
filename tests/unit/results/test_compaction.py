"""`compact` (results/compaction.py): a sweep's per-trial files merged into parts that every reader
reads as before (the store, DuckDB over the documented glob, pandas), an unfinished trial's files
left alone, and a compaction killed midway finished by the next one with no row lost or counted
twice."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import psutil
import pytest

from framework.results import compaction
from framework.results.compaction import MANIFEST
from framework.results.compaction import compact
from framework.results.compaction import plan_parts
from framework.results.rows import REQUEST_COLUMNS
from framework.results.store import ResultStore
from tests.cli import cli_in_process
from tests.sweeps import killed_sweep_file
from tests.sweeps import write_rows
from tests.unit.results.test_store import columns  # noqa: F401 - the module fixture
from tests.unit.results.test_store import make_row

SWEEP = "big"


def request_rows(number: int, count: int) -> list[dict]:
    rows = []
    for i in range(count):
        row = {name: None for name, _ in REQUEST_COLUMNS}
        row.update({"trial_number": number, "request_index": i, "success": i % 5 != 4,
                    "ttft_ms": 10.0 * number + i, "itl_ms": [1.0, 2.0], "step": 0})
        rows.append(row)
    return rows


def filled(tmp_path: Path, columns, trials: int = 6) -> ResultStore:  # noqa: F811
    """`trials` finished trials (rows and requests), then trial `trials` with requests only (a
    trial in flight: its row is not written yet)."""
    store = ResultStore(tmp_path / "results", SWEEP)
    for n in range(trials):
        store.write_requests(n, request_rows(n, 3 + n), REQUEST_COLUMNS)
        store.write_trial(make_row(columns, n, objective=float(n)), columns)
    store.write_requests(trials, request_rows(trials, 2), REQUEST_COLUMNS)
    return store


def snapshot(store: ResultStore) -> dict:
    glob = f"{store.sweep_dir}/requests/**/*.parquet"
    return {
        "trials": store.read_trials().to_json(orient="records", date_format="iso"),
        "numbers": store.trial_numbers(),
        "requests": duckdb.sql(f"SELECT trial_number, request_index, ttft_ms, sweep FROM "
                               f"read_parquet('{glob}', hive_partitioning = true) "
                               "ORDER BY 1, 2").fetchall(),
    }


def files(store: ResultStore, table: str) -> list[str]:
    return sorted(p.name for p in (store.sweep_dir / table / f"sweep={SWEEP}").iterdir())


@pytest.mark.parametrize(("counts", "limit", "parts"), [
    ([3, 3, 3], 6, [[0, 1], [2]]),
    ([3, 3, 3], 100, [[0, 1, 2]]),
    ([10, 1, 1], 5, [[0], [1, 2]]),  # a file larger than the limit is a part of its own
    ([1], 1, [[0]]),
    ([], 5, []),
])
def test_plan_parts_keeps_order_and_the_limit(counts, limit, parts):
    assert plan_parts(counts, limit) == parts


def test_compaction_keeps_every_row_and_leaves_the_unfinished_trial(tmp_path, columns):  # noqa: F811
    store = filled(tmp_path, columns)
    before = snapshot(store)
    done = compact(store, rows_per_part=12)  # requests: 3+4+5 | 6 | 7 | 8 -> four parts
    assert [(c.table, c.files, c.parts, c.rows) for c in done] == [
        ("trials", 6, 1, 6), ("requests", 6, 4, 3 + 4 + 5 + 6 + 7 + 8)]
    assert snapshot(store) == before
    assert files(store, "trials") == ["part-00000.parquet"]
    assert files(store, "requests") == [f"part-{k:05d}.parquet" for k in range(4)] + [
        "trial-00006.parquet"]  # trial 6 has no row yet: not compacted
    assert not (store.sweep_dir / MANIFEST).exists()
    assert compact(store) == []  # nothing left to compact


def test_a_trial_written_after_compaction_is_a_new_file_and_compacts_into_a_new_part(
        tmp_path, columns):  # noqa: F811
    store = filled(tmp_path, columns, trials=2)
    compact(store)
    store.write_trial(make_row(columns, 2, objective=2.0), columns)  # trial 2's row arrives
    assert store.trial_numbers() == {0, 1, 2}
    before = snapshot(store)
    assert [(c.table, c.files) for c in compact(store)] == [("trials", 1), ("requests", 1)]
    assert files(store, "trials") == ["part-00000.parquet", "part-00001.parquet"]
    assert snapshot(store) == before


def test_a_compaction_killed_after_its_manifest_is_finished_by_the_next(tmp_path, columns,  # noqa: F811
                                                                       monkeypatch):
    store = filled(tmp_path, columns)
    before = snapshot(store)
    calls = []
    real = compaction.commit_file

    def dies_at_the_second_part(tmp: Path, path: Path) -> None:
        calls.append(path.name)
        if len(calls) == 3:  # the manifest, one part renamed, then the driver dies
            raise KeyboardInterrupt
        real(tmp, path)

    monkeypatch.setattr(compaction, "commit_file", dies_at_the_second_part)
    with pytest.raises(KeyboardInterrupt):
        compact(store, rows_per_part=12)
    assert calls[0] == MANIFEST and (store.sweep_dir / MANIFEST).is_file()
    monkeypatch.setattr(compaction, "commit_file", real)
    assert compaction.finish(store) is True
    assert snapshot(store) == before
    assert not (store.sweep_dir / MANIFEST).exists()
    assert not [p for p in store.sweep_dir.rglob(".*") if p.is_file()]  # no hidden part left


def test_a_compaction_killed_before_its_manifest_leaves_only_hidden_files(tmp_path, columns,  # noqa: F811
                                                                         monkeypatch):
    store = filled(tmp_path, columns)
    before = snapshot(store)

    def dies(tmp: Path, path: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(compaction, "commit_file", dies)
    with pytest.raises(KeyboardInterrupt):
        compact(store)
    assert snapshot(store) == before  # readers see the per-trial files only
    monkeypatch.undo()
    compact(store)
    assert snapshot(store) == before


def test_a_manifest_whose_parts_are_gone_is_undone_and_the_per_trial_files_kept(tmp_path,
                                                                               columns):  # noqa: F811
    """A manifest naming a part that is nowhere (its driver's folder lost before the part
    reached the object store): nothing is removed on its word."""
    store = filled(tmp_path, columns, trials=2)
    before = snapshot(store)
    folder = f"trials/sweep={SWEEP}"
    (store.sweep_dir / MANIFEST).write_text(json.dumps({
        "renames": [[f"{folder}/.part-00000.parquet.1.tmp", f"{folder}/part-00000.parquet"]],
        "replaced": [f"{folder}/trial-00000.parquet", f"{folder}/trial-00001.parquet"]}))
    assert compaction.finish(store) is True
    assert snapshot(store) == before and files(store, "trials") == [
        "trial-00000.parquet", "trial-00001.parquet"]
    assert not (store.sweep_dir / MANIFEST).exists()


def test_the_compact_command_merges_and_status_reads_the_same(tmp_path, tiny_model):
    write_rows(tmp_path / "results")
    sweep = str(killed_sweep_file(tmp_path, tiny_model))
    before = cli_in_process("status", sweep)
    res = cli_in_process("compact", sweep)
    assert res.returncode == 0, res.stderr
    assert "trials: 5 per-trial files -> 1 part(s), 5 rows" in res.stdout
    assert f"compacted: {tmp_path / 'results' / 'killed'}" in res.stdout
    assert cli_in_process("status", sweep).stdout == before.stdout
    again = cli_in_process("compact", sweep)
    assert again.returncode == 0 and "nothing to compact" in again.stdout


def test_compact_is_refused_while_the_driver_runs_and_a_bad_size_is_one_line(tmp_path,
                                                                            tiny_model):
    write_rows(tmp_path / "results")
    sweep = str(killed_sweep_file(tmp_path, tiny_model))
    me = psutil.Process()
    (tmp_path / "results" / "killed" / "driver.json").write_text(json.dumps(
        {"pid": me.pid, "create_time": me.create_time(), "session": "live"}))
    res = cli_in_process("compact", sweep)
    assert res.returncode == 3 and f"driver (pid {me.pid}) is running" in res.stderr
    folder = tmp_path / "results" / "killed" / "trials" / "sweep=killed"
    assert len(list(folder.glob("trial-*.parquet"))) == 5  # nothing merged
    bad = cli_in_process("compact", sweep, "--rows-per-file", "0")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "--rows-per-file must be >= 1, got 0" in bad.stderr
