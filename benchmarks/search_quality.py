"""Search quality on a GPU-scale proving ground: how many trials, and how much cluster time,
each search strategy needs before the configuration it would ship is within 3% of the space's
true optimum (issue "Predicted, then measured", item 5).

    .venv/bin/python benchmarks/search_quality.py [--seeds 5] [--budget 60] [--error 0.3]
        [--spaces llama70b-8xH100,qwen32b-4xH200] [--strategies ...] [--no-doc]

The ground (needs the `predict` extra, AIConfigurator's tables): each space is a sweep file of
the fake engine with `gpu:` (its model a shipped config.json of aiconfigurator_core), loaded by
the product's loader; a configuration's TRUE metrics are the product's prediction
(engine/prediction.py: vLLM V1's scheduler in virtual time, sweep/prior.py's deployment and
SLA/feasibility rules) with AIConfigurator's step times multiplied by the simulated truth's
error field (engine/sim_truth.py, `--error`, field seed = the run's seed: one "cluster" per
seed). A MEASUREMENT is the truth times one lognormal factor of CV 2% (sim_truth.RUN_CV; the
throughputs times it, the latencies divided by it). The true optimum is the best true objective
among every configuration of the space that holds the SLA on its true metrics and fits.

Strategies (each through the product's Tuner, search/tuner.py, with its constraints; no
baseline trial, so that every strategy starts from nothing):
- grid: every configuration in the space's product order (vllm bench sweep's way);
- random, tpe, gp: Optuna's samplers (gp: GPSampler, constraint-aware);
- tpe+prior: AIConfigurator's own top 3 (sweep/prior.py Prior.first) enqueued first;
- tpe+prior+corr: the same, and every 2 measured trials the best untried configuration under the
  prediction corrected by this cluster's measurements (engine/correction.py) runs next.
Per run, after each trial k: pick_k = the best MEASURED feasible configuration so far;
reached = the first k whose pick's TRUE objective is >= 97% of the optimum (and truly feasible).
Cluster time to k = the sum of trial times: a launched trial costs START_UP_S plus its simulated
load's duration; a configuration that cannot be placed or does not fit never launches (0 s).
Reported per space and strategy: median (min-max) over seeds of trials and hours to reach, and
how many runs reached within the budget (a run that did not counts as budget + 1 trials).
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import replace
from datetime import UTC
from datetime import datetime
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from record import append_section
from record import uptime

from framework.base.vocabulary import Scalar
from framework.config.search_space import configurations
from framework.engine.prediction import limits_of
from framework.engine.predictor import Deployment
from framework.engine.predictor import MemoryEstimate
from framework.engine.predictor import Predictor
from framework.engine.predictor import predictor
from framework.engine.sim_truth import RUN_CV
from framework.engine.sim_truth import lognormal_factor
from framework.engine.sim_truth import truth_config
from framework.engine.sim_truth import truth_step_time
from framework.engine.step_time import StepTime
from framework.search.tuner import Evaluation
from framework.search.tuner import Tuner
from framework.sweep.loader import load
from framework.sweep.prior import Prior
from framework.trial.objective import evaluate
from framework.trial.objective import per_device

WITHIN = 0.97  # "within 3% of the optimum"
START_UP_S = 300.0  # a 70B-class vLLM start on GPUs: weights, compile, CUDA graphs (assumption)
PRIOR_K = 3
REFIT_EVERY = 2
STRATEGIES = ("grid", "random", "tpe", "gp", "tpe+prior", "tpe+prior+corr")

COMMON = {"max-num-batched-tokens": {"type": "categorical", "choices": [2048, 4096, 8192, 16384]},
          "enable-chunked-prefill": {"type": "bool"},
          "kv-cache-dtype": {"type": "categorical", "choices": ["auto", "fp8"]}}
SPACES = {
    # Llama-3.1-70B on one 8 x H100 node: a chat load (2k in, 256 out)
    "llama70b-8xH100": {
        "model": "meta-llama--Meta-Llama-3.1-70B", "gpu": "H100-80GB", "gpus": 8,
        "params": {"tensor-parallel-size": {"type": "categorical", "choices": [2, 4, 8]},
                   "pipeline-parallel-size": {"type": "categorical", "choices": [1, 2]},
                   "replicas": {"type": "categorical", "choices": [1, 2, 4], "kind": "shape"},
                   "max-num-seqs": {"type": "categorical", "choices": [32, 64, 128, 256, 512]},
                   **COMMON},
        "workload": {"input_len": 2048, "output_len": 256, "num_prompts": 256,
                     "max_concurrency": 64},
        "sla": {"p99_ttft_ms": 6000, "p99_tpot_ms": 60},
    },
    # Qwen3-32B on 4 x H200: long prompts, short answers (RAG-like: 4k in, 128 out)
    "qwen32b-4xH200": {
        "model": "Qwen--Qwen3-32B", "gpu": "H200-141GB", "gpus": 4,
        "params": {"tensor-parallel-size": {"type": "categorical", "choices": [1, 2, 4]},
                   "replicas": {"type": "categorical", "choices": [1, 2, 4], "kind": "shape"},
                   "max-num-seqs": {"type": "categorical", "choices": [16, 32, 64, 128, 256]},
                   **COMMON},
        "workload": {"input_len": 4096, "output_len": 128, "num_prompts": 256,
                     "max_concurrency": 32},
        "sla": {"p99_ttft_ms": 5000, "p99_tpot_ms": 60},
    },
}


@dataclass(frozen=True)
class Truth:
    """The simulated cluster: `model`'s step times x the error field of seed `seed`."""

    model: Predictor
    error: float
    seed: int
    name: str = "truth"

    def unavailable(self) -> str | None:
        return self.model.unavailable()

    def supports(self, d: Deployment) -> str | None:
        return self.model.supports(d)

    def step_time(self, d: Deployment) -> StepTime:
        config = truth_config(d.tensor_parallel, d.pipeline_parallel, limits_of(d, None),
                              d.kv_cache_dtype)
        return truth_step_time(self.model.step_time(d), config, self.error, self.seed)

    def memory(self, d: Deployment) -> MemoryEstimate | None:
        return self.model.memory(d)


def sweep_files(folder: Path, name: str, space: dict) -> Path:
    """The space as a fake-engine sweep with `gpu:` (a model folder of the shipped config)."""
    import aiconfigurator_core

    model = folder / "model"
    model.mkdir()
    shipped = Path(aiconfigurator_core.__file__).parent / "model_configs"
    shutil.copy(shipped / f"{space['model']}_config.json", model / "config.json")
    (folder / "space.yaml").write_text(yaml.safe_dump({"parameters": space["params"]}))
    sweep = folder / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": name.replace("x", "-"), "model": str(model), "search_space": str(folder / "space.yaml"),
        "engine": "fake", "gpu": space["gpu"],
        "workload": {"dataset": "random", **space["workload"]},
        "objective": {"metric": "output_throughput_per_gpu", "direction": "maximize"},
        "sla": space["sla"],
        "search": {"prior": "aiconfigurator", "baseline": False, "prior_top_k": PRIOR_K},
        "results_dir": str(folder / "results")}))
    return sweep


class Ground:
    """One space on one simulated cluster: true metrics of every configuration (cached)."""

    def __init__(self, prior: Prior, gpus: int, truth: Truth) -> None:
        self.prior, self.gpus = prior, gpus
        self.true = Prior(prior.sweep, truth)  # the product's rules, the truth's step times
        self.configs = [c for c in configurations(prior.sweep.space)]

    def placeable(self, params: Mapping[str, Scalar]) -> bool:
        return self.prior.devices(params) <= self.gpus

    def true_value(self, params: Mapping[str, Scalar]) -> float | None:
        """The true objective (None: breaks the SLA, does not fit or cannot be placed)."""
        if not self.placeable(params):
            return None
        p = self.true.of(params)
        return None if p is None else self.true.value(params, p)

    def optimum(self) -> float:
        values = [v for v in map(self.true_value, self.configs) if v is not None]
        return max(values)

    def measure(self, params: Mapping[str, Scalar], rng: random.Random
                ) -> tuple[Evaluation, float, dict[str, float]]:
        """One trial: its evaluation as the runner tells it, the cluster seconds it took and
        its measured metrics (empty when it never launched)."""
        if not self.placeable(params):
            return Evaluation(None, {}, fail_reason="unplaceable"), 0.0, {}
        p = self.true.of(params)
        if p is None or not p.metrics or (p.memory is not None and p.memory.kv_blocks <= 0):
            return Evaluation(None, {}, fail_reason="infeasible"), 0.0, {}
        f = lognormal_factor(RUN_CV, rng)
        measured = {k: (v * f if "throughput" in k else v / f) for k, v in p.metrics.items()}
        spec = self.prior.sweep.spec
        v = evaluate(per_device(measured, self.prior.devices(params)), spec.sla,
                     spec.objective.metric)
        return (Evaluation(v.objective, v.constraints),
                START_UP_S + float(p.metrics["duration"]), measured)


def run(ground: Ground, strategy: str, seed: int, budget: int, optimum: float, folder: Path
        ) -> tuple[int | None, float | None]:
    """(trials, cluster hours) until the pick is within 3% of the optimum (None: not reached)."""
    sweep = ground.prior.sweep
    sampler = {"tpe+prior": "tpe", "tpe+prior+corr": "tpe"}.get(strategy, strategy)
    tuner = Tuner(folder / f"{strategy}-{seed}.journal", "bench", sweep.space, ["maximize"],
                  "random" if sampler == "grid" else sampler, seed, startup_trials=10,
                  constraint_keys=list(sweep.spec.sla))
    order = list(ground.configs) if strategy == "grid" else []
    prior = Prior(replace_refit(sweep, REFIT_EVERY if strategy.endswith("corr") else 0),
                  ground.prior.model, cache=ground.prior.cache)
    if "prior" in strategy:
        tuner.enqueue_new(prior.first(PRIOR_K))
    rng = random.Random(seed * 7919 + 1)
    best_measured, seconds = -math.inf, 0.0
    pick: dict[str, Scalar] | None = None
    for k in range(1, budget + 1):
        if strategy == "grid":
            tuner.enqueue_new([order[k - 1]])
        p = tuner.ask()
        ev, cost, measured = ground.measure(p.params, rng)
        tuner.tell(p, ev)
        seconds += cost
        feasible = ev.objective is not None and all(c <= 0 for c in ev.constraints.values())
        if feasible and float(ev.objective) > best_measured:  # type: ignore[arg-type]
            best_measured, pick = float(ev.objective), dict(p.params)  # type: ignore[arg-type]
        if "corr" in strategy and measured:
            prior.observe(p.params, {"state": "COMPLETE", **measured})
            nxt = prior.corrected_next(tuner.tried())
            if nxt is not None:
                tuner.enqueue_new([nxt])
        if pick is not None:
            true = ground.true_value(pick)
            if true is not None and true >= WITHIN * optimum:
                return k, seconds / 3600
    return None, None


def replace_refit(sweep, every: int):
    spec = sweep.spec.model_copy(update={"search": sweep.spec.search.model_copy(
        update={"prior_refit_every": every})})
    return replace(sweep, spec=spec)


def summarize(results: list[tuple[int | None, float | None]], budget: int) -> str:
    trials = [t if t is not None else budget + 1 for t, _ in results]
    hours = [h for _, h in results if h is not None]
    reached = sum(1 for t, _ in results if t is not None)
    tr = f"{statistics.median(trials):g} ({min(trials)}-{max(trials)})"
    hr = f"{statistics.median(hours):.1f} ({min(hours):.1f}-{max(hours):.1f})" if hours else "-"
    return f"{tr} | {hr} | {reached}/{len(results)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=60)
    ap.add_argument("--error", type=float, default=0.3)
    ap.add_argument("--spaces", default=",".join(SPACES))
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    started, t0 = datetime.now(UTC), time.monotonic()
    load_line = uptime()
    aic = predictor("aiconfigurator")
    if aic.unavailable():
        print(aic.unavailable(), file=sys.stderr)
        return 2
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="vsweep-sq-") as tmp:
        for name in args.spaces.split(","):
            space = SPACES[name]
            folder = Path(tmp) / name
            folder.mkdir()
            sweep = load(sweep_files(folder, name, space), check_flags=False)
            prior = Prior(sweep, aic)
            results: dict[str, list[tuple[int | None, float | None]]] = {s: [] for s in
                                                                          args.strategies.split(",")}
            for seed in range(args.seeds):
                ground = Ground(prior, space["gpus"], Truth(aic, args.error, seed))
                feasible = sum(1 for c in ground.configs if ground.true_value(c) is not None)
                if not feasible:
                    notes.append(f"{name} seed {seed}: no configuration holds the SLA: skipped")
                    continue
                optimum = ground.optimum()
                near = sum(1 for c in ground.configs
                           if (v := ground.true_value(c)) is not None and v >= WITHIN * optimum)
                notes.append(f"{name} seed {seed}: {len(ground.configs)} configurations, "
                             f"{feasible} truly feasible, {near} within 3% of the optimum "
                             f"{optimum:.1f} tok/s/GPU")
                print(notes[-1], flush=True)
                for strategy in results:
                    results[strategy].append(run(ground, strategy, seed, args.budget, optimum,
                                                 folder))
                    print(f"  {strategy}: {results[strategy][-1]}", flush=True)
            for strategy, found in results.items():
                rows.append(f"| {name} | {strategy} | {summarize(found, args.budget)} |")
    table = ("| space | strategy | trials to 3% (median, min-max) | cluster hours to 3% | "
             "reached |\n|---|---|---|---|---|\n" + "\n".join(rows))
    print(table)
    if not args.no_doc:
        append_section(
            "Search quality on the simulated GPU ground (issue #37)",
            f"`.venv/bin/python benchmarks/search_quality.py --seeds {args.seeds} --budget "
            f"{args.budget} --error {args.error}` ({time.monotonic() - t0:.0f} s; {load_line}). "
            f"Start-up {START_UP_S:.0f} s per launched trial; measurement noise CV {RUN_CV:.0%}; "
            "no baseline trial.", table + "\n\n" + "\n".join(f"- {n}" for n in notes), started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
