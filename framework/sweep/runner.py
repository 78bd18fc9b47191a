"""The ask -> trial -> record -> tell loop of one sweep, with trials side by side.

Order per trial: ask Optuna -> its plan (flags, shape, bundles, server key, load:
`trial_plan.TrialPlan`, worked out once) -> placement check and feasibility model (a
configuration that can never be placed, or cannot fit in memory, is recorded without launching)
-> run the trial in a worker thread (reserve its placement group, start, warm up, measure) ->
judge it (trial.judge) -> write request rows, then the trial row -> tell Optuna. Optuna is
touched only through the Tuner, from the calling thread (and, for a screening run's pruning
decision, from the trial's thread through the Tuner's lock). A new trial is asked for only
while fewer than MAX_WAITING earlier ones still wait for placement, or while devices sit free
that none of them can use (placement.ask_another), so the study stays close to what the cluster
can place and small trials backfill behind a large one; the loop wakes when a trial ends and
when a background stop releases a group. Ray reserves each group all-or-nothing, so queued
trials hold nothing and cannot deadlock. Rows are keyed by trial number: a resumed sweep
rewrites rather than duplicates, and a driver killed between writing and telling leaves a
RUNNING trial that the next run closes as FAIL(interrupted). A measured trial's server goes to
the `ServerPool`: with server.reuse it is kept for one asking round, and a new trial with the
same vLLM flags takes it over (trial.Reused); otherwise it is stopped in the background, and
every stop is joined before `run` returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any
from typing import Protocol

from rich.console import Console

from framework.cluster.placement import ask_another
from framework.config.search_space import grid_size
from framework.config.workloads_spec import class_names
from framework.engine.feasibility import Feasibility
from framework.engine.flag_cache import vllm_version
from framework.engine.kv_transfer import default_connector
from framework.fleet.columns import Sizing
from framework.results.console import Progress
from framework.results.console import print_summary
from framework.results.decision import device_of
from framework.results.provenance import provenance
from framework.results.rows import REQUEST_COLUMNS
from framework.results.rows import TrialContext
from framework.results.rows import request_rows
from framework.results.rows import trial_columns
from framework.results.rows import trial_row
from framework.results.workload_rows import workload_columns
from framework.results.workload_rows import workload_rows
from framework.search.tuner import Evaluation
from framework.search.tuner import Tuner
from framework.sweep.follow_ups import queue_corrected
from framework.sweep.follow_ups import queue_retry
from framework.sweep.follow_ups import queue_siblings
from framework.sweep.loader import Sweep
from framework.sweep.prior import off_reason as prior_off
from framework.sweep.prior import sweep_prior
from framework.sweep.quality_gate import QualityGate
from framework.sweep.remeasure import queue_confirmations
from framework.sweep.remeasure import queue_end_runs
from framework.sweep.remeasure import queue_interleaved
from framework.sweep.remeasure import remeasure_load
from framework.sweep.server_pool import ServerPool
from framework.sweep.trial_load import load_plan
from framework.sweep.trial_plan import Running
from framework.sweep.trial_plan import TrialPlan
from framework.sweep.trial_plan import plan_trial
from framework.sweep.trial_plan import rejection
from framework.trial.judge import judge
from framework.trial.measure import LoadPlan
from framework.trial.objective import per_device
from framework.trial.replicas import ReplicaLauncher
from framework.trial.replicas import check_transfer
from framework.trial.run import Reused
from framework.trial.run import ServerLauncher
from framework.trial.run import TrialOutcome
from framework.trial.run import run_trial
from framework.trial.share_gate import OPEN
from framework.trial.share_gate import ShareGate


class ClusterLauncher(ServerLauncher, Protocol):
    def node_resources(self) -> list[dict[str, float]]: ...

    def placeable_nodes(self) -> list[dict[str, float]]: ...

    def free_devices(self) -> float: ...

    def stop_all(self) -> None: ...


@dataclass
class _Loop:
    """One `run`'s state: the trials it must finish, those finished, those running."""

    target: int
    done: int
    load: LoadPlan
    progress: Progress
    executor: ThreadPoolExecutor
    running: dict[Future[TrialOutcome], Running] = field(default_factory=dict)


class Runner:
    """Runs the trials of one sweep against a launcher and records them."""

    def __init__(self, sweep: Sweep, launcher: ClusterLauncher, console: Console,
                 gate: ShareGate | None = None) -> None:
        """`gate`: the share gate to use (default: share_gate's rule for cluster.start_ahead)."""
        self.sweep, self.launcher, self.console = sweep, launcher, console
        self.spec = spec = sweep.spec
        self.store = sweep.store
        self.store.write_origin(sweep.path)
        classes = class_names(w.mix for w in (*spec.workloads, spec.workload))
        self.columns = trial_columns(sweep.space, spec.workload.percentiles, list(spec.sla),
                                     classes)
        self.workload_columns = workload_columns(spec.workload.percentiles, classes)
        self.vllm_version = vllm_version() or "unknown"
        self.tuner = Tuner(spec.search.storage or self.store.journal_path, spec.name, sweep.space,
                           spec.objective.directions, spec.search.sampler,
                           spec.search.seed, spec.search.effective_startup_trials,
                           constraint_keys=list(spec.sla),
                           learn_from_failures=spec.search.learn_from_failures,
                           screen_margin=(spec.search.screen_margin
                                          if spec.search.screen else None))
        self._lock = threading.Lock()
        self._search_target = spec.search.n_trials  # set by run()
        self._waiting: dict[int, int] = {}  # trial number -> devices, until placed
        # start-ahead: servers start side by side, each measured alone (trial.share_gate)
        self._gate = gate or (ShareGate() if spec.cluster.start_ahead else OPEN)
        self._pool = ServerPool(spec.server.reuse, console.print, gate=self._gate)
        self._quality = QualityGate(sweep)  # the quality probe: which trials, the reference
        self._prior = sweep_prior(sweep)  # search.prior: predictions (sweep.prior)
        if spec.search.prior is not None and self._prior is None:
            console.print(f"search.prior {spec.search.prior} is off: {prior_off(sweep)}")
        self.provenance = provenance(spec, launcher.node_resources())
        self._limit = spec.concurrent_trials or 256
        # run settings in the space: trials that differ only in them can share a server, which
        # asking ahead of the cluster would defeat (the next trial would already be waiting)
        self._reuse_first = spec.server.reuse and bool(sweep.space.run_params)
        self._ttft_key = next((k for k in spec.sla if "ttft" in k), "p99_ttft_ms")
        self._tpot_key = next((k for k in spec.sla if "tpot" in k), "p99_tpot_ms")

    def run(self, target: int) -> None:
        """Run trials until the study holds `target` finished trials (plus the queued re-runs
        and, at the end, the confirmation runs). Every server is stopped before it returns;
        on an exception (Ctrl-C) the trials in flight are recorded as FAIL(interrupted)."""
        spec = self.spec
        self.recover()
        done = self.tuner.finished()
        # re-runs come on top of the grid's size: an interrupted grid point runs again
        target = self._grid_capped(target) + self.tuner.waiting_retries()
        if done >= target:
            target += sum(queue_confirmations(self.spec, self.sweep.space, self.tuner,
                                              self.store.read_trials()))
        if done >= target:
            self.console.print(f"study '{spec.name}' already holds {done} finished trials "
                               f"(target {target}); nothing to run. Use --add-trials N to extend.")
            return
        load = load_plan(spec, self.sweep.api_key)
        progress = Progress(self.console, target, spec.objective.metric,
                            spec.objective.direction == "maximize")
        self._search_target = target
        loop = _Loop(target, done, load, progress,
                     ThreadPoolExecutor(max_workers=self._limit, thread_name_prefix="trial"))
        try:
            while self._goes_on(loop):
                self._ask_and_launch(loop)
                self._pool.stop_unclaimed()
                self._collect_finished(loop)
        except BaseException:
            self._interrupt(loop)
            raise
        finally:
            self._pool.stop_all()
            self._pool.join()
            loop.executor.shutdown(wait=False, cancel_futures=True)
            self.store.publish_journal()  # the interrupted trials' FAIL, the queued re-runs
            self.store.publish_logs()  # each fetched from its node when its server stopped

    def _grid_capped(self, target: int) -> int:
        """The grid sampler runs each configuration once: at most the grid's size (with the
        baseline) trials, plus the baseline's re-measurements during the search
        (search.baseline_repeats, sweep.remeasure), which would otherwise take the place of
        grid points (they count toward the target)."""
        spec = self.spec
        if spec.search.sampler != "grid":
            return target
        whole = grid_size(self.sweep.space) + int(spec.search.baseline)
        repeats = spec.search.interleaved_runs
        if target > whole:
            self.console.print(f"the grid holds {whole} configurations"
                               f"{' (with the baseline)' if spec.search.baseline else ''}: "
                               f"running {whole} trials, not {target}")
            target = whole
        return target + repeats

    def _goes_on(self, loop: _Loop) -> bool:
        """Whether trials remain; at the target, the confirmation runs are queued (once) and
        the loop goes on for them."""
        if loop.done < loop.target:
            return True
        queued, note = queue_end_runs(self.spec, self.sweep.space, self.tuner,
                                      self.store.read_trials())
        if not queued:
            return False
        loop.target += queued
        loop.progress.total = loop.target
        loop.progress.note(note)
        return True

    def _ask_and_launch(self, loop: _Loop) -> None:
        """Ask for trials while the target, the concurrency limit and the cluster's room
        allow; each is recorded at once if it must not launch, else launched."""
        parked = self._pool.has_parked()
        while len(loop.running) < self._limit and loop.done + len(loop.running) < loop.target:
            if self._reuse_first and loop.running and not parked and (
                    self._waiting or self.launcher.free_devices() < 1):
                break  # queue nothing ahead: a finishing server may serve the next
            parked = False  # a parked server lets one trial be asked for it
            if not self._may_ask():
                break
            queue_interleaved(self.spec, self.sweep.space, self.tuner,
                              loop.done + len(loop.running), self._search_target)
            plan = plan_trial(self.sweep, self.tuner.ask(), loop.load)
            p = plan.proposal
            loop.progress.trial_started(p.number, loop.done + len(loop.running), p.params,
                                        p.is_baseline, p.confirm_of)
            rejected, feas = rejection(self.sweep, plan, self.launcher.placeable_nodes())
            if rejected is None:
                self._launch(loop, plan, feas)
                continue
            row = self._record(plan, rejected, feas)
            loop.progress.trial_finished(row, self._ttft_key, self._tpot_key)
            loop.done += 1

    def _may_ask(self) -> bool:
        with self._lock:
            waiting = list(self._waiting.values())
        return ask_another(waiting, self.launcher.free_devices())

    def _launch(self, loop: _Loop, plan: TrialPlan, feas: Feasibility | None) -> None:
        """Start the trial in a worker thread, on the parked server for its key if there is
        one (confirmation runs re-measure on fresh servers)."""
        with self._lock:
            self._waiting[plan.number] = len(plan.all_wanted)
        plan = replace(plan, load=remeasure_load(self.spec, plan.load, plan.proposal,
                                                 plan.devices, self.store.read_trials()))
        reuse = None if plan.proposal.confirm_of is not None else self._pool.take(plan.server_key)
        log_path = reuse.log_path if reuse else self.store.log_path(plan.number)
        running = Running(plan, feas, log_path)
        loop.running[loop.executor.submit(self._trial, running, reuse, loop.progress)] = running

    def _trial(self, running: Running, reuse: Reused | None, progress: Progress) -> TrialOutcome:
        """In a worker thread: the trial itself; releases its 'waiting for placement' slot
        exactly once; a measured server is handed to the pool."""
        plan, number, model = running.plan, running.plan.number, str(self.spec.model)
        released = threading.Event()

        def placed() -> None:
            if not released.is_set():
                released.set()
                with self._lock:
                    self._waiting.pop(number, None)

        for warning in running.feasibility.warnings if running.feasibility is not None else ():
            progress.phase(number, f"note: {warning}")
        try:
            launcher: ServerLauncher = self.launcher
            extra: Callable[[], list[str]] = list
            if plan.servers > 1:
                launcher = replicas = ReplicaLauncher(
                    self.launcher, plan.replicas, prefill=plan.prefill,
                    connector=default_connector(self.spec.engine) if plan.prefill else None,
                    kv_parent=self.spec.cluster.shared_folder)
                extra = replicas.server_args
            outcome = run_trial(launcher, lambda host, port: [*plan.argv(model, host, port),
                                                              *extra()],
                             plan.load, running.log_path, plan.wanted,
                             phase=lambda text: progress.phase(number, text), on_placed=placed,
                             stop_later=lambda server: self._pool.hand_over(number, server),
                             reuse=reuse, screen=lambda metrics: self._screen(plan, metrics),
                             unit=plan.unit, probe=self._quality.probe_for(plan),
                             gate=self._gate)
            return check_transfer(outcome) if plan.prefill else outcome
        finally:
            placed()

    def _screen(self, plan: TrialPlan, metrics: dict[str, float]) -> str | None:
        """From a trial's thread, after its screening run: why it stops there (PRUNED), or
        None. An SLA limit broken by more than screen_margin prunes it outright; otherwise its
        objective goes to Optuna's pruner (tuner.FarFromBestPruner)."""
        margin = self.spec.search.screen_margin
        for key, limit in self.spec.sla.items():
            value = metrics.get(key)
            if value is not None and value > limit * (1 + margin):
                return f"screening run: {key} {value:.4g} > {limit:g} by more than {margin:.0%}"
        metric = self.spec.objective.metric
        value = per_device(metrics, plan.devices).get(metric)
        if value is None or not self.tuner.screen(plan.proposal, float(value)):
            return None
        return (f"screening run: {metric} {value:.4g} is more than {margin:.0%} worse than the "
                "best feasible trial's screen")

    def _collect_finished(self, loop: _Loop) -> None:
        """Wait (up to 1 s) for a trial or a background stop to end; record every finished
        trial, settle its server, queue what follows from it."""
        waiting: list[Future[Any]] = [*loop.running, *self._pool.stops_running()]
        finished, _ = wait(waiting, timeout=1.0, return_when=FIRST_COMPLETED)
        for fut in (f for f in finished if f in loop.running):
            running = loop.running.pop(fut)
            plan, outcome = running.plan, fut.result()
            p = plan.proposal
            row = self._record(plan, outcome, running.feasibility, running.log_path)
            self._pool.settle(p.number, plan.server_key, outcome.argv, running.log_path)
            self.store.publish_logs()  # the logs of the servers stopped since
            queue_siblings(self.sweep, self.tuner, p, outcome)
            queue_corrected(self._prior, self.tuner, p, row)
            loop.progress.trial_finished(row, self._ttft_key, self._tpot_key)
            loop.done += 1
            if queue_retry(self.spec, self.tuner, p, row):
                loop.target += 1
                loop.progress.total = loop.target
                loop.progress.note(f"  trial {p.number}: its node died; queued once more")

    def _interrupt(self, loop: _Loop) -> None:
        """The loop was interrupted: stop every server and wait, then record the trials in
        flight as FAIL(interrupted) (queued again if the sweep says so)."""
        self._gate.cancel()
        try:
            self.launcher.stop_all()  # every server's stop tried; the first failure raised
        except Exception as exc:  # noqa: BLE001 - reported; the trials in flight still recorded
            self.console.print(f"stopping the servers: {type(exc).__name__}: {exc}")
        self._pool.join()
        for fut, running in loop.running.items():
            try:
                fut.result(timeout=120)
            except BaseException:  # noqa: BLE001 - the trial is recorded as interrupted
                pass
            p = running.plan.proposal
            self._record_interrupted(p.number, p.params, p.is_baseline)
            self.tuner.fail(p, "interrupted")
            if self.spec.search.requeue_interrupted:
                self.tuner.enqueue_retry(p.params, p.is_baseline, p.number)

    def _record(self, plan: TrialPlan, outcome: TrialOutcome, feas: Feasibility | None = None,
                server_log: Path | None = None) -> dict:
        """Store the trial's evaluation in the study, write its request rows, then its row; tell
        the study. Returns the row."""
        p, shape = plan.proposal, plan.shape
        sla, judged = self._quality.recorded(p, outcome)  # min_token_agreement's limit, value
        j = judge(outcome, sla, self.spec.objective, sla_on=self.spec.search.sla_on,
                  judged=judged, devices=plan.devices, precision=plan.load.precision,
                  sizing=Sizing(self.sweep.target, self.sweep.price(shape.tp, shape.pp, shape.dp),
                                shape.tp, shape.pp, shape.dp, plan.servers))
        outcome, verdict, intervals = j.outcome, j.verdict, j.intervals
        ctx = TrialContext(number=p.number, params=p.params, is_baseline=p.is_baseline,
                           serve_command=plan.key, vllm_version=self.vllm_version,
                           server_log=self.store.where(server_log or self.store.log_path(p.number)),
                           feasibility=feas, sla=self.spec.sla, provenance=self.provenance,
                           confirmation_of=p.confirm_of, startup_levers=plan.levers,
                           shape=plan.shape_label, fleet=j.fleet,
                           prediction=self._prior.columns(p.params, p.is_baseline)
                           if self._prior else None)
        row = trial_row(ctx, outcome, verdict, self.columns, intervals)
        ev = Evaluation(
            objective=(verdict.values if len(verdict.values) > 1 else verdict.objective)
            if verdict else None,
            constraints=verdict.constraints if verdict else {}, fail_reason=outcome.fail_reason,
            violation=feas.violation if feas is not None and not feas.ok else 1.0)
        self.tuner.remember(p, ev)  # a kill between the rows and the tell: told on resume
        self.store.publish(server_log or self.store.log_path(p.number))  # object store: its log
        self.store.write_requests(p.number, request_rows(p.number, outcome), REQUEST_COLUMNS)
        if self.spec.workloads:
            self.store.write_workloads(p.number, workload_rows(
                p.number, outcome, j.each, self.workload_columns,
                {w.name: w for w in self.spec.workloads}), self.workload_columns)
        self.store.write_trial(row, self.columns)
        self.tuner.tell(p, ev)
        self.store.publish_journal()
        return row

    def _record_interrupted(self, number: int, params: dict, is_baseline: bool) -> None:
        outcome = TrialOutcome(started_at=datetime.now(UTC), argv=(),
                               fail_reason="interrupted", fail_detail="the driver stopped mid-trial")
        ctx = TrialContext(number=number, params=params, is_baseline=is_baseline, serve_command="",
                           vllm_version=self.vllm_version,
                           server_log=self.store.where(self.store.log_path(number)),
                           provenance=self.provenance)
        self.store.write_requests(number, [], REQUEST_COLUMNS)
        self.store.write_trial(trial_row(ctx, outcome, None, self.columns), self.columns)

    def recover(self) -> None:
        """Close trials an earlier, killed driver left RUNNING (told from what it stored, or
        FAIL(interrupted) and re-queued if the sweep says so), then queue the baseline.
        Idempotent: `run` calls it again, and a second call finds nothing to do."""
        for number in self.tuner.tell_recorded(self.store.trial_numbers()):
            self.console.print(f"trial {number} was recorded by an earlier run that stopped "
                               "before telling the study: told from what it stored")
        requeue = self.spec.search.requeue_interrupted
        for number in self.tuner.close_interrupted():
            c = self.tuner.configuration(number)
            self._record_interrupted(number, c.params, c.is_baseline)
            if requeue:
                self.tuner.enqueue_retry(c.params, c.is_baseline, number)
            self.console.print(f"trial {number} was interrupted by an earlier run: recorded as "
                               f"FAIL(interrupted){'; queued to run again' if requeue else ''}")
        if self.spec.search.baseline:
            self.tuner.enqueue_baseline(self.sweep.space.defaults())
        if self._prior is not None:  # the predicted top k, after the baseline
            self._prior.queue_first(self.tuner, self.console.print)

    def summary(self) -> None:
        spec = self.spec
        print_summary(self.console, self.store.read_trials(), list(self.sweep.space.parameters),
                      spec.objective.metric, spec.objective.direction == "maximize", spec.sla,
                      spec.target, spec.pricing.currency, device_of(spec.engine))
