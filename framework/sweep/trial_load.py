"""The load every trial receives, from the sweep's workload(s): spec -> trial.measure.LoadPlan
(load_plan), and a trial's run settings applied to it (with_run_settings)."""

from __future__ import annotations

import math
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from framework.base.errors import ConfigError
from framework.base.vocabulary import Scalar
from framework.base.vocabulary import load_limits
from framework.config.specs import NamedWorkloadSpec
from framework.config.specs import SweepSpec
from framework.config.specs import WorkloadSpec
from framework.config.trace_spec import TimedTraceSpec
from framework.load.conversations import first_turns
from framework.load.conversations import sharegpt_sessions
from framework.load.conversations import synthetic_sessions
from framework.load.mix import Mix
from framework.load.mix import RequestClass
from framework.load.sampling import sampling_from
from framework.load.sharegpt import read_sharegpt_conversations
from framework.load.trace import mean_rate
from framework.load.trace import read_trace
from framework.load.workload import Dataset
from framework.load.workload import arrival_offsets
from framework.load.workload import load_tokenizer
from framework.trial.capacity import CapacitySettings
from framework.trial.measure import CapacityPlan
from framework.trial.measure import LoadPlan
from framework.trial.measure import WorkloadPart
from framework.trial.objective import goodput_slo_ms
from framework.trial.saturation import SaturationSettings

SCREEN_SEED = 3000  # the screening run's requests and arrivals: workload seed + this


def _dataset(w: WorkloadSpec) -> Dataset:
    return Dataset(name=w.dataset, input_len=w.input_len, output_len=w.output_len,
                   range_ratio=w.range_ratio, path=w.dataset_path,
                   min_prompt_tokens=w.min_prompt_tokens, max_prompt_tokens=w.max_prompt_tokens,
                   prefix_len=w.prefix_len, prefix_groups=w.prefix_groups,
                   trace=w.timed_trace or TimedTraceSpec())


def load_plan(spec: SweepSpec, api_key: str | None = None) -> LoadPlan:
    """The load every trial receives: the workload's dataset drawn with `seed` (measured) and
    `seed + 1` (warm-up), arrivals (a timed trace's: its timestamps / speed_up), its
    sampling fields, and the SLA's per-request limits as
    goodput SLOs; in capacity mode one request set per rate step (seeds `seed + 1000 +
    step`); runs 2.. of repeats or precision `seed + 2000 + r`; the screening run
    `seed + 3000`. dataset multi_turn: multi_turn.num_sessions sessions instead of
    num_prompts requests, drawn with the same seeds (arrivals are session starts); the
    warm-up sends the first turns of `warmup_requests` other sessions as single requests.
    A mix draws each set with load.mix.mix_requests from the same seed.
    Several workloads: one such plan per workload, measured one after another. `api_key`: the
    run's key (Sweep.api_key), sent with every request."""
    if spec.workloads:
        return _workloads_plan(spec, api_key)
    w = spec.workload
    try:
        tok = load_tokenizer(w.tokenizer or spec.model)
    except FileNotFoundError as exc:
        key = "workload.tokenizer" if w.tokenizer else "model"
        raise ConfigError(spec.name, key, str(w.tokenizer or spec.model),
                          f"{exc} (set workload.tokenizer to a folder with tokenizer.json)") from None
    single = _dataset(w)
    dataset: Dataset | Mix = single
    if w.mix:
        dataset = Mix(tuple(RequestClass(c.name, c.weight, _dataset(w.for_class(c.name)))
                            for c in w.mix))
    draw, count = dataset.requests, w.num_prompts
    if w.dataset == "multi_turn":
        draw, count = _session_draw(w), w.sessions.num_sessions
    try:
        measured = draw(tok, count, w.seed)
        warmup: list[Any] = (draw(tok, w.warmup_requests, w.seed + 1)  # multi_turn: sessions
                             if w.warmup_requests else [])
    except ValueError as exc:
        raise ConfigError(str(w.dataset_path or "workload"), "workload.dataset", w.dataset,
                          str(exc)) from None
    if w.dataset == "multi_turn":
        warmup = first_turns(warmup)  # single requests: the first turns of other sessions
    trace = single.trace_offsets(w.num_prompts)
    arrivals = _arrivals(w, len(measured), w.seed, trace)
    screen, screen_arrivals = [], None
    if spec.search.screen is not None:
        n = math.ceil(spec.search.screen * count)
        screen = draw(tok, n, w.seed + SCREEN_SEED)
        screen_arrivals = _arrivals(w, len(screen), w.seed + SCREEN_SEED, trace)
    capacity = None
    if spec.capacity is not None:
        c = spec.capacity
        # multi_turn: the steps start sessions at the rate (sessions/s), `count` sessions a step
        settings = CapacitySettings(start_rate=c.start_rate, max_rate=c.max_rate,
                                    tolerance=c.tolerance, max_steps=c.max_steps,
                                    step_duration_s=c.step_duration_s,
                                    min_requests=min(c.min_requests, count),
                                    max_requests=count)
        steps = [draw(tok, count, w.seed + 1000 + i) for i in range(c.max_steps)]
        capacity = CapacityPlan(settings=settings, step_requests=steps,
                                burstiness=w.burstiness, seed=w.seed,
                                sla=load_limits(spec.sla), trace_offsets=trace,
                                trace_rate=None if trace is None else _trace_rate(w))
    return LoadPlan(model=str(spec.model), warmup=warmup, measured=measured, arrivals=arrivals,
                    max_concurrency=w.max_concurrency, ignore_eos=w.ignore_eos,
                    request_timeout_s=w.request_timeout_s, percentiles=w.percentiles,
                    goodput_slo_ms=goodput_slo_ms(spec.sla),
                    startup_timeout_s=spec.server.startup_timeout_s, endpoint=w.endpoint,
                    duration_s=w.duration_s, trial_timeout_s=spec.search.trial_timeout_s,
                    api_key=api_key,
                    request_rate=None if math.isinf(w.request_rate) else w.request_rate,
                    capacity=capacity,
                    sla_guard=(load_limits(spec.sla) or None) if spec.search.stop_early else None,
                    repeat_requests=[draw(tok, count, w.seed + 2000 + r)
                                     for r in range(1, spec.search.max_runs)],
                    screen=screen, screen_arrivals=screen_arrivals,
                    min_runs=spec.search.repeats,
                    sampling=sampling_from(w.sampling.set_fields()), trace_offsets=trace,
                    max_active_sessions=w.sessions.max_active_sessions,
                    classes=tuple(c.name for c in w.mix),
                    saturation=saturation_settings(spec))


def _trace_rate(w: WorkloadSpec) -> float:
    """A timed trace's mean rate at speed-up 1 over the whole file (trace.mean_rate, the rate
    target.from_trace takes); a trace without one is a ConfigError."""
    assert w.dataset_path is not None
    try:
        return mean_rate(read_trace(w.dataset_path, w.timed_trace or TimedTraceSpec()))
    except ValueError as exc:
        raise ConfigError(str(w.dataset_path), "capacity", "dataset timed_trace",
                          f"{exc}: capacity on a trace needs its rate") from None


def saturation_settings(spec: SweepSpec) -> SaturationSettings:
    s = spec.search.saturation
    return SaturationSettings(enabled=s.enabled, min_duration_s=s.min_duration_s,
                              min_samples=s.min_samples, min_growth=s.min_growth,
                              max_margin=s.max_margin)


def _workloads_plan(spec: SweepSpec, api_key: str | None) -> LoadPlan:
    """Several workloads: each one's plan as if it were the sweep's only workload; the trial's
    plan is the first's without a warm-up of its own (each workload warms up before its run)."""
    parts = [WorkloadPart(w.name, w.weight,
                          load_plan(spec.model_copy(update={"workload": w, "workloads": ()}), api_key))
             for w in spec.workloads]
    return replace(parts[0].load, warmup=(), workloads=tuple(parts),
                   aggregate=spec.objective.aggregate)


def _session_draw(w: WorkloadSpec) -> Callable[..., list]:
    """dataset multi_turn: (tokenizer, n, seed) -> n sessions, synthetic or from the ShareGPT
    file at dataset_path (read once); a file that is not ShareGPT is a ConfigError."""
    if w.dataset_path is None:
        return lambda t, n, seed: synthetic_sessions(t, w.sessions, n, seed)
    try:
        conversations = read_sharegpt_conversations(w.dataset_path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(str(w.dataset_path), "workload.dataset_path", str(w.dataset_path),
                          str(exc)) from None
    return lambda t, n, seed: sharegpt_sessions(t, conversations, w.sessions, n, seed)


def _arrivals(w: WorkloadSpec, n: int, seed: int,
              trace: list[float] | None = None) -> list[float] | None:
    """Send offsets of n requests: a timed trace's first n offsets (at speed-up 1) divided by
    the workload's speed_up; else at its request rate and burstiness (None: unpaced, request
    rate inf)."""
    if trace is not None:
        return [t / float(w.speed_up) for t in trace[:n]]
    rate = float(w.request_rate)
    return None if math.isinf(rate) else arrival_offsets(n, rate, float(w.burstiness), seed)


def with_run_settings(plan: LoadPlan, spec: SweepSpec, settings: Mapping[str, Scalar]) -> LoadPlan:
    """`plan` with a trial's run settings (workload field -> value, search_space.RUN_SETTINGS)
    in place of the workload's: concurrency, and the arrivals of its request rate and
    burstiness (drawn with the workload's seed, as load_plan does) or of its speed-up; with
    several workloads, in each. Pure."""
    if not settings:
        return plan
    if plan.workloads:
        named: dict[str, NamedWorkloadSpec] = {w.name: w for w in spec.workloads}
        parts = tuple(replace(p, load=_with_settings(p.load, named[p.name], settings))
                      for p in plan.workloads)
        return replace(_with_settings(plan, spec.workload, settings), workloads=parts)
    return _with_settings(plan, spec.workload, settings)


def _with_settings(plan: LoadPlan, workload: WorkloadSpec,
                   settings: Mapping[str, Scalar]) -> LoadPlan:
    w = workload.model_copy(update=dict(settings))
    rate = float(w.request_rate)
    trace = None if plan.trace_offsets is None else list(plan.trace_offsets)
    screen_arrivals = (_arrivals(w, len(plan.screen), w.seed + SCREEN_SEED, trace)
                       if plan.screen else None)
    return replace(plan, max_concurrency=w.max_concurrency,
                   arrivals=_arrivals(w, len(plan.measured), w.seed, trace),
                   request_rate=None if math.isinf(rate) else rate,
                   screen_arrivals=screen_arrivals)
