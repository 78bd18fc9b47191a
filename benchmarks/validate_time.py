"""How long `vllm-sweep validate` takes, phase by phase (issue #17 item 5: values, not only names).

    .venv/bin/python benchmarks/validate_time.py [SWEEP ...] [--runs 5] [--append docs/BENCHMARKS.md]

Each run is a fresh Python process (what a `validate` or `run` command is), timing:
    files    = sweep.loader.load(check_flags=False)  the YAML, the model's config.json, TP
    vllm     = engine.flag_check.installed_vllm()    vLLM's import and its `vllm serve` parser,
                                                     built once per process (names were
                                                     checked with it before values were)
    checks   = sweep.loader.load(check_flags=True)   every check `validate` makes, on the
                                                     parser already built: flag names, every
                                                     probe value, the cross checks
Wall seconds (time.perf_counter) and the process's CPU seconds (time.process_time); the
machine is shared, so the CPU seconds are the steadier reading. Mean, sample SD and min over
the runs. Prints a table and, with --append, appends it to the given file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from record import ROOT
from record import append_section
from record import uptime

CHILD = """
import json, sys, time
from pathlib import Path
marks = [(time.perf_counter(), time.process_time())]
from framework.sweep import loader
from framework.engine.flag_check import installed_vllm
loader.load(Path(sys.argv[1]), check_flags=False)
marks.append((time.perf_counter(), time.process_time()))
installed_vllm()
marks.append((time.perf_counter(), time.process_time()))
loader.load(Path(sys.argv[1]))
marks.append((time.perf_counter(), time.process_time()))
print(json.dumps([[b[0] - a[0], b[1] - a[1]] for a, b in zip(marks, marks[1:])]))
"""
PHASES = ("files", "vllm", "checks")


def one_run(sweep: str) -> list[list[float]]:
    """[[wall, cpu] per phase] from a fresh process."""
    out = subprocess.run([sys.executable, "-c", CHILD, sweep], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {sd:.2f} (min {min(values):.2f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweeps", nargs="*", default=["sweeps/quickstart.yaml"])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--append", type=Path, default=None)
    args = p.parse_args()
    load_before = uptime()
    rows = ["| sweep | phase | wall s | CPU s |", "|---|---|---|---|"]
    for sweep in args.sweeps:
        runs = [one_run(sweep) for _ in range(args.runs)]
        for i, phase in enumerate(PHASES):
            rows.append(f"| {sweep} | {phase} | {summary([r[i][0] for r in runs])} | "
                        f"{summary([r[i][1] for r in runs])} |")
        totals = [sum(r[i][0] for i in range(3)) for r in runs]
        cpus = [sum(r[i][1] for i in range(3)) for r in runs]
        rows.append(f"| {sweep} | total | {summary(totals)} | {summary(cpus)} |")
    table = "\n".join(rows)
    print(table)
    load_after = uptime()
    print(load_before, load_after, sep="\n")
    if args.append:
        append_section(
            "Validate time (issue #17 item 5)",
            f"`.venv/bin/python benchmarks/validate_time.py {' '.join(args.sweeps)} --runs "
            f"{args.runs}`: each run a fresh process; mean ± sample SD (min) over {args.runs} "
            f"runs. Load before: `{load_before}`; after: `{load_after}`.",
            table, doc=args.append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
