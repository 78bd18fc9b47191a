"""A trial's whole-run deadline."""

from __future__ import annotations

import math
from collections.abc import Callable

from framework.base.errors import TrialError


class Deadline:
    """The whole-trial deadline, checked by the trial's own thread between and within phases
    (no timer thread: stopping a server from another thread raced Ray's shutdown)."""

    def __init__(self, limit_s: float | None, clock: Callable[[], float]) -> None:
        self.limit_s, self.clock = limit_s, clock
        self.at = math.inf if limit_s is None else clock() + limit_s

    def left(self) -> float:
        return self.at - self.clock()

    def extend(self, seconds: float) -> None:
        """Move the deadline by `seconds` (time the trial spent waiting for its turn)."""
        self.at += seconds

    def bound(self, timeout_s: float) -> float:
        return max(0.0, min(timeout_s, self.left()))

    def check(self, doing: str) -> None:
        if self.left() <= 0:
            raise TrialError("trial_timeout", f"trial exceeded its {self.limit_s:g} s deadline "
                             f"while {doing}")
