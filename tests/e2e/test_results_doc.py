"""docs/RESULTS.md against the code and a real sweep: its column tables are the trial and request
schemas (a column added in code without docs, or in the docs only, fails), its `param_` rule is
the code's, the types it names are what pandas, pyarrow and DuckDB read back from a FakeEngine
sweep on a private Ray, and its worked queries run on that sweep's folder."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import yaml

from framework.config.search_space import SearchSpace
from framework.config.search_space import load_search_space
from framework.config.specs import WorkloadSpec
from framework.results.rows import REQUEST_COLUMNS
from framework.results.rows import param_column
from framework.results.rows import trial_columns
from framework.results.store import KINDS
from framework.results.workload_rows import workload_columns
from tests.helpers import NO_REMEASURE
from tests.helpers import ROOT
from tests.helpers import cli_env
from tests.helpers import new_marker
from tests.helpers import run_cli
from tests.helpers import wait_no_marked_processes

DOC = ROOT / "docs" / "RESULTS.md"
COLUMN_HEADER = ["column", "type", "unit", "meaning"]
RULE_HEADER = ["parameter in the search space", "column type"]
TYPES_HEADER = ["kind", "Parquet / Arrow", "DuckDB", "pandas `read_parquet` (default)",
                "pandas `dtype_backend=\"pyarrow\"`"]
SECTIONS = {"The trial table": "trial", "The request table": "request",
            "The workloads table": "workloads", "The partition column": "partition"}
QUERY_PATH = 'RESULTS = "results/quickstart"'


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """Every markdown table as (its H2 section, header cells, body rows)."""
    tables, section, current = [], "", None
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        if line.startswith("|"):
            if current is None:
                current = (section, _cells(line), [])
                tables.append(current)
            elif not set(line) <= set("|- "):
                current[2].append(_cells(line))
        else:
            current = None
    return tables


def _name(cell: str) -> str:
    assert cell.startswith("`") and cell.endswith("`"), cell
    return cell.strip("`")


def documented_columns() -> dict[str, list[tuple[str, str, str, str]]]:
    """(name, kind, unit, meaning) of each column table, by section (trial, request, partition)."""
    found: dict[str, list[tuple[str, str, str, str]]] = {v: [] for v in SECTIONS.values()}
    for section, header, rows in _tables(DOC.read_text()):
        if header != COLUMN_HEADER:
            continue
        where = next((v for k, v in SECTIONS.items() if section.startswith(k)), None)
        assert where is not None, f"column table under an unexpected heading: {section!r}"
        for cells in rows:
            assert len(cells) == 4, cells
            found[where].append((_name(cells[0]), cells[1], cells[2], cells[3]))
    return found


def _kinds(rows: list[tuple[str, str, str, str]]) -> dict[str, str]:
    names = [r[0] for r in rows]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"documented twice: {twice}"
    for name, _, unit, meaning in rows:
        assert unit and meaning, f"{name}: unit and meaning must be filled in"
    return {name: kind for name, kind, _, _ in rows}


def _diff(documented: dict[str, str], code: dict[str, str]) -> str:
    differ = [(n, documented[n], code[n]) for n in sorted(documented.keys() & code.keys())
              if documented[n] != code[n]]
    return (f"in code, not documented: {sorted(set(code) - set(documented))}; "
            f"documented, not in code: {sorted(set(documented) - set(code))}; "
            f"type differs (name, documented, code): {differ}")


def doc_trial_kinds() -> dict[str, str]:
    """The trial table's documented columns except the `param_<flag>` rule row."""
    rows = documented_columns()["trial"]
    assert [r for r in rows if r[0] == "param_<flag>"], "the param_<flag> rule row is missing"
    return {n: k for n, k in _kinds(rows).items() if "<" not in n}


def doc_types() -> dict[str, list[str]]:
    """The Types table: kind -> [arrow, duckdb, pandas default, pandas pyarrow], the first
    backticked token of each cell."""
    table = next(rows for _, header, rows in _tables(DOC.read_text()) if header == TYPES_HEADER)
    return {cells[0]: [re.search(r"`([^`]+)`", c).group(1) for c in cells[1:]] for cells in table}


def test_trial_table_columns_are_the_code_schema():
    """Every trial column of the code (tiny_cpu space, default percentiles) is documented with
    its type, and nothing else is; `param_` columns are documented by rule."""
    space = load_search_space(ROOT / "search_spaces" / "tiny_cpu.yaml")
    code = {n: k for n, k in trial_columns(space, WorkloadSpec().percentiles)
            if not n.startswith("param_")}
    documented = doc_trial_kinds()
    assert documented == code, _diff(documented, code)


def test_request_table_columns_are_the_code_schema():
    """The request table is documented exactly as framework.results.rows.REQUEST_COLUMNS."""
    documented = _kinds(documented_columns()["request"])
    assert documented == dict(REQUEST_COLUMNS), _diff(documented, dict(REQUEST_COLUMNS))
    assert len(REQUEST_COLUMNS) == len(dict(REQUEST_COLUMNS))


def test_workloads_table_columns_are_the_code_schema():
    """The workloads table is documented as workload_columns() (default percentiles), its
    metric columns by the `<metric>` and `<class>.<metric>` rule rows."""
    rows = documented_columns()["workloads"]
    assert {r[0] for r in rows if "<" in r[0]} == {"<metric>", "<class>.<metric>"}
    documented = {n: k for n, k in _kinds(rows).items() if "<" not in n}
    trial = dict(trial_columns(load_search_space(ROOT / "search_spaces" / "tiny_cpu.yaml"),
                               WorkloadSpec().percentiles))
    code = dict(workload_columns(WorkloadSpec().percentiles))
    by_rule = {n: k for n, k in code.items() if n not in documented}
    assert by_rule and all(trial[n] == k for n, k in by_rule.items()), _diff(documented, code)
    assert documented == {n: k for n, k in code.items() if n in documented}, _diff(documented, code)


def test_every_documented_kind_is_a_store_kind_with_its_arrow_type():
    """Kinds in the column tables are framework.results.store.KINDS, and the Types table names each
    kind's Arrow type as store.py writes it."""
    used = {k for rows in documented_columns().values() for n, k, _, _ in rows if "<" not in n}
    assert used <= set(KINDS), used - set(KINDS)
    types = doc_types()
    assert set(types) == set(KINDS)
    for kind, (arrow, *_) in types.items():
        assert arrow == str(KINDS[kind]).replace("item: ", ""), kind


# One search-space parameter per row of the documented param_ rule table.
RULE_EXAMPLES = {
    "`type: int`": [{"type": "int", "low": 1, "high": 4}],
    "`type: float`": [{"type": "float", "low": 0.1, "high": 0.9}],
    "`type: bool`": [{"type": "bool"}],
    "`type: categorical`, every choice an int": [{"type": "categorical", "choices": [1, 2]}],
    "`type: categorical`, int and float choices": [{"type": "categorical", "choices": [1, 2.5]}],
    "`type: categorical`, every choice a bool": [{"type": "categorical", "choices": [True, False]}],
    "`type: categorical`, any other choices (strings, or mixed)": [
        {"type": "categorical", "choices": ["auto", "fp8"]},
        {"type": "categorical", "choices": [1, "auto"]},
        {"type": "categorical", "choices": [2, True]}],
}


def test_param_columns_follow_the_documented_rule():
    """`param_` + flag with '-' -> '_', typed as the rule table says."""
    rule = next(rows for _, header, rows in _tables(DOC.read_text()) if header == RULE_HEADER)
    documented = {cells[0]: cells[1] for cells in rule}
    assert set(documented) == set(RULE_EXAMPLES)
    assert param_column("max-num-seqs") == "param_max_num_seqs"
    for row, examples in RULE_EXAMPLES.items():
        for i, example in enumerate(examples):
            flag = f"some-flag-{i}"
            space = SearchSpace.model_validate({"parameters": {flag: example}})
            columns = dict(trial_columns(space, (50,)))
            assert columns[f"param_some_flag_{i}"] == documented[row], (row, example)


def test_pandas_turns_int_and_bool_columns_with_nulls_into_float_and_object(tmp_path):
    """What the Types table says about nulls: a FAIL row makes pandas' default `completed`
    float64 and `feasible` object; the pyarrow backend and DuckDB keep int and bool."""
    from tests.helpers import write_rows

    write_rows(tmp_path)  # trials of sweep "killed", one with fail_reason startup_crash
    folder = tmp_path / "killed" / "trials"
    default = pd.read_parquet(folder)
    assert default["completed"].isna().any() and default["feasible"].isna().any()
    assert str(default["completed"].dtype) == "float64"
    assert str(default["feasible"].dtype) == "object"
    backed = pd.read_parquet(folder, dtype_backend="pyarrow")
    assert str(backed["completed"].dtype) == doc_types()["int"][3]
    assert str(backed["feasible"].dtype) == doc_types()["bool"][3]
    duck = duckdb.sql(f"SELECT completed FROM read_parquet('{folder}/**/*.parquet', "
                      "hive_partitioning = true)").df()
    assert str(duck["completed"].dtype) == "Int64"


# --- one real sweep --------------------------------------------------------------------------

SWEEP = "docs"
SWEEP_SLA = {"p99_ttft_ms": 60000, "p99_tpot_ms": 1000}
PARAM_KINDS = {"param_max_num_seqs": "int", "param_gpu_memory_utilization": "float",
               "param_max_num_batched_tokens": "int", "param_kv_cache_dtype": "str",
               "param_enable_prefix_caching": "bool"}


@pytest.fixture(scope="module")
def sweep_dir(tiny_model):
    """results/docs of a 2-trial FakeEngine sweep on a private Ray (baseline + one sampled),
    over a space with an int, a float, two categoricals (int, str) and a bool parameter."""
    tmp = Path(tempfile.mkdtemp(prefix="vst-"))
    try:
        space = tmp / "space.yaml"
        space.write_text(yaml.safe_dump({"parameters": {
            "max-num-seqs": {"type": "int", "low": 2, "high": 8, "default": 4},
            "gpu-memory-utilization": {"type": "float", "low": 0.8, "high": 0.95,
                                       "default": 0.92},
            "max-num-batched-tokens": {"type": "categorical", "choices": [512, 1024],
                                       "default": 512},
            "kv-cache-dtype": {"type": "categorical", "choices": ["auto", "fp8"],
                               "default": "auto"},
            "enable-prefix-caching": {"type": "bool", "default": True},
        }}))
        sweep = tmp / f"{SWEEP}.yaml"
        sweep.write_text(yaml.safe_dump({
            "name": SWEEP, "model": str(tiny_model), "search_space": str(space), "engine": "fake",
            "gpu": "A100-80GB",  # the memory model fills the est_ columns
            "server": {"startup_timeout_s": 60,
                       "env": {"FAKE_ENGINE_STARTUP_S": "0.5", "FAKE_ENGINE_TTFT_MS": "20",
                               "FAKE_ENGINE_TPOT_MS": "2"}},
            "workload": {"num_prompts": 8, "input_len": 16, "output_len": 8, "max_concurrency": 2,
                         "warmup_requests": 0},
            "sla": SWEEP_SLA,  # request_goodput is set
            "search": {**NO_REMEASURE, "n_trials": 2, "seed": 1},
            "cluster": {"num_cpus": 2, "num_gpus": 2, "max_concurrent_trials": 1},
            "results_dir": str(tmp / "results"),
        }))
        marker = new_marker()
        res = run_cli(["run", str(sweep)], tmp, cli_env(marker, tmp), timeout_s=240)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert wait_no_marked_processes(marker) == []
        yield tmp / "results" / SWEEP
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _expected(table: str) -> dict[str, str]:
    docs = documented_columns()
    if table == "trials":  # + the `<sla key>_ci95_high` rule columns of this sweep's SLA
        kinds = {**doc_trial_kinds(), **PARAM_KINDS,
                 **{f"{key}_ci95_high": "float" for key in SWEEP_SLA}}
    else:
        kinds = _kinds(docs["request"])
    return {**kinds, **_kinds(docs["partition"])}


HIVE = ds.partitioning(pa.schema([("sweep", pa.string())]), flavor="hive")


@pytest.mark.server
@pytest.mark.timeout(300)
@pytest.mark.parametrize("table", ["trials", "requests"])
def test_tables_read_back_with_the_documented_types(sweep_dir, table):
    """pyarrow.dataset, pandas (default and pyarrow-backed) and DuckDB read exactly the
    documented columns, each with the type the Types table gives for its kind."""
    expected = _expected(table)
    types = doc_types()
    folder = sweep_dir / table

    dataset = ds.dataset(folder, format="parquet", partitioning=HIVE)
    arrow = dataset.to_table()
    assert arrow.num_rows >= 2
    read = dict.fromkeys(arrow.column_names, "?")
    assert set(read) == set(expected), _diff(expected, read)
    for name, kind in expected.items():
        assert arrow.schema.field(name).type == KINDS[kind], (name, arrow.schema.field(name).type)
    inferred = ds.dataset(folder, format="parquet", partitioning="hive").schema
    assert inferred.field("sweep").type == pa.string()
    assert set(arrow.column("sweep").to_pylist()) == {SWEEP}

    described = duckdb.sql(f"DESCRIBE SELECT * FROM read_parquet('{folder}/**/*.parquet', "
                           "hive_partitioning = true)").fetchall()
    duck = {row[0]: row[1] for row in described}
    assert set(duck) == set(expected)
    for name, kind in expected.items():
        assert duck[name] == types[kind][1], (name, duck[name])

    backed = pd.read_parquet(folder, dtype_backend="pyarrow")
    default = pd.read_parquet(folder)
    assert set(backed.columns) == set(default.columns) == set(expected)
    assert str(default["sweep"].dtype) == "category"
    for name, kind in expected.items():
        if name == "sweep":
            continue
        assert str(backed[name].dtype) == types[kind][3], (name, backed[name].dtype)
        has_null = bool(arrow.column(name).null_count)
        wanted = {"int": "float64", "bool": "object"}.get(kind) if has_null else None
        wanted = wanted or types[kind][2]
        if wanted == "str" and pd.__version__.startswith("2."):
            wanted = "object"  # pandas 2 has no default string dtype
        assert str(default[name].dtype) == wanted, (name, default[name].dtype)


def worked_queries() -> dict[str, str]:
    """The fenced blocks marked `# results-query: <reader>`, by reader."""
    blocks = re.findall(r"```python\n# results-query: (\w+)\n(.*?)```", DOC.read_text(), re.S)
    return dict(blocks)


@pytest.mark.server
@pytest.mark.timeout(300)
def test_the_worked_queries_run_on_a_real_sweep(sweep_dir):
    """Each worked query runs as written on the sweep's folder and returns rows; the pandas one
    recomputes p99 TTFT from the request rows equal to the trial row's."""
    queries = worked_queries()
    assert set(queries) == {"duckdb", "pandas", "pyarrow"}
    for reader, code in queries.items():
        assert code.count(QUERY_PATH) == 1, reader
        namespace: dict[str, object] = {}
        exec(compile(code.replace(QUERY_PATH, f'RESULTS = "{sweep_dir}"'), f"<{reader}>", "exec"),
             namespace)
        result = namespace["result"]
        assert len(result) >= 1, reader
        if reader == "pandas":
            assert result["difference_ms"].abs().max() < 1e-6, result
