"""Parts of failure handling without a server: refining a start-up failure (a start-up OOM on
devices an earlier server may still have held is `devices_held`), the whole-trial deadline,
and the after-load health check (against a local HTTP stub of /health)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from framework.base.errors import TrialError
from framework.engine.vllm_server import startup_failure
from framework.load import loadgen
from framework.trial.measure import Deadline
from framework.trial.measure import LoadPlan
from framework.trial.run import _check_still_serving
from framework.trial.run import held_failure
from framework.trial.run import run_trial

KV_TOO_SMALL = ("ValueError: To serve at least one request with the model's max seq len (512), "
                "(0.02 GiB KV cache is needed, which is larger than the available KV cache memory "
                "(0.00 GiB).")


@pytest.mark.parametrize("reason, detail, log, expected_reason, expected_detail", [
    ("startup_crash", "RuntimeError: Engine core initialization failed. See root cause above.",
     f"INFO loading\n{KV_TOO_SMALL}\nERROR EngineCore failed", "oom_at_startup", KV_TOO_SMALL),
    ("startup_crash", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "",
     "oom_at_startup", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ("invalid_args", "ValueError: No available memory for the cache blocks. Try increasing", "",
     "oom_at_startup", "ValueError: No available memory for the cache blocks. Try increasing"),
    ("startup_crash", "RuntimeError: boom", "ValueError: No common block size for 16", "startup_crash",
     "RuntimeError: boom"),
    ("invalid_args", "argument --max-num-seqs: invalid int value: 'many'", "", "invalid_args",
     "argument --max-num-seqs: invalid int value: 'many'"),
    ("startup_timeout", "not ready within 240 s", "CUDA out of memory", "startup_timeout",
     "not ready within 240 s"),  # only crashes and rejections are refined
])
def test_startup_failure(reason, detail, log, expected_reason, expected_detail):
    assert startup_failure(reason, detail, log) == (expected_reason, expected_detail)


def test_startup_failure_takes_the_last_memory_line_of_the_log():
    log = "WARNING Cannot allocate memory for pinned buffer (retrying)\nINFO ok\n" + KV_TOO_SMALL
    assert startup_failure("startup_crash", "RuntimeError: x", log)[1] == KV_TOO_SMALL


FREE_MEMORY = ("ValueError: Free memory on device cuda:0 (41.2/79.1 GiB) on startup is less "
               "than desired GPU memory utilization (0.9, 71.19 GiB).")
HELD = "devices on 10.0.0.7 were handed on at 12:00:00 while pids [4321] of ... still ran"


@pytest.mark.parametrize(("reason", "held", "expected"), [
    # the free-memory check failed while an earlier server's process still ran there
    ("oom_at_startup", HELD, ("devices_held", f"{HELD}; vLLM: {FREE_MEMORY}")),
    ("oom_at_startup", "", ("oom_at_startup", FREE_MEMORY)),  # nothing held: the configuration's
    ("startup_crash", HELD, ("startup_crash", FREE_MEMORY)),  # not a memory shortage: unchanged
    ("invalid_args", HELD, ("invalid_args", FREE_MEMORY)),
])
def test_a_start_up_oom_on_held_devices_is_devices_held(reason, held, expected):
    assert held_failure(reason, FREE_MEMORY, held) == expected


@dataclass
class CrashedServer:
    """A ServerHandle whose server died before ready with vLLM's free-memory error."""
    held: str
    base_url: str = "http://127.0.0.1:9"
    node_ip: str = "10.0.0.7"
    pid: int = 1
    placement: tuple[str, ...] = ("10.0.0.7",)

    def is_alive(self) -> bool:
        return False

    def failure(self) -> TrialError | None:
        return TrialError("invalid_args", FREE_MEMORY)

    def stop(self) -> list[int]:
        return []

    def command(self, name: str, timeout_s: float = 60.0) -> str:
        return "ok"

    def startup_log(self) -> str:
        return ""

    def devices_held(self) -> str:
        return self.held


@pytest.mark.parametrize(("held", "reason"), [(HELD, "devices_held"), ("", "oom_at_startup")])
def test_run_trial_records_a_start_up_oom_on_held_devices_as_devices_held(tmp_path: Path, held,
                                                                          reason):
    server = CrashedServer(held)

    class Launcher:
        def launch(self, argv_for_port, log_path, wanted, on_placed=lambda: None, unit=1,
                   avoid=frozenset()):
            on_placed()
            return server

    plan = LoadPlan(model="m", warmup=(), measured=(), arrivals=None, max_concurrency=1,
                    ignore_eos=True, request_timeout_s=10.0, percentiles=(50.0,),
                    goodput_slo_ms={}, startup_timeout_s=10.0)
    outcome = run_trial(Launcher(), lambda host, port: ["--model", "m"], plan,
                        tmp_path / "trial-00001.log", [{"GPU": 1.0}])
    assert outcome.fail_reason == reason and FREE_MEMORY in outcome.fail_detail
    assert outcome.fail_detail.startswith(held)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_deadline_bounds_waits_and_raises_trial_timeout_once_past():
    clock = Clock()
    deadline = Deadline(30.0, clock)
    assert deadline.bound(240.0) == 30.0 and deadline.bound(5.0) == 5.0
    clock.now += 25
    assert deadline.bound(240.0) == pytest.approx(5.0)
    deadline.check("warming up")
    clock.now += 6
    assert deadline.bound(240.0) == 0.0
    with pytest.raises(TrialError) as err:
        deadline.check("under load")
    assert err.value.reason == "trial_timeout"
    assert err.value.detail == "trial exceeded its 30 s deadline while under load"


def test_no_deadline_never_expires():
    clock = Clock()
    deadline = Deadline(None, clock)
    clock.now += 1e9
    deadline.check("under load")
    assert deadline.bound(240.0) == 240.0


@contextmanager
def health_stub(status: int, silent: int = 0,
                polls: list[str] | None = None) -> Iterator[str]:
    """A local server whose /health answers `status`, except the first `silent` polls: those
    get no answer until the client gives up on them (hangs up). Each poll's path goes to
    `polls`. Yields the base URL."""
    seen = [] if polls is None else polls
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                seen.append(self.path)
                quiet = len(seen) <= silent
            if quiet:
                self.rfile.read()  # returns once the client hangs up
                self.close_connection = True
                return
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@dataclass
class StubHandle:
    """The slice of trial.ServerHandle that the health check uses."""
    base_url: str
    alive: bool = True
    ended_with: TrialError | None = None

    def is_alive(self) -> bool:
        return self.alive

    def failure(self) -> TrialError | None:
        return None if self.alive else self.ended_with


@pytest.mark.timeout(60)
def test_a_live_server_slow_to_answer_health_is_not_called_dead(monkeypatch):
    """The first poll gets no answer before its own timeout (the stub answers nothing until
    the client hangs up); the grace goes on and a later poll's answer counts."""
    monkeypatch.setattr(loadgen, "HEALTH_POLL_TIMEOUT_S", 1.0)  # the silent poll ends sooner
    polls: list[str] = []
    with health_stub(status=200, silent=1, polls=polls) as url:
        _check_still_serving(StubHandle(url), grace_s=20.0)
    assert len(polls) >= 2


@pytest.mark.timeout(60)
def test_a_live_server_silent_for_the_whole_grace_died():
    with health_stub(status=503) as url:
        t0 = time.monotonic()
        with pytest.raises(TrialError) as err:
            _check_still_serving(StubHandle(url), grace_s=2.0)
    assert err.value.reason == "server_died"
    assert "not answering /health for 2 s" in err.value.detail
    assert time.monotonic() - t0 >= 2.0


@pytest.mark.timeout(60)
def test_an_ended_actor_raises_its_own_failure_at_once():
    """At once: before any poll, and without waiting out the grace (an hour: waiting for it
    would run into the test's timeout), instead of a bound in seconds on the time taken."""
    polls: list[str] = []
    with health_stub(status=503, polls=polls) as url:
        handle = StubHandle(url, alive=False, ended_with=TrialError("node_lost", "node 127.0.0.3 died"))
        with pytest.raises(TrialError) as err:
            _check_still_serving(handle, grace_s=3600.0)
    assert (err.value.reason, err.value.detail) == ("node_lost", "node 127.0.0.3 died")
    assert polls == []
