"""FakeEngine's holds (framework/engine/fake_engine.py): the events tests act on instead of a
window of seconds. A start-up pass is taken once, by one server; a token hold is on while its
file exists; no server passes the ready barrier before all N were recorded."""

from __future__ import annotations

import itertools
import threading

from framework.engine import fake_engine


def test_each_pass_is_taken_once_and_an_empty_folder_gives_none(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).touch()
    assert fake_engine.take_pass(str(tmp_path)) is True
    assert fake_engine.take_pass(str(tmp_path)) is True
    assert fake_engine.take_pass(str(tmp_path)) is False
    assert list(tmp_path.iterdir()) == []


def test_servers_racing_for_passes_take_each_once(tmp_path):
    """Eight takers, five passes: exactly five succeed (one unlink per file)."""
    for i in range(5):
        (tmp_path / str(i)).touch()
    taken: list[bool] = []
    lock = threading.Lock()
    go = threading.Barrier(8)

    def take() -> None:
        go.wait()
        got = fake_engine.take_pass(str(tmp_path))
        with lock:
            taken.append(got)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == [False] * 3 + [True] * 5


def test_a_token_hold_is_on_while_its_file_exists(tmp_path, monkeypatch):
    hold = tmp_path / "hold"
    monkeypatch.delenv("FAKE_ENGINE_HOLD_TOKENS", raising=False)
    assert not fake_engine.held("FAKE_ENGINE_HOLD_TOKENS")  # unset: never held
    monkeypatch.setenv("FAKE_ENGINE_HOLD_TOKENS", str(hold))
    assert not fake_engine.held("FAKE_ENGINE_HOLD_TOKENS")
    hold.touch()
    assert fake_engine.held("FAKE_ENGINE_HOLD_TOKENS")
    hold.unlink()
    assert not fake_engine.held("FAKE_ENGINE_HOLD_TOKENS")


def test_no_server_passes_the_ready_barrier_before_all_n_arrived(tmp_path):
    """Three servers arrive one after another (each only once the previous one is recorded);
    none returns before the third arrived, and a fourth, later, passes at once."""
    order = itertools.count()
    arrived: dict[int, int] = {}
    passed: dict[int, int] = {}

    def server(i: int) -> None:
        arrived[i] = next(order)
        fake_engine.ready_together(f"{tmp_path}:3")
        passed[i] = next(order)

    threads = []
    for i in range(3):
        threads.append(threading.Thread(target=server, args=(i,)))
        threads[-1].start()
        while len(list(tmp_path.iterdir())) < i + 1:  # recorded: the next may come
            threading.Event().wait(0.01)
    for t in threads:
        t.join(timeout=60)
    assert sorted(passed) == [0, 1, 2]
    assert min(passed.values()) > max(arrived.values())
    server(3)  # a late server: the barrier is long met
    assert passed[3] == arrived[3] + 1
