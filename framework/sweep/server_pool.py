"""Measured servers kept for the next trial with the same vLLM flags (`server.reuse`).

A trial's thread hands its measured server over (`hand_over`); the runner's main thread, once
the trial is recorded, `settle`s it: parked under its flags' key when reuse is on and it still
runs, else stopped. A parked server waits one asking round: the next trial whose key matches
`take`s it (trial.Reused), and `stop_unclaimed` stops the rest, since they hold devices.
Stopping goes through the runner's `stop_later` (a background thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from framework.trial.run import Reused, ServerHandle


class ServerPool:
    def __init__(self, enabled: bool, stop_later: Callable[[int, ServerHandle], None]) -> None:
        self.enabled, self._stop_later = enabled, stop_later
        self._lock = threading.Lock()
        self._handed: dict[int, ServerHandle] = {}  # trial -> its measured server
        self._parked: dict[str, tuple[int, Reused]] = {}  # flags key -> (trial, server)

    def hand_over(self, number: int, server: ServerHandle) -> None:
        """From trial `number`'s thread, after its measurement."""
        with self._lock:
            self._handed[number] = server

    def settle(self, number: int, key: str, argv: tuple[str, ...], log_path: Path) -> None:
        """Park trial `number`'s handed-over server under `key`, or stop it (reuse off, the
        key already parked, or the server gone)."""
        with self._lock:
            server = self._handed.pop(number, None)
        if server is None:
            return
        if self.enabled and key not in self._parked and server.is_alive():
            self._parked[key] = (number, Reused(server, argv, log_path))
        else:
            self._stop_later(number, server)

    def has_parked(self) -> bool:
        return bool(self._parked)

    def take(self, key: str) -> Reused | None:
        """The parked server for `key`, if any and still running; it leaves the pool."""
        found = self._parked.pop(key, None)
        if found is None:
            return None
        if not found[1].server.is_alive():
            self._stop_later(found[0], found[1].server)
            return None
        return found[1]

    def stop_unclaimed(self) -> None:
        for number, reused in self._parked.values():
            self._stop_later(number, reused.server)
        self._parked.clear()

    def stop_all(self) -> None:
        """Parked and handed-over servers alike (the sweep ends)."""
        self.stop_unclaimed()
        with self._lock:
            handed, self._handed = list(self._handed.items()), {}
        for number, server in handed:
            self._stop_later(number, server)
