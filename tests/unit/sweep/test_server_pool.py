"""ServerPool: a measured server is parked for one asking round or stopped, each server
stopped once, in the background, and `join` waits for every stop."""

from __future__ import annotations

import threading
from pathlib import Path

from framework.sweep.server_pool import ServerPool


class Handle:
    def __init__(self, fail: bool = False, survivors: tuple[int, ...] = ()) -> None:
        self.alive, self.fail, self.survivors, self.stops = True, fail, list(survivors), 0
        self.may_stop = threading.Event()
        self.may_stop.set()

    def is_alive(self) -> bool:
        return self.alive

    def stop(self) -> list[int]:
        self.may_stop.wait(10)
        self.stops += 1
        if self.fail:
            raise RuntimeError("node unreachable")
        return self.survivors


def test_reuse_off_stops_each_handed_server_once_in_the_background():
    lines: list[str] = []
    pool = ServerPool(False, lines.append)
    a, b = Handle(), Handle()
    a.may_stop.clear()
    pool.hand_over(0, a)
    pool.hand_over(1, b)
    pool.settle(0, "k", (), Path("log0"))
    pool.settle(1, "k", (), Path("log1"))
    pool.settle(1, "k", (), Path("log1"))  # nothing handed over any more
    assert len(pool.stops_running()) >= 1 and a.stops == 0
    a.may_stop.set()
    pool.join()
    assert (a.stops, b.stops) == (1, 1) and pool.stops_running() == [] and lines == []


def test_a_parked_server_goes_to_one_taker_or_is_stopped_after_the_round():
    pool = ServerPool(True, print)
    a, b = Handle(), Handle()
    pool.hand_over(0, a)
    pool.settle(0, "k", ("--x",), Path("log0"))
    pool.hand_over(1, b)
    pool.settle(1, "k", ("--x",), Path("log1"))  # key taken: stopped
    taken = pool.take("k")
    assert taken is not None and taken.server is a and taken.log_path == Path("log0")
    assert pool.take("k") is None and not pool.has_parked()
    pool.hand_over(2, a)
    pool.settle(2, "k", ("--x",), Path("log0"))
    pool.stop_unclaimed()
    pool.join()
    assert (a.stops, b.stops) == (1, 1)


def test_a_dead_parked_server_is_stopped_not_handed_out():
    pool = ServerPool(True, print)
    a = Handle()
    pool.hand_over(0, a)
    pool.settle(0, "k", (), Path("log0"))
    a.alive = False
    assert pool.take("k") is None
    pool.join()
    assert a.stops == 1


def test_stop_all_stops_parked_and_handed_servers_and_failures_are_reported():
    lines: list[str] = []
    pool = ServerPool(True, lines.append)
    parked, handed, leaky = Handle(), Handle(fail=True), Handle(survivors=(4242,))
    pool.hand_over(0, parked)
    pool.settle(0, "k", (), Path("log0"))
    pool.hand_over(1, handed)
    pool.hand_over(2, leaky)
    pool.stop_all()
    pool.join()
    assert (parked.stops, handed.stops, leaky.stops) == (1, 1, 1)
    assert sorted(lines) == ["  trial 2: processes [4242] survived the stop",
                             "a background stop failed: node unreachable"]
