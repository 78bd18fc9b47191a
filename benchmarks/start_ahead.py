"""Start-ahead and warm start on the CPU engine (issue #19): the quickstart space in two
variants alternated in one run, each a real `vllm-sweep run` on a private local Ray.

    .venv/bin/python benchmarks/start_ahead.py [--rounds 3] [--trials 4]
        [--old today] [--new start_ahead [warm_start ...]] [--no-doc]
    .venv/bin/python benchmarks/start_ahead.py --neighbour [--rounds 4] [--no-doc]

The sweep is sweeps/quickstart.yaml with the random sampler (seed 0: both variants measure the
same configurations in the same order, so their throughputs pair up), `--trials` trials, the
baseline and no re-measurement (baseline_repeats 0, confirm_top 0, one run per trial), written
to a temp dir with its own results_dir. Variants (`--old`, one or more `--new`, each compared
with the old; the order is reversed every other round): `today` = start_ahead 0,
no start-up lever (as when issue #19 was filed); `start_ahead` = start_ahead 1, no lever;
`warm_start` = start_ahead 1 and the `warm_start` lever (framework/engine/zygote.py); `warm_only`
= start_ahead 0 and `warm_start`. Per run:
- wall_s: the command's wall time; span_s: first trial start to last trial end (rows);
- startup_s: each trial's own start-up (placement to /health; gate waits excluded), median;
  server_s: the same without the placement wait (with start-ahead, the wait for a free slot);
- measured_s: warm-up + load per trial, summed; load_s: the measured load alone (bench_s), summed;
- efficiency = load_s / wall_s (the issue's measure), and per-trial wall = wall_s / trials;
- throughput: each trial's output tok/s, paired by trial number across the two variants.
`--neighbour` asks the question start-ahead's rule leaves open: does a ready, idle vLLM server
(the next trial's, waiting for its turn) change what is measured on another? One `vllm serve`
A (the quickstart's server flags) is measured with the quickstart's load (`vllm-sweep bench`,
200 prompts 128/64, concurrency 32, temperature 0, a new seed each run) with a second idle
server B up and without it, alternated `--rounds` times; B is started or stopped 10 s before
the run, never during it. Output tok/s and median TPOT per run, and B's CPU seconds per run.
Appends the tables to docs/BENCHMARKS.md.
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
except ModuleNotFoundError:  # imported as benchmarks.start_ahead
    from benchmarks.record import ROOT
    from benchmarks.record import append_section
    from benchmarks.record import uptime

# name: (cluster.start_ahead, server.startup_levers)
VARIANTS: dict[str, tuple[int, list[str]]] = {
    "today": (0, []), "start_ahead": (1, []), "warm_start": (1, ["warm_start"]),
    "warm_only": (0, ["warm_start"])}


def sweep_file(folder: Path, name: str, variant: str, trials: int) -> Path:
    doc = yaml.safe_load((ROOT / "sweeps" / "quickstart.yaml").read_text())
    doc.update(name=name, model=str(ROOT / doc["model"]),
               search_space=str(ROOT / doc["search_space"]),
               results_dir=str(folder / "results"))
    doc["search"] = {"sampler": "random", "seed": 0, "n_trials": trials, "baseline": True,
                     "baseline_repeats": 0, "confirm_top": 0}
    start_ahead, levers = VARIANTS[variant]
    doc.setdefault("cluster", {})["start_ahead"] = start_ahead
    doc.setdefault("server", {})["startup_levers"] = levers
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_one(folder: Path, variant: str, round_: int, trials: int) -> dict:
    name = f"sa-{variant}-{round_}"
    path = sweep_file(folder, name, variant, trials)
    t0 = time.monotonic()
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "vllm-sweep"), "run", str(path)],
                          capture_output=True, text=True, timeout=3600, check=False)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        sys.exit(f"{name}: vllm-sweep run exited {done.returncode}:\n{done.stderr[-3000:]}")
    rows = pd.read_parquet(folder / "results" / name / "trials").sort_values("trial_number")
    ends = rows["started_at"] + pd.to_timedelta(rows["trial_s"], unit="s")
    ok = rows[rows["state"] == "COMPLETE"]
    load = float(ok["bench_s"].sum())
    return {"variant": variant, "round": round_, "wall_s": wall,
            "span_s": (ends.max() - rows["started_at"].min()).total_seconds(),
            "trials": len(rows), "complete": len(ok),
            "startup_s": float(rows["startup_s"].median()),
            "server_s": float((rows["startup_s"] - rows["startup_placement_s"].fillna(0)).median()),
            "startups": [round(float(v), 1) for v in rows["startup_s"]],
            "gate_wait_s": float(rows["gate_wait_s"].median()),
            "measured_s": float((ok["warmup_s"].fillna(0) + ok["bench_s"]).sum()),
            "load_s": load, "efficiency": load / wall, "per_trial_s": wall / len(rows),
            "throughput": dict(zip(ok["trial_number"], ok["output_throughput"]))}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}-{max(values):.3g}]"


def run_table(runs: list[dict]) -> str:
    lines = ["| variant | round | wall s | span s | trials | median start-up s | median server "
             "s | each trial's start-up s | median gate wait s | measured s | load s | "
             "efficiency | wall per trial s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['variant']} | {r['round']} | {r['wall_s']:.0f} | {r['span_s']:.0f} | "
                     f"{r['complete']}/{r['trials']} | {r['startup_s']:.1f} | "
                     f"{r['server_s']:.1f} | {', '.join(map(str, r['startups']))} | "
                     f"{r['gate_wait_s']:.1f} | {r['measured_s']:.0f} | {r['load_s']:.0f} | "
                     f"{r['efficiency']:.3f} | {r['per_trial_s']:.1f} |")
    return "\n".join(lines)


def tables(runs: list[dict], old_name: str = "today", new_name: str = "start_ahead") -> str:
    """The old and the new variant compared, run by run."""
    lines: list[str] = []
    old = [r for r in runs if r["variant"] == old_name]
    new = [r for r in runs if r["variant"] == new_name]
    lines += [f"| measure | {old_name}, median [range] | {new_name} | ratio new/old per "
              "round (median [range]) |", "|---|---|---|---|"]
    for key, label in (("wall_s", "wall s"), ("startup_s", "median start-up s"),
                       ("server_s", "median server start-up s (no placement wait)"),
                       ("per_trial_s", "wall per trial s"), ("efficiency", "efficiency")):
        ratios = [n[key] / o[key] for o, n in zip(old, new)]
        lines.append(f"| {label} | {spread([r[key] for r in old])} | "
                     f"{spread([r[key] for r in new])} | {spread(ratios)} |")
    paired = [n["throughput"][t] / o["throughput"][t] for o, n in zip(old, new)
              for t in o["throughput"] if t in n["throughput"]]
    within = [o2["throughput"][t] / o1["throughput"][t] for o1, o2 in zip(old, old[1:])
              for t in o1["throughput"] if t in o2["throughput"]]
    lines.append(f"| output tok/s, same configuration: {new_name} / {old_name} | "
                 f"{len(paired)} pairs | | {spread(paired)} |")
    if within:
        lines.append(f"| output tok/s, same configuration: {old_name} / {old_name} (noise) | "
                     f"{len(within)} pairs | | {spread(within)} |")
    return "\n".join(lines)


def neighbour_runs(rounds: int) -> str:
    """A measured with B idle vs without B, alternated; see the module docstring."""
    import json

    import psutil
    from loadgen_parity import MODEL
    from loadgen_parity import VllmServer

    extra = ("--max-model-len", "512")

    def cpu_s(pid: int) -> float:
        root = psutil.Process(pid)
        return sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)])

    def bench(url: str, seed: int, out: Path) -> dict:
        argv = [str(ROOT / ".venv" / "bin" / "vllm-sweep"), "bench", "--base-url", url,
                "--model", str(MODEL), "--dataset-name", "random", "--random-input-len", "128",
                "--random-output-len", "64", "--num-prompts", "200", "--max-concurrency", "32",
                "--temperature", "0", "--seed", str(seed), "--result-json", str(out)]
        subprocess.run(argv, check=True, capture_output=True, timeout=900)
        return json.loads(out.read_text())

    rows = []
    with tempfile.TemporaryDirectory(prefix="neighbour-") as tmp:
        folder = Path(tmp)
        with VllmServer(MODEL, folder / "a.log", extra) as a:
            bench(a.base_url, 999, folder / "warm.json")
            b = None
            for i in range(2 * rounds):
                want_b = (i % 2 == 0) == (i // 2 % 2 == 0)  # with, without, without, with, ...
                if want_b and b is None:
                    b = VllmServer(MODEL, folder / f"b{i}.log", extra).__enter__()
                elif not want_b and b is not None:
                    b.stop()
                    b = None
                time.sleep(10)
                b_before = cpu_s(b.pid) if b else 0.0
                result = bench(a.base_url, i, folder / f"run{i}.json")
                rows.append({"with_b": want_b, "tok_s": result["output_throughput"],
                             "tpot": result["median_tpot_ms"], "failed": result["failed"],
                             "b_cpu_s": (cpu_s(b.pid) - b_before) if b else None})
                print(f"run {i} {'with' if want_b else 'without'} B: "
                      f"{rows[-1]['tok_s']:.0f} tok/s, TPOT {rows[-1]['tpot']:.2f} ms", flush=True)
            if b is not None:
                b.stop()
    lines = ["| run | idle neighbour B | output tok/s | median TPOT ms | failed | B's CPU s |",
             "|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        lines.append(f"| {i} | {'up' if r['with_b'] else 'none'} | {r['tok_s']:.0f} | "
                     f"{r['tpot']:.2f} | {r['failed']} | "
                     f"{'' if r['b_cpu_s'] is None else format(r['b_cpu_s'], '.2f')} |")
    up = [r for r in rows if r["with_b"]]
    none = [r for r in rows if not r["with_b"]]
    lines += ["", "| measure | B up, median [range] | no B | B up / no B |", "|---|---|---|---|"]
    for key, label in (("tok_s", "output tok/s"), ("tpot", "median TPOT ms")):
        u, n = [r[key] for r in up], [r[key] for r in none]
        lines.append(f"| {label} | {spread(u)} | {spread(n)} | "
                     f"{statistics.median(u) / statistics.median(n):.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--old", choices=list(VARIANTS), default="today")
    parser.add_argument("--new", choices=list(VARIANTS), nargs="+", default=["start_ahead"])
    parser.add_argument("--no-doc", action="store_true")
    parser.add_argument("--neighbour", action="store_true",
                        help="measure one server with an idle second server up vs not")
    args = parser.parse_args()
    started, load_before = datetime.now(UTC), uptime()
    if args.neighbour:
        text = neighbour_runs(args.rounds)
        print(text)
        if not args.no_doc:
            append_section("An idle ready server beside a measured one (start-ahead, #19)",
                           f"`benchmarks/start_ahead.py --neighbour --rounds {args.rounds}`. "
                           f"Load before: `{load_before}`; after: `{uptime()}`.", text, started)
        return
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="start-ahead-") as tmp:
        for i in range(args.rounds):
            every = [args.old, *args.new]
            order = every if i % 2 == 0 else every[::-1]
            for variant in order:
                runs.append(run_one(Path(tmp), variant, i, args.trials))
                r = runs[-1]
                print(f"{variant} round {i}: wall {r['wall_s']:.0f} s, start-up "
                      f"{r['startup_s']:.1f} s, efficiency {r['efficiency']:.3f}", flush=True)
    runs.sort(key=lambda r: (r["round"], r["variant"]))
    text = "\n\n".join([run_table(runs), *(tables(runs, args.old, new) for new in args.new)])
    print(text)
    if not args.no_doc:
        append_section(
            f"{', '.join(args.new)} against {args.old} on the CPU engine (issue #19)",
            f"`benchmarks/start_ahead.py --rounds {args.rounds} --trials {args.trials} --old "
            f"{args.old} --new {' '.join(args.new)}`: the quickstart space (random sampler, seed 0, "
            "baseline, no re-measurement), the two variants alternated (module docstring). "
            "Efficiency = measured load time / wall time. "
            f"Load before: `{load_before}`; after: `{uptime()}`.", text, started)


if __name__ == "__main__":
    main()
