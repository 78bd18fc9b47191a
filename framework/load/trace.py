"""Timed traces: the rows of a trace file and when each request is sent.

Formats (the file's suffix decides: ``.csv`` is CSV, anything else JSONL, as vLLM reads any
file as JSONL):
- JSONL, vLLM 0.32's ``--dataset-name timed_trace`` (``vllm/benchmarks/datasets/datasets.py``,
  TimedTrace): one object per line with ``timestamp``, ``input_length``, ``output_length`` and
  optionally ``hash_ids`` (a list of ints, each standing for ``chunk_hash_size`` tokens;
  Mooncake's traces). Blank lines are skipped (vLLM would fail on them).
- CSV with a header, Azure's LLM inference traces: ``TIMESTAMP`` (a number, or a date-time such
  as ``2023-11-16 18:15:46.6805900``), ``ContextTokens``, ``GeneratedTokens``; no hash ids.
The field names can be relabelled (config.trace_spec.TimedTraceSpec: the sweep's
``timed_trace:`` section, bench's --timed-trace-label-* flags).

Times: a numeric timestamp t is ``t x sec_multiplier`` seconds from the start of the run, as
vLLM reads it (not shifted: a trace whose first timestamp is 5 s waits 5 s first); a date-time
is the seconds since the first row's, times ``sec_multiplier``. Requests are sent in file
order: vLLM's get_request (``vllm/benchmarks/serve.py``, self_timed) sleeps until each
request's time, so one whose time has already passed goes at once, after the one before it.
``send_offsets`` states that schedule.

Any bad row is a ConfigError naming ``file:line``, the field and its value (cut to SHOWN
characters). A hostile or corrupt file gets such an error too, never a traceback or a prompt
that fills memory: input and output lengths are at most MAX_TOKENS, hash ids fit 64 bits,
a row is due within MAX_SECONDS of the start (either way), CSV date-times all carry a time
zone or none, and a CSV field over Python's csv limit (128 KiB) names its line. Stdlib only
(the bench parser is built from ``add_cli_args`` without importing anything heavy).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import cast

from framework.base.errors import ConfigError

if TYPE_CHECKING:
    from framework.config.trace_spec import TimedTraceSpec

# field -> (JSONL name, vLLM's default; CSV name, Azure's): used where a label is not given
JSONL_LABELS = {"timestamp": "timestamp", "input_length": "input_length",
                "output_length": "output_length", "hash_ids": "hash_ids"}
CSV_LABELS = {"timestamp": "TIMESTAMP", "input_length": "ContextTokens",
              "output_length": "GeneratedTokens", "hash_ids": None}


# A row's input or output length is at most this many tokens: 10 million, the longest context
# of any model (Llama 4 Scout's 10M); more is a corrupt trace, whose prompt (a list of token
# ids, about 8 bytes each) would take gigabytes to build.
MAX_TOKENS = 10_000_000
# A hash id is a 64-bit signed integer, as Mooncake's traces and every Parquet/Arrow int64 hold.
HASH_ID_BOUND = 2**63
# A row is due at most 366 days from the start of the run (either way): the longest public LLM
# traces (Azure's) span a week; a raw epoch time (~1.7e9 s: 54 years of waiting) is refused.
MAX_SECONDS = 366 * 24 * 3600
# Digits a JSON integer may have before it is kept as text: 2**63 has 19, and Python's int()
# refuses 4,300 (a traceback); a longer one is refused by every field's check.
_MAX_DIGITS = 40
# A value shown in an error is cut to this many characters of its repr.
SHOWN = 80


class _Shown(str):
    """A value's repr, cut: shown as is in an error (no quotes added)."""

    def __repr__(self) -> str:
        return str(self)


class _LongNumber(str):
    """A JSON integer of more than _MAX_DIGITS digits, kept as its text (shown unquoted)."""

    def __repr__(self) -> str:
        return str(self)


def shown(value: Any) -> Any:
    """``value`` itself when its repr is at most SHOWN characters, else that repr cut, with its
    length. Pure."""
    text = repr(value)
    if len(text) <= SHOWN:
        return value
    return _Shown(f"{text[:SHOWN]}... ({len(text):,} characters)")


def _json_int(text: str) -> int | str:
    return int(text) if len(text.lstrip("-")) <= _MAX_DIGITS else _LongNumber(text)


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace: its line in the file, when it is due (seconds from the start,
    sec_multiplier applied), its lengths, and its hash ids (None: the row has none)."""

    line: int
    timestamp_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None = None


def is_csv(path: Path) -> bool:
    return Path(path).suffix.lower() == ".csv"


def labels(settings: TimedTraceSpec, csv_format: bool) -> dict[str, str | None]:
    """The field name of each of timestamp, input_length, output_length, hash_ids: the
    settings' label, else the format's default (JSONL_LABELS / CSV_LABELS)."""
    defaults = CSV_LABELS if csv_format else JSONL_LABELS
    return {key: getattr(settings, f"label_{key}") or default for key, default in defaults.items()}


def _fail(where: str, key: str, value: Any, reason: str) -> ConfigError:
    return ConfigError(where, key, shown(value), reason)


def _whole(where: str, key: str, value: Any) -> int:
    """A count in [1, MAX_TOKENS]: an int, an integral float, or (CSV) a string of one."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise _fail(where, key, value, "expected a whole number >= 1") from None
    if isinstance(number, bool) or not isinstance(number, int | float) or math.isnan(number) \
            or number < 1 or (math.isfinite(number) and number != int(number)):
        raise _fail(where, key, value, "expected a whole number >= 1")
    if number > MAX_TOKENS:
        raise _fail(where, key, value, f"more than {MAX_TOKENS:,} tokens, the bound on a "
                    "trace's lengths (no model's context is longer)")
    return int(number)


def _seconds(where: str, key: str, value: Any) -> float:
    """A finite number; a JSON integer too long for int() as a float (maybe inf: _due refuses)."""
    if isinstance(value, _LongNumber):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(where, key, value, "expected a finite number (or, in a CSV, a date-time)")
    return float(value)


def _due(where: str, key: str, value: Any, seconds: float) -> float:
    """``seconds`` (from the start, sec_multiplier applied) when within MAX_SECONDS."""
    if not abs(seconds) <= MAX_SECONDS:
        raise _fail(where, key, value, f"due {seconds:.4g} s from the start (timestamp x "
                    f"sec_multiplier), beyond the bound of {MAX_SECONDS:,} s (366 days); "
                    "rebase epoch timestamps to start at 0")
    return seconds


def _hash_ids(where: str, key: str, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _fail(where, key, value, "expected a list of integers")
    for i, h in enumerate(value):
        if not isinstance(h, int) or isinstance(h, bool) \
                or not -HASH_ID_BOUND <= h < HASH_ID_BOUND:
            raise _fail(where, key, h, f"expected a list of integers of 64 bits (-2**63 <= "
                        f"id < 2**63); item {i} is not")
    return tuple(value) or None


def _missing(where: str, key: str, row: dict[str, Any], field: str) -> ConfigError:
    return _fail(where, key, None, f"no such field in this row (fields: {list(row)}); name the "
                 f"{field} field with label_{field} (--timed-trace-label-{field.replace('_', '-')})")


def _jsonl_rows(path: Path, names: dict[str, str | None], multiplier: float,
                limit: int | None) -> Iterator[TraceRow]:
    with path.open(encoding="utf-8") as fh:
        count = 0
        for line_no, text in enumerate(fh, start=1):
            if limit is not None and count >= limit:
                return
            if not text.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                row = json.loads(text, parse_int=_json_int)
            except json.JSONDecodeError as exc:
                raise _fail(where, "(row)", text.strip(), f"not JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise _fail(where, "(row)", row, "expected a JSON object")
            values = {}
            for field in ("timestamp", "input_length", "output_length"):
                key = str(names[field])
                if row.get(key) is None:
                    raise _missing(where, key, row, field)
                values[field] = row[key]
            ids_key = str(names["hash_ids"])
            count += 1
            stamp_key = str(names["timestamp"])
            seconds = _seconds(where, stamp_key, values["timestamp"]) * multiplier
            yield TraceRow(line=line_no,
                           timestamp_s=_due(where, stamp_key, values["timestamp"], seconds),
                           input_length=_whole(where, str(names["input_length"]),
                                               values["input_length"]),
                           output_length=_whole(where, str(names["output_length"]),
                                                values["output_length"]),
                           hash_ids=_hash_ids(where, ids_key, row.get(ids_key)))


def _csv_time(where: str, key: str, value: str) -> float | datetime:
    try:
        return _seconds(where, key, float(value))
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value.strip())
    except ValueError:
        raise _fail(where, key, value, "expected a number or a date-time such as "
                    "2023-11-16 18:15:46.6805900") from None


def _csv_records(path: Path, reader: csv.DictReader[str]) -> Iterator[dict[str, str | None]]:
    """The reader's rows; csv.Error (a field over csv.field_size_limit(), 128 KiB) as a
    ConfigError naming the line it was read at."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # line_num counts the lines read whole: the bad one is next
            raise _fail(f"{path}:{reader.line_num + 1}", "(row)", None,
                        f"unreadable CSV: {exc}") from None
        yield cast(dict[str, str | None], row)


def _csv_header(path: Path, reader: csv.DictReader[str]) -> Sequence[str]:
    try:
        return reader.fieldnames or []
    except csv.Error as exc:
        raise _fail(f"{path}:{reader.line_num + 1}", "(header)", None,
                    f"unreadable CSV: {exc}") from None


def _csv_rows(path: Path, names: dict[str, str | None], multiplier: float,
              limit: int | None) -> Iterator[TraceRow]:
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        header = _csv_header(path, reader)
        for field in ("timestamp", "input_length", "output_length"):
            if names[field] not in header:
                raise _fail(f"{path}:1", str(names[field]), None,
                            f"no such column (columns: {header}); name the {field} column with "
                            f"label_{field} (--timed-trace-label-{field.replace('_', '-')})")
        first: float | datetime | None = None
        count = 0
        for row in _csv_records(path, reader):
            if limit is not None and count >= limit:
                return
            where = f"{path}:{reader.line_num}"
            key = str(names["timestamp"])
            stamp = _csv_time(where, key, row[key] or "")
            first = stamp if first is None else first
            if isinstance(stamp, datetime) != isinstance(first, datetime):
                raise _fail(where, key, row[key], "mixes numbers and date-times in one column")
            if isinstance(stamp, datetime) and isinstance(first, datetime) \
                    and (stamp.tzinfo is None) != (first.tzinfo is None):
                raise _fail(where, key, row[key], "mixes date-times with and without a time "
                            f"zone in one column (the first row's: {first.isoformat()})")
            seconds = ((stamp - cast(datetime, first)).total_seconds()
                       if isinstance(stamp, datetime) else float(stamp))
            count += 1
            yield TraceRow(line=reader.line_num,
                           timestamp_s=_due(where, key, row[key], seconds * multiplier),
                           input_length=_whole(where, str(names["input_length"]),
                                               row[str(names["input_length"])]),
                           output_length=_whole(where, str(names["output_length"]),
                                                row[str(names["output_length"])]))


def read_trace(path: Path, settings: TimedTraceSpec, limit: int | None = None) -> list[TraceRow]:
    """The first ``limit`` rows (all if None) of a JSONL or CSV trace, in file order (vLLM
    takes the first --num-prompts lines). ConfigError naming ``file:line``, field and value on
    a bad row, or ``file`` when the file is missing or holds no row."""
    path = Path(path)
    if not path.is_file():
        raise _fail(str(path), "dataset_path", str(path), "file not found")
    csv_format = is_csv(path)
    read = _csv_rows if csv_format else _jsonl_rows
    try:
        rows = list(read(path, labels(settings, csv_format), settings.sec_multiplier, limit))
    except UnicodeDecodeError as exc:
        raise _fail(str(path), "dataset_path", str(path),
                    f"not UTF-8 text ({exc.reason})") from None
    if not rows and limit != 0:
        raise _fail(str(path), "dataset_path", str(path), "the trace holds no request")
    return rows


def send_offsets(rows: Sequence[TraceRow], speed_up: float = 1.0) -> list[float]:
    """When each request is sent, in seconds from the start of the run: vLLM's self-timed
    schedule, offset_i = max(0, t_0, ..., t_i) / speed_up (t = timestamp x sec_multiplier;
    in file order, a request due earlier than the one before it goes right after it).
    speed_up 2 replays the trace twice as fast (vllm bench: --timed-trace-sec-multiplier
    halved). Pure."""
    if not speed_up > 0:
        raise ValueError(f"speed_up must be > 0, got {speed_up}")
    offsets, latest = [], 0.0
    for row in rows:
        latest = max(latest, row.timestamp_s)
        offsets.append(latest / speed_up)
    return offsets


def mean_rate(rows: Sequence[TraceRow]) -> float:
    """A trace's mean request rate at speed-up 1: requests / (latest - earliest timestamp),
    timestamps in seconds (sec_multiplier applied). ValueError when the span is 0 (one row, or
    every row due at once: no rate). Pure."""
    stamps = [row.timestamp_s for row in rows]
    span = max(stamps, default=0.0) - min(stamps, default=0.0)
    if not span > 0:
        raise ValueError(f"its {len(stamps)} request(s) span 0 s of timestamps: no mean rate")
    return len(stamps) / span


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """vllm bench serve's "timed-trace dataset options" (same names; the label flags default
    to None: the format's own names, vLLM's for JSONL, Azure's for CSV)."""
    g = p.add_argument_group("timed-trace dataset options")
    g.add_argument("--timed-trace-chunk-hash-size", type=int, default=16,
                   help="tokens each hash id stands for (default 16; Mooncake's traces: 512)")
    g.add_argument("--timed-trace-sec-multiplier", type=float, default=1.0,
                   help="timestamps x this = seconds (0.001 for milliseconds; 0.5 replays twice "
                        "as fast)")
    for field, jsonl in JSONL_LABELS.items():
        csv_name = CSV_LABELS[field]
        g.add_argument(f"--timed-trace-label-{field.replace('_', '-')}", default=None,
                       help=f"field holding the {field.replace('_', ' ')} (default: {jsonl}"
                            + (f"; {csv_name} in a CSV)" if csv_name else "; none in a CSV)"))
    p.add_argument("--self-timed", action=argparse.BooleanOptionalAction, default=None,
                   help="timed_trace: send at the trace's timestamps (default) or, with "
                        "--no-self-timed, at --request-rate")


def self_timed(args: argparse.Namespace, endpoint: str, where: str) -> bool:
    """Whether the bench run follows the trace's timestamps: vllm bench's rule (serve.py,
    main_async): --self-timed / --no-self-timed only with timed_trace, on by default there.
    timed_trace sends token ids, so the completions endpoint only. ConfigError otherwise."""
    trace = args.dataset_name == "timed_trace"
    if args.self_timed is not None and not trace:
        raise ConfigError(where, "--self-timed", args.self_timed,
                          "only with --dataset-name timed_trace")
    if trace and endpoint != "completions":
        raise ConfigError(where, "--endpoint", endpoint, "timed_trace sends token-id prompts: "
                          "completions only (as vllm bench)")
    return trace and args.self_timed is not False


def settings_from_args(args: argparse.Namespace, where: str) -> TimedTraceSpec:
    """The timed-trace flags of parsed ``args`` as a TimedTraceSpec; ConfigError(where, --flag,
    value) for a value it refuses (a chunk size or multiplier <= 0)."""
    from pydantic import ValidationError

    from framework.config.trace_spec import TimedTraceSpec

    values = {name: getattr(args, f"timed_trace_{name}")
              for name in ("chunk_hash_size", "sec_multiplier", *(f"label_{f}" for f in
                                                                   JSONL_LABELS))}
    try:
        return TimedTraceSpec(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0])
        raise ConfigError(where, "--timed-trace-" + name.replace("_", "-"), values[name],
                          error["msg"]) from None
