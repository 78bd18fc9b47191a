"""Framework overhead per trial, from a finished sweep's trial rows (not a timed test).

    .venv/bin/python benchmarks/trial_overhead.py [results/quickstart] [--append docs/BENCHMARKS.md]

Per COMPLETE trial (all times from the trial row, measured by the driver's monotonic clock):
    vLLM start-up  = startup_s - launch_s     (serve() called -> /health answers)
    load           = warmup_s + bench_s       (warm-up and measured run)
    overhead       = trial_s - vLLM start-up - load
                   = placement group + actor + port (launch_s) + metrics, rows, stop and reap
    overhead share = overhead / trial_s                 target: <= 5 %
Since servers are stopped in the background (the next trial starts meanwhile), the stop is
no longer inside trial_s; the sweep-level view catches anything between trials:
    wall           = last trial's end - first trial's start (sequential sweeps)
    wall overhead  = (wall - sum of vLLM start-up and load) / wall
Prints a table and, with --append, appends it with the date and command to the given file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from record import append_section
from record import uptime


def overhead_table(trials: pd.DataFrame) -> pd.DataFrame:
    ok = trials[trials["state"] == "COMPLETE"].copy()
    ok["vllm_startup_s"] = ok["startup_s"] - ok["launch_s"]
    ok["load_s"] = ok["warmup_s"].fillna(0) + ok["bench_s"]
    ok["overhead_s"] = ok["trial_s"] - ok["vllm_startup_s"] - ok["load_s"]
    ok["overhead_pct"] = 100 * ok["overhead_s"] / ok["trial_s"]
    cols = ["trial_number", "trial_s", "launch_s", "vllm_startup_s", "load_s", "overhead_s",
            "overhead_pct"]
    return ok[cols].round(2)


def wall_summary(trials: pd.DataFrame) -> str:
    """Sweep-level overhead: wall time not spent starting vLLM or under load (all trials)."""
    t = trials.sort_values("started_at")
    start = t["started_at"].min()
    end = (t["started_at"] + pd.to_timedelta(t["trial_s"].fillna(0), unit="s")).max()
    wall = (end - start).total_seconds()
    ok = overhead_table(trials)
    useful = float((ok["vllm_startup_s"] + ok["load_s"]).sum())
    return (f"Sweep wall time {wall:.1f} s, of which {wall - useful:.1f} s "
            f"({100 * (wall - useful) / wall:.1f} %) is neither vLLM start-up nor load "
            f"({len(t)} trials, {len(ok)} COMPLETE).")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir", nargs="?", default="results/quickstart")
    p.add_argument("--append", type=Path, default=None)
    args = p.parse_args()
    trials = pd.read_parquet(Path(args.sweep_dir) / "trials")
    if "launch_s" not in trials or trials["launch_s"].isna().all():
        print(f"{args.sweep_dir}: no launch_s column: re-run the sweep with this version", file=sys.stderr)
        return 2
    table = overhead_table(trials)
    total = table[["trial_s", "overhead_s"]].sum()
    share = 100 * total["overhead_s"] / total["trial_s"]
    text = table.to_markdown(index=False)
    summary = (f"Overall: {total['overhead_s']:.1f} s of {total['trial_s']:.1f} s = {share:.1f} % "
               f"framework overhead over {len(table)} COMPLETE trials (target <= 5 %); "
               f"median per trial {table['overhead_s'].median():.2f} s. {wall_summary(trials)}")
    print(text)
    print(summary)
    if args.append:
        append_section("Framework overhead per trial",
                       f"Command: `.venv/bin/python benchmarks/trial_overhead.py {args.sweep_dir}` "
                       f"(rows of a finished sweep). Machine load after: `{uptime()}`.",
                       f"{text}\n\n{summary}", doc=args.append)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
