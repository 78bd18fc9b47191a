"""The measured part of a trial, on a server that is ready: one load run, or capacity mode's
rate steps. No Ray; everything is bounded by the trial's deadline.

A run's records are kept as they finish (`Measurement`), so a run cut short by the deadline
or by the server dying still leaves its finished requests. Capacity mode (framework.capacity)
measures rate steps on the same server; a step's SLA verdict is framework.objective's; the
trial's metrics are those of the highest rate that held (of the lowest rate tried when none
held) plus `capacity_rps` and `capacity_steps`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from framework.capacity import CapacitySettings, capacity, next_rate, requests_for
from framework.errors import TrialError
from framework.loadgen import LoadResult, RequestRecord, run_load
from framework.metrics import compute_metrics
from framework.objective import evaluate
from framework.workload import RequestSpec, arrival_offsets

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


@dataclass(frozen=True)
class CapacityPlan:
    """Capacity mode's steps: request sets drawn ahead (one per step, different seeds, so no
    step replays another's prompts), arrivals' burstiness and seed, the SLA to hold."""

    settings: CapacitySettings
    step_requests: Sequence[Sequence[RequestSpec]]
    burstiness: float
    seed: int
    sla: Mapping[str, float]


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
    request_rate: float | None = None  # None: as fast as max_concurrency allows
    capacity: CapacityPlan | None = None


@dataclass(frozen=True)
class LoadStep:
    """One measured run: its rate (None = unpaced), start (perf_counter s), records, and, in
    capacity mode, whether the SLA held."""

    rate: float | None
    start_s: float
    records: tuple[RequestRecord, ...]
    held: bool | None = None


class Measurement:
    """Steps so far plus the records of the run in progress (for partial results)."""

    def __init__(self) -> None:
        self.steps: list[LoadStep] = []
        self._rate: float | None = None
        self._start_s = 0.0
        self._records: list[RequestRecord] = []
        self._then: Callable[[RequestRecord], None] | None = None

    def begin(self, rate: float | None, then: Callable[[RequestRecord], None] | None) -> None:
        self._rate, self._start_s, self._records, self._then = rate, time.perf_counter(), [], then

    def __call__(self, record: RequestRecord) -> None:
        self._records.append(record)
        if self._then is not None:
            self._then(record)

    def finish(self, result: LoadResult, held: bool | None = None) -> LoadStep:
        step = LoadStep(self._rate, result.start_s, result.records, held)
        self.steps.append(step)
        self._records = []
        return step

    def partial(self) -> tuple[LoadStep, ...]:
        """Finished steps, then the unfinished run's finished requests, if any."""
        cut = (LoadStep(self._rate, self._start_s, tuple(self._records)),) if self._records else ()
        return (*self.steps, *cut)


def run_once(base_url: str, plan: LoadPlan, requests: Sequence[RequestSpec],
             arrivals: Sequence[float] | None, on_done: Callable[[RequestRecord], None],
             deadline: Deadline, doing: str, duration_s: float | None = None) -> LoadResult:
    """One run of the load generator, cut at the trial's deadline (TrialError trial_timeout)."""
    async def bounded() -> LoadResult:
        return await asyncio.wait_for(run_load(
            base_url, plan.model, requests, arrivals=arrivals,
            max_concurrency=plan.max_concurrency, ignore_eos=plan.ignore_eos,
            timeout_s=plan.request_timeout_s, on_done=on_done, endpoint=plan.endpoint,
            duration_s=duration_s, api_key=plan.api_key),
            None if math.isinf(deadline.left()) else max(0.0, deadline.left()))

    deadline.check(doing)
    try:
        return asyncio.run(bounded())
    except TimeoutError:
        deadline.check(doing)
        raise


def _metrics(plan: LoadPlan, result: LoadResult) -> dict[str, float]:
    return compute_metrics(result.records, result.duration_s, plan.percentiles,
                           plan.goodput_slo_ms or None)


def measure_fixed(base_url: str, plan: LoadPlan, deadline: Deadline, phase: Phase,
                  m: Measurement) -> dict[str, float]:
    """The workload's measured requests, once; returns their metrics."""
    done = 0

    def progress(_: RequestRecord) -> None:
        nonlocal done
        done += 1
        if done % max(1, len(plan.measured) // 4) == 0:
            phase(f"under load: {done}/{len(plan.measured)} requests")

    phase(f"under load: 0/{len(plan.measured)} requests")
    m.begin(plan.request_rate, progress)
    result = run_once(base_url, plan, plan.measured, plan.arrivals, m, deadline, "under load",
                      plan.duration_s)
    m.finish(result)
    return _metrics(plan, result)


def measure_capacity(base_url: str, plan: LoadPlan, deadline: Deadline, phase: Phase,
                     m: Measurement, still_serving: Callable[[], None]) -> dict[str, float]:
    """Rate steps until framework.capacity says done; the metrics of the step that decides
    the capacity, with capacity_rps and capacity_steps."""
    cap = plan.capacity
    assert cap is not None
    s = cap.settings
    measured: list[tuple[LoadStep, dict[str, float]]] = []
    while (rate := next_rate([(st.rate, bool(st.held)) for st, _ in measured], s)) is not None:
        index = len(measured)
        n = requests_for(rate, s)
        requests = list(cap.step_requests[index % len(cap.step_requests)])[:n]
        arrivals = arrival_offsets(len(requests), rate, cap.burstiness, cap.seed + index)
        doing = f"under load at {rate:.3g} req/s"
        phase(f"{doing} ({len(requests)} requests, step {index + 1})")
        m.begin(rate, None)
        result = run_once(base_url, plan, requests, arrivals, m, deadline, doing)
        still_serving()
        metrics = _metrics(plan, result)
        held = metrics["completed"] > 0 and evaluate(metrics, cap.sla, "request_throughput").feasible
        measured.append((m.finish(result, held), metrics))
        phase(f"  {rate:.3g} req/s: SLA {'holds' if held else 'broken'}")
    found = capacity([(st.rate, bool(st.held)) for st, _ in measured])
    deciding = max((x for x in measured if x[0].held), key=lambda x: x[0].rate, default=None) \
        or min(measured, key=lambda x: x[0].rate)
    return {**deciding[1], "capacity_rps": found, "capacity_steps": len(measured)}
