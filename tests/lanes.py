"""The order in which pytest-xdist hands test files to its lanes (`make test`: `-n 2 --dist
loadfile --no-loadscope-reorder`): the costliest files first, so that no lane starts a long file
while the other has nothing left (longest-processing-time-first; a lane holds its current file
and at most one queued file, xdist/scheduler/loadscope.py `_reschedule`).

A file's cost is its seconds in tests/durations.json (junit seconds of a clean-clone run, per
file, written by `python -m benchmarks.suite_durations <junit.xml>`); a file not in the table
(new since) counts as NEW_FILE_S, which puts it among the middling e2e files. Only the order
changes: every collected test still runs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

DURATIONS = Path(__file__).with_name("durations.json")
NEW_FILE_S = 30.0


def file_costs(path: Path = DURATIONS) -> dict[str, float]:
    """{file path relative to the repo: seconds}; {} if the table is missing."""
    if not path.is_file():
        return {}
    return {str(k): float(v) for k, v in json.loads(path.read_text())["seconds"].items()}


def costliest_first(files: Sequence[str], costs: Mapping[str, float]) -> list[str]:
    """`files` (each once, in first-seen order) sorted by cost, highest first; equal costs keep
    their collection order (a stable sort), so the order is the same in every lane."""
    unique = list(dict.fromkeys(files))
    return sorted(unique, key=lambda f: -costs.get(f, NEW_FILE_S))
