"""The ask -> trial -> record -> tell loop of one sweep, with trials side by side.

Order per trial: ask Optuna -> placement check and feasibility model (a configuration that
can never be placed, or cannot fit in memory, is recorded without launching) -> run the trial in a worker thread (reserve its
placement group, start, warm up, measure, stop) -> write request rows, then the trial row ->
tell Optuna. Optuna is touched from the calling thread (and, for a screening run's pruning
decision, from the trial's thread through the Tuner's lock). A new trial is asked for only
while fewer than MAX_WAITING earlier ones still wait for placement, or while devices sit free
that none of them can use (placement.ask_another), so the study stays close to what the cluster
can place and small trials backfill behind a large one; the loop wakes when a trial ends and
when a background stop releases a group. Ray reserves each group all-or-nothing, so queued
trials hold nothing and cannot deadlock. Rows are keyed by trial number: a resumed sweep
rewrites rather than duplicates, and a driver killed between writing and telling leaves a
RUNNING trial that the next run closes as FAIL(interrupted). With server.reuse, a measured
trial's server is kept for one asking round: a new trial with the same vLLM flags takes it
over (trial.Reused), otherwise it is stopped in the background.
"""

from __future__ import annotations

import importlib.metadata
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import pandas as pd
from rich.console import Console

from framework.engine.feasibility import Feasibility
from framework.trial.objective import evaluate_repeated, per_device
from framework.cluster.placement import Bundle, ask_another, bundles, fits, node_unit, shape_of, \
    why_unplaceable
from framework.results.provenance import provenance
from framework.results.console import Progress, print_summary
from framework.results.rows import (
    REQUEST_COLUMNS,
    TrialContext,
    param_column,
    plain,
    request_rows,
    trial_columns,
    trial_row,
)
from framework.engine.server_args import serve_command, server_argv, trial_flags
from framework.trial.measure import LoadPlan
from framework.config.search_space import grid_size
from framework.sweep.loader import Sweep, feasibility, load_plan, with_run_settings
from framework.sweep.server_pool import ServerPool
from framework.trial.run import Reused, ServerLauncher, TrialOutcome, run_trial
from framework.search.tuner import Evaluation, Proposal, Tuner


class ClusterLauncher(ServerLauncher, Protocol):
    def node_resources(self) -> list[dict[str, float]]: ...

    def free_devices(self) -> float: ...

    def stop_all(self) -> None: ...


def _vllm_version() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Runner:
    """Runs the trials of one sweep against a launcher and records them."""

    def __init__(self, sweep: Sweep, launcher: ClusterLauncher, console: Console) -> None:
        self.sweep, self.launcher, self.console = sweep, launcher, console
        self.spec = sweep.spec
        self.store = sweep.store
        self.columns = trial_columns(sweep.space, self.spec.workload.percentiles,
                                     list(self.spec.sla))
        self.vllm_version = _vllm_version()
        self.tuner = Tuner(self.store.journal_path, self.spec.name, sweep.space,
                           self.spec.objective.directions, self.spec.search.sampler,
                           self.spec.search.seed, self.spec.search.effective_startup_trials,
                           constraint_keys=list(self.spec.sla),
                           learn_from_failures=self.spec.search.learn_from_failures,
                           screen_margin=(self.spec.search.screen_margin
                                          if self.spec.search.screen else None))
        self._lock = threading.Lock()
        self._waiting: dict[int, int] = {}  # trial number -> devices, until placed
        self._stopper = ThreadPoolExecutor(max_workers=4, thread_name_prefix="stop")
        self._stops: list[Future] = []
        self._pool = ServerPool(self.spec.server.reuse, self._stop_later)
        self.provenance = provenance(self.spec, launcher.node_resources())

    def _record(self, p: Proposal, flags: dict, outcome: TrialOutcome,
                feas: Feasibility | None = None, server_log: Path | None = None) -> dict:
        obj = self.spec.objective
        verdict, intervals = None, None
        if outcome.ok:
            devices = shape_of(flags).world_size
            runs = [per_device(r, devices) for r in outcome.runs or (outcome.metrics,)]
            outcome = replace(outcome, metrics=per_device(outcome.metrics, devices))
            verdict, intervals = evaluate_repeated(runs, self.spec.sla, obj.metric,
                                                   obj.pareto_with, self.spec.search.sla_on)
        ctx = TrialContext(number=p.number, params=p.params, is_baseline=p.is_baseline,
                           serve_command=serve_command(str(self.spec.model), flags),
                           vllm_version=self.vllm_version,
                           server_log=str(server_log or self.store.log_path(p.number)),
                           feasibility=feas,
                           sla=self.spec.sla, provenance=self.provenance,
                           confirmation_of=p.confirm_of)
        row = trial_row(ctx, outcome, verdict, self.columns, intervals)
        self.store.write_requests(p.number, request_rows(p.number, outcome), REQUEST_COLUMNS)
        self.store.write_trial(row, self.columns)
        self.tuner.tell(p, Evaluation(
            objective=(verdict.values if len(verdict.values) > 1 else verdict.objective)
            if verdict else None,
            constraints=verdict.constraints if verdict else {}, fail_reason=outcome.fail_reason,
            violation=feas.violation if feas is not None and not feas.ok else 1.0))
        return row

    def _devices(self, nodes: list[dict[str, float]]) -> int | None:
        """Devices a trial may span: the cluster's GPUs (None on the CPU engine, whose
        workers are bounded by placement instead)."""
        return None if self.spec.engine == "cpu" else int(sum(n.get("GPU", 0) for n in nodes))

    def _rejected(self, p: Proposal, flags: dict, wanted: list[Bundle],
                  nodes: list[dict[str, float]]) -> tuple[TrialOutcome | None, Feasibility | None]:
        """A trial that must not launch (unplaceable, or infeasible by the memory model), as
        its outcome; (None, feasibility) when it may launch."""
        now = datetime.now(timezone.utc)
        unit = node_unit(shape_of(flags))
        if not fits(wanted, nodes, unit):
            return TrialOutcome(started_at=now, argv=(), fail_reason="unplaceable",
                                fail_detail=why_unplaceable(wanted, nodes, unit)), None
        feas = feasibility(self.sweep, flags, self._devices(nodes))
        if feas is not None and not feas.ok:
            return TrialOutcome(started_at=now, argv=(), fail_reason="infeasible",
                                fail_detail="; ".join(feas.reasons)), feas
        return None, feas

    def _record_interrupted(self, number: int, params: dict, is_baseline: bool) -> None:
        outcome = TrialOutcome(started_at=datetime.now(timezone.utc), argv=(),
                               fail_reason="interrupted", fail_detail="the driver stopped mid-trial")
        ctx = TrialContext(number=number, params=params, is_baseline=is_baseline, serve_command="",
                           vllm_version=self.vllm_version, server_log=str(self.store.log_path(number)),
                           provenance=self.provenance)
        self.store.write_requests(number, [], REQUEST_COLUMNS)
        self.store.write_trial(trial_row(ctx, outcome, None, self.columns), self.columns)

    def _trial(self, p: Proposal, flags: dict, wanted: list[Bundle], plan: LoadPlan,
               progress: Progress, feas: Feasibility | None,
               reuse: Reused | None, log_path: Path) -> TrialOutcome:
        """Runs in a worker thread; releases its 'waiting for placement' slot exactly once."""
        released = threading.Event()

        def placed() -> None:
            if not released.is_set():
                released.set()
                with self._lock:
                    self._waiting.pop(p.number, None)

        model = str(self.spec.model)
        if self.spec.server.dummy_weights:
            flags = {**flags, "load-format": "dummy"}
        for warning in feas.warnings if feas is not None else ():
            progress.phase(p.number, f"note: {warning}")
        try:
            return run_trial(self.launcher, lambda host, port: server_argv(model, flags, host, port),
                             plan, log_path, wanted,
                             phase=lambda text: progress.phase(p.number, text), on_placed=placed,
                             stop_later=lambda server: self._pool.hand_over(p.number, server),
                             reuse=reuse, screen=lambda metrics: self._screen(p, flags, metrics),
                             unit=node_unit(shape_of(flags)))
        finally:
            placed()

    def _screen(self, p: Proposal, flags: dict, metrics: dict[str, float]) -> str | None:
        """From a trial's thread, after its screening run: why it stops there (PRUNED), or
        None. An SLA limit broken by more than screen_margin prunes it outright; otherwise its
        objective goes to Optuna's pruner (tuner.FarFromBestPruner)."""
        margin = self.spec.search.screen_margin
        for key, limit in self.spec.sla.items():
            value = metrics.get(key)
            if value is not None and value > limit * (1 + margin):
                return f"screening run: {key} {value:.4g} > {limit:g} by more than {margin:.0%}"
        metric = self.spec.objective.metric
        value = per_device(metrics, shape_of(flags).world_size).get(metric)
        if value is None or not self.tuner.screen(p, float(value)):
            return None
        return (f"screening run: {metric} {value:.4g} is more than {margin:.0%} worse than the "
                "best feasible trial's screen")

    def _queue_siblings(self, p: Proposal, outcome: TrialOutcome) -> None:
        """server.reuse with a model-guided sampler: a trial that started a server and measured
        on it is followed by its configuration at the other values of its discrete run
        settings, which then run on that server (the grid sampler orders its walk instead)."""
        if (self.spec.server.reuse and self.spec.search.sampler != "grid"
                and not outcome.server_reused and p.confirm_of is None and not p.is_baseline
                and outcome.fail_reason in (None, "pruned")):
            self.tuner.enqueue_new(self.sweep.space.siblings(p.params))

    def _key(self, flags: dict) -> str:
        return serve_command(str(self.spec.model), flags)

    def _stop_later(self, number: int, server) -> None:
        """Stop a measured trial's server off the critical path (the next trial starts
        meanwhile); `_join_stops` waits for every such stop before the sweep ends."""
        def stop() -> None:
            left = server.stop()
            if left:
                self.console.print(f"  trial {number}: processes {left} survived the stop")

        with self._lock:
            self._stops.append(self._stopper.submit(stop))

    def _stops_running(self) -> list[Future]:
        """The background stops still running; those that ended are reported and dropped."""
        with self._lock:
            ended = [f for f in self._stops if f.done()]
            self._stops = [f for f in self._stops if f not in ended]
            running = list(self._stops)
        for fut in ended:
            self._report_stop(fut)
        return running

    def _join_stops(self) -> None:
        with self._lock:
            pending, self._stops = self._stops, []
        for fut in pending:
            self._report_stop(fut)

    def _report_stop(self, fut: Future) -> None:
        try:
            fut.result(timeout=180)
        except Exception as exc:  # noqa: BLE001 - reported; stop_all and the session reap
            self.console.print(f"a background stop failed: {exc}")

    def _may_ask(self) -> bool:
        with self._lock:
            waiting = list(self._waiting.values())
        return ask_another(waiting, self.launcher.free_devices())

    def _flags(self, p: Proposal) -> dict:
        return trial_flags(self.spec.server.args, self.sweep.space.server_params(p.params),
                           p.is_baseline)

    def _plan(self, plan: LoadPlan, p: Proposal) -> LoadPlan:
        """The sweep's load with this trial's run settings (the baseline's: their defaults)."""
        return with_run_settings(plan, self.spec, self.sweep.space.run_settings(p.params))

    def _retry(self, p: Proposal, row: dict) -> bool:
        """Queue a node_lost trial's configuration again, once, if the sweep asks for it."""
        if row["fail_reason"] != "node_lost" or not self.spec.cluster.retry_node_lost:
            return False
        if p.retry_of is not None:
            return False
        self.tuner.enqueue_retry(p.params, p.is_baseline, p.number)
        return True

    def _queue_confirmations(self) -> int:
        """Once the trials are done: queue the `confirm_top` best feasible configurations
        once more (distinct configurations, confirmation runs not themselves confirmed);
        nothing if the study already holds confirmations. Returns how many were queued."""
        k = self.spec.search.confirm_top
        if not k or self.tuner.has_confirmations():
            return 0
        trials = self.store.read_trials()
        if trials.empty:
            return 0
        ok = trials[(trials["state"] == "COMPLETE") & (trials["feasible"] == True)  # noqa: E712
                    & trials["confirmation_of"].isna()]
        ok = ok.sort_values("objective", ascending=self.spec.objective.direction != "maximize")
        top = ok.drop_duplicates("serve_command").head(k)
        for _, row in top.iterrows():
            params = {n: plain(row[param_column(n)]) for n in self.sweep.space.parameters
                      if param_column(n) in row and pd.notna(row[param_column(n)])}
            self.tuner.enqueue_confirmation(params, bool(row["is_baseline"]),
                                            int(row["trial_number"]))
        return len(top)

    def recover(self) -> None:
        """Close trials an earlier, killed driver left RUNNING (re-queued if the sweep says
        so), then queue the baseline."""
        requeue = self.spec.search.requeue_interrupted
        for number in self.tuner.close_interrupted():
            t = self.tuner.study.trials[number]
            is_baseline = bool(t.user_attrs.get("baseline"))
            self._record_interrupted(number, dict(t.params), is_baseline)
            if requeue:
                self.tuner.enqueue_retry(dict(t.params), is_baseline, number)
            self.console.print(f"trial {number} was interrupted by an earlier run: recorded as "
                               f"FAIL(interrupted){'; queued to run again' if requeue else ''}")
        if self.spec.search.baseline:
            self.tuner.enqueue_baseline(self.sweep.space.defaults())

    def run(self, target: int) -> None:
        """Run trials until the study holds `target` finished trials."""
        spec = self.spec
        self.recover()
        done = self.tuner.finished()
        target += self.tuner.waiting_retries()
        if spec.search.sampler == "grid":
            whole = grid_size(self.sweep.space) + int(spec.search.baseline)
            if target > whole:
                self.console.print(f"the grid holds {whole} configurations"
                                   f"{' (with the baseline)' if spec.search.baseline else ''}: "
                                   f"running {whole} trials, not {target}")
                target = whole
        if done >= target:
            target += self._queue_confirmations()
        if done >= target:
            self.console.print(f"study '{spec.name}' already holds {done} finished trials "
                               f"(target {target}); nothing to run. Use --add-trials N to extend.")
            return
        plan = load_plan(spec)
        progress = Progress(self.console, target, spec.objective.metric,
                            spec.objective.direction == "maximize")
        ttft_key = next((k for k in spec.sla if "ttft" in k), "p99_ttft_ms")
        tpot_key = next((k for k in spec.sla if "tpot" in k), "p99_tpot_ms")
        limit = spec.concurrent_trials or 256
        running: dict[Future, tuple[Proposal, dict, Feasibility | None, Path, str]] = {}
        # run settings in the space: trials that differ only in them can share a server, which
        # asking ahead of the cluster would defeat (the next trial would already be waiting)
        reuse_first = spec.server.reuse and bool(self.sweep.space.run_params)
        pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="trial")
        try:
            while True:
                if done >= target:
                    extra = self._queue_confirmations()
                    if not extra:
                        break
                    target += extra
                    progress.total = target
                    progress.note(f"confirmation runs: the {extra} best feasible "
                                  "configurations once more, on fresh servers")
                parked = self._pool.has_parked()
                while len(running) < limit and done + len(running) < target:
                    if reuse_first and running and not parked and (
                            self._waiting or self.launcher.free_devices() < 1):
                        break  # queue nothing ahead: a finishing server may serve the next
                    parked = False  # a parked server lets one trial be asked for it
                    if not self._may_ask():
                        break
                    p = self.tuner.ask()
                    flags = self._flags(p)
                    wanted = bundles(shape_of(flags), spec.engine, spec.cluster.cpus_per_worker)
                    progress.trial_started(p.number, done + len(running), p.params, p.is_baseline,
                                           p.confirm_of)
                    rejected, feas = self._rejected(p, flags, wanted,
                                                    self.launcher.node_resources())
                    if rejected is not None:
                        row = self._record(p, flags, rejected, feas)
                        progress.trial_finished(row, ttft_key, tpot_key)
                        done += 1
                        continue
                    with self._lock:
                        self._waiting[p.number] = len(wanted)
                    # confirmation runs re-measure on fresh servers
                    key = self._key(flags)
                    reuse = None if p.confirm_of is not None else self._pool.take(key)
                    log_path = reuse.log_path if reuse else self.store.log_path(p.number)
                    running[pool.submit(self._trial, p, flags, wanted, self._plan(plan, p),
                                        progress, feas, reuse, log_path)] = (p, flags, feas,
                                                                             log_path, key)
                self._pool.stop_unclaimed()
                # a stop that releases a group wakes the loop: its devices may backfill
                finished, _ = wait([*running, *self._stops_running()], timeout=1.0,
                                   return_when=FIRST_COMPLETED)
                for fut in (f for f in finished if f in running):
                    p, flags, feas, log_path, key = running.pop(fut)
                    outcome = fut.result()
                    row = self._record(p, flags, outcome, feas, log_path)
                    self._pool.settle(p.number, key, outcome.argv, log_path)
                    self._queue_siblings(p, outcome)
                    progress.trial_finished(row, ttft_key, tpot_key)
                    done += 1
                    if self._retry(p, row):
                        target += 1
                        progress.total = target
                        progress.note(f"  trial {p.number}: its node died; queued once more")
        except BaseException:
            self.launcher.stop_all()
            self._join_stops()
            for fut, (p, *_) in running.items():
                try:
                    fut.result(timeout=120)
                except BaseException:  # noqa: BLE001 - the trial is recorded as interrupted
                    pass
                self._record_interrupted(p.number, p.params, p.is_baseline)
                self.tuner.fail(p, "interrupted")
                if spec.search.requeue_interrupted:
                    self.tuner.enqueue_retry(p.params, p.is_baseline, p.number)
            raise
        finally:
            self._pool.stop_all()
            self._join_stops()
            pool.shutdown(wait=False, cancel_futures=True)

    def summary(self) -> None:
        spec = self.spec
        print_summary(self.console, self.store.read_trials(), list(self.sweep.space.parameters),
                      spec.objective.metric, spec.objective.direction == "maximize", spec.sla)
