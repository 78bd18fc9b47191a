"""Parquet result tables written by ResultStore, read back with DuckDB and pandas."""

from __future__ import annotations

from datetime import UTC
from datetime import datetime

import duckdb
import pandas as pd
import pytest

from framework.config.search_space import load_search_space
from framework.load.loadgen import RequestRecord
from framework.results.rows import REQUEST_COLUMNS
from framework.results.rows import TrialContext
from framework.results.rows import request_rows
from framework.results.rows import trial_columns
from framework.results.rows import trial_row
from framework.results.store import ResultStore
from framework.results.store import arrow_schema
from framework.trial.measure import LoadStep
from framework.trial.run import TrialOutcome
from tests.paths import ROOT as REPO

SWEEP = "demo-sweep"


STARTED = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)


@pytest.fixture(scope="module")
def columns():
    space = load_search_space(REPO / "search_spaces" / "tiny_cpu.yaml")
    return trial_columns(space, (50, 99))


def make_row(columns, number: int, *, objective: float | None = 100.0, state: str = "COMPLETE",
             max_num_seqs: int = 16) -> dict:
    row = {name: None for name, _ in columns}
    row.update({
        "trial_number": number, "state": state, "is_baseline": number == 0,
        "param_max_num_seqs": max_num_seqs, "param_max_num_batched_tokens": 1024,
        "param_enable_chunked_prefill": True, "param_enable_prefix_caching": False,
        "vllm_argv": ["--model", "m", "--max-num-seqs", str(max_num_seqs)],
        "serve_command": f"vllm serve m --max-num-seqs {max_num_seqs}",
        "completed": 10, "failed": 0, "output_throughput": objective, "p99_ttft_ms": 12.5,
        "objective": objective, "feasible": True, "started_at": STARTED, "schema_version": 1,
    })
    return row


def glob(store: ResultStore, table: str = "trials") -> str:
    return f"{store.sweep_dir}/{table}/**/*.parquet"


def query(sql: str) -> list[tuple]:
    # TIMESTAMPTZ values are compared as epoch_us(...): DuckDB needs pytz (not installed) to
    # return them as Python datetimes.
    return duckdb.sql(sql).fetchall()


def test_trial_row_read_by_duckdb_with_partition_and_types(tmp_path, columns):
    store = ResultStore(tmp_path / "results", SWEEP)
    path = store.write_trial(make_row(columns, 7), columns)

    assert path == tmp_path / "results" / SWEEP / "trials" / f"sweep={SWEEP}" / "trial-00007.parquet"
    src = f"read_parquet('{glob(store)}', hive_partitioning=true)"
    assert query(f"SELECT sweep, trial_number, state, param_max_num_seqs, "
                 f"param_enable_prefix_caching, vllm_argv, epoch_us(started_at), objective "
                 f"FROM {src}") == [
        (SWEEP, 7, "COMPLETE", 16, False, ["--model", "m", "--max-num-seqs", "16"],
         int(STARTED.timestamp()) * 1_000_000, 100.0)]

    types = {name: kind for name, kind, *_ in query(f"DESCRIBE SELECT * FROM {src}")}
    assert types["sweep"] == "VARCHAR"  # from the directory name, not a stored column
    assert types["trial_number"] == "BIGINT"
    assert types["param_max_num_seqs"] == "BIGINT"
    assert types["param_max_num_batched_tokens"] == "BIGINT"  # int-only categorical
    assert types["param_enable_prefix_caching"] == "BOOLEAN"
    assert types["vllm_argv"] == "VARCHAR[]"
    assert types["started_at"] == "TIMESTAMP WITH TIME ZONE"
    assert types["completed"] == "BIGINT"
    assert types["p99_ttft_ms"] == "DOUBLE"
    assert types["schema_version"] == "BIGINT"
    # every declared column is present, in declared order, plus the partition column
    assert [n for n in types if n != "sweep"] == [name for name, _ in columns]


def test_all_null_columns_keep_their_declared_type(tmp_path, columns):
    store = ResultStore(tmp_path, SWEEP)
    row = make_row(columns, 1, objective=None)  # objective and fail_reason etc. are null
    store.write_trial(row, columns)
    src = f"read_parquet('{glob(store)}', hive_partitioning=true)"
    types = {name: kind for name, kind, *_ in query(f"DESCRIBE SELECT * FROM {src}")}
    assert types["objective"] == "DOUBLE"
    assert types["fail_reason"] == "VARCHAR"
    assert query(f"SELECT objective IS NULL, fail_reason IS NULL FROM {src}") == [(True, True)]


def test_trial_row_built_by_rows_module_round_trips(tmp_path, columns):
    """The production row builder and the store agree on the schema."""
    store = ResultStore(tmp_path, SWEEP)
    params = {"max-num-seqs": 8, "max-num-batched-tokens": 4096, "enable-chunked-prefill": False,
              "enable-prefix-caching": True}
    ctx = TrialContext(number=3, params=params, is_baseline=False,
                       serve_command="vllm serve m --max-num-seqs 8", vllm_version="0.32.0",
                       server_log="logs/trial-00003.log")
    outcome = TrialOutcome(started_at=STARTED, argv=("--model", "m", "--max-num-seqs", "8"),
                           fail_reason="startup_crash", fail_detail="boom", trial_s=1.5)
    store.write_trial(trial_row(ctx, outcome, None, columns), columns)

    src = f"read_parquet('{glob(store)}', hive_partitioning=true)"
    assert query(f"SELECT trial_number, state, fail_reason, param_max_num_batched_tokens, "
                 f"param_enable_chunked_prefill, objective IS NULL, trial_s FROM {src}") == [
        (3, "FAIL", "startup_crash", 4096, False, True, 1.5)]


def test_rewriting_a_trial_replaces_its_row(tmp_path, columns):
    store = ResultStore(tmp_path, SWEEP)
    store.write_trial(make_row(columns, 2, objective=1.0), columns)
    store.write_trial(make_row(columns, 4, objective=5.0), columns)
    store.write_trial(make_row(columns, 2, objective=2.0, state="FAIL", max_num_seqs=64), columns)

    src = f"read_parquet('{glob(store)}', hive_partitioning=true)"
    assert query(f"SELECT trial_number, state, objective, param_max_num_seqs FROM {src} "
                 "ORDER BY trial_number") == [(2, "FAIL", 2.0, 64), (4, "COMPLETE", 5.0, 16)]
    assert store.trial_numbers() == {2, 4}


def test_no_temp_file_left_visible(tmp_path, columns):
    store = ResultStore(tmp_path, SWEEP)
    for n in (0, 1, 1):
        store.write_trial(make_row(columns, n), columns)
    store.write_requests(1, [], REQUEST_COLUMNS)

    files = sorted(p.relative_to(store.sweep_dir).as_posix()
                   for p in store.sweep_dir.rglob("*") if p.is_file())
    assert files == [f"requests/sweep={SWEEP}/trial-00001.parquet",
                     f"trials/sweep={SWEEP}/trial-00000.parquet",
                     f"trials/sweep={SWEEP}/trial-00001.parquet"]


def test_partial_temp_file_of_killed_writer_is_invisible(tmp_path, columns):
    """A writer killed mid-write leaves its hidden temp file; readers must not see it."""
    store = ResultStore(tmp_path, SWEEP)
    store.write_trial(make_row(columns, 0), columns)
    final = store.trial_path(5)
    partial = final.with_name(f".{final.name}.424242.tmp")
    partial.write_bytes(b"PAR1 truncated garbage")

    assert store.trial_numbers() == {0}
    assert list(store.read_trials()["trial_number"]) == [0]
    src = f"read_parquet('{glob(store)}', hive_partitioning=true)"
    assert query(f"SELECT count(*) FROM {src}") == [(1,)]


def test_write_failing_at_rename_leaves_only_a_hidden_non_parquet_temp(tmp_path, columns):
    """Make the final rename fail (a directory squats the target name): whatever the writer
    leaves behind must be hidden and not match `*.parquet`, so readers never pick it up."""
    store = ResultStore(tmp_path, SWEEP)
    store.write_trial(make_row(columns, 0), columns)
    target = store.trial_path(5)
    target.mkdir()
    (target / "keep").write_text("x")  # non-empty: os.replace cannot overwrite it

    with pytest.raises(OSError, match="Is a directory|Directory not empty"):
        store.write_trial(make_row(columns, 5), columns)

    leftovers = [p.name for p in target.parent.iterdir() if p.is_file()
                 and p.name != "trial-00000.parquet"]
    assert all(n.startswith(".") and not n.endswith(".parquet") for n in leftovers)
    assert [p.name for p in target.parent.glob("*.parquet") if p.is_file()] == [
        "trial-00000.parquet"]


def test_read_trials_sorted_by_number(tmp_path, columns):
    store = ResultStore(tmp_path, SWEEP)
    # file names sort as trial-00003 < trial-100000 < trial-99999; rows must sort numerically
    for n in (100000, 3, 99999, 12):
        store.write_trial(make_row(columns, n, objective=float(n)), columns)

    df = store.read_trials()
    assert list(df["trial_number"]) == [3, 12, 99999, 100000]
    assert list(df["objective"]) == [3.0, 12.0, 99999.0, 100000.0]
    assert list(df.index) == [0, 1, 2, 3]
    assert store.trial_numbers() == {3, 12, 99999, 100000}
    assert str(df["started_at"].dt.tz) == "UTC"
    assert df["started_at"].iloc[0] == pd.Timestamp(STARTED)
    assert list(df["vllm_argv"].iloc[0]) == ["--model", "m", "--max-num-seqs", "16"]


def test_read_trials_empty(tmp_path):
    store = ResultStore(tmp_path, SWEEP)
    df = store.read_trials()
    assert isinstance(df, pd.DataFrame) and df.empty
    assert store.trial_numbers() == set()


def test_stores_of_two_sweeps_are_separate_partitions(tmp_path, columns):
    a, b = ResultStore(tmp_path, "a"), ResultStore(tmp_path, "b")
    a.write_trial(make_row(columns, 0), columns)
    b.write_trial(make_row(columns, 0), columns)
    b.write_trial(make_row(columns, 1), columns)
    rows = query(f"SELECT sweep, count(*) FROM read_parquet('{tmp_path}/*/trials/**/*.parquet', "
                 "hive_partitioning=true) GROUP BY sweep ORDER BY sweep")
    assert rows == [("a", 1), ("b", 2)]


def test_request_rows_round_trip(tmp_path):
    store = ResultStore(tmp_path, SWEEP)
    # times in binary-exact fractions so ms values are exact
    ok = RequestRecord(index=0, send_s=10.5, ttft_s=0.5, chunk_s=(11.0, 11.25, 11.5, 12.0),
                       end_s=12.0, prompt_tokens=7, output_tokens=4, success=True)
    failed = RequestRecord(index=1, send_s=10.75, ttft_s=None, chunk_s=(), end_s=11.0,
                           prompt_tokens=9, output_tokens=0, success=False, error="HTTP 500")
    cut = RequestRecord(index=2, send_s=11.0, ttft_s=0.25, chunk_s=(11.25, 11.75), end_s=12.0,
                        prompt_tokens=5, output_tokens=2, success=False, error="disconnected")
    outcome = TrialOutcome(started_at=STARTED, argv=(),
                           steps=(LoadStep(rate=None, start_s=10.0, records=(ok, failed, cut)),))
    path = store.write_requests(6, request_rows(6, outcome), REQUEST_COLUMNS)
    assert path == store.requests_path(6)

    got = query(f"SELECT trial_number, request_index, send_s, ttft_ms, tpot_ms, e2el_ms, itl_ms, "
                f"prompt_tokens, output_tokens, success, error FROM "
                f"read_parquet('{glob(store, 'requests')}', hive_partitioning=true) "
                "ORDER BY request_index")
    assert len(got) == 3
    # ok: send 0.5 s after load start; ttft 500 ms; e2el 12.0 - 10.5 = 1.5 s;
    # tpot (1500 - 500) / (4 - 1) ms; itl gaps 0.25, 0.25, 0.5 s
    assert got[0][:6] == (6, 0, 0.5, 500.0, pytest.approx(1000.0 / 3), 1500.0)
    assert got[0][6:] == ([250.0, 250.0, 500.0], 7, 4, True, None)  # no error -> null
    # failed before any token: latencies null, itl an empty list (not null)
    assert got[1] == (6, 1, 0.75, None, None, None, [], 9, 0, False, "HTTP 500")
    # failed mid-stream: ttft known, no e2el/tpot, the one gap kept
    assert got[2] == (6, 2, 1.0, 250.0, None, None, [500.0], 5, 2, False, "disconnected")

    types = {n: k for n, k, *_ in query(f"DESCRIBE SELECT * FROM read_parquet('{path}')")}
    assert types["itl_ms"] == "DOUBLE[]"
    assert types["success"] == "BOOLEAN"
    assert types["request_index"] == "BIGINT"

    df = pd.read_parquet(path)
    assert list(df["itl_ms"].iloc[0]) == [250.0, 250.0, 500.0]
    assert pd.isna(df["ttft_ms"].iloc[1]) and pd.isna(df["e2el_ms"].iloc[2])
    assert pd.isna(df["error"].iloc[0]) and df["error"].iloc[1] == "HTTP 500"


def test_request_rows_of_capacity_steps_carry_step_rate_and_step_relative_send_times():
    def rec(index: int, send: float) -> RequestRecord:
        return RequestRecord(index=index, send_s=send, ttft_s=0.25, chunk_s=(send + 0.25,),
                             end_s=send + 0.25, prompt_tokens=3, output_tokens=1, success=True)

    outcome = TrialOutcome(started_at=STARTED, argv=(), steps=(
        LoadStep(rate=1.0, start_s=100.0, records=(rec(0, 100.5), rec(1, 101.0))),
        LoadStep(rate=2.0, start_s=200.0, records=(rec(0, 200.25),))))
    rows = request_rows(3, outcome)
    assert [(r["step"], r["rate"], r["request_index"], r["send_s"]) for r in rows] == [
        (0, 1.0, 0, 0.5), (0, 1.0, 1, 1.0), (1, 2.0, 0, 0.25)]
    assert len(outcome.records) == 3


def test_empty_request_table_keeps_schema(tmp_path):
    store = ResultStore(tmp_path, SWEEP)
    path = store.write_requests(0, [], REQUEST_COLUMNS)
    assert query(f"SELECT count(*) FROM read_parquet('{path}')") == [(0,)]
    names = [n for n, *_ in query(
        f"DESCRIBE SELECT * FROM read_parquet('{path}', hive_partitioning=false)")]
    assert names == [n for n, _ in REQUEST_COLUMNS]


def test_arrow_schema_rejects_duplicate_names(tmp_path, columns):
    with pytest.raises(ValueError, match="trial_number"):
        arrow_schema([("trial_number", "int"), ("x", "float"), ("trial_number", "str")])

    store = ResultStore(tmp_path, SWEEP)
    with pytest.raises(ValueError, match="objective"):
        store.write_trial({"trial_number": 1}, [*columns, ("objective", "str")])
    assert not store.trial_path(1).exists()


def test_arrow_schema_kinds():
    import pyarrow as pa

    schema = arrow_schema([("a", "int"), ("b", "float"), ("c", "str"), ("d", "bool"),
                           ("e", "timestamp"), ("f", "list<str>"), ("g", "list<float>")])
    assert schema.names == ["a", "b", "c", "d", "e", "f", "g"]
    assert schema.types == [pa.int64(), pa.float64(), pa.string(), pa.bool_(),
                            pa.timestamp("us", tz="UTC"), pa.list_(pa.string()),
                            pa.list_(pa.float64())]
    with pytest.raises(KeyError, match="decimal"):
        arrow_schema([("a", "decimal")])
