"""Where a sweep's time went and its efficiency (issue #19), from a finished sweep's rows.

    .venv/bin/python benchmarks/sweep_efficiency.py results/quickstart [more sweep dirs] [--no-doc]
    .venv/bin/python benchmarks/sweep_efficiency.py --run 4 [--rounds 2] [--start-ahead 1] [--no-doc]

`--run N` first runs the quickstart sweep (sweeps/quickstart.yaml, random sampler, seed 0, N
trials with the baseline, no re-measurement) `--rounds` times in a temp dir on a private local
Ray, then reads them (hold /tmp/vllm-heavy.lock around it on a shared machine). For each sweep:
- the table of framework.results.time_report: each start-up phase (read from vLLM's log,
  engine/startup_log.py), gate waits, warm-up, measured load, the rest, the time no trial ran,
  summed over trials, against the wall time (first trial's start to last trial's end);
- efficiency = sum of measured load (bench_s) / wall time;
- each phase over the fresh servers: median [min-max] seconds, and how far the phases' sum is
  from startup_s (by construction 0: the API phase is the remainder).
Prints the tables and appends them to docs/BENCHMARKS.md (unless --no-doc).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC
from datetime import datetime
from pathlib import Path

import pandas as pd
import yaml

try:
    from record import ROOT
    sys.path.insert(0, str(Path(__file__).parent))
    from record import append_section
    from record import uptime
except ModuleNotFoundError:  # imported as benchmarks.sweep_efficiency
    from benchmarks.record import ROOT
    from benchmarks.record import append_section
    from benchmarks.record import uptime

from framework.results.time_report import PHASE_LABELS
from framework.results.time_report import text_table
from framework.results.time_report import time_report


def run_quickstart(folder: Path, name: str, trials: int, start_ahead: int) -> Path:
    """The quickstart sweep with `trials` trials in `folder`; its results dir."""
    doc = yaml.safe_load((ROOT / "sweeps" / "quickstart.yaml").read_text())
    doc.update(name=name, model=str(ROOT / doc["model"]),
               search_space=str(ROOT / doc["search_space"]), results_dir=str(folder / "results"))
    doc["search"] = {"sampler": "random", "seed": 0, "n_trials": trials, "baseline": True,
                     "baseline_repeats": 0, "confirm_top": 0}
    doc.setdefault("cluster", {})["start_ahead"] = start_ahead
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "framework.cli", "run", str(path)],
                          capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        sys.exit(f"vllm-sweep run exited {done.returncode}:\n{done.stderr[-3000:]}")
    print(f"ran {trials} trials in {time.monotonic() - t0:.0f} s")
    return folder / "results" / name


def spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def phase_table(trials: pd.DataFrame) -> str:
    """Each phase over the fresh servers that became ready, and the sum against startup_s."""
    fresh = trials[trials["startup_api_s"].notna()] if "startup_api_s" in trials else trials[:0]
    lines = [f"Per fresh server ({len(fresh)} of {len(trials)} trials), median [range] s:", "",
             "| phase | s |", "|---|---|"]
    lines += [f"| {label.removeprefix('start-up: ')} | {spread(list(fresh[c].dropna()))} |"
              for c, label in PHASE_LABELS.items() if c in fresh]
    if not fresh.empty:
        total = fresh[list(PHASE_LABELS)].fillna(0).sum(axis=1)
        off = ((total - fresh["startup_s"]).abs() / fresh["startup_s"]).max()
        lines.append(f"| startup_s | {spread(list(fresh['startup_s']))} |")
        lines += ["", f"Largest |sum of phases - startup_s| / startup_s: {100 * off:.2g} %"]
    return "\n".join(lines)


def report(sweep_dir: Path) -> tuple[str, float | None]:
    """The sweep's tables and its efficiency (None: no trial ran)."""
    trials = pd.read_parquet(sweep_dir / "trials").sort_values("trial_number")
    found = time_report(trials)
    if found is None:
        return f"{sweep_dir}: no trial ran", None
    return (f"### {sweep_dir.name}\n\n{text_table(found)}\n\n{phase_table(trials)}",
            found.efficiency)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep_dirs", nargs="*", type=Path)
    p.add_argument("--run", type=int, default=0, help="run the quickstart with N trials first")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--start-ahead", type=int, default=1)
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args()
    started = datetime.now(UTC)
    load_before = uptime()
    with tempfile.TemporaryDirectory(prefix="sweep-efficiency-") as tmp:
        dirs = list(args.sweep_dirs)
        for round_ in range(args.rounds if args.run else 0):
            dirs.append(run_quickstart(Path(tmp), f"efficiency-{round_}", args.run,
                                       args.start_ahead))
        if not dirs:
            p.error("name a sweep's results dir, or --run N")
        found = [report(d) for d in dirs]
        text = "\n\n".join(t for t, _ in found)
        values = [e for _, e in found if e is not None]
        if len(values) > 1:
            text += (f"\n\nEfficiency over the {len(values)} sweeps, median [range]: "
                     f"{spread([100 * e for e in values])} %")
    print(text)
    if not args.no_doc:
        command = " ".join(["benchmarks/sweep_efficiency.py", *sys.argv[1:]])
        append_section("Where a sweep's time went (issue #19)",
                       f"`{command}`. Load before: `{load_before}`; after: `{uptime()}`.",
                       text, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
