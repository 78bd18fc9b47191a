"""Per-file seconds of a pytest run, for the lane order (tests/lanes.py, tests/durations.json),
and per-file core-seconds, for its wait lanes.

    python -m benchmarks.suite_durations JUNIT.xml [--cores LEDGER/report.json] \
        [--out tests/durations.json]

JUNIT.xml is pytest's `--junitxml` of a full run (a clean-clone `bash .ci/run` with
PYTEST_ADDOPTS=--junitxml=...). A file's seconds are the sum of its test cases' `time`
(setup + call + teardown, as pytest's junit reporter records it). --cores: the same run's CPU
ledger (benchmarks/suite_cpu.py `report`, its report.json), whose per-file core-seconds go in
the table's `cores`."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def seconds_per_file(junit: Path) -> dict[str, float]:
    """{tests/…/test_x.py: seconds}; a case's file is its `file` attribute, or its classname
    read as a module path (tests.e2e.test_x[.Class])."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("file")
        if not name:
            parts = (case.get("classname") or "").split(".")
            while parts and not parts[-1].startswith("test_"):
                parts.pop()
            name = "/".join(parts) + ".py"
        totals[name] += float(case.get("time") or 0.0)
    return {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def cores_per_file(report: Path) -> dict[str, float]:
    """{tests/…/test_x.py: core-seconds} from the CPU ledger's report.json (its `files`),
    costliest first."""
    files = json.loads(report.read_text())["files"]
    return {k: round(v, 1) for k, v in sorted(files.items(), key=lambda kv: -kv[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--cores", type=Path, default=None,
                        help="the same run's CPU ledger report.json (per-file core-seconds)")
    parser.add_argument("--out", type=Path, default=Path("tests/durations.json"))
    args = parser.parse_args()
    seconds = seconds_per_file(args.junit)
    table: dict[str, object] = {"source": f"junit seconds per file of {args.junit.name}",
                                "seconds": seconds}
    if args.cores is not None:
        table["source"] = f"{table['source']}; core-seconds per file of {args.cores.name}"
        table["cores"] = cores_per_file(args.cores)
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{args.out}: {len(seconds)} files, {sum(seconds.values()):.0f} s")


if __name__ == "__main__":
    main()
