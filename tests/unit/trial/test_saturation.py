"""Over-saturation detection on synthetic series of waiting requests (trial.saturation), its
watch over a sampler's samples, how it ends a measured run and what the row records."""

from __future__ import annotations

import math

import numpy as np
import pytest

from framework.engine.server_metrics import WAITING
from framework.engine.server_metrics import Sample
from framework.load.loadgen import RequestRecord
from framework.trial import measure
from framework.trial.measure import Measurement
from framework.trial.measure import OverSaturated
from framework.trial.saturation import SaturationSettings
from framework.trial.saturation import SaturationWatch
from framework.trial.saturation import detect
from framework.trial.saturation import saturation_values

S = SaturationSettings()  # min 10 s, 6 samples, +4 requests, margin < 1


def every(step: float, until: float) -> np.ndarray:
    return np.arange(step, until + 1e-9, step)


def series(times, waiting) -> list[tuple[float, float]]:
    return [(float(t), float(w)) for t, w in zip(times, waiting)]


def noise(n: int, scale: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, scale, n)


T = every(0.5, 20.0)  # a 20 s run sampled every 0.5 s
CASES = {
    # (series, saturated?)
    "linear growth, 5 req/s": (series(T, 5 * T), True),
    "growth with noise": (series(T, np.maximum(0, 3 * T + noise(len(T), 4))), True),
    "slow but steady growth, 0.5 req/s": (series(T, 0.5 * T), True),  # +5 over the half
    "ramp, then a flat queue": (series(T, np.minimum(40, 10 * T)), False),
    "flat queue with noise": (series(T, 30 + noise(len(T), 3, seed=1)), False),
    "empty queue": (series(T, 0 * T), False),
    "draining (an unpaced burst)": (series(T, np.maximum(0, 200 - 12 * T)), False),
    "a queue of 0-1": (series(T, (T > 15).astype(float)), False),  # too little growth
    "growth, but only 8 s so far": (series(every(0.5, 8), 5 * every(0.5, 8)), False),
    "growth, too few samples": (series([1, 4, 7, 11], [5, 20, 35, 55]), False),
    "no samples": ([], False),
    "noise around a weak rise": (series(T, 20 + 0.2 * T + noise(len(T), 6, seed=2)), False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_detect_on_synthetic_series(name):
    points, expected = CASES[name]
    verdict = detect(points, S)
    assert verdict.saturated is expected, (name, verdict)
    if points:
        assert verdict.at_s == points[-1][0]
        assert verdict.window_start_s >= points[-1][0] / 2  # the later half only


def test_detect_evidence_of_a_linear_queue():
    verdict = detect(series(T, 4 * T + 2), S)
    assert verdict.slope == pytest.approx(4.0)
    assert verdict.margin == pytest.approx(0.0, abs=1e-6)
    assert verdict.samples == 21  # 10.0, 10.5, ..., 20.0
    assert verdict.waiting == 82
    assert "+4/s" in verdict.text() and "21 samples" in verdict.text()


@pytest.mark.parametrize(("settings", "expected"), [
    (SaturationSettings(min_duration_s=25), False),  # the run is 20 s long
    (SaturationSettings(min_growth=30), False),  # 2 req/s over 10 s gains 20
    (SaturationSettings(min_samples=30), False),  # the later half holds 21
    (SaturationSettings(min_growth=15), True),
])
def test_each_setting_is_a_threshold(settings, expected):
    assert detect(series(T, 2 * T), settings).saturated is expected


def test_margin_separates_a_clear_rise_from_a_noisy_one():
    noisy = series(T, np.maximum(0, 1.0 * T + noise(len(T), 8, seed=3)))
    verdict = detect(noisy, S)
    assert verdict.margin is not None and verdict.margin > 0
    assert detect(noisy, SaturationSettings(max_margin=verdict.margin * 1.01)).saturated == (
        verdict.slope * 10 >= 4)
    assert not detect(noisy, SaturationSettings(max_margin=verdict.margin * 0.99)).saturated


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _samples(clock: FakeClock, start: float, waiting) -> list[Sample]:
    """Samples every 0.5 s from `start` (absolute), the first a bracket (before the load)."""
    out = [Sample(start - 0.1, {WAITING: 999.0}, bracket=True)]
    out += [Sample(start + 0.5 * (i + 1), {WAITING: float(w)}) for i, w in enumerate(waiting)]
    return out


def test_watch_judges_only_the_current_run():
    """A watch reads the samples after begin(): those of an earlier run, and the bracket
    scrape, do not count."""
    clock = FakeClock()
    held: list[Sample] = _samples(clock, 50.0, [500 - i for i in range(40)])  # an earlier run
    watch = SaturationWatch(lambda: held, S, clock)
    watch.begin()  # t0 = 100
    assert watch.check().samples == 0 and not watch.check().saturated
    held += _samples(clock, 100.0, [6 * (i + 1) for i in range(40)])  # 0.5 .. 20 s, +12/s
    verdict = watch.check()
    assert verdict.saturated and verdict.slope == pytest.approx(12.0)
    assert verdict.at_s == pytest.approx(20.0)


def _record(index: int) -> RequestRecord:
    return RequestRecord(index=index, send_s=0.0, ttft_s=0.1, chunk_s=(0.1, 0.2), end_s=0.2,
                         prompt_tokens=4, output_tokens=2, success=True)


def test_a_watched_run_stops_when_over_saturated_and_keeps_its_evidence():
    clock = FakeClock()
    held: list[Sample] = []
    m = Measurement()
    m.watch = SaturationWatch(lambda: held, S, clock)
    m.begin(2.0, None, total=100)
    m(_record(0))  # nothing sampled yet: goes on
    held += _samples(clock, clock.now, [3 * (i + 1) for i in range(30)])  # 15 s, +6/s
    with pytest.raises(OverSaturated, match="^over-saturated: waiting requests"):
        m(_record(1))
    step, result = m.finish_early("over-saturated")
    assert step.saturation is not None and step.saturation.saturated
    assert len(step.records) == 2 and result.not_sent == 98
    row = saturation_values([None, step.saturation])
    assert row["saturated"] is True and row["saturation_slope"] == pytest.approx(6.0)
    assert row["saturation_samples"] == 16 and row["saturation_at_s"] == pytest.approx(15.0)


def test_the_row_keeps_the_verdict_that_stopped_the_run(monkeypatch):
    """Samples that arrive after the stop (the queue draining as the run is cut) do not
    overwrite the evidence: the step keeps the saturated verdict that raised (CI saw a row with
    `saturated` False under a stop reading "over-saturated")."""
    clock = FakeClock()
    held: list[Sample] = []
    m = Measurement()
    m.watch = SaturationWatch(lambda: held, S, clock)

    def run_once(base_url, plan, requests, arrivals, on_done, deadline, doing, duration_s):
        held.extend(_samples(clock, clock.now, [3 * (i + 1) for i in range(30)]))  # +6/s
        try:
            on_done(_record(0))
        finally:  # a flat later half arrives before the step is written
            held.extend(Sample(clock.now + 15 + 0.5 * i, {WAITING: 0.0}) for i in range(1, 60))

    monkeypatch.setattr(measure, "run_once", run_once)
    m.begin(2.0, None, total=100)
    step, _ = measure._guarded_run("http://unused", None, [], None, m, None, "measuring")
    assert not m._verdict().saturated  # what a second look would have recorded
    assert step.stopped.startswith("over-saturated") and step.saturation.saturated
    assert step.saturation.slope == pytest.approx(6.0)


def test_a_disabled_watch_records_but_never_stops():
    clock = FakeClock()
    held = _samples(clock, clock.now, [3 * (i + 1) for i in range(30)])
    m = Measurement()
    m.watch = SaturationWatch(lambda: held, SaturationSettings(enabled=False), clock)
    m.begin(2.0, None, total=3)
    for i in range(3):
        m(_record(i))
    assert m._verdict().saturated  # the evidence is kept all the same


@pytest.mark.parametrize(("verdicts", "saturated", "slope"), [
    ([], None, None),
    ([None], None, None),
    ([detect(series(T, 0 * T), S)], False, 0.0),
    ([detect(series(T, 5 * T), S), detect(series(T, 0 * T), S)], True, 5.0),  # the saturated one
    ([detect(series(T, 0 * T), S), detect(series(T, 3 * T), S)], True, 3.0),
])
def test_saturation_values_pick_the_saturated_run_else_the_last(verdicts, saturated, slope):
    row = saturation_values(verdicts)
    assert row["saturated"] is saturated
    assert (row["saturation_slope"] is None) == (slope is None)
    if slope is not None:
        assert row["saturation_slope"] == pytest.approx(slope, abs=1e-9)
        margin = row["saturation_margin"]
        assert margin is None or math.isfinite(margin)
