"""Servers after their trial: kept for the next trial with the same vLLM flags
(`server.reuse`), else stopped in the background; every stop joined before the sweep ends.

A trial's thread hands its measured server over (`hand_over`); the runner's main thread, once
the trial is recorded, `settle`s it: parked under its flags' key when reuse is on and it still
runs, else stopped. A parked server waits one asking round: the next trial whose key matches
`take`s it (trial.Reused), and `stop_unclaimed` stops the rest, since they hold devices.
Stops run in background threads (`stop_later`), off the next trial's critical path; the runner
waits on `stops_running` too (an ended stop frees devices) and calls `join` before it returns.
A server handed to the pool is either taken by one trial or stopped once by the pool.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from framework.trial.run import Reused
from framework.trial.run import ServerHandle
from framework.trial.share_gate import OPEN
from framework.trial.share_gate import ShareGate

STOP_TIMEOUT_S = 180.0  # how long `join` and `stops_running` wait for one stop's result


class ServerPool:
    """`reuse`: park measured servers for the next trial with the same key; `report`: where a
    stop's problems go (a line of text); `gate`: stops are its busy work (share_gate)."""

    def __init__(self, reuse: bool, report: Callable[[str], None], stoppers: int = 4,
                 gate: ShareGate = OPEN) -> None:
        self.reuse, self._report, self._gate = reuse, report, gate
        self._lock = threading.Lock()
        self._handed: dict[int, ServerHandle] = {}  # trial -> its measured server
        self._parked: dict[str, tuple[int, Reused]] = {}  # flags key -> (trial, server)
        self._stopper = ThreadPoolExecutor(max_workers=stoppers, thread_name_prefix="stop")
        self._stops: list[Future[None]] = []

    def hand_over(self, number: int, server: ServerHandle) -> None:
        """From trial `number`'s thread, after its measurement."""
        with self._lock:
            self._handed[number] = server

    def settle(self, number: int, key: str, argv: tuple[str, ...], log_path: Path) -> None:
        """Park trial `number`'s handed-over server under `key`, or stop it (reuse off, the
        key already parked, or the server gone). Nothing if it handed none over."""
        with self._lock:
            server = self._handed.pop(number, None)
        if server is None:
            return
        if self.reuse and key not in self._parked and server.is_alive():
            self._parked[key] = (number, Reused(server, argv, log_path))
        else:
            self.stop_later(number, server)

    def has_parked(self) -> bool:
        return bool(self._parked)

    def take(self, key: str) -> Reused | None:
        """The parked server for `key`, if any and still running; it leaves the pool and
        belongs to the taker (run_trial hands it back or stops it)."""
        found = self._parked.pop(key, None)
        if found is None:
            return None
        number, reused = found
        if not reused.server.is_alive():
            self.stop_later(number, reused.server)
            return None
        return reused

    def stop_unclaimed(self) -> None:
        """Stop every parked server (the asking round that could take them is over)."""
        for number, reused in self._parked.values():
            self.stop_later(number, reused.server)
        self._parked.clear()

    def stop_all(self) -> None:
        """Stop parked and handed-over servers alike (the sweep ends)."""
        self.stop_unclaimed()
        with self._lock:
            handed, self._handed = list(self._handed.items()), {}
        for number, server in handed:
            self.stop_later(number, server)

    def stop_later(self, number: int, server: ServerHandle) -> None:
        """Stop trial `number`'s server in a background thread."""
        def stop() -> None:
            with self._gate.busy():
                left = server.stop()
            if left:
                self._report(f"  trial {number}: processes {left} survived the stop")

        with self._lock:
            self._stops.append(self._stopper.submit(stop))

    def stops_running(self) -> list[Future[None]]:
        """The background stops still running; those that ended are reported and dropped."""
        with self._lock:
            ended = [f for f in self._stops if f.done()]
            self._stops = [f for f in self._stops if f not in ended]
            running = list(self._stops)
        for fut in ended:
            self._result(fut)
        return running

    def join(self) -> None:
        """Wait for every background stop begun so far, reporting any that failed."""
        with self._lock:
            pending, self._stops = self._stops, []
        for fut in pending:
            self._result(fut)

    def _result(self, fut: Future[None]) -> None:
        try:
            fut.result(timeout=STOP_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - reported; stop_all and the session reap
            self._report(f"a background stop failed: {exc}")
