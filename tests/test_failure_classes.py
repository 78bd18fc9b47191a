"""Pure parts of failure handling: refining a start-up failure, the whole-trial deadline."""

from __future__ import annotations

import pytest

from framework.engine import startup_failure
from framework.errors import TrialError
from framework.measure import Deadline

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
