"""Who may use the cores while a trial is measured (`cluster.start_ahead`, CPU engine).

With start-ahead, the next trials' servers start while nothing is measured, and wait, ready and
idle, for their turn. The rule that keeps every measurement as it was without start-ahead:
- `busy` work (a server's start-up up to ready, a server's stop) may overlap other busy work;
- a measurement (warm-up, the measured runs, the quality probe) runs alone: no busy work and no
  other measurement shares the cores with it.
A waiting measurement goes first: busy work asking to enter waits behind it, so a stream of
start-ups and stops cannot starve it. A ready server idles while another one is measured; what
that costs the measured run is benchmarked (benchmarks/start_ahead.py), not assumed.

`cancel()` (the sweep is interrupted) lets every waiter through at once; callers check
`cancelled` after a wait and stop instead of going on.

`OPEN` is the gate without start-ahead: every call passes at once (one trial at a time, or
trials on devices of their own).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class ShareGate:
    """Busy work shared, measurements exclusive, waiting measurements first."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = 0
        self._measuring = False
        self._waiting = 0  # measurements asking to start
        self.cancelled = False

    def cancel(self) -> None:
        with self._cond:
            self.cancelled = True
            self._cond.notify_all()

    def enter_busy(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.cancelled or (not self._measuring
                                                           and self._waiting == 0))
            self._busy += 1

    def leave_busy(self) -> None:
        with self._cond:
            self._busy -= 1
            self._cond.notify_all()

    @contextmanager
    def busy(self) -> Iterator[None]:
        self.enter_busy()
        try:
            yield
        finally:
            self.leave_busy()

    @contextmanager
    def measuring(self) -> Iterator[float]:
        """Yields the seconds this measurement waited for its turn."""
        t0 = time.monotonic()
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: self.cancelled or (not self._measuring
                                                               and self._busy == 0))
            finally:
                self._waiting -= 1
            self._measuring = True
        try:
            yield time.monotonic() - t0
        finally:
            with self._cond:
                self._measuring = False
                self._cond.notify_all()


class OpenGate(ShareGate):
    """Lets everything through at once: the behaviour without start-ahead. Never cancelled
    (one instance serves every sweep in the process)."""

    def cancel(self) -> None:
        return None

    def enter_busy(self) -> None:
        return None

    def leave_busy(self) -> None:
        return None

    @contextmanager
    def measuring(self) -> Iterator[float]:
        yield 0.0


OPEN = OpenGate()
