"""The share gate (framework.trial.share_gate): busy work shared, measurements alone, a waiting
measurement ahead of new busy work; the open gate lets everything through."""

from __future__ import annotations

import threading
import time

import pytest

from framework.trial.share_gate import OPEN
from framework.trial.share_gate import ShareGate

SETTLE_S = 0.2  # a thread that must not pass gets this long to show that it does not
WAIT_S = 30.0  # ends a wait for what must happen; reached only when it never does


def _in_thread(target) -> tuple[threading.Thread, threading.Event]:
    """Run `target` in a thread; the event is set once it returns."""
    done = threading.Event()

    def run() -> None:
        target()
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


def _measure_once(gate: ShareGate, waited: list[float]) -> None:
    with gate.measuring() as w:
        waited.append(w)


def _until_measurements_wait(gate: ShareGate, n: int) -> None:
    """Return once `n` measurements wait at the gate (read under its lock: each of them has
    released it inside its wait)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        with gate._cond:
            if gate._waiting == n:
                return
        assert time.monotonic() < deadline, f"{n} measurement(s) never waited at the gate"
        time.sleep(0.001)


@pytest.mark.timeout(120)
def test_busy_work_overlaps_busy_work():
    gate = ShareGate()
    gate.enter_busy()
    _, done = _in_thread(lambda: (gate.enter_busy(), gate.leave_busy()))
    assert done.wait(WAIT_S), "a second start-up must not wait for the first"
    gate.leave_busy()


@pytest.mark.timeout(120)
def test_a_measurement_waits_for_busy_work_and_reports_the_wait():
    gate = ShareGate()
    gate.enter_busy()
    waited: list[float] = []
    _, done = _in_thread(lambda: _measure_once(gate, waited))
    _until_measurements_wait(gate, 1)
    waiting_since = time.monotonic()  # the measurement's own clock started before this
    assert not done.wait(SETTLE_S), "a measurement began while a server was starting"
    released_at = time.monotonic()
    gate.leave_busy()
    assert done.wait(WAIT_S)
    assert waited[0] >= released_at - waiting_since > 0


@pytest.mark.timeout(120)
def test_busy_work_waits_for_a_running_measurement():
    gate = ShareGate()
    asked = time.monotonic()
    with gate.measuring() as waited:
        # nothing to wait for: the reported wait is within the call itself (no bound in
        # seconds, which a loaded machine could exceed)
        assert 0.0 <= waited <= time.monotonic() - asked
        _, done = _in_thread(lambda: (gate.enter_busy(), gate.leave_busy()))
        assert not done.wait(SETTLE_S), "a server started while a measurement ran"
    assert done.wait(WAIT_S)


@pytest.mark.timeout(120)
def test_measurements_run_one_at_a_time():
    gate = ShareGate()
    waited: list[float] = []
    with gate.measuring():
        _, done = _in_thread(lambda: _measure_once(gate, waited))
        assert not done.wait(SETTLE_S), "two measurements overlapped"
    assert done.wait(WAIT_S)


@pytest.mark.timeout(120)
def test_a_waiting_measurement_goes_before_new_busy_work():
    gate = ShareGate()
    gate.enter_busy()
    order: list[str] = []
    lock = threading.Lock()

    def measure() -> None:
        with gate.measuring():
            with lock:
                order.append("measure")
            time.sleep(SETTLE_S)

    def start() -> None:
        gate.enter_busy()
        with lock:
            order.append("start")
        gate.leave_busy()

    _, measured = _in_thread(measure)
    _until_measurements_wait(gate, 1)
    _, started = _in_thread(start)
    assert not started.wait(SETTLE_S) and order == [], "new busy work passed a waiting measurement"
    gate.leave_busy()
    assert measured.wait(WAIT_S) and started.wait(WAIT_S)
    assert order == ["measure", "start"]


@pytest.mark.timeout(120)
def test_the_open_gate_lets_everything_through_at_once():
    OPEN.enter_busy()
    with OPEN.measuring() as waited, OPEN.measuring() as again:
        assert (waited, again) == (0.0, 0.0)
        with OPEN.busy():
            pass
    OPEN.leave_busy()


@pytest.mark.timeout(120)
def test_cancel_lets_every_waiter_through_and_says_so():
    gate = ShareGate()
    waited: list[float] = []
    with gate.measuring():
        _, started = _in_thread(lambda: (gate.enter_busy(), gate.leave_busy()))
        _, measured = _in_thread(lambda: _measure_once(gate, waited))
        assert not started.wait(SETTLE_S) and not measured.wait(0.01)
        gate.cancel()
        assert started.wait(WAIT_S) and measured.wait(WAIT_S)
    assert gate.cancelled
    OPEN.cancel()
    assert not OPEN.cancelled, "the shared open gate must never be cancelled"
