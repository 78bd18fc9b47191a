"""One trial end to end, without Ray: start -> ready -> warm-up -> measured load (one run, or
capacity mode's rate steps: framework.trial.measure) -> [quality probe] -> stop.

The consumer owns the interface: `ServerLauncher` / `ServerHandle` are what this module needs
from whoever starts servers (`cluster.RayLauncher` in production). A failure is returned as
data (`TrialOutcome.fail_reason`), never raised; the server is stopped on every path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Protocol

from framework.base.errors import TrialError
from framework.base.vocabulary import COUNT_METRICS
from framework.base.vocabulary import PEAK_METRICS
from framework.engine.server_metrics import MetricsSampler
from framework.engine.server_metrics import summarize
from framework.engine.startup_log import StartupPhases
from framework.engine.startup_log import phases as startup_phases
from framework.engine.startup_log import read_marks
from framework.engine.vllm_server import log_tail
from framework.engine.vllm_server import startup_failure
from framework.load.loadgen import RequestRecord
from framework.load.loadgen import wait_ready
from framework.load.session_metrics import SESSION_COUNTS
from framework.trial.deadline import Deadline
from framework.trial.measure import LoadPlan
from framework.trial.measure import LoadStep
from framework.trial.measure import Measurement
from framework.trial.measure import Phase
from framework.trial.measure import measure_capacity
from framework.trial.measure import measure_fixed
from framework.trial.measure import measure_screen
from framework.trial.measure import run_once
from framework.trial.quality import QualityVerdict
from framework.trial.saturation import SaturationWatch
from framework.trial.share_gate import OPEN
from framework.trial.share_gate import ShareGate
from framework.trial.stats import combine
from framework.trial.workloads import WorkloadResult
from framework.trial.workloads import aggregate_metrics
from framework.trial.workloads import measure_workloads

# How long one /metrics scrape of a measured run may take. A flooded server answers late, and
# a late sample is still one: stamped when the scrape began, it holds the server's gauges at
# a moment within the scrape, so on a queue that grows it only steepens the slope
# trial.saturation fits (a flat queue stays flat), while a scrape given up on leaves no sample
# at all (the sampler scrapes one at a time, so a given-up scrape costs the same wait).
SCRAPE_TIMEOUT_S = 10.0


class ServerHandle(Protocol):
    @property
    def base_url(self) -> str: ...

    @property
    def node_ip(self) -> str: ...

    @property
    def pid(self) -> int:
        """Of the process serving the API (the server actor's)."""

    @property
    def placement(self) -> tuple[str, ...]:
        """Node IP of each placement-group bundle."""

    def is_alive(self) -> bool: ...

    def failure(self) -> TrialError | None: ...

    def stop(self) -> list[int]:
        """End every process of the server and release its devices; the server's full log is
        then at the `log_path` it was launched with. Returns pids that survived."""

    def command(self, name: str, timeout_s: float = 60.0) -> str:
        """A control command to the server process (framework.engine.control): its answer line."""

    def startup_log(self) -> str:
        """The server's log so far ('' if unreadable); read once it is ready, for its start-up
        phases (framework.engine.startup_log)."""

    def devices_held(self) -> str:
        """'' unless an earlier server's processes may still have held this server's devices
        when it started (what and where: the detail of a `devices_held` failure); asked after
        a start-up failure (`held_failure`)."""


class ServerLauncher(Protocol):
    def launch(self, argv_for_port: Callable[[str, int], list[str]], log_path: Path,
               wanted: Sequence[dict[str, float]],
               on_placed: Callable[[], None] = lambda: None, unit: int = 1,
               avoid: frozenset[str] = frozenset()) -> ServerHandle:
        """`unit`: consecutive bundles of `wanted` that must share a node. `on_placed` is
        called once the devices are reserved (or their wait ended), before the server starts:
        start-ahead's share gate waits in it. `avoid`: node IPs the server should not run on
        (a decode server, its prefill servers' nodes), a preference kept only where the other
        nodes could hold the group."""


@dataclass(frozen=True)
class Reused:
    """A ready server an earlier trial measured on: the argv it was started with, its log."""

    server: ServerHandle
    argv: tuple[str, ...]
    log_path: Path


@dataclass(frozen=True)
class TrialOutcome:
    started_at: datetime
    argv: tuple[str, ...]
    node_ip: str = ""
    placement: tuple[str, ...] = ()
    placement_wait_s: float | None = None
    launch_s: float | None = None
    startup_s: float | None = None
    gate_wait_s: float = 0.0  # waiting at the share gate (start-ahead), in startup_s or not
    startup_phases: StartupPhases | None = None  # a fresh server's, read from its log
    warmup_s: float | None = None
    bench_s: float | None = None
    trial_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)  # over all runs (stats.combine)
    runs: tuple[dict[str, float], ...] = ()  # each measured run's metrics (repeats)
    server_metrics: dict[str, float | None] = field(default_factory=dict)
    steps: tuple[LoadStep, ...] = ()
    fail_reason: str | None = None
    fail_detail: str = ""
    log_tail: str = ""
    leftover_pids: tuple[int, ...] = ()
    server_pid: int | None = None
    server_reused: bool = False
    precision_stop: str | None = None  # why precision runs ended (trial.precision)
    quality: QualityVerdict | None = None  # the quality probe's, when the trial ran it
    workloads: tuple[WorkloadResult, ...] = ()  # several workloads: each one's metrics

    @property
    def ok(self) -> bool:
        return self.fail_reason is None

    @property
    def records(self) -> tuple[RequestRecord, ...]:
        return tuple(r for step in self.steps for r in step.records)


def held_failure(reason: str, detail: str, held: str) -> tuple[str, str]:
    """A start-up OOM on devices an earlier server's processes may still have held (`held`,
    ServerHandle.devices_held) is `devices_held`: vLLM's free-memory check counts what they
    hold, so the failure says nothing of the configuration, and the search does not learn
    from it (search.tuner.CONFIG_FAILURES lacks it); vLLM's line is kept after what held
    them. Any other outcome is returned unchanged."""
    if reason != "oom_at_startup" or not held:
        return reason, detail
    return "devices_held", f"{held}; vLLM: {detail}"[:2000]


def _await_ready(server: ServerHandle, timeout_s: float, deadline: Deadline) -> None:
    ready = asyncio.run(wait_ready(server.base_url, deadline.bound(timeout_s),
                                   is_alive=server.is_alive))
    if ready:
        return
    failure = server.failure()
    if failure is not None:
        raise failure
    deadline.check("starting the server")
    raise TrialError("startup_timeout", f"not ready within {timeout_s:.0f} s")


def reset_prefix_cache(server: ServerHandle, timeout_s: float = 30.0) -> None:
    """Reset the server's prefix cache in-process (the control command; no dev-mode route)
    until it succeeds (vLLM refuses while blocks are still held); TrialError("load_failed")
    if it never does."""
    deadline = time.monotonic() + timeout_s
    answer = ""
    while time.monotonic() < deadline:
        answer = server.command("reset_prefix_cache")
        if answer == "ok":
            return
        time.sleep(0.5)
    raise TrialError("load_failed", f"could not reset the reused server's prefix cache: {answer}")


def _check_still_serving(server: ServerHandle, grace_s: float = 60.0) -> None:
    """After the load, the server must answer /health within `grace_s` while its actor lives.

    A loaded host can hold a live server's answer back for seconds, so the whole grace is
    waited before a silent live server is called dead (`server_died`). An actor that ends
    meanwhile (its node lost, its engine crashed) raises its own failure at once."""
    if asyncio.run(wait_ready(server.base_url, grace_s, is_alive=server.is_alive)):
        return
    raise server.failure() or TrialError(
        "server_died", f"server alive but not answering /health for {grace_s:.0f} s after the load")


@dataclass(frozen=True)
class _Measured:
    metrics: dict[str, float]
    runs: list[dict[str, float]]
    samples: list
    workloads: list[WorkloadResult]
    pruned: str | None
    quality: QualityVerdict | None


def _check_not_cancelled(gate: ShareGate) -> None:
    if gate.cancelled:
        raise TrialError("interrupted", "the sweep stopped while the trial waited for its turn")


def _measure(server: ServerHandle, plan: LoadPlan, deadline: Deadline, phase: Phase,
             measurement: Measurement, screen: Callable[[dict[str, float]], str | None] | None,
             probe: Callable[[str], QualityVerdict] | None, clock: Callable[[], float],
             times: dict[str, float | None]) -> _Measured:
    """Warm-up, the measured load (screen, runs, workloads or capacity) and the quality probe
    on a ready server; `times` gets warmup_s and bench_s as they are known."""
    if plan.warmup:
        phase(f"warming up ({len(plan.warmup)} requests)")
        t_warm = clock()
        run_once(server.base_url, plan, plan.warmup, None, lambda _: None, deadline,
                 "warming up")
        times["warmup_s"] = clock() - t_warm
    t_load = clock()
    pruned = None
    if plan.screen and screen is not None:
        metrics, stopped = measure_screen(server.base_url, plan, deadline, phase, measurement)
        runs = [metrics]
        pruned = (f"SLA surely broken in the screening run ({stopped})" if stopped
                  else screen(metrics))
    samples: list = []
    workloads = []
    if pruned:
        phase(f"pruned: {pruned}")
    else:
        sampler = MetricsSampler(server.base_url, timeout_s=SCRAPE_TIMEOUT_S).start()
        if plan.saturation is not None:
            measurement.watch = SaturationWatch(sampler.snapshot, plan.saturation)
        try:
            if plan.workloads:
                workloads = measure_workloads(server.base_url, plan, deadline, phase,
                                              measurement, lambda: reset_prefix_cache(server),
                                              lambda: _check_still_serving(server))
                metrics = aggregate_metrics(workloads, plan.aggregate)
                runs = [metrics]
            elif plan.capacity is None:
                runs = measure_fixed(server.base_url, plan, deadline, phase, measurement)
                metrics = combine(runs, COUNT_METRICS + SESSION_COUNTS, PEAK_METRICS)
            else:
                metrics = measure_capacity(server.base_url, plan, deadline, phase,
                                           measurement, lambda: _check_still_serving(server))
                runs = [metrics]
        finally:
            measurement.watch = None
            samples = sampler.stop().samples
    times["bench_s"] = clock() - t_load
    _check_still_serving(server)
    if metrics["completed"] == 0:
        records = [r for step in measurement.steps for r in step.records]
        first = next((r.error for r in records if r.error), "")
        raise TrialError("load_failed", f"all {len(records)} requests failed: {first}")
    quality = None
    if probe is not None and not pruned:
        phase("quality probe")
        quality = probe(server.base_url)
    return _Measured(metrics, runs, samples, workloads, pruned, quality)


def run_trial(launcher: ServerLauncher, argv_for_port: Callable[[str, int], list[str]],
              plan: LoadPlan, log_path: Path, wanted: Sequence[dict[str, float]],
              phase: Phase = lambda _: None, on_placed: Callable[[], None] = lambda: None,
              clock: Callable[[], float] = time.monotonic,
              stop_later: Callable[[ServerHandle], None] | None = None,
              reuse: Reused | None = None,
              screen: Callable[[dict[str, float]], str | None] | None = None,
              unit: int = 1,
              probe: Callable[[str], QualityVerdict] | None = None,
              gate: ShareGate = OPEN) -> TrialOutcome:
    """Run one trial; every failure comes back as `fail_reason` with the server log tail.

    `stop_later`: after a successful measurement, hand the server to it instead of stopping
    it here (the caller stops it off the trial's critical path, or reuses it, and must stop
    it before it exits); failures always stop the server here, before reading its log.
    `reuse`: measure on this ready server instead of launching one (`log_path` should then be
    its `reuse.log_path`); its prefix cache is reset first, so the trial starts as on a fresh
    server (minus vLLM's start-up).
    `screen`: with `plan.screen`, called with the screening run's metrics; a reason (str)
    ends the trial there as `fail_reason="pruned"` (metrics: the screen's; the server is
    handed to `stop_later` as after a full run), None lets the full run follow.
    `unit`: consecutive bundles that must share a node (placement.node_unit).
    `probe`: after a full measured run (not after a pruning screen), called with the server's
    base URL while it still serves: the quality probe (framework.sweep.quality_gate); its
    verdict goes to `TrialOutcome.quality`, a TrialError it raises fails the trial.
    `gate`: start-up and stops are its busy work, warm-up through the probe its measurement
    (share_gate); the time spent waiting at it is `gate_wait_s`, outside the trial's deadline."""
    started_at = datetime.now(UTC)
    t0 = clock()
    argv: list[str] = []
    server: ServerHandle | None = None
    startup_s = placement_wait_s = launch_s = None
    times: dict[str, float | None] = {"warmup_s": None, "bench_s": None}
    measurement = Measurement()
    deadline = Deadline(None, clock)
    ready = False
    gate_wait_s = 0.0
    go_at = time.time()  # wall clock when the server was let start (startup_log.phases)
    starting = False  # inside the gate's busy work
    try:
        def remember(host: str, port: int) -> list[str]:
            built = argv_for_port(host, port)
            if not argv:  # several servers (replicas): the first one's argv is recorded
                argv.extend(built)
            return built

        def placed() -> None:
            nonlocal placement_wait_s, deadline, gate_wait_s, starting, go_at
            placement_wait_s = clock() - t0
            on_placed()
            if reuse is None:
                t_gate = clock()
                gate.enter_busy()
                starting = True
                gate_wait_s += clock() - t_gate
            go_at = time.time()
            deadline = Deadline(plan.trial_timeout_s, clock)

        if reuse is not None:
            phase(f"reusing the running server (pid {reuse.server.pid}), prefix cache reset")
            server = reuse.server
            argv.extend(reuse.argv)
            placed()
            reset_prefix_cache(server)
        else:
            phase(f"waiting for {len(wanted)} bundle(s)" if len(wanted) > 1
                  else "starting server")
            server = launcher.launch(remember, log_path, wanted, placed, unit=unit)
            _check_not_cancelled(gate)
        launch_s = clock() - t0
        if len(wanted) > 1 and reuse is None:
            phase(f"starting server on {', '.join(server.placement)}")
        _await_ready(server, plan.startup_timeout_s, deadline)
        ready = True
        startup_s = clock() - t0 - gate_wait_s
        phases = None if reuse is not None else startup_phases(
            read_marks(server.startup_log()), placement_wait_s or 0.0, go_at, startup_s)
        if starting:
            starting = False
            gate.leave_busy()
        with gate.measuring() as waited:
            _check_not_cancelled(gate)
            gate_wait_s += waited
            deadline.extend(waited)
            measured = _measure(server, plan, deadline, phase, measurement, screen, probe,
                                clock, times)
        if stop_later is None:
            phase("stopping")
            with gate.busy():
                left = server.stop()
        else:
            phase("stopping (in the background)")
            stop_later(server)
            left = []
        return TrialOutcome(started_at=started_at, argv=tuple(argv), node_ip=server.node_ip,
                            placement=server.placement, placement_wait_s=placement_wait_s,
                            launch_s=launch_s, startup_s=startup_s, gate_wait_s=gate_wait_s,
                            startup_phases=phases,
                            warmup_s=times["warmup_s"], bench_s=times["bench_s"],
                            trial_s=clock() - t0, metrics=measured.metrics,
                            runs=tuple(measured.runs),
                            server_metrics=summarize(measured.samples),
                            steps=tuple(measurement.steps), leftover_pids=tuple(left),
                            server_pid=server.pid, server_reused=reuse is not None,
                            precision_stop=measurement.precision_stop,
                            fail_reason="pruned" if measured.pruned else None,
                            fail_detail=measured.pruned or "", quality=measured.quality,
                            workloads=tuple(measured.workloads))
    except TrialError as exc:
        if not starting:
            gate.enter_busy()
        starting = True  # the stop is busy work too
        left = server.stop() if server is not None else []
        tail = log_tail(log_path)
        if ready:
            reason, detail = ("server_died" if exc.reason == "startup_crash" else exc.reason,
                              exc.detail)
        else:
            reason, detail = startup_failure(exc.reason, exc.detail, tail)
            if server is not None and reason == "oom_at_startup":
                reason, detail = held_failure(reason, detail, server.devices_held())
        return TrialOutcome(started_at=started_at, argv=tuple(argv),
                            node_ip=server.node_ip if server else "",
                            placement=server.placement if server else (),
                            placement_wait_s=placement_wait_s, launch_s=launch_s,
                            startup_s=startup_s, gate_wait_s=gate_wait_s,
                            warmup_s=times["warmup_s"], bench_s=times["bench_s"],
                            trial_s=clock() - t0, fail_reason=reason,
                            fail_detail=detail, log_tail=tail,
                            steps=measurement.partial(), leftover_pids=tuple(left),
                            server_pid=server.pid if server else None,
                            server_reused=reuse is not None)
    except BaseException:  # interrupted: stop at once, whatever is measured
        if server is not None:
            server.stop()
        raise
    finally:
        if starting:
            gate.leave_busy()
