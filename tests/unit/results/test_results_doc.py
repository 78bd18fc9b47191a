"""docs/RESULTS.md against the code, without a sweep: its column tables are the trial, request
and workloads schemas (a column added in code without docs, or in the docs only, fails), every
kind it names is a store kind with the Arrow type store.py writes, its `param_` rule is the
code's, and what it says pandas does to int and bool columns with nulls holds on stored rows.

The docs-parsing helpers here (documented_columns, doc_trial_kinds, column_kinds, doc_types,
kinds_diff) are also what tests/e2e/test_results_doc.py uses to check the types pandas, pyarrow
and DuckDB read back from a real sweep, and that the worked queries run on it."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pandas as pd

from framework.config.search_space import SearchSpace
from framework.config.search_space import load_search_space
from framework.config.specs import WorkloadSpec
from framework.results.rows import REQUEST_COLUMNS
from framework.results.rows import param_column
from framework.results.rows import trial_columns
from framework.results.store import KINDS
from framework.results.workload_rows import workload_columns
from tests.paths import ROOT
from tests.sweeps import write_rows

DOC = ROOT / "docs" / "RESULTS.md"
COLUMN_HEADER = ["column", "type", "unit", "meaning"]
RULE_HEADER = ["parameter in the search space", "column type"]
TYPES_HEADER = ["kind", "Parquet / Arrow", "DuckDB", "pandas `read_parquet` (default)",
                "pandas `dtype_backend=\"pyarrow\"`"]
SECTIONS = {"The trial table": "trial", "The request table": "request",
            "The workloads table": "workloads", "The partition column": "partition"}


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
    """(name, kind, unit, meaning) of each column table, by section (trial, request, workloads,
    partition)."""
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


def column_kinds(rows: list[tuple[str, str, str, str]]) -> dict[str, str]:
    """name -> kind of documented rows; each name once, its unit and meaning filled in."""
    names = [r[0] for r in rows]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"documented twice: {twice}"
    for name, _, unit, meaning in rows:
        assert unit and meaning, f"{name}: unit and meaning must be filled in"
    return {name: kind for name, kind, _, _ in rows}


def kinds_diff(documented: dict[str, str], code: dict[str, str]) -> str:
    """An assertion message: the names on one side only, and the names whose kinds differ."""
    differ = [(n, documented[n], code[n]) for n in sorted(documented.keys() & code.keys())
              if documented[n] != code[n]]
    return (f"in code, not documented: {sorted(set(code) - set(documented))}; "
            f"documented, not in code: {sorted(set(documented) - set(code))}; "
            f"type differs (name, documented, code): {differ}")


def doc_trial_kinds() -> dict[str, str]:
    """The trial table's documented columns except the `param_<flag>` rule row."""
    rows = documented_columns()["trial"]
    assert [r for r in rows if r[0] == "param_<flag>"], "the param_<flag> rule row is missing"
    return {n: k for n, k in column_kinds(rows).items() if "<" not in n}


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
    assert documented == code, kinds_diff(documented, code)


def test_request_table_columns_are_the_code_schema():
    """The request table is documented exactly as framework.results.rows.REQUEST_COLUMNS."""
    documented = column_kinds(documented_columns()["request"])
    assert documented == dict(REQUEST_COLUMNS), kinds_diff(documented, dict(REQUEST_COLUMNS))
    assert len(REQUEST_COLUMNS) == len(dict(REQUEST_COLUMNS))


def test_workloads_table_columns_are_the_code_schema():
    """The workloads table is documented as workload_columns() (default percentiles), its
    metric columns by the `<metric>` and `<class>.<metric>` rule rows."""
    rows = documented_columns()["workloads"]
    assert {r[0] for r in rows if "<" in r[0]} == {"<metric>", "<class>.<metric>"}
    documented = {n: k for n, k in column_kinds(rows).items() if "<" not in n}
    trial = dict(trial_columns(load_search_space(ROOT / "search_spaces" / "tiny_cpu.yaml"),
                               WorkloadSpec().percentiles))
    code = dict(workload_columns(WorkloadSpec().percentiles))
    by_rule = {n: k for n, k in code.items() if n not in documented}
    assert by_rule and all(trial[n] == k for n, k in by_rule.items()), kinds_diff(documented, code)
    assert documented == {n: k for n, k in code.items() if n in documented}, (
        kinds_diff(documented, code))


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


def test_pandas_turns_int_and_bool_columns_with_nulls_into_float_and_object(tmp_path: Path):
    """What the Types table says about nulls: a FAIL row makes pandas' default `completed`
    float64 and `feasible` object; the pyarrow backend and DuckDB keep int and bool."""
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
