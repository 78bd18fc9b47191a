"""Over-saturation: a run whose queue grows without bound, told from the server's waiting
requests (`vllm:num_requests_waiting`, sampled by framework.engine.server_metrics) while it runs.

The idea is GuideLLM's over-saturation stop (guidellm/scheduler/constraints/saturation.py: a
least-squares slope over a window of recent points, "significant" when its relative margin of
error is small, judged only after a minimum duration), applied to the one signal that says a
queue has no steady state: vLLM's waiting requests. `detect` is pure; over the samples
(t_i seconds into the run, w_i waiting) it judges the window of the later half of the run so
far (t_i >= t_last / 2; the first half is the ramp every open-loop run has):

- n = samples in the window, slope b = Sxy / Sxx (least squares, waiting requests per second),
  standard error se = sqrt(RSS / (n - 2) / Sxx), margin m = t(0.975, n - 2) x se / b;
- saturated iff t_last >= min_duration_s, n >= min_samples, b > 0, m < max_margin (the
  slope's 95% interval excludes 0 when max_margin = 1) and the line gains at least
  min_growth requests over the window (b x window length), so a queue going from 0 to 1 is
  not called unbounded.
A queue that rises and settles (a load the server holds) has a flat later half; a load the
client's max_concurrency bounds cannot grow past it; an unpaced burst only drains.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass

from framework.engine.server_metrics import WAITING
from framework.engine.server_metrics import Sample
from framework.trial.stats import t975

OVER_SATURATED = "over-saturated"  # how the `stopped` text of such a run begins


@dataclass(frozen=True)
class SaturationSettings:
    """When a run counts as over-saturated (module docstring); `enabled`: stop such runs."""

    enabled: bool = True
    min_duration_s: float = 10.0
    min_samples: int = 6
    min_growth: float = 4.0
    max_margin: float = 1.0


@dataclass(frozen=True)
class SaturationVerdict:
    """The judgement of one run (so far): saturated or not, and its evidence: the slope of
    waiting requests (req/s) and its relative margin of error over `samples` samples of the
    window [window_start_s, at_s] (seconds into the run), the last waiting count."""

    saturated: bool
    slope: float | None
    margin: float | None
    samples: int
    window_start_s: float
    at_s: float
    waiting: float | None

    def text(self) -> str:
        """`waiting requests +12.3/s (+-8%) over 4.5-9.8 s of the run, 14 samples, 61 waiting`."""
        if self.slope is None:
            return f"{self.samples} samples up to {self.at_s:.1f} s of the run: too few to judge"
        margin = "" if self.margin is None or math.isinf(self.margin) else \
            f" (+-{self.margin * 100:.0f}%)"
        return (f"waiting requests {self.slope:+.3g}/s{margin} over {self.window_start_s:.1f}-"
                f"{self.at_s:.1f} s of the run, {self.samples} samples, "
                f"{self.waiting:.0f} waiting at the end")


def detect(series: Sequence[tuple[float, float]], s: SaturationSettings) -> SaturationVerdict:
    """The verdict on (seconds into the run, waiting requests) samples, in time order."""
    if not series:
        return SaturationVerdict(False, None, None, 0, 0.0, 0.0, None)
    t_last = series[-1][0]
    window = [(t, w) for t, w in series if t >= t_last / 2]
    n, start = len(window), window[0][0]
    if n < 3:
        return SaturationVerdict(False, None, None, n, start, t_last, window[-1][1])
    mean_t = sum(t for t, _ in window) / n
    mean_w = sum(w for _, w in window) / n
    sxx = sum((t - mean_t) ** 2 for t, _ in window)
    sxy = sum((t - mean_t) * (w - mean_w) for t, w in window)
    slope = sxy / sxx if sxx > 0 else 0.0
    rss = max(0.0, sum((w - mean_w - slope * (t - mean_t)) ** 2 for t, w in window))
    se = math.sqrt(rss / (n - 2) / sxx) if sxx > 0 else math.inf
    margin = t975(n - 2) * se / slope if slope > 0 else math.inf
    saturated = (t_last >= s.min_duration_s and n >= s.min_samples and slope > 0
                 and margin < s.max_margin and slope * (t_last - start) >= s.min_growth)
    return SaturationVerdict(saturated, slope, margin, n, start, t_last, window[-1][1])


class SaturationWatch:
    """Judges the run in progress from a sampler's samples (`samples()`: a snapshot, clock
    `clock` = the sampler's): `begin()` at the start of each run, `check()` at will (cached
    until a new sample arrives)."""

    def __init__(self, samples: Callable[[], Sequence[Sample]], settings: SaturationSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._samples, self.settings, self._clock = samples, settings, clock
        self._t0 = clock()
        self._seen = -1
        self._last = detect([], settings)

    def begin(self) -> None:
        self._t0, self._seen = self._clock(), -1
        self._last = detect([], self.settings)

    def check(self) -> SaturationVerdict:
        series = [(x.t_s - self._t0, x.values[WAITING]) for x in self._samples()
                  if x.t_s >= self._t0 and not x.bracket and WAITING in x.values]
        if len(series) != self._seen:
            self._seen, self._last = len(series), detect(series, self.settings)
        return self._last


# The evidence in a trial row (and a workload row): framework.results.rows.
SATURATION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("saturated", "bool"), ("saturation_slope", "float"), ("saturation_margin", "float"),
    ("saturation_samples", "int"), ("saturation_at_s", "float"), ("saturation_detail", "str"),
)


def saturation_values(verdicts: Sequence[SaturationVerdict | None]) -> dict[str, object]:
    """The SATURATION_COLUMNS of some runs: the first over-saturated run's verdict, else the
    last judged one's (`saturated` False); all None when no run was watched. A margin that
    is infinite (no rise) is None."""
    judged = [v for v in verdicts if v is not None]
    if not judged:
        return {name: None for name, _ in SATURATION_COLUMNS}
    v = next((v for v in judged if v.saturated), judged[-1])
    return {"saturated": v.saturated, "saturation_slope": v.slope,
            "saturation_margin": None if v.margin is None or math.isinf(v.margin) else v.margin,
            "saturation_samples": v.samples, "saturation_at_s": v.at_s,
            "saturation_detail": v.text()}
