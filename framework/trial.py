"""One trial end to end, without Ray: start -> ready -> warm-up -> measured load -> stop.

The consumer owns the interface: `ServerLauncher` / `ServerHandle` are what this module needs
from whoever starts servers (`cluster.RayLauncher` in production). A failure is returned as
data (`TrialOutcome.fail_reason`), never raised; the server is stopped on every path.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from framework.engine import log_tail, startup_failure
from framework.errors import TrialError
from framework.loadgen import LoadResult, RequestRecord, run_load, wait_ready
from framework.metrics import compute_metrics
from framework.server_metrics import MetricsSampler, summarize
from framework.workload import RequestSpec


class ServerHandle(Protocol):
    base_url: str
    node_ip: str
    placement: tuple[str, ...]  # node IP of each placement-group bundle

    def is_alive(self) -> bool: ...

    def failure(self) -> TrialError | None: ...

    def stop(self) -> list[int]: ...


class ServerLauncher(Protocol):
    def launch(self, argv_for_port: Callable[[str, int], list[str]], log_path: Path,
               wanted: Sequence[dict[str, float]],
               on_placed: Callable[[], None] = lambda: None) -> ServerHandle: ...


@dataclass(frozen=True)
class LoadPlan:
    """The load every trial of a sweep receives (built once, identical across trials)."""

    model: str
    warmup: Sequence[RequestSpec]
    measured: Sequence[RequestSpec]
    arrivals: Sequence[float] | None
    max_concurrency: int | None
    ignore_eos: bool
    request_timeout_s: float
    percentiles: Sequence[float]
    goodput_slo_ms: dict[str, float]
    startup_timeout_s: float
    endpoint: str = "completions"
    duration_s: float | None = None
    trial_timeout_s: float | None = None
    api_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class TrialOutcome:
    started_at: datetime
    argv: tuple[str, ...]
    node_ip: str = ""
    placement: tuple[str, ...] = ()
    placement_wait_s: float | None = None
    launch_s: float | None = None
    startup_s: float | None = None
    warmup_s: float | None = None
    bench_s: float | None = None
    trial_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    server_metrics: dict[str, float | None] = field(default_factory=dict)
    records: tuple[RequestRecord, ...] = ()
    load_start_s: float = 0.0
    fail_reason: str | None = None
    fail_detail: str = ""
    log_tail: str = ""
    leftover_pids: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.fail_reason is None


Phase = Callable[[str], None]


class Deadline:
    """The whole-trial deadline, checked by the trial's own thread between and within phases
    (no timer thread: stopping a server from another thread raced Ray's shutdown)."""

    def __init__(self, limit_s: float | None, clock: Callable[[], float]) -> None:
        self.limit_s, self.clock = limit_s, clock
        self.at = math.inf if limit_s is None else clock() + limit_s

    def left(self) -> float:
        return self.at - self.clock()

    def bound(self, timeout_s: float) -> float:
        return max(0.0, min(timeout_s, self.left()))

    def check(self, doing: str) -> None:
        if self.left() <= 0:
            raise TrialError("trial_timeout", f"trial exceeded its {self.limit_s:g} s deadline "
                             f"while {doing}")


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


def _check_still_serving(server: ServerHandle, grace_s: float = 60.0) -> None:
    """After the load: a server that stopped answering /health died (or lost its node) during
    the run; wait for its actor's fate so the failure gets the right reason."""
    if server.is_alive() and asyncio.run(wait_ready(server.base_url, 3.0, is_alive=server.is_alive)):
        return
    deadline = time.monotonic() + grace_s
    while server.is_alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    raise server.failure() or TrialError("server_died", "server stopped answering during the load")


class _Collected:
    """Records of a run as they finish, kept when the deadline cuts the run short."""

    def __init__(self, then: Callable[[RequestRecord], None] | None) -> None:
        self.records: list[RequestRecord] = []
        self.start_s = time.perf_counter()
        self.then = then

    def __call__(self, record: RequestRecord) -> None:
        self.records.append(record)
        if self.then is not None:
            self.then(record)


def _load(server: ServerHandle, plan: LoadPlan, requests: Sequence[RequestSpec],
          arrivals: Sequence[float] | None, collected: _Collected, deadline: Deadline,
          doing: str, duration_s: float | None = None) -> LoadResult:
    """One run of the load generator, cut at the trial's deadline (TrialError trial_timeout)."""
    async def bounded() -> LoadResult:
        return await asyncio.wait_for(run_load(
            server.base_url, plan.model, requests, arrivals=arrivals,
            max_concurrency=plan.max_concurrency, ignore_eos=plan.ignore_eos,
            timeout_s=plan.request_timeout_s, on_done=collected, endpoint=plan.endpoint,
            duration_s=duration_s, api_key=plan.api_key),
            None if math.isinf(deadline.left()) else max(0.0, deadline.left()))

    deadline.check(doing)
    try:
        return asyncio.run(bounded())
    except TimeoutError:
        deadline.check(doing)
        raise


def run_trial(launcher: ServerLauncher, argv_for_port: Callable[[str, int], list[str]],
              plan: LoadPlan, log_path: Path, wanted: Sequence[dict[str, float]],
              phase: Phase = lambda _: None, on_placed: Callable[[], None] = lambda: None,
              clock: Callable[[], float] = time.monotonic) -> TrialOutcome:
    """Run one trial; every failure comes back as `fail_reason` with the server log tail."""
    started_at = datetime.now(timezone.utc)
    t0 = clock()
    argv: list[str] = []
    server: ServerHandle | None = None
    startup_s = bench_s = placement_wait_s = launch_s = warmup_s = None
    result: LoadResult | None = None
    collected = _Collected(None)
    deadline = Deadline(None, clock)
    ready = False
    try:
        def remember(host: str, port: int) -> list[str]:
            argv.extend(argv_for_port(host, port))
            return argv

        def placed() -> None:
            nonlocal placement_wait_s, deadline
            placement_wait_s = clock() - t0
            deadline = Deadline(plan.trial_timeout_s, clock)
            on_placed()

        phase(f"waiting for {len(wanted)} bundle(s)" if len(wanted) > 1 else "starting server")
        server = launcher.launch(remember, log_path, wanted, placed)
        launch_s = clock() - t0
        if len(wanted) > 1:
            phase(f"starting server on {', '.join(server.placement)}")
        _await_ready(server, plan.startup_timeout_s, deadline)
        ready = True
        startup_s = clock() - t0
        if plan.warmup:
            phase(f"warming up ({len(plan.warmup)} requests)")
            t_warm = clock()
            _load(server, plan, plan.warmup, None, _Collected(None), deadline, "warming up")
            warmup_s = clock() - t_warm
        done = 0

        def progress(_: RequestRecord) -> None:
            nonlocal done
            done += 1
            if done % max(1, len(plan.measured) // 4) == 0:
                phase(f"under load: {done}/{len(plan.measured)} requests")

        phase(f"under load: 0/{len(plan.measured)} requests")
        t_load = clock()
        sampler = MetricsSampler(server.base_url).start()
        collected = _Collected(progress)
        try:
            result = _load(server, plan, plan.measured, plan.arrivals, collected, deadline,
                           "under load", plan.duration_s)
        finally:
            sampled = sampler.stop()
        bench_s = clock() - t_load
        _check_still_serving(server)
        metrics = compute_metrics(result.records, result.duration_s, plan.percentiles,
                                  plan.goodput_slo_ms or None)
        if metrics["completed"] == 0:
            first = next((r.error for r in result.records if r.error), "")
            raise TrialError("load_failed", f"all {len(result.records)} requests failed: {first}")
        phase("stopping")
        left = server.stop()
        return TrialOutcome(started_at=started_at, argv=tuple(argv), node_ip=server.node_ip,
                            placement=server.placement, placement_wait_s=placement_wait_s,
                            launch_s=launch_s, startup_s=startup_s, warmup_s=warmup_s,
                            bench_s=bench_s, trial_s=clock() - t0,
                            metrics=metrics, server_metrics=summarize(sampled.samples),
                            records=result.records,
                            load_start_s=result.start_s, leftover_pids=tuple(left))
    except TrialError as exc:
        left = server.stop() if server is not None else []
        tail = log_tail(log_path)
        if ready:
            reason, detail = ("server_died" if exc.reason == "startup_crash" else exc.reason,
                              exc.detail)
        else:
            reason, detail = startup_failure(exc.reason, exc.detail, tail)
        return TrialOutcome(started_at=started_at, argv=tuple(argv),
                            node_ip=server.node_ip if server else "",
                            placement=server.placement if server else (),
                            placement_wait_s=placement_wait_s, launch_s=launch_s,
                            startup_s=startup_s, warmup_s=warmup_s,
                            bench_s=bench_s, trial_s=clock() - t0, fail_reason=reason,
                            fail_detail=detail, log_tail=tail,
                            records=result.records if result else tuple(collected.records),
                            load_start_s=result.start_s if result else collected.start_s,
                            leftover_pids=tuple(left))
    except BaseException:
        if server is not None:
            server.stop()
        raise
