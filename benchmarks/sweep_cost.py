"""Sweep cost: wall time to the best feasible configuration with the cost cutters on, off, and
with `vllm bench sweep serve`.

    .venv/bin/python benchmarks/sweep_cost.py --truth DIR [--seeds 2] [--trials 10]
        [--vllm-sweep-s S] [--workdir DIR] [--no-doc]

`--truth DIR`: the work dir of a finished `benchmarks/search_efficiency.py --engine cpu` run.
Its grid passes give the target (the best feasible grid mean, as defined there) and its
phase 3 gives (b), the wall time of `vllm bench sweep serve` over the same 16-configuration grid
(from DIR/vllm-sweep/result.json, or `--vllm-sweep-s` when that run predates the file).

Then TPE on the same space, workload and SLA, S seeds x N trials, twice per seed, through the
real CLI on vLLM CPU:
- on:  search.stop_early, search.learn_from_failures, server.dummy_weights, server.reuse,
       search.screen 0.25 (a 50-request screening run; pruned if 30% off the best);
- off (a): all of these off.
`search.repeats` and `confirm_top` are left at 1 / 0 in both: they buy trust, not speed.
Per run, as in search_efficiency.score: trials and wall seconds (first trial start to the end
of the trial that got there) until the best-so-far feasible measurement is within 5% of the
target. Ratio = median wall to 5% (on) / (b); target <= 0.5x. A run never reaching 5% counts as
+inf in the medians. Appends the tables to docs/BENCHMARKS.md unless --no-doc.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from record import append_section
from search_efficiency import SLA
from search_efficiency import fmt
from search_efficiency import ground_truth
from search_efficiency import label
from search_efficiency import med
from search_efficiency import median_inf
from search_efficiency import run_sweep
from search_efficiency import score
from search_efficiency import uptime

VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "on": {"search": {"stop_early": True, "learn_from_failures": True, "screen": 0.25},
           "server": {"dummy_weights": True, "reuse": True}},
    "off": {"search": {"stop_early": False, "learn_from_failures": False},
            "server": {"dummy_weights": False, "reuse": False}},
}


def truth_from(workdir: Path) -> tuple[float, dict[tuple, float], str]:
    """Target and per-configuration grid means from search_efficiency's grid passes."""
    passes = [pd.read_parquet(d) for d in sorted((workdir / "results").glob("grid-r*/trials"))]
    if not passes:
        raise SystemExit(f"{workdir}: no results/grid-r*/trials (run search_efficiency first)")
    gt = ground_truth(passes, SLA["cpu"])
    feas = gt[gt["feasible"]]
    top = feas.loc[feas["mean"].idxmax()]
    return float(top["mean"]), dict(zip(gt["cfg"], gt["mean"], strict=True)), label(top["cfg"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--truth", type=Path, required=True)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--vllm-sweep-s", type=float, default=None)
    p.add_argument("--workdir", type=Path, default=None, help="default: a new /tmp/sc-* dir")
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args()
    args.engine = "cpu"
    args.workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))).resolve()
    (args.workdir / "t").mkdir(parents=True, exist_ok=True)
    result = args.truth / "vllm-sweep" / "result.json"
    theirs = args.vllm_sweep_s or (json.loads(result.read_text())["wall"]
                                   if result.is_file() else None)
    if theirs is None:
        raise SystemExit(f"no {result}: pass --vllm-sweep-s (phase 3's wall time)")
    target, truth, top = truth_from(args.truth)
    command = " ".join([".venv/bin/python benchmarks/sweep_cost.py", *sys.argv[1:]])
    print(f"target {target:.0f} tok/s ({top}); vllm bench sweep serve {theirs:.0f} s; "
          f"{2 * args.seeds} sweeps of {args.trials} trials in {args.workdir}", flush=True)
    started, load_before, t0 = datetime.now(UTC), uptime(), time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for seed in range(args.seeds):  # interleaved: drift in machine load hits both alike
        for variant, extra in VARIANTS.items():
            rows = run_sweep(args, f"{variant}-s{seed}", "tpe", seed, args.trials, extra)
            r = score(rows, target, truth)
            r["span"] = ((rows["started_at"] + pd.to_timedelta(rows["trial_s"], unit="s")).max()
                         - rows["started_at"].min()).total_seconds()
            r["pruned"] = int((rows["state"] == "PRUNED").sum())
            runs[variant].append(r)

    lines = ["| variant | seed | trials to 5% | wall s to 5% | whole sweep s | pruned | "
             "its pick | pick's grid mean (% of target) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for variant, results in runs.items():
        for seed, r in enumerate(results):
            lines.append(f"| {variant} | {seed} | {fmt(r['reached'])} | {fmt(r['wall'])} | "
                         f"{r['span']:.0f} | {r['pruned']} | {label(r['pick'])} | "
                         f"{fmt(r['true'])} ({fmt(100 * r['true'] / target)}%) |")
    walls = {v: median_inf(rs, "wall") for v, rs in runs.items()}
    lines += ["", "| | median wall s to 5% | runs reaching 5% | median whole sweep s | "
              "ratio to `vllm bench sweep serve` |", "| --- | ---: | ---: | ---: | ---: |"]
    for variant, results in runs.items():
        lines.append(f"| vllm-sweep, cost cutters {variant} | {med(results, 'wall')} | "
                     f"{sum(r['reached'] is not None for r in results)}/{len(results)} | "
                     f"{statistics.median(r['span'] for r in results):.0f} | "
                     f"{walls[variant] / theirs:.2f}x |")
    lines.append(f"| `vllm bench sweep serve`, 16 configurations x 1 run | {theirs:.0f} | - | "
                 f"{theirs:.0f} | 1.00x |")
    ratio = walls["on"] / theirs
    lines += ["", f"Target {target:.0f} tok/s ({top}); on / (b) = {ratio:.2f}x (target <= 0.5x): "
              f"{'met' if ratio <= 0.5 else 'missed'}; on / off = "
              f"{walls['on'] / walls['off']:.2f}x. Whole run {(time.monotonic() - t0) / 60:.1f} min."]
    text = "\n".join(lines)
    print("\n" + text)
    if not args.no_doc:
        append_section("Sweep cost (issue 8)",
                       f"Command: `{command}`. Machine: {os.cpu_count()} cores, CPU vLLM 0.32. "
                       f"Load: before `{load_before}`; after `{uptime()}`. Method: see the "
                       "docstring of benchmarks/sweep_cost.py.", text, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
