"""Where a server's "process start and imports" phase goes, process by process (issue #19),
from finished sweeps' trial logs and rows.

    .venv/bin/python benchmarks/import_split.py results/<sweep> [more sweep dirs] [--no-doc]

For each trial that started its own server (a row with startup_imports_s), spans between the
first log line of each vLLM process (framework.engine.startup_log.process_starts) in the
trial's log (results/<sweep>/logs/trial-NNNNN.log):
- actor: imports phase - (first "Starting to load model" - serve mark): the server actor's
  own process start and imports before `serve` runs (Ray worker, framework);
- API server: serve mark -> the API server's first line (its imports of torch and vLLM);
- EngineCore: the API server's first line -> EngineCore's first line (the API server's
  configuration, then EngineCore's process start and imports);
- worker: EngineCore's first line -> the worker's first line (likewise);
- to load: the worker's first line -> "Starting to load model".
They add up to the imports phase. Prints median [min-max] over trials, appends to
docs/BENCHMARKS.md unless --no-doc.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from datetime import UTC
from datetime import datetime
from pathlib import Path

import pandas as pd

try:
    from record import append_section
    from record import uptime
except ModuleNotFoundError:  # imported as benchmarks.import_split
    from benchmarks.record import append_section
    from benchmarks.record import uptime

from framework.engine.startup_log import process_starts
from framework.engine.startup_log import read_marks

SPANS = ("actor", "API server", "EngineCore", "worker", "to load")


def split(log: str, imports_s: float) -> dict[str, float] | None:
    """The spans of one trial's imports phase (module docstring); None if a line is missing."""
    starts, marks = process_starts(log), read_marks(log)
    worker = min((v for k, v in starts.items() if k.endswith("Worker")), default=None)
    points = [starts.get("serve_mark"), starts.get("APIServer"), starts.get("EngineCore"),
              worker, marks.imports_end]
    if any(p is None for p in points):
        return None
    gaps = [b - a for a, b in zip(points, points[1:])]
    return dict(zip(SPANS, [imports_s - sum(gaps), *gaps]))


def trial_splits(sweep_dir: Path) -> list[dict[str, float]]:
    rows = pd.read_parquet(sweep_dir / "trials")
    found = []
    for row in rows[rows["startup_imports_s"].notna()].itertuples():
        log = sweep_dir / "logs" / f"trial-{int(row.trial_number):05d}.log"
        if log.exists() and (got := split(log.read_text(errors="replace"),
                                          float(row.startup_imports_s))):
            found.append(got)
    return found


def table(splits: list[dict[str, float]]) -> str:
    lines = ["| span | s, median [min-max] | share of the imports phase |", "|---|---:|---:|"]
    total = statistics.median(sum(s.values()) for s in splits)
    for span in SPANS:
        values = [s[span] for s in splits]
        med = statistics.median(values)
        lines.append(f"| {span} | {med:.2f} [{min(values):.2f}-{max(values):.2f}] | "
                     f"{med / total:.0%} |")
    lines.append(f"| imports phase | {total:.2f} | 100% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dirs", nargs="+", type=Path)
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    started = datetime.now(UTC)
    splits = [s for d in args.sweep_dirs for s in trial_splits(d)]
    if not splits:
        sys.exit("no trial with a start-up log and an imports phase in " +
                 ", ".join(map(str, args.sweep_dirs)))
    text = table(splits)
    print(text)
    if not args.no_doc:
        append_section("The imports phase, process by process (issue #19)",
                       f"`benchmarks/import_split.py {' '.join(map(str, args.sweep_dirs))}`: "
                       f"{len(splits)} fresh servers. Load now: `{uptime()}`.", text, started)


if __name__ == "__main__":
    main()
