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
changes: every collected test still runs.

Wait lanes (`make test`: `--wait-lanes 1`, one lane beyond LANES): the suite is CPU-bound, but
some files mostly wait on wall-clock events (FakeEngine loads at fixed rates, an autoscaler's
rounds, trial deadlines): their core-seconds (the CPU ledger's, benchmarks/suite_cpu.py, in the
table's `cores`) are at most WAITING_SHARE of their seconds. A wait lane runs such scopes first
(`waiting_scopes`), beside the others, so they no longer hold a lane the CPU-bound files need,
then the remaining ones that need the CPU least; the other lanes take waiting scopes too once
nothing else is left (`next_scope`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

DURATIONS = Path(__file__).with_name("durations.json")
NEW_FILE_S = 30.0
# A scope whose core-seconds are at most this share of its seconds mostly waits (the two-lane
# runs of session 22: 0.31-0.54 for the waiting files, 0.64-1.38 for the rest).
WAITING_SHARE = 0.55
WAITING_MIN_S = 5.0  # a scope shorter than this is not judged: the ledger samples once a second
# Once no waiting scope is left, a wait lane takes those up to this share, the lowest first (the
# real-vLLM files, 0.73-1.38 in s23a/s23b, stay in the other lanes).
WAIT_LANE_MAX_SHARE = 0.7
# The files that use `vllm_server` (tests/e2e/conftest.py: a real vLLM CPU server, ~40 core-s
# to start; docs/BENCHMARKS.md, session 15): one lane starts it.
GROUPS: dict[str, tuple[str, ...]] = {
    "vllm_server": ("tests/e2e/test_bench.py", "tests/e2e/test_engine_contract.py",
                    "tests/e2e/test_multi_turn.py", "tests/e2e/test_zygote_vllm.py"),
}


def scope_of(file: str) -> str:
    """The lane scope of a test file (repo-relative path): its group's name, else the file."""
    return next((name for name, files in GROUPS.items() if file in files), file)


def file_costs(path: Path = DURATIONS, column: str = "seconds") -> dict[str, float]:
    """{file path relative to the repo: seconds} (or the table's `cores`: core-seconds); {} if
    the table or the column is missing."""
    if not path.is_file():
        return {}
    table = json.loads(path.read_text()).get(column, {})
    return {str(k): float(v) for k, v in table.items()}


def cpu_shares(seconds: Mapping[str, float], cores: Mapping[str, float]) -> dict[str, float]:
    """{scope (scope_of): its files' core-seconds / their seconds} for the scopes of at least
    WAITING_MIN_S seconds whose files are all in both tables (the others are not judged)."""
    sums: dict[str, list[float]] = {}
    unknown: set[str] = set()
    for f in set(seconds) | set(cores):
        scope = scope_of(f)
        if f not in seconds or f not in cores:
            unknown.add(scope)
            continue
        total = sums.setdefault(scope, [0.0, 0.0])
        total[0] += seconds[f]
        total[1] += cores[f]
    return {scope: cpu / wall for scope, (wall, cpu) in sums.items()
            if scope not in unknown and wall >= WAITING_MIN_S}


def waiting_scopes(seconds: Mapping[str, float], cores: Mapping[str, float]) -> set[str]:
    """The judged scopes (cpu_shares) whose share is at most WAITING_SHARE: they mostly wait."""
    return {scope for scope, share in cpu_shares(seconds, cores).items() if share <= WAITING_SHARE}


def next_scope(queue: Sequence[str], shares: Mapping[str, float], wait_lane: bool,
               with_wait_lanes: bool) -> str | None:
    """The scope a lane takes next from `queue` (costliest first), given the judged scopes' CPU
    shares (cpu_shares):
    - a wait lane: the first waiting one (share <= WAITING_SHARE); once none is left, the one of
      the lowest share up to WAIT_LANE_MAX_SHARE (the lane stays busy with what needs the CPU
      least); else None: the lane ends;
    - another lane, when the run has wait lanes: the first that is not waiting, else the first;
    - without wait lanes: the first (xdist's order)."""
    def waiting(scope: str) -> bool:
        return scope in shares and shares[scope] <= WAITING_SHARE

    if wait_lane:
        light = [s for s in queue if s in shares and shares[s] <= WAIT_LANE_MAX_SHARE]
        return next((s for s in light if waiting(s)),
                    min(light, key=lambda s: shares[s]) if light else None)
    if with_wait_lanes:
        return next((s for s in queue if not waiting(s)), queue[0] if queue else None)
    return queue[0] if queue else None


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
