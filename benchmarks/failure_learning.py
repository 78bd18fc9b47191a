"""Does the search learn from configuration failures? Crashing trials, ours vs plain TPE.

    .venv/bin/python benchmarks/failure_learning.py [--engine fake|cpu] [--seeds 3] [--trials 16]
        [--record]

Space: num-gpu-blocks-override in {4, 8, 16, 32, 64, 128, 256, 512} x max-num-seqs in
{4, 8, 16, 32, 64}, with max-model-len 512 and block size 16: the override's lower half
(4..16 blocks = 64..256 tokens) cannot hold one 512-token sequence, so the server dies at
start-up (FAIL oom_at_startup; vLLM's KV check, which FakeEngine copies). The same TPE sweep
runs with `search.learn_from_failures` on (configuration failures told to Optuna as violated
constraints) and off (plain FAIL, which TPE ignores), for each seed. Reported: crashing
trials among those after TPE's random start-up trials (those are the same for both).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml
from record import ROOT
from record import append_section

SPACE = {"parameters": {
    "num-gpu-blocks-override": {"type": "categorical", "choices": [4, 8, 16, 32, 64, 128, 256, 512]},
    "max-num-seqs": {"type": "categorical", "choices": [4, 8, 16, 32, 64]}}}


def sweep_yaml(work: Path, name: str, engine: str, seed: int, trials: int, learn: bool) -> Path:
    fake = engine == "fake"
    spec = {
        "name": name, "model": str(ROOT / "models" / "tiny-llama"),
        "search_space": str(work / "space.yaml"), "engine": engine,
        "server": {"args": {"max-model-len": 512, "block-size": 16,
                            **({} if fake else {"enforce-eager": True})},
                   "env": {"FAKE_ENGINE_STARTUP_S": "1", "FAKE_ENGINE_TPOT_MS": "5"} if fake else {}},
        "workload": {"num_prompts": 32 if fake else 64, "input_len": 64, "output_len": 32,
                     "max_concurrency": 16, "warmup_requests": 0},
        "sla": {"p99_ttft_ms": 5000},
        "search": {"sampler": "tpe", "n_trials": trials, "seed": seed, "baseline": False,
                   "startup_trials": 4, "learn_from_failures": learn},
        "cluster": {"num_cpus": 2, "num_gpus": 1} if fake else {},
        "results_dir": str(work / "results"),
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=("fake", "cpu"), default="fake")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--record", action="store_true", help="append to docs/BENCHMARKS.md")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fl-"))
    (work / "space.yaml").write_text(yaml.safe_dump(SPACE))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TMPDIR": str(work), "HF_HUB_OFFLINE": "1"}
    rows = []
    for seed in range(args.seeds):
        for learn in (True, False):
            name = f"{'learn' if learn else 'plain'}-s{seed}"
            sweep = sweep_yaml(work, name, args.engine, seed, args.trials, learn)
            res = subprocess.run([sys.executable, "-m", "framework.cli", "run", str(sweep)],
                                 cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
            if res.returncode != 0:
                print(res.stdout[-2000:], res.stderr[-2000:], file=sys.stderr)
                return 1
            t = pd.read_parquet(work / "results" / name / "trials").sort_values("trial_number")
            after = t[t["trial_number"] >= 4]
            crashed = int((after["fail_reason"] == "oom_at_startup").sum())
            best = t.loc[t["feasible"] == True, "objective"].max()  # noqa: E712
            rows.append({"search": "learn_from_failures" if learn else "plain TPE", "seed": seed,
                         "trials after start-up": len(after), "crashed": crashed,
                         "best feasible objective": round(float(best), 1) if pd.notna(best) else None,
                         "wall s": round(float(t["trial_s"].sum()), 1)})
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    summary = table.groupby("search")[["crashed", "trials after start-up", "wall s"]].sum()
    text = table.to_markdown(index=False) + "\n\n" + summary.to_markdown()
    print(text)
    if args.record:
        append_section("Learning from configuration failures",
                       "Command: `.venv/bin/python benchmarks/failure_learning.py --engine "
                       f"{args.engine} --seeds {args.seeds} --trials {args.trials} --record` "
                       f"(engine {args.engine}; method in the script's docstring).", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
