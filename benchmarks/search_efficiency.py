"""Search efficiency: how fast TPE (and random) get near the best configuration a full grid finds.

    .venv/bin/python benchmarks/search_efficiency.py [--engine cpu|fake] [--repeats 3] [--seeds 3]
        [--trials 10] [--num-prompts 200] [--workdir DIR] [--record]

Space: search_spaces/tiny_cpu_grid.yaml (16 configurations). Workload, objective and SLA of
sweeps/quickstart.yaml (cpu engine); the fake engine gets FakeEngine latencies and a looser SLA.
Every sweep runs through the real CLI (`python -m framework.cli run X.yaml`), no baseline trial.

Phase 1, ground truth: the grid sweep R times (seed r shuffles its order), so every
configuration c is measured R times (each after the workload's warm-up). Per configuration:
    mean(c) = mean of its measured objectives;  CV(c) = std(ddof=1) / mean(c)
    feasible(c) = feasible in more than R/2 repeats; on an exact tie (R even), feasible iff the
                  mean over repeats of every SLA metric is within its limit; a failed repeat is
                  an infeasible one
    target = max over feasible c of mean(c) (maximize)
Phase 2: TPE and random, S seeds each, N trials. Per run, trials in order k = 1..N:
    best_k  = max objective of the feasible trials among 1..k, each judged by its own measurement
    reached = first k with best_k >= 0.95 * target          (else "not reached")
    wall    = started_at_k + trial_s_k - min(started_at)   (s from the run's first trial start)
    pick    = the configuration of best_N; its "true" value = mean(pick) from phase 1.
The grid passes of phase 1 are scored the same way (one pass = a 16-trial grid search; their
measurements also make up the target, which favours them).
Phase 3 (cpu engine, unless --no-vllm-sweep): `vllm bench sweep serve` over the same 16
configurations, one run each after the same warm-up, with the same workload and server flags
(its own `vllm serve` per configuration, `vllm bench serve` per run). It knows its best only once
every configuration ran, so its time to the best configuration is its whole wall time; its pick
is the best output tok/s among its runs within the SLA. Ratio = our median wall s to 5% (TPE) /
that wall time.
Prints the tables; appends them to docs/BENCHMARKS.md by default with --engine cpu, and with
--engine fake only when --record is given. Reusing a --workdir resumes its sweeps (the CLI's
own resume) and then the clock times cover only the new trials: use a fresh one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from record import ROOT
from record import append_section
from record import uptime

from framework.cluster.ports import pick_port

BIN = Path(sys.executable).parent
MODEL = ROOT / "models" / "tiny-llama"
SPACE = ROOT / "search_spaces" / "tiny_cpu_grid.yaml"
PARAMS = ["param_max_num_seqs", "param_max_num_batched_tokens", "param_enable_prefix_caching"]
GRID_SIZE = 16
BAND = 0.95  # within 5% of the target (objective maximized)
SLA = {"cpu": {"p99_ttft_ms": 500.0, "p99_tpot_ms": 10.0},
       "fake": {"p99_ttft_ms": 1000.0, "p99_tpot_ms": 50.0}}
TRIAL_S = {"cpu": 30.0, "fake": 8.0}  # rough per-trial cost, for the up-front estimate


def sweep_yaml(args: argparse.Namespace, name: str, sampler: str, seed: int, n: int,
               extra: dict[str, dict[str, Any]] | None = None) -> Path:
    spec: dict[str, Any] = {
        "name": name, "model": str(ROOT / "models" / "tiny-llama"), "search_space": str(SPACE),
        "engine": args.engine,
        "server": {"args": {"enforce-eager": True, "max-model-len": 512}, "startup_timeout_s": 240},
        "workload": {"dataset": "random", "num_prompts": args.num_prompts, "input_len": 128,
                     "output_len": 64, "max_concurrency": 32, "request_rate": math.inf,
                     "warmup_requests": 32, "seed": 0},
        "objective": {"metric": "output_throughput", "direction": "maximize"},
        "sla": SLA[args.engine],
        "search": {"sampler": sampler, "n_trials": n, "seed": seed, "baseline": False},
        "results_dir": str(args.workdir / "results")}
    for section, values in (extra or {}).items():
        spec[section] = {**spec.get(section, {}), **values}
    if args.engine == "fake":  # max-num-seqs < 32 queues requests; the other flags do nothing
        spec["server"].update(startup_timeout_s=60, env={
            "FAKE_ENGINE_STARTUP_S": "1", "FAKE_ENGINE_TTFT_MS": "20", "FAKE_ENGINE_TPOT_MS": "5"})
        spec["cluster"] = {"num_cpus": 2, "num_gpus": 1, "max_concurrent_trials": 1}
    path = args.workdir / "sweeps" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_sweep(args: argparse.Namespace, name: str, sampler: str, seed: int, n: int,
              extra: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
    """One sweep through the CLI, as a user runs it; its trial rows from the Parquet files.
    `extra`: keys merged into the sweep's sections (e.g. {"search": {"screen": 0.25}})."""
    path = sweep_yaml(args, name, sampler, seed, n, extra)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TMPDIR": str(args.workdir / "t"),
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    log = args.workdir / "logs" / f"{name}.log"
    log.parent.mkdir(exist_ok=True)
    t0 = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "framework.cli", "run", str(path)],
                                cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=600 + 400 * n)
        except subprocess.TimeoutExpired:  # SIGTERM: the CLI stops its servers and Ray, exits
            proc.terminate()
            proc.wait(timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}; see {log}:\n"
                           f"{log.read_text(errors='replace')[-2000:]}")
    rows = pd.read_parquet(args.workdir / "results" / name / "trials")
    rows = rows.sort_values("trial_number").reset_index(drop=True)
    print(f"  {name}: {len(rows)} trials in {time.monotonic() - t0:.0f} s", flush=True)
    return rows


def run_vllm_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Phase 3: `vllm bench sweep serve` over the grid; its wall time, runs and pick."""
    sys.path.insert(0, str(ROOT))
    from framework.config.search_space import grid_values
    from framework.config.search_space import load_search_space
    from framework.config.specs import SweepSpec
    from framework.sweep.loader import CACHE_DIR_VAR
    from framework.sweep.loader import server_env

    grid = grid_values(load_search_space(SPACE))
    names = [n.replace("-", "_") for n in grid]
    combos = [dict(zip(names, values, strict=True)) for values in itertools.product(*grid.values())]
    out = args.workdir / "vllm-sweep"
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(json.dumps(combos))
    port, sla = pick_port("127.0.0.1", []), SLA["cpu"]
    serve = (f"{BIN / 'vllm'} serve {MODEL} --host 127.0.0.1 --port {port} --enforce-eager "
             "--max-model-len 512")
    bench = (f"{BIN / 'vllm'} bench serve --backend vllm --model {MODEL} "
             f"--base-url http://127.0.0.1:{port} --dataset-name random --random-input-len 128 "
             f"--random-output-len 64 --num-prompts {args.num_prompts} --max-concurrency 32 "
             "--request-rate inf --ignore-eos --seed 0 --percentile-metrics ttft,tpot "
             "--metric-percentiles 99")
    spec = SweepSpec.model_validate({"name": "x", "model": str(MODEL), "engine": "cpu",
                                     "search_space": str(SPACE)})
    env = {**os.environ, **server_env(spec), "TMPDIR": str(args.workdir / "t"),
           "PYTHONUNBUFFERED": "1"}
    cache = Path(env[CACHE_DIR_VAR]).expanduser()  # vllm bench's own servers: caches in there too
    env.update({"VLLM_CACHE_ROOT": str(cache / "vllm"), "HF_HOME": str(cache / "hf")})
    argv = [str(BIN / "vllm"), "bench", "sweep", "serve", "--serve-cmd", serve, "--bench-cmd",
            bench, "--serve-params", str(out / "serve.json"), "--num-runs", "1",
            "--warmup-num-prompts", "32", "--server-ready-timeout", "240", "-o", str(out),
            "-e", "grid"]
    log = args.workdir / "logs" / "vllm-bench-sweep.log"
    log.parent.mkdir(exist_ok=True)
    t0 = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                              timeout=400 * len(combos), start_new_session=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench sweep serve: exit {proc.returncode}; see {log}")
    df = pd.read_csv(out / "grid" / "summary.csv")
    df["cfg"] = [tuple(bool(r[n]) if isinstance(grid[k][0], bool) else int(r[n])
                       for n, k in zip(names, grid, strict=True)) for _, r in df.iterrows()]
    ok = df[(df["p99_ttft_ms"] <= sla["p99_ttft_ms"]) & (df["p99_tpot_ms"] <= sla["p99_tpot_ms"])]
    best = ok.loc[ok["output_throughput"].idxmax()] if len(ok) else None
    print(f"  vllm bench sweep serve: {len(df)} runs in {wall:.0f} s", flush=True)
    found = {"wall": wall, "runs": len(df), "pick": None if best is None else best["cfg"],
             "best": math.nan if best is None else float(best["output_throughput"])}
    (out / "result.json").write_text(json.dumps(found))  # for benchmarks/sweep_cost.py
    return found


def config(row: pd.Series) -> tuple:
    return tuple(row[p].item() if hasattr(row[p], "item") else row[p] for p in PARAMS)


def label(cfg: tuple | None) -> str:
    return "-" if cfg is None else f"seqs {cfg[0]}, mbt {cfg[1]}, pc {'on' if cfg[2] else 'off'}"


def ground_truth(passes: list[pd.DataFrame], sla: dict[str, float]) -> pd.DataFrame:
    """Per configuration: n, mean objective, CV, feasible count and the rule's verdict."""
    rows = pd.concat(passes, ignore_index=True)
    rows["cfg"] = rows.apply(config, axis=1)
    rows["ok"] = (rows["state"] == "COMPLETE") & rows["feasible"].fillna(False).astype(bool)
    out = []
    for cfg, g in rows.groupby("cfg", sort=True):
        obj = g["objective"].dropna()
        mean = float(obj.mean()) if len(obj) else math.nan
        n_ok, n = int(g["ok"].sum()), len(g)
        feasible = 2 * n_ok > n or (2 * n_ok == n and all(
            g[k].mean() <= lim for k, lim in sla.items()))
        cv = float(obj.std(ddof=1) / mean) if len(obj) >= 2 and mean > 0 else math.nan
        out.append({"cfg": cfg, "n": n, "mean": mean, "cv": cv, "feasible_runs": n_ok,
                    "feasible": bool(feasible)})
    return pd.DataFrame(out)


def span_s(rows: pd.DataFrame) -> float:
    """First trial start to last trial end, from the rows' own timestamps."""
    ends = rows["started_at"] + pd.to_timedelta(rows["trial_s"], unit="s")
    return (ends.max() - rows["started_at"].min()).total_seconds()


def score(rows: pd.DataFrame, target: float, truth: dict[tuple, float]) -> dict[str, Any]:
    """Trials and seconds until the best-so-far feasible objective is >= BAND * target."""
    t0 = rows["started_at"].min()
    ok = (rows["state"] == "COMPLETE") & rows["feasible"].fillna(False).astype(bool)
    best, pick, reached, wall = -math.inf, None, None, None
    for k, (i, row) in enumerate(rows.iterrows(), start=1):
        if ok[i] and row["objective"] > best:
            best, pick = float(row["objective"]), config(row)
        if reached is None and best >= BAND * target:
            reached = k
            wall = (row["started_at"] - t0).total_seconds() + float(row["trial_s"])
    true = truth.get(pick, math.nan) if pick is not None else math.nan
    return {"trials": len(rows), "reached": reached, "wall": wall,
            "best": best if pick else math.nan, "pick": pick, "true": true}


def fmt(x: float | int | None, spec: str = ".0f") -> str:
    return "not reached" if x is None or (isinstance(x, float) and math.isinf(x)) \
        else "-" if isinstance(x, float) and math.isnan(x) else format(x, spec)


def median_inf(results: list[dict[str, Any]], key: str) -> float:
    """Median over runs of `key` (trials or seconds to 5%), a run never reaching it = +inf."""
    return statistics.median([math.inf if r[key] is None else r[key] for r in results])


def med(results: list[dict[str, Any]], key: str, spec: str = ".0f") -> str:
    """median_inf, formatted."""
    return fmt(median_inf(results, key), spec)


def tables(runs: dict[str, list[dict[str, Any]]], gt: pd.DataFrame, target: float) -> list[str]:
    lines = ["| sampler | seed | trials | trials to 5% | wall s to 5% | best measured tok/s | "
             "its configuration | its grid mean (% of target) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for sampler, results in runs.items():
        for seed, r in enumerate(results):
            lines.append(f"| {sampler} | {seed} | {r['trials']} | {fmt(r['reached'])} | "
                         f"{fmt(r['wall'])} | {fmt(r['best'])} | {label(r['pick'])} | "
                         f"{fmt(r['true'])} ({fmt(100 * r['true'] / target)}%) |")
    lines += ["", "| sampler | runs reaching 5% | median trials to 5% | median wall s to 5% | "
              "median grid mean of pick (% of target) |", "| --- | ---: | ---: | ---: | ---: |"]
    for sampler, results in runs.items():
        picked = [r["true"] for r in results if not math.isnan(r["true"])]
        true = statistics.median(picked) if picked else math.nan
        lines.append(f"| {sampler} | {sum(r['reached'] is not None for r in results)}/"
                     f"{len(results)} | {med(results, 'reached', '.1f')} | "
                     f"{med(results, 'wall')} | "
                     f"{fmt(true)} ({fmt(100 * true / target)}%) |")
    lines += ["", "Ground truth (phase 1), per configuration:", "",
              "| configuration | repeats | mean tok/s | CV | feasible repeats | feasible |",
              "| --- | ---: | ---: | ---: | ---: | --- |"]
    for g in gt.sort_values("mean", ascending=False).itertuples():
        lines.append(f"| {label(g.cfg)} | {g.n} | {fmt(g.mean)} | {fmt(100 * g.cv, '.1f')}% | "
                     f"{g.feasible_runs} | {'yes' if g.feasible else 'no'} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=("cpu", "fake"), default="cpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--workdir", type=Path, default=None, help="default: a new /tmp/se-* dir")
    p.add_argument("--record", action="store_true", help="append to docs/BENCHMARKS.md (fake)")
    p.add_argument("--no-vllm-sweep", action="store_true",
                   help="skip phase 3 (`vllm bench sweep serve` over the grid)")
    args = p.parse_args()
    args.workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="se-", dir="/tmp"))).resolve()
    (args.workdir / "t").mkdir(parents=True, exist_ok=True)
    if len(str(args.workdir)) > 40:
        print(f"warning: {args.workdir} is long; Ray's socket paths under TMPDIR may not fit")
    command = " ".join([".venv/bin/python benchmarks/search_efficiency.py", *sys.argv[1:]])
    n_trials = GRID_SIZE * args.repeats + 2 * args.seeds * args.trials
    est = n_trials * TRIAL_S[args.engine] + 15 * (args.repeats + 2 * args.seeds)
    vllm_sweep = args.engine == "cpu" and not args.no_vllm_sweep
    est += 40 * GRID_SIZE if vllm_sweep else 0
    print(f"{n_trials} trials in {args.repeats + 2 * args.seeds} sweeps on engine {args.engine}: "
          f"roughly {est / 60:.0f} min. Work dir {args.workdir}", flush=True)
    started, load_before, t0 = datetime.now(UTC), uptime(), time.monotonic()

    print("phase 1: the grid", flush=True)
    passes = [run_sweep(args, f"grid-r{r}", "grid", r, GRID_SIZE) for r in range(args.repeats)]
    grid_wall = time.monotonic() - t0
    gt = ground_truth(passes, SLA[args.engine])
    feas = gt[gt["feasible"]]
    if feas.empty:
        print("no configuration is feasible by the rule: no target", file=sys.stderr)
        return 1
    top = feas.loc[feas["mean"].idxmax()]
    target, truth = float(top["mean"]), dict(zip(gt["cfg"], gt["mean"], strict=True))
    median_cv = float(gt["cv"].median())

    print("phase 2: TPE and random", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {"tpe": [], "random": []}
    for seed in range(args.seeds):  # interleaved, so drift in machine load hits both alike
        for sampler in runs:
            rows = run_sweep(args, f"{sampler}-s{seed}", sampler, seed, args.trials)
            runs[sampler].append(score(rows, target, truth))
    runs["grid (one pass)"] = [score(rows, target, truth) for rows in passes]
    pass_s = statistics.median(span_s(rows) for rows in passes)
    near = int((feas["mean"] >= BAND * target).sum())
    summary = [
        f"Grid: {GRID_SIZE} configurations x {args.repeats} repeats, phase 1 wall time "
        f"{grid_wall / 60:.1f} min (clock, with each sweep's Ray start-up); one pass "
        f"{pass_s:.0f} s from first trial start to last trial end (median over passes). "
        f"Median CV of a configuration's objective across repeats: "
        f"{fmt(100 * median_cv, '.1f')}%.",
        f"Target: {target:.0f} tok/s ({label(top['cfg'])}); {near} of {len(feas)} feasible "
        f"configurations have a grid mean within 5% of it. "
        f"Whole run {(time.monotonic() - t0) / 60:.1f} min."]
    reading = [f"- {s}: reached 5% in {sum(r['reached'] is not None for r in runs[s])}/"
               f"{len(runs[s])} runs, median trials / s to it: {med(runs[s], 'reached', '.1f')}"
               f" / {med(runs[s], 'wall')}; a whole grid pass ({GRID_SIZE} trials) takes "
               f"{pass_s:.0f} s." for s in ("tpe", "random")]
    if vllm_sweep:
        print("phase 3: vllm bench sweep serve over the grid", flush=True)
        theirs = run_vllm_sweep(args)
        tpe_wall = statistics.median(math.inf if r["wall"] is None else r["wall"]
                                     for r in runs["tpe"])
        ratio = tpe_wall / theirs["wall"]
        true = truth.get(theirs["pick"], math.nan) if theirs["pick"] else math.nan
        reading += [f"- `vllm bench sweep serve` over the same grid: {theirs['runs']} runs in "
                    f"{theirs['wall']:.0f} s (its time to the best: it must run all of them); "
                    f"its pick within the SLA {label(theirs['pick'])} at {fmt(theirs['best'])} "
                    f"tok/s, grid mean {fmt(true)} ({fmt(100 * true / target)}% of target). "
                    f"Our median wall s to 5% with TPE / its wall: {ratio:.2f}x (target <= 0.5x): "
                    f"{'met' if ratio <= 0.5 else 'missed'}."]
    reading += [f"- Noise: 2 x the median CV = {200 * median_cv:.1f}%, "
                f"{'wider' if 2 * median_cv > 0.05 else 'narrower'} than the 5% band: a run can "
                "reach (or miss) it on one lucky (unlucky) measurement; the grid-mean column is "
                "the pick's real quality."] if not math.isnan(median_cv) else []
    reading += [f"- {near} of {GRID_SIZE} configurations have a grid mean within 5% of the "
                f"target: one random draw lands in the band with p ~ {near / GRID_SIZE:.2f}."]
    text = "\n".join([*tables(runs, gt, target), "", *summary, "",
                      "Reading (generated from the numbers above):", "", *reading])
    print("\n" + text)
    if args.engine == "cpu" or args.record:
        engine = "CPU vLLM 0.32" if args.engine == "cpu" else "FakeEngine (no vLLM)"
        machine = f"{os.cpu_count()} cores, {engine}"
        append_section("Search efficiency (issue 6)",
                       f"Command: `{command}`. Machine: {machine}. Load: before `{load_before}`; "
                       f"after `{uptime()}`. Method: see the docstring of "
                       "benchmarks/search_efficiency.py (feasible = in a majority of repeats; "
                       "5% = best-so-far feasible single measurement >= 0.95 x the grid's best "
                       "feasible mean).", text, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
