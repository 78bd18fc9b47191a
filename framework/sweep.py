"""One sweep: specs + search space -> Optuna loop over real trials -> Parquet rows -> summary.

Order per trial: ask Optuna -> run the trial (start, warm up, measure, stop) -> write request
rows, then the trial row -> tell Optuna. Rows are keyed by trial number, so a resumed sweep
rewrites rather than duplicates; a driver killed between writing and telling leaves a RUNNING
trial that the next run closes as FAIL(interrupted).
"""

from __future__ import annotations

import importlib.metadata
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from framework.errors import ConfigError
from framework.objective import evaluate, goodput_slo_ms
from framework.report import Progress, print_summary
from framework.rows import REQUEST_COLUMNS, TrialContext, request_rows, trial_columns, trial_row
from framework.search_space import SearchSpace, load_search_space
from framework.server_args import merge_flags, serve_command, server_argv
from framework.specs import SweepSpec, load_sweep
from framework.store import ResultStore
from framework.trial import LoadPlan, ServerLauncher, TrialOutcome, run_trial
from framework.tuner import Evaluation, Proposal, Tuner
from framework.workload import arrival_offsets, load_tokenizer, random_requests


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: its spec, its search space and where the sweep file was."""

    path: Path
    spec: SweepSpec
    space: SearchSpace

    @property
    def store(self) -> ResultStore:
        return ResultStore(self.spec.results_dir, self.spec.name)


def load(path: Path) -> Sweep:
    """Load and cross-check a sweep and its search space (ConfigError on any problem)."""
    spec = load_sweep(path)
    if not spec.search_space.is_file():
        raise ConfigError(str(path), "search_space", str(spec.search_space), "file not found")
    space = load_search_space(spec.search_space)
    if not (spec.model / "config.json").is_file():
        raise ConfigError(str(path), "model", str(spec.model),
                          "no config.json there (for the quickstart model run `make model`)")
    if spec.search.baseline and space.missing_defaults():
        raise ConfigError(str(spec.search_space), f"parameters.{space.missing_defaults()[0]}.default",
                          None, "search.baseline is on, so every parameter needs vLLM's default")
    for name in space.parameters:
        if name in ("model", "host", "port"):
            raise ConfigError(str(spec.search_space), f"parameters.{name}", name,
                              "set by vllm-sweep, cannot be searched")
    return Sweep(path=path, spec=spec, space=space)


def server_env(spec: SweepSpec) -> dict[str, str]:
    """Environment of every server: offline, caches inside the project, then the sweep's env."""
    cache = Path(".cache").resolve()
    env = {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1", "VLLM_CACHE_ROOT": str(cache / "vllm"), "HF_HOME": str(cache / "hf"),
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
    }
    if spec.engine == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    env.update(spec.server.env)
    return env


def load_plan(spec: SweepSpec) -> LoadPlan:
    w = spec.workload
    tok = load_tokenizer(spec.model)
    measured = random_requests(tok, w.num_prompts, w.input_len, w.output_len, w.seed, w.range_ratio)
    warmup = random_requests(tok, w.warmup_requests, w.input_len, w.output_len, w.seed + 1,
                             w.range_ratio) if w.warmup_requests else []
    arrivals = None if math.isinf(w.request_rate) else arrival_offsets(
        w.num_prompts, w.request_rate, w.burstiness, w.seed)
    return LoadPlan(model=str(spec.model), warmup=warmup, measured=measured, arrivals=arrivals,
                    max_concurrency=w.max_concurrency, ignore_eos=w.ignore_eos,
                    request_timeout_s=w.request_timeout_s, percentiles=w.percentiles,
                    goodput_slo_ms=goodput_slo_ms(spec.sla),
                    startup_timeout_s=spec.server.startup_timeout_s)


def _vllm_version() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Runner:
    """Runs the trials of one sweep against a launcher and records them."""

    def __init__(self, sweep: Sweep, launcher: ServerLauncher, console: Console) -> None:
        self.sweep, self.launcher, self.console = sweep, launcher, console
        self.spec = sweep.spec
        self.store = sweep.store
        self.columns = trial_columns(sweep.space, self.spec.workload.percentiles)
        self.vllm_version = _vllm_version()
        self.tuner = Tuner(self.store.journal_path, self.spec.name, sweep.space,
                           self.spec.objective.direction == "maximize", self.spec.search.sampler,
                           self.spec.search.seed, self.spec.search.effective_startup_trials)

    def _record(self, p: Proposal, flags: dict, outcome: TrialOutcome) -> dict:
        verdict = (evaluate(outcome.metrics, self.spec.sla, self.spec.objective.metric)
                   if outcome.ok else None)
        ctx = TrialContext(number=p.number, params=p.params, is_baseline=p.is_baseline,
                           serve_command=serve_command(str(self.spec.model), flags),
                           vllm_version=self.vllm_version,
                           server_log=str(self.store.log_path(p.number)))
        row = trial_row(ctx, outcome, verdict, self.columns)
        self.store.write_requests(p.number, request_rows(p.number, outcome), REQUEST_COLUMNS)
        self.store.write_trial(row, self.columns)
        self.tuner.tell(p, Evaluation(objective=verdict.objective if verdict else None,
                                      constraints=verdict.constraints if verdict else {},
                                      fail_reason=outcome.fail_reason))
        return row

    def _record_interrupted(self, number: int, params: dict, is_baseline: bool, argv=()) -> None:
        outcome = TrialOutcome(started_at=datetime.now(timezone.utc), argv=tuple(argv),
                               fail_reason="interrupted", fail_detail="the driver stopped mid-trial")
        ctx = TrialContext(number=number, params=params, is_baseline=is_baseline, serve_command="",
                           vllm_version=self.vllm_version, server_log=str(self.store.log_path(number)))
        self.store.write_requests(number, [], REQUEST_COLUMNS)
        self.store.write_trial(trial_row(ctx, outcome, None, self.columns), self.columns)

    def run(self, target: int) -> None:
        """Run trials until the study holds `target` finished trials."""
        spec = self.spec
        for number in self.tuner.close_interrupted():
            t = self.tuner.study.trials[number]
            self._record_interrupted(number, dict(t.params), bool(t.user_attrs.get("baseline")))
            self.console.print(f"trial {number} was interrupted by an earlier run: recorded as "
                               "FAIL(interrupted)")
        if spec.search.baseline:
            self.tuner.enqueue_baseline(self.sweep.space.defaults())
        done = self.tuner.finished()
        if done >= target:
            self.console.print(f"study '{spec.name}' already holds {done} finished trials "
                               f"(target {target}); nothing to run. Use --add-trials N to extend.")
            return
        plan = load_plan(spec)
        progress = Progress(self.console, target, spec.objective.metric,
                            spec.objective.direction == "maximize")
        ttft_key = next((k for k in spec.sla if "ttft" in k), "p99_ttft_ms")
        tpot_key = next((k for k in spec.sla if "tpot" in k), "p99_tpot_ms")
        while done < target:
            p = self.tuner.ask()
            flags = merge_flags(spec.server.args, {} if p.is_baseline else p.params)
            progress.trial_started(p.number, done, p.params, p.is_baseline)
            try:
                outcome = run_trial(
                    self.launcher,
                    lambda host, port, f=flags: server_argv(str(spec.model), f, host, port),
                    plan, self.store.log_path(p.number),
                    phase=lambda text, n=p.number: progress.phase(n, text))
            except BaseException:
                self._record_interrupted(p.number, p.params, p.is_baseline)
                self.tuner.fail(p, "interrupted")
                raise
            row = self._record(p, flags, outcome)
            progress.trial_finished(row, ttft_key, tpot_key)
            done += 1

    def summary(self) -> None:
        spec = self.spec
        print_summary(self.console, self.store.read_trials(), list(self.sweep.space.parameters),
                      spec.objective.metric, spec.objective.direction == "maximize", spec.sla)
