"""The order in which pytest-xdist hands test files to its lanes (`make test`: `-n 2 --dist
loadfile --no-loadscope-reorder`): the costliest files first, so that no lane starts a long file
while the other has nothing left (longest-processing-time-first; a lane holds its current file
and at most one queued file, xdist/scheduler/loadscope.py `_reschedule`).

Files that share a lane's costly session fixture form one scope (GROUPS): xdist hands the whole
group to one lane (tests/conftest.py's scheduler), so the fixture starts once in the suite, not
once per lane that runs one of them. A scope's cost is the sum of its files'.

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
# The files that use `vllm_server` (tests/e2e/conftest.py: a real vLLM CPU server, ~40 core-s
# to start; docs/BENCHMARKS.md, session 15): one lane starts it.
GROUPS: dict[str, tuple[str, ...]] = {
    "vllm_server": ("tests/e2e/test_bench.py", "tests/e2e/test_engine_contract.py",
                    "tests/e2e/test_multi_turn.py", "tests/e2e/test_zygote_vllm.py"),
}


def scope_of(file: str) -> str:
    """The lane scope of a test file (repo-relative path): its group's name, else the file."""
    return next((name for name, files in GROUPS.items() if file in files), file)


def file_costs(path: Path = DURATIONS) -> dict[str, float]:
    """{file path relative to the repo: seconds}; {} if the table is missing."""
    if not path.is_file():
        return {}
    return {str(k): float(v) for k, v in json.loads(path.read_text())["seconds"].items()}


def costliest_first(files: Sequence[str], costs: Mapping[str, float]) -> list[str]:
    """`files` (each once, in first-seen order) sorted by their scope's cost (scope_of: the sum
    of its files' costs), highest first, a scope's files together in first-seen order; equal
    costs keep the collection order (a stable sort), so the order is the same in every lane."""
    unique = list(dict.fromkeys(files))
    scope_cost: dict[str, float] = {}
    for f in unique:
        scope_cost[scope_of(f)] = scope_cost.get(scope_of(f), 0.0) + costs.get(f, NEW_FILE_S)
    scopes = sorted(dict.fromkeys(scope_of(f) for f in unique), key=lambda s: -scope_cost[s])
    rank = {scope: n for n, scope in enumerate(scopes)}
    return sorted(unique, key=lambda f: rank[scope_of(f)])
