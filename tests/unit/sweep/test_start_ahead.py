"""Start-ahead (`cluster.start_ahead`) in the runner, against FakeEngine servers without Ray:
servers start side by side, but no server starts or stops while a trial is measured, and every
trial is still told once with its rows (the runner contract of test_runner_contract)."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import yaml
from rich.console import Console

from framework.base.errors import ConfigError
from framework.config.specs import SweepSpec
from framework.sweep.loader import load
from framework.sweep.runner import Runner
from framework.trial.share_gate import ShareGate
from tests.unit.sweep.test_runner_contract import Counted
from tests.unit.sweep.test_runner_contract import FakeLauncher
from tests.unit.sweep.test_runner_contract import _sweep
from tests.unit.sweep.test_runner_contract import _told_once_with_rows

WAIT_S = 60.0  # ends a wait for what must happen; reached only when it never does
HOLD_S = 0.05  # how long the first measurement goes on once another one waits


class RecordingGate(ShareGate):
    """The real gate, with the times its measurements began and ended. With `hold_first`, the
    first measurement goes on until another one waits for it, and HOLD_S more: a trial then
    waits for another's measurement by construction, not by timing."""

    def __init__(self, hold_first: bool = False) -> None:
        super().__init__()
        self.measured: list[tuple[float, float]] = []
        self._hold = hold_first

    @contextmanager
    def measuring(self) -> Iterator[float]:
        with super().measuring() as waited:
            began = time.monotonic()
            try:
                if self._hold:
                    self._hold = False
                    self._until_another_waits()
                    time.sleep(HOLD_S)
                yield waited
            finally:
                self.measured.append((began, time.monotonic()))

    def _until_another_waits(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            with self._cond:
                if self._waiting:
                    return
            assert time.monotonic() < deadline, "no other trial asked to be measured"
            time.sleep(0.001)


class StampingLauncher(FakeLauncher):
    """FakeLauncher that stamps each server's start (right after `on_placed`) and stop. With
    `together`, the first that many launches wait for each other after `on_placed` (that is,
    once the start-ahead gate let each start): their servers start side by side however the
    machine schedules the trials' threads."""

    def __init__(self, gpus: int, together: int = 0) -> None:
        super().__init__(gpus)
        self.stamps: list[tuple[str, float]] = []
        self._together = threading.Barrier(together) if together else None
        self._placed = 0
        self._placed_lock = threading.Lock()

    def launch(self, argv_for_port, log_path, wanted, on_placed=lambda: None, unit=1,
               avoid=frozenset()):
        def placed() -> None:
            on_placed()
            self.stamps.append(("start", time.monotonic()))
            with self._placed_lock:
                self._placed += 1
                first = self._together is not None and self._placed <= self._together.parties
            if first:
                self._together.wait(WAIT_S)

        server = super().launch(argv_for_port, log_path, wanted, placed, unit)
        stop = server.stop

        def stamped_stop() -> list[int]:
            self.stamps.append(("stop", time.monotonic()))
            return stop()

        server.stop = stamped_stop  # type: ignore[method-assign]
        return server


def _with_start_ahead(path, n: int) -> None:
    doc = yaml.safe_load(path.read_text())
    doc["cluster"] = {"start_ahead": n}
    path.write_text(yaml.safe_dump(doc))


@pytest.mark.timeout(120)
def test_servers_start_side_by_side_and_each_trial_is_measured_alone(tmp_path):
    """The first two servers start together and the first measurement lasts until the other
    trial waits for it (events, see StampingLauncher and RecordingGate): what the test
    asserts does not depend on start-ups being long enough to overlap."""
    path = _sweep(tmp_path, "ahead", {"max-num-seqs": {"type": "categorical",
                                                        "choices": [4, 8, 16, 32]}},
                  reuse=False, n_trials=4)
    _with_start_ahead(path, 1)
    gate, launcher = RecordingGate(hold_first=True), StampingLauncher(gpus=2, together=2)
    runner = Runner(load(path), launcher, Console(file=io.StringIO(), width=200), gate=gate)
    counted = Counted(runner.tuner)
    runner.run(4)
    trials = _told_once_with_rows(runner, counted, 4)
    assert (trials["state"] == "COMPLETE").all()
    assert launcher.most_held == 2, "the next trial's server did not start ahead"
    assert len(gate.measured) == 4
    spans = sorted(gate.measured)
    for (_, end), (begin, _) in zip(spans, spans[1:]):
        assert end <= begin, "two trials were measured at once"
    for what, t in launcher.stamps:
        inside = [s for s in spans if s[0] < t < s[1]]
        assert not inside, f"a server {what} happened during a measurement"
    assert (trials["gate_wait_s"] >= 0).all()
    assert trials["gate_wait_s"].max() >= HOLD_S, "no trial waited for another to be measured"


@pytest.mark.timeout(60)
def test_start_ahead_is_refused_on_the_gpu_engine(tmp_path):
    path = _sweep(tmp_path, "gpu", {"max-num-seqs": {"type": "categorical", "choices": [4]}},
                  reuse=False, n_trials=1)
    doc = yaml.safe_load(path.read_text())
    doc.update(engine="gpu", gpu="H100", cluster={"start_ahead": 1})
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="start_ahead"):
        load(path)


@pytest.mark.parametrize(("start_ahead", "engine", "expected"),
                         [(0, "cpu", 1), (2, "cpu", 3), (1, "fake", 2), (0, "fake", None)])
def test_start_ahead_sets_how_many_trials_run_at_once(start_ahead, engine, expected):
    spec = SweepSpec.model_validate({"name": "x", "model": "m", "search_space": "s.yaml",
                                     "engine": engine, "cluster": {"start_ahead": start_ahead}})
    assert spec.concurrent_trials == expected


@pytest.mark.timeout(120)
def test_an_interrupt_while_trials_wait_at_the_gate_stops_every_server(tmp_path, monkeypatch):
    """Ctrl-C once two servers were launched: the one waiting for its turn is not left
    running, and every asked trial is told once (COMPLETE or interrupted)."""
    monkeypatch.setenv("FAKE_ENGINE_STARTUP_S", "0.5")
    path = _sweep(tmp_path, "ahead-stop", {"max-num-seqs": {"type": "categorical",
                                                            "choices": [4, 8, 16, 32]}},
                  reuse=False, n_trials=4)
    _with_start_ahead(path, 1)
    launcher = StampingLauncher(gpus=2)
    runner = Runner(load(path), launcher, Console(file=io.StringIO(), width=200))
    counted = Counted(runner.tuner, interrupt=lambda: len(launcher.servers) >= 2)
    with pytest.raises(KeyboardInterrupt):
        runner.run(4)
    trials = _told_once_with_rows(runner, counted, len(counted.asked))
    for _, row in trials.iterrows():
        assert row["state"] == "COMPLETE" or row["fail_reason"] == "interrupted", dict(row)
    assert all(s.stops >= 1 and not s.is_alive() for s in launcher.servers)
    assert launcher.held == 0
