"""The measured part of a trial, on a server that is ready: one load run, or capacity mode's
rate steps. No Ray; everything is bounded by the trial's deadline.

A run's records are kept as they finish (`Measurement`), so a run cut short by the deadline
or by the server dying still leaves its finished requests. Capacity mode (framework.trial.capacity)
measures rate steps on the same server; a step's SLA verdict is framework.trial.objective's; the
trial's metrics are those of the highest rate that held (of the lowest rate tried when none
held) plus `capacity_rps` and `capacity_steps`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from typing import Any

from framework.load.conversations import is_sessions
from framework.load.conversations import turn_count
from framework.load.loadgen import LoadResult
from framework.load.loadgen import RequestRecord
from framework.load.loadgen import run_load
from framework.load.metrics import compute_metrics
from framework.load.mix import class_metrics
from framework.load.sampling import Sampling
from framework.load.sampling import request_fields
from framework.load.session_metrics import session_metrics
from framework.load.sessions import run_sessions
from framework.load.workload import RequestSpec
from framework.load.workload import arrival_offsets
from framework.trial.capacity import CapacitySettings
from framework.trial.capacity import capacity
from framework.trial.capacity import next_rate
from framework.trial.capacity import requests_for
from framework.trial.capacity import trace_arrivals
from framework.trial.deadline import Deadline
from framework.trial.objective import by_class
from framework.trial.objective import evaluate
from framework.trial.objective import per_device
from framework.trial.objective import surely_broken
from framework.trial.precision import PrecisionRule
from framework.trial.precision import stop_reason
from framework.trial.saturation import OVER_SATURATED
from framework.trial.saturation import SaturationSettings
from framework.trial.saturation import SaturationVerdict
from framework.trial.saturation import SaturationWatch

Phase = Callable[[str], None]


@dataclass(frozen=True)
class CapacityPlan:
    """Capacity mode's steps: request sets drawn ahead (one per step, different seeds, so no
    step replays another's prompts), arrivals' burstiness and seed, the SLA to hold."""

    settings: CapacitySettings
    step_requests: Sequence[Sequence[RequestSpec]]
    burstiness: float
    seed: int
    sla: Mapping[str, float]
    # a timed trace: its send offsets at speed-up 1 and its mean rate (capacity.trace_arrivals)
    trace_offsets: Sequence[float] | None = None
    trace_rate: float | None = None


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
    sla_guard: Mapping[str, float] | None = None  # stop a run once this SLA surely breaks
    repeat_requests: Sequence[Sequence[RequestSpec]] = ()  # runs 2..N (repeats, precision)
    min_runs: int = 1  # `search.repeats`: without precision, every set of runs is measured
    precision: PrecisionRule | None = None  # `search.precision`, set per trial by the runner
    screen: Sequence[RequestSpec] = ()  # `search.screen`'s short first run
    screen_arrivals: Sequence[float] | None = None
    sampling: Sampling = Sampling()  # sent with every request (warm-up too); unset: not sent
    trace_offsets: Sequence[float] | None = None  # a timed trace's send offsets at speed-up 1
    # dataset multi_turn: measured, repeat_requests and screen hold load.conversations.Session
    # items (arrivals are then session starts), sent by load.sessions.run_sessions
    max_active_sessions: int | None = None
    classes: tuple[str, ...] = ()  # a mix's request classes: each gets its own metrics
    saturation: SaturationSettings | None = None  # stop over-saturated runs (trial.saturation)
    workloads: Sequence[WorkloadPart] = ()  # several workloads, measured one after another
    aggregate: str = "min"  # how their metrics combine (trial.workloads.aggregate_metrics)


@dataclass(frozen=True)
class WorkloadPart:
    """One of several workloads (framework.trial.workloads): its name, its weight in a mean
    objective and its load (its own warm-up and measured requests)."""

    name: str
    weight: float
    load: LoadPlan


@dataclass(frozen=True)
class LoadStep:
    """One measured run: its rate (None = unpaced), start (perf_counter s), records, why
    it stopped early (None: it ran out), whether it was a screening run, when each request
    was due (seconds from the start, by request index; None = unpaced), the workload it
    belongs to (several workloads) and the over-saturation verdict on it (a watched run)."""

    rate: float | None
    start_s: float
    records: tuple[RequestRecord, ...]
    stopped: str | None = None
    screening: bool = False
    arrivals: tuple[float, ...] | None = None
    workload: str | None = None
    saturation: SaturationVerdict | None = None


class SlaBroken(Exception):
    """Raised from a finished request's callback: the run's SLA is surely broken."""


class OverSaturated(SlaBroken):
    """Raised from a finished request's callback: the run's queue grows without bound, as
    `verdict` judged (the row keeps this verdict, not a later look at newer samples)."""

    def __init__(self, verdict: SaturationVerdict) -> None:
        super().__init__(f"{OVER_SATURATED}: {verdict.text()}")
        self.verdict = verdict


class Measurement:
    """Steps so far plus the records of the run in progress (for partial results). With an
    SLA guard, a run stops as soon as objective.surely_broken says its SLA cannot hold (a
    class-prefixed limit judged on its class's requests); with a `watch`, as soon as it is
    over-saturated (trial.saturation)."""

    def __init__(self) -> None:
        self.steps: list[LoadStep] = []
        self._rate: float | None = None
        self._start_s = 0.0
        self._records: list[RequestRecord] = []
        self._then: Callable[[RequestRecord], None] | None = None
        self._guard: Mapping[str, float] = {}
        self._total = 0
        self._arrivals: tuple[float, ...] | None = None
        self.precision_stop: str | None = None  # why precision runs ended (None: no rule)
        self.watch: SaturationWatch | None = None  # set while the server's /metrics is sampled
        self._class_totals: dict[str, int] = {}

    def begin(self, rate: float | None, then: Callable[[RequestRecord], None] | None,
              total: int = 0, guard: Mapping[str, float] | None = None,
              arrivals: Sequence[float] | None = None,
              requests: Sequence[RequestSpec] = ()) -> None:
        """A new run of `total` requests (`requests`: them, for their classes' totals; sessions
        have none), due at `arrivals` (by request index; None: unpaced)."""
        self._rate, self._start_s, self._records, self._then = rate, time.perf_counter(), [], then
        self._guard, self._total = guard or {}, total
        self._arrivals = None if arrivals is None else tuple(arrivals)
        self._class_totals = {}
        for spec in requests:
            name = getattr(spec, "request_class", None)
            if name is not None:
                self._class_totals[name] = self._class_totals.get(name, 0) + 1
        if self.watch is not None:
            self.watch.begin()

    def __call__(self, record: RequestRecord) -> None:
        self._records.append(record)
        if self._then is not None:
            self._then(record)
        if self._guard and (why := self._broken()):
            raise SlaBroken(why)
        if self.watch is not None and self.watch.settings.enabled and (
                verdict := self.watch.check()).saturated:
            raise OverSaturated(verdict)

    def _broken(self) -> str | None:
        for name, limits in by_class(self._guard).items():
            records = [r for r in self._records if name is None or r.request_class == name]
            ok = [r for r in records if r.success]
            values = {"ttft": [r.ttft_s * 1000 for r in ok if r.ttft_s is not None],
                      "tpot": [r.tpot_s * 1000 for r in ok if r.tpot_s is not None],
                      "e2el": [r.e2el_s * 1000 for r in ok if r.e2el_s is not None]}
            total = self._total if name is None else self._class_totals.get(name, 0)
            if why := surely_broken(values, len(records) - len(ok), total, limits):
                return why if name is None else f"{name}.{why}"
        return None

    def _verdict(self) -> SaturationVerdict | None:
        return self.watch.check() if self.watch is not None else None

    def finish(self, result: LoadResult) -> LoadStep:
        step = LoadStep(self._rate, result.start_s, result.records, arrivals=self._arrivals,
                        saturation=self._verdict())
        self.steps.append(step)
        self._records = []
        return step

    def finish_early(self, why: str, verdict: SaturationVerdict | None = None
                     ) -> tuple[LoadStep, LoadResult]:
        """End the run in progress with the requests finished so far; `verdict`: the one that
        stopped it (else the watch's latest)."""
        now = time.perf_counter()
        records = tuple(sorted(self._records, key=lambda r: r.index))
        step = LoadStep(self._rate, self._start_s, records, stopped=why, arrivals=self._arrivals,
                        saturation=verdict or self._verdict())
        self.steps.append(step)
        self._records = []
        return step, LoadResult(records=records, start_s=self._start_s, end_s=now,
                                not_sent=self._total - len(records))

    def partial(self) -> tuple[LoadStep, ...]:
        """Finished steps, then the unfinished run's finished requests, if any."""
        cut = ((LoadStep(self._rate, self._start_s, tuple(self._records), arrivals=self._arrivals),)
               if self._records else ())
        return (*self.steps, *cut)


def run_once(base_url: str, plan: LoadPlan, requests: Sequence[RequestSpec],
             arrivals: Sequence[float] | None, on_done: Callable[[RequestRecord], None],
             deadline: Deadline, doing: str, duration_s: float | None = None) -> LoadResult:
    """One run of the load generator, cut at the trial's deadline (TrialError trial_timeout);
    sessions (a multi-turn load) go through the session driver."""
    common: dict[str, Any]  # keyword arguments of run_load and run_sessions
    common = dict(arrivals=arrivals, max_concurrency=plan.max_concurrency,
                  ignore_eos=plan.ignore_eos, timeout_s=plan.request_timeout_s, on_done=on_done,
                  endpoint=plan.endpoint, duration_s=duration_s, api_key=plan.api_key,
                  fields=request_fields(plan.sampling))

    async def bounded() -> LoadResult:
        load = (run_sessions(base_url, plan.model, requests,
                             max_active_sessions=plan.max_active_sessions, **common)
                if is_sessions(requests) else run_load(base_url, plan.model, requests, **common))
        return await asyncio.wait_for(
            load, None if math.isinf(deadline.left()) else max(0.0, deadline.left()))

    deadline.check(doing)
    try:
        return asyncio.run(bounded())
    except TimeoutError:
        deadline.check(doing)
        raise


def _guarded_run(base_url: str, plan: LoadPlan, requests: Sequence[RequestSpec],
                 arrivals: Sequence[float] | None, m: Measurement, deadline: Deadline,
                 doing: str, duration_s: float | None = None) -> tuple[LoadStep, LoadResult]:
    """run_once recorded as the measurement's next step (after `m.begin`); a run the SLA
    guard stopped comes back with the requests finished so far and `step.stopped` set."""
    try:
        result = run_once(base_url, plan, requests, arrivals, m, deadline, doing, duration_s)
    except OverSaturated as flooded:
        return m.finish_early(str(flooded), flooded.verdict)
    except SlaBroken as broken:
        return m.finish_early(str(broken))
    return m.finish(result), result


def _metrics(plan: LoadPlan, result: LoadResult,
             planned: Sequence[RequestSpec] = ()) -> dict[str, float]:
    """vllm bench's metrics; each mix class's (`chat.p99_ttft_ms`, load.mix); for a run of
    sessions (`planned`) also load.session_metrics."""
    metrics = compute_metrics(result.records, result.duration_s, plan.percentiles,
                              plan.goodput_slo_ms or None)
    if plan.classes:
        metrics.update(class_metrics(result.records, plan.classes, result.duration_s,
                                     plan.percentiles, plan.goodput_slo_ms or None))
    if is_sessions(planned):
        turns = {i: turn_count([s]) for i, s in enumerate(planned)}
        metrics.update(session_metrics(result.records, turns))
    return metrics


def measure_screen(base_url: str, plan: LoadPlan, deadline: Deadline, phase: Phase,
                   m: Measurement) -> tuple[dict[str, float], str | None]:
    """The screening run (`plan.screen`, SLA-guarded like any run): its metrics and why it
    stopped early (None: it ran out). Recorded as a step marked `screening`."""
    phase(f"screening ({turn_count(plan.screen)} requests)")
    m.begin(plan.request_rate, None, turn_count(plan.screen), plan.sla_guard,
            _due(plan.screen, plan.screen_arrivals), plan.screen)
    step, result = _guarded_run(base_url, plan, plan.screen, plan.screen_arrivals, m, deadline,
                                "screening")
    m.steps[-1] = replace(step, screening=True)
    return _metrics(plan, result, plan.screen), step.stopped


def _due(items: Sequence[object], arrivals: Sequence[float] | None) -> Sequence[float] | None:
    """When each request is due, by request index (None: unpaced, or sessions, whose arrivals
    are session starts and whose later turns wait for answers)."""
    return None if is_sessions(items) else arrivals


def _enough(plan: LoadPlan, runs: Sequence[dict[str, float]], load_s: float) -> str | None:
    """With `plan.precision`, after at least `plan.min_runs` runs: precision.stop_reason on
    the runs' objective values; None without a rule (every set is measured)."""
    rule = plan.precision
    if rule is None or len(runs) < plan.min_runs:
        return None
    values = [float(per_device(r, rule.devices).get(rule.metric, 0.0)) for r in runs]
    return stop_reason(values, load_s, rule) if all(v > 0 for v in values) else "no value"


def measure_fixed(base_url: str, plan: LoadPlan, deadline: Deadline, phase: Phase,
                  m: Measurement) -> list[dict[str, float]]:
    """The workload's measured requests, then one fresh request set per further run (same
    arrival times); the metrics of each run. The first run stops, and ends the measurement,
    once its SLA surely broke; later runs are not guarded: they refine the objective, and the
    trial's SLA verdict is on the mean over its runs, which one slow run does not surely
    break. With `plan.precision` the rule's stop reason ends it too (kept in
    `m.precision_stop`)."""
    runs: list[dict[str, float]] = []
    sets = [plan.measured, *plan.repeat_requests]
    t0 = time.perf_counter()
    for index, requests in enumerate(sets):
        done, total = 0, turn_count(requests)
        label = f"under load (run {index + 1}/{len(sets)})" if len(sets) > 1 else "under load"

        def progress(_: RequestRecord, total: int = total, label: str = label) -> None:
            nonlocal done
            done += 1
            if done % max(1, total // 4) == 0:
                phase(f"{label}: {done}/{total} requests")

        phase(f"{label}: 0/{total} requests")
        m.begin(plan.request_rate, progress, total, plan.sla_guard if index == 0 else None,
                _due(requests, plan.arrivals), requests)
        # every run keeps the workload's arrival times (same rate, same burstiness)
        step, result = _guarded_run(base_url, plan, requests, plan.arrivals, m, deadline, label,
                                    plan.duration_s)
        runs.append(_metrics(plan, result, requests))
        if step.stopped:
            why = "" if step.stopped.startswith(OVER_SATURATED) else "SLA surely broken: "
            phase(f"stopped early after {len(step.records)}/{total} requests: "
                  f"{why}{step.stopped}")
            break
        if (stop := _enough(plan, runs, time.perf_counter() - t0)) is not None:
            m.precision_stop = stop
            if index + 1 < len(sets):
                phase(f"measured {len(runs)} run(s): {stop}")
            break
    if plan.precision is not None and m.precision_stop is None:
        m.precision_stop = f"cap: {len(runs)} runs"
    return runs


def measure_capacity(base_url: str, plan: LoadPlan, deadline: Deadline, phase: Phase,
                     m: Measurement, still_serving: Callable[[], None]) -> dict[str, float]:
    """Rate steps until framework.trial.capacity says done; the metrics of the step that decides
    the capacity, with capacity_rps and capacity_steps (and, on a timed trace, capacity_speed_up:
    capacity_rps / the trace's mean rate). Of sessions (multi_turn) a step starts that many
    sessions per second, each sending its turns; the SLA is judged on the turns' requests."""
    cap = plan.capacity
    assert cap is not None
    s = cap.settings
    measured: list[tuple[float, bool, dict[str, float]]] = []  # rate, SLA held, metrics
    while (rate := next_rate([(r, ok) for r, ok, _ in measured], s)) is not None:
        index = len(measured)
        n = requests_for(rate, s)
        requests = list(cap.step_requests[index % len(cap.step_requests)])[:n]
        unit = "sessions/s" if is_sessions(requests) else "req/s"
        doing = f"under load at {rate:.3g} {unit}"
        if cap.trace_offsets is not None and cap.trace_rate:
            arrivals = trace_arrivals(cap.trace_offsets, cap.trace_rate, rate, len(requests))
            doing += f" (the trace at {rate / cap.trace_rate:.3g}x)"
        else:
            arrivals = arrival_offsets(len(requests), rate, cap.burstiness, cap.seed + index)
        count = (f"{turn_count(requests)} requests in {len(requests)} sessions"
                 if unit == "sessions/s" else f"{len(requests)} requests")
        phase(f"{doing} ({count}, step {index + 1})")
        m.begin(rate, None, turn_count(requests), cap.sla if plan.sla_guard else None,
                _due(requests, arrivals), requests)
        step, result = _guarded_run(base_url, plan, requests, arrivals, m, deadline, doing)
        still_serving()
        metrics = _metrics(plan, result, requests)
        held = (step.stopped is None and metrics["completed"] > 0
                and evaluate(metrics, cap.sla, "request_throughput").feasible)
        measured.append((rate, held, metrics))
        early = (f" (stopped after {len(step.records)} requests: {step.stopped})"
                 if step.stopped else "")
        phase(f"  {rate:.3g} {unit}: SLA {'holds' if held else 'broken'}{early}")
    found = capacity([(r, ok) for r, ok, _ in measured])
    deciding = max((x for x in measured if x[1]), key=lambda x: x[0], default=None) \
        or min(measured, key=lambda x: x[0])
    speed_up = found / cap.trace_rate if cap.trace_offsets is not None and cap.trace_rate else None
    return {**deciding[2], "capacity_rps": found, "capacity_steps": len(measured),
            **({"capacity_speed_up": speed_up} if speed_up is not None else {})}
