"""Does `make demo` give the same answer twice, and what do its re-measurements cost? Reads the
results of finished demo runs (each a clean clone in which `make demo` ran) and prints, per run:
the sweep's wall time (first trial start to last trial end), its trials, the verdict
(framework.results.verdict.decide) and the configuration it names.

    python benchmarks/demo_verdict.py /tmp/demoE /tmp/demoF [--sweep sweeps/quickstart.yaml]
        [--append "reading"]

`--sweep` is the sweep file inside each clone (a run of an older variant, e.g. without
re-measurements, may name its own file: `CLONE:sweeps/other.yaml`). With --append the table and
the reading go to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pandas as pd

from framework.results.rows import param_column
from framework.results.verdict import decide
from framework.results.verdict import number
from framework.sweep.loader import load

try:  # run as a script from the repository root
    from record import append_section
    from record import uptime
except ModuleNotFoundError:  # imported as benchmarks.demo_verdict
    from benchmarks.record import append_section
    from benchmarks.record import uptime


def run_row(clone: Path, sweep: str) -> dict[str, str]:
    """One demo run's wall time, trials, verdict and named configuration."""
    here = Path.cwd()
    os.chdir(clone)
    try:
        sw = load(Path(sweep), check_flags=False)
        trials = sw.store.read_trials()
    finally:
        os.chdir(here)
    spec = sw.spec
    ends = trials["started_at"] + pd.to_timedelta(trials["trial_s"].fillna(0), unit="s")
    wall = (ends.max() - trials["started_at"].min()).total_seconds()
    v = decide(trials, spec.objective.metric, spec.objective.direction == "maximize", spec.sla)
    named = "-"
    if v.number is not None:
        row = trials[trials["trial_number"] == v.number].iloc[0]
        named = ", ".join(f"{p} {row[param_column(p)]}" for p in sw.space.parameters)
    est = v.estimate if v.number is not None else v.baseline
    value = "-" if est is None else number(est.value) + (
        f" [{number(est.low)}-{number(est.high)}]" if est.low is not None and est.high else "")
    sla = ", ".join(f"{k} {x:g}" for k, x in spec.sla.items())
    return {"run": f"{clone.name}:{sweep}", "SLA": sla, "trials": str(len(trials)),
            "wall s": f"{wall:.0f}", "verdict": v.kind,
            "defaults": v.baseline_breaks or "meet the SLA", "named": named,
            f"{spec.objective.metric} [95%]": value}


def table(rows: list[dict[str, str]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(r[k] for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="clone dirs (CLONE or CLONE:SWEEP)")
    ap.add_argument("--sweep", default="sweeps/quickstart.yaml")
    ap.add_argument("--append", metavar="READING", help="append the table and this reading")
    args = ap.parse_args()
    rows = []
    for run in args.runs:
        clone, _, sweep = run.partition(":")
        rows.append(run_row(Path(clone).resolve(), sweep or args.sweep))
    text = table(rows)
    print(text)
    if args.append:
        append_section("Demo verdicts and their cost (issue #17)",
                       f"`python benchmarks/demo_verdict.py {' '.join(args.runs)}`, each run a "
                       f"clean clone's `make demo`. Load now: `{uptime()}`.",
                       text + "\n\n" + args.append)


if __name__ == "__main__":
    main()
