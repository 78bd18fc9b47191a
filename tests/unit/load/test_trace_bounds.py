"""Hostile or corrupt trace files (#33 item 10): every bound of framework.load.trace gives one
line naming the file, the line and the field, with a huge value cut; never a traceback, nor a
prompt that fills memory. Values at a bound are still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from framework.base.errors import ConfigError
from framework.config.trace_spec import TimedTraceSpec
from framework.load.trace import HASH_ID_BOUND
from framework.load.trace import MAX_SECONDS
from framework.load.trace import MAX_TOKENS
from framework.load.trace import SHOWN
from framework.load.trace import read_trace
from framework.load.trace import shown

DEFAULT = TimedTraceSpec()
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
HUGE_INT = "9" * 5000  # Python's int() refuses 4,300+ digits
FIELD_LIMIT = 128 * 1024  # csv.field_size_limit()'s default


def row(timestamp: object = 0, input_length: object = 4, output_length: object = 2,
        hash_ids: str | None = None) -> str:
    """One JSONL row; values are written as given (a str as raw JSON)."""
    fields = {"timestamp": timestamp, "input_length": input_length,
              "output_length": output_length}
    text = ", ".join(f'"{k}": {v}' for k, v in fields.items())
    return "{" + text + (f', "hash_ids": {hash_ids}' if hash_ids is not None else "") + "}\n"


GOOD = row()


@pytest.mark.parametrize(("name", "text", "line", "key", "reason"), [
    ("t.jsonl", GOOD + row(input_length="1e15"), 2, "input_length", f"{MAX_TOKENS:,} tokens"),
    ("t.jsonl", row(output_length=MAX_TOKENS + 1), 1, "output_length", f"{MAX_TOKENS:,} tokens"),
    ("t.jsonl", row(input_length=HUGE_INT), 1, "input_length", f"{MAX_TOKENS:,} tokens"),
    ("t.jsonl", row(input_length="1e400"), 1, "input_length", f"{MAX_TOKENS:,} tokens"),
    ("t.jsonl", row(hash_ids=f"[1, {HUGE_INT}]"), 1, "hash_ids", "item 1 is not"),
    ("t.jsonl", row(hash_ids=f"[{HASH_ID_BOUND}]"), 1, "hash_ids", "item 0 is not"),
    ("t.jsonl", row(hash_ids=f"[0, 1, {-HASH_ID_BOUND - 1}]"), 1, "hash_ids", "item 2 is not"),
    ("t.jsonl", GOOD * 2 + row(timestamp="1e300"), 3, "timestamp", f"{MAX_SECONDS:,} s"),
    ("t.jsonl", row(timestamp=-MAX_SECONDS - 1), 1, "timestamp", f"{MAX_SECONDS:,} s"),
    ("t.jsonl", row(timestamp=1_700_000_000), 1, "timestamp", "epoch"),  # raw epoch seconds
    ("t.jsonl", row(timestamp=HUGE_INT), 1, "timestamp", f"{MAX_SECONDS:,} s"),
    ("t.jsonl", row(timestamp=f"-{HUGE_INT}"), 1, "timestamp", f"{MAX_SECONDS:,} s"),
    ("t.jsonl", "[" + "1, " * 1000 + "1]\n", 1, "(row)", "expected a JSON object"),
    ("t.csv", HEADER + f"1,2,3\n1,{MAX_TOKENS + 1},3\n", 3, "ContextTokens",
     f"{MAX_TOKENS:,} tokens"),
    ("t.csv", HEADER + f"1,2,{HUGE_INT}\n", 2, "GeneratedTokens", f"{MAX_TOKENS:,} tokens"),
    ("t.csv", HEADER + "1,2,3\n1e300,2,3\n", 3, "TIMESTAMP", f"{MAX_SECONDS:,} s"),
    ("t.csv", HEADER + f"{HUGE_INT},2,3\n", 2, "TIMESTAMP", "finite number"),
    ("t.csv", HEADER + "2023-11-16 18:15:46,2,3\n0001-01-01 00:00:00,2,3\n", 3, "TIMESTAMP",
     f"{MAX_SECONDS:,} s"),
    ("t.csv", HEADER + "2023-11-16 18:15:46,2,3\n2023-11-16 18:15:47+00:00,2,3\n", 3,
     "TIMESTAMP", "with and without a time zone"),
    ("t.csv", HEADER + "2023-11-16 18:15:46+01:00,2,3\n2023-11-16 18:15:47,2,3\n", 3,
     "TIMESTAMP", "with and without a time zone"),
    ("t.csv", HEADER + "1,2,3\n1,2,3\n" + "x" * (FIELD_LIMIT + 1) + ",2,3\n", 4, "(row)",
     "field larger than field limit"),
    ("t.csv", HEADER + '1,2,3\n"' + "x" * (FIELD_LIMIT + 1) + '",2,3\n', 3, "(row)",
     "field larger than field limit"),
    ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens," + "x" * (FIELD_LIMIT + 1) + "\n", 1,
     "(header)", "field larger than field limit"),
])
def test_a_hostile_row_is_one_bounded_line(tmp_path: Path, name: str, text: str, line: int,
                                           key: str, reason: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_trace(path, DEFAULT)
    message = str(err.value)
    assert (err.value.file, err.value.key) == (f"{path}:{line}", key)
    assert reason in err.value.reason and "\n" not in message
    # the value is cut: the line stays short whatever the row holds
    assert len(message) < len(str(path)) + len(key) + len(err.value.reason) + SHOWN + 60


def test_a_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(HEADER.encode() + b"1,2,\xff\n")
    with pytest.raises(ConfigError, match="not UTF-8") as err:
        read_trace(path, DEFAULT)
    assert err.value.file == str(path) and "\n" not in str(err.value)


def test_values_at_the_bounds_are_read(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(row(timestamp=MAX_SECONDS, input_length=MAX_TOKENS, output_length=MAX_TOKENS,
                        hash_ids=f"[{HASH_ID_BOUND - 1}, {-HASH_ID_BOUND}]")
                    + row(timestamp=-MAX_SECONDS, input_length=float(MAX_TOKENS)))
    rows = read_trace(path, DEFAULT)
    assert [(r.timestamp_s, r.input_length, r.output_length, r.hash_ids) for r in rows] == [
        (MAX_SECONDS, MAX_TOKENS, MAX_TOKENS, (HASH_ID_BOUND - 1, -HASH_ID_BOUND)),
        (-MAX_SECONDS, MAX_TOKENS, 2, None)]


def test_the_time_bound_applies_after_sec_multiplier(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    millis = MAX_SECONDS * 1000  # within the bound once read as milliseconds
    path.write_text(row(timestamp=millis))
    assert read_trace(path, TimedTraceSpec(sec_multiplier=0.001))[0].timestamp_s == \
        pytest.approx(MAX_SECONDS)
    with pytest.raises(ConfigError, match="beyond the bound"):
        read_trace(path, DEFAULT)


def test_csv_date_times_in_one_time_zone_kind_are_read(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "2023-11-16 18:15:46+00:00,2,3\n2023-11-16 19:15:50+01:00,2,3\n")
    assert [r.timestamp_s for r in read_trace(path, DEFAULT)] == pytest.approx([0.0, 4.0])


@pytest.mark.parametrize(("value", "expected"), [
    (7, "7"),
    ("x" * (SHOWN - 2), repr("x" * (SHOWN - 2))),  # its repr, quotes and all, is SHOWN long
    ("x" * (SHOWN - 1), f"'{'x' * (SHOWN - 1)}... ({SHOWN + 1} characters)"),
    ([1] * 1000, f"{repr([1] * 1000)[:SHOWN]}... ({len(repr([1] * 1000)):,} characters)"),
])
def test_shown_cuts_a_long_repr(value: object, expected: str) -> None:
    assert repr(shown(value)) == expected


def test_the_json_of_a_good_trace_is_unchanged(tmp_path: Path) -> None:
    rows = [{"timestamp": 1.5, "input_length": 40, "output_length": 9,
             "hash_ids": [0, 12345678901234567]}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_trace(path, DEFAULT)[0].hash_ids == (0, 12345678901234567)
