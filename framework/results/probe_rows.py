"""The quality probe's table (`results/<sweep>/probes/trial-NNNNN.parquet`): one row per probe
prompt and run, so a resumed sweep compares new trials with the same baseline answers, and
anyone can see which tokens changed. Pure (the store writes and reads the rows).

Runs: 0 is a trial's probe at the probe's concurrency (the baseline's run 0 is the reference
every trial is compared with); 1 is the baseline's second run, at concurrency 1 (its
self-agreement: framework.trial.quality).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from framework.load.probe import ProbeAnswer

PROBE_COLUMNS: list[tuple[str, str]] = [
    ("trial_number", "int"), ("is_baseline", "bool"), ("run", "int"), ("concurrency", "int"),
    ("prompt_index", "int"), ("token_ids", "list<int>"), ("logprobs", "list<float>"),
]


def probe_rows(number: int, is_baseline: bool,
               runs: Sequence[tuple[int, Sequence[ProbeAnswer]]]) -> list[dict[str, object]]:
    """Rows of trial `number`'s probe runs, given as (concurrency, answers) in run order."""
    return [{"trial_number": number, "is_baseline": is_baseline, "run": run,
             "concurrency": concurrency, "prompt_index": index,
             "token_ids": list(answer.token_ids), "logprobs": list(answer.logprobs)}
            for run, (concurrency, answers) in enumerate(runs)
            for index, answer in enumerate(answers)]


def stored_reference(rows: Sequence[Mapping[str, Any]]
                     ) -> tuple[int, tuple[ProbeAnswer, ...], tuple[ProbeAnswer, ...]] | None:
    """(trial number, run 0, run 1) of the first baseline trial that stored both runs, the
    answers in prompt order; None if no baseline did."""
    runs: dict[tuple[int, int], dict[int, ProbeAnswer]] = {}
    for row in rows:
        if row["is_baseline"]:
            key = (int(row["trial_number"]), int(row["run"]))
            runs.setdefault(key, {})[int(row["prompt_index"])] = ProbeAnswer(
                tuple(int(i) for i in row["token_ids"]), tuple(float(v) for v in row["logprobs"]))
    for number in sorted({n for n, _ in runs}):
        first, second = runs.get((number, 0)), runs.get((number, 1))
        if first and second and len(first) == len(second):
            return (number, tuple(first[i] for i in sorted(first)),
                    tuple(second[i] for i in sorted(second)))
    return None
