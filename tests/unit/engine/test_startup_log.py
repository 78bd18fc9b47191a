"""engine.startup_log: the start-up phases read from a server's log.

tests/fixtures/startup_cpu.log is an excerpt of a real log: the tiny Llama on vLLM 0.32's CPU
engine (enforce-eager), started by engine.vllm_server.serve (serve mark, and the millisecond
local timestamps of the logging config it used before the epoch prefix; still read), after an
older start's lines; the driver let it start at epoch 1795705730.789 and saw /health answer at
1795705769.599 (38.81 s later). tests/fixtures/startup_gpu_lines.log holds vLLM's GPU-side
lines as its source words them (paths in startup_log's docstring), with made-up times, read
after the serve mark MARK.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from framework.engine import vllm_server
from framework.engine.startup_log import STARTUP_PHASE_COLUMNS
from framework.engine.startup_log import StartupMarks
from framework.engine.startup_log import StartupPhases
from framework.engine.startup_log import phases
from framework.engine.startup_log import process_starts
from framework.engine.startup_log import read_marks
from tests.paths import ROOT

FIXTURES = ROOT / "tests" / "fixtures"

REAL = (FIXTURES / "startup_cpu.log").read_text()
GO, READY = 1795705730.789, 1795705769.599
# the mark's local time is 1 ms behind its epoch: every local stamp + 0.001 s
OFFSET = 1795705730.851 - 1795705730.850


def test_the_real_cpu_log_gives_each_closing_line_in_epoch_seconds():
    marks = read_marks(REAL)
    assert marks.serve_mark == pytest.approx(1795705730.851)
    # 15:09:26.598 is 35.748 s after the mark's local 15:08:50.850
    assert marks.imports_end == pytest.approx(1795705730.850 + 35.748 + OFFSET, abs=1e-6)
    assert marks.weights_end - marks.imports_end == pytest.approx(0.082, abs=1e-6)
    assert marks.engine_end - marks.weights_end == pytest.approx(1.508, abs=1e-6)
    assert marks.api_start - marks.engine_end == pytest.approx(0.839, abs=1e-6)
    assert marks.compile_s == 0.0  # enforce-eager: no compilation, no graphs


def test_the_real_cpu_log_splits_the_ready_time_exactly():
    got = phases(read_marks(REAL), placement_s=1.5, go_at=GO, startup_s=1.5 + READY - GO)
    # imports: 15:09:26.599 (epoch) - GO = 1795705766.599 - 1795705730.789 = 35.810
    assert got.columns() == pytest.approx(StartupPhases(
        placement=1.5, imports=35.810, weights=0.082, profile_kv=1.508, compile=0.0,
        api=1.410).columns(), abs=1e-3)
    assert sum(got.columns().values()) == pytest.approx(1.5 + READY - GO, abs=1e-9)


MARK = "vllm-sweep serve mark: epoch 1000.000 local 2026-01-01 00:16:40.000\n"
GPU_LINES = (FIXTURES / "startup_gpu_lines.log").read_text()
GPU = MARK + GPU_LINES


def without(text: str, words: str) -> str:
    return MARK + "\n".join(ln for ln in text.splitlines() if words not in ln)


def same(got: StartupPhases, expected: StartupPhases) -> bool:
    pairs = zip(got.columns().values(), expected.columns().values())
    return all((a is None) == (b is None) and (a is None or abs(a - b) < 1e-6) for a, b in pairs)


@pytest.mark.parametrize("log, placement_s, go_at, startup_s, expected", [
    # GPU lines: go at epoch 1005 (mark 1000 at local 00:16:40, so 00:17:00 = 1020); ready at
    # 1095: imports 1020 - 1005 = 15, weights to the last loading line 1051 - 1020 = 31,
    # init engine at 1091: span 40 = compile (15.2 + 12 graphs) 27.2 + profile_kv 12.8,
    # api 1095 - 1091 = 4; startup 2 + 90 = 92
    (GPU, 2.0, 1005.0, 92.0, StartupPhases(2.0, 15.0, 31.0, 12.8, 27.2, 4.0)),
    # vLLM's default format (no year, whole seconds): the year comes from the mark
    (MARK + GPU_LINES.replace("2026-01-01 ", "01-01 ").replace(".000 [", " ["),
     2.0, 1005.0, 92.0, StartupPhases(2.0, 15.0, 31.0, 12.8, 27.2, 4.0)),
    # no "Starting to load model": imports None, its 15 s counted in weights (46)
    (without(GPU_LINES, "Starting to load"),
     2.0, 1005.0, 92.0, StartupPhases(2.0, None, 46.0, 12.8, 27.2, 4.0)),
    # no init-engine line (a Ray-executor worker logs elsewhere): profile_kv and compile
    # None, api from the weights line: 90 - 46 = 44
    (without(GPU_LINES, "init engine"),
     2.0, 1005.0, 92.0, StartupPhases(2.0, 15.0, 31.0, None, None, 44.0)),
    # ready 3 s after go (a skewed node clock): each phase clamped into the 3 s window
    (GPU, 2.0, 1005.0, 5.0, StartupPhases(2.0, 3.0, 0.0, 0.0, 0.0, 0.0)),
    # no serve mark (FakeEngine, or the user's logging config without our mark)
    ("INFO:     Application startup complete.\n", 0.5, 1005.0, 3.0,
     StartupPhases(0.5, None, None, None, None, 2.5)),
])
def test_phases_follow_the_closing_lines_and_add_up(log, placement_s, go_at, startup_s, expected):
    got = phases(read_marks(log), placement_s, go_at, startup_s)
    assert same(got, expected), got
    assert sum(v for v in got.columns().values() if v is not None) == pytest.approx(startup_s)
    assert all(v is None or v >= 0 for v in got.columns().values())


def test_compile_never_exceeds_its_span():
    # 27.2 s of reported compile inside a 10 s span: compile 10, profile_kv 0
    marks = StartupMarks(serve_mark=0.0, imports_end=10.0, weights_end=20.0, engine_end=30.0,
                         compile_s=27.2)
    assert same(phases(marks, 0.0, 0.0, 31.0), StartupPhases(0.0, 10.0, 10.0, 0.0, 10.0, 1.0))


def test_garbage_is_no_phase_and_never_raises():
    assert read_marks("vllm-sweep serve mark: epoch x\n\x00INFO 99-99 [") == StartupMarks()


# vLLM's own logger (vllm/logger.py) configured as its processes configure it, in a child
# that imports vLLM with the environment the launcher gives a server (epoch_log_env).
VLLM_LINES = """
import time
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging, init_logger
configure_logging(LoggingConfig())
print(repr(time.time()), flush=True)
logger = init_logger("vllm.v1.worker.cpu_model_runner")
logger.info("Starting to load model %s...", "m")
logger.info("two\\nlines")
"""


def test_vllm_stamps_its_lines_with_the_epoch_prefix_the_parser_reads():
    """The contract with vLLM: VLLM_LOGGING_PREFIX is `%`-formatted with the log record, so
    each line (and each line of a multi-line message) starts with its epoch time, read to
    the millisecond whatever the node's time zone."""
    env = {**os.environ, **vllm_server.epoch_log_env({}), "TZ": "Pacific/Kiritimati",
           "VLLM_CONFIGURE_LOGGING": "1"}
    env.pop("VLLM_LOGGING_CONFIG_PATH", None)
    out = subprocess.run([sys.executable, "-c", VLLM_LINES], env=env, capture_output=True,
                         text=True, timeout=600, check=True).stdout
    before, *lines = [ln for ln in out.splitlines() if ln.strip()]
    mark = vllm_server.serve_mark(float(before))
    assert [ln.startswith("t=") for ln in lines] == [True, True, True], out
    marks = read_marks(mark + "\n" + "\n".join(lines) + "\n")
    # the prefix has the record's time to the millisecond (`%.3f`, rounded), so a line logged
    # in the millisecond of `before` may read below it: `before` is compared rounded alike
    # (rounding keeps the order: created >= before)
    assert round(float(before), 3) <= marks.imports_end <= float(before) + 60
    assert marks.imports_end == float(lines[0].split()[0][2:])
    starts = process_starts(mark + "\n" + "\n".join(lines) + "\n")
    assert starts == {"serve_mark": pytest.approx(float(before), abs=1e-3),
                      "MainProcess": marks.imports_end}


@pytest.mark.parametrize(("environ", "wanted"), [
    ({}, {vllm_server.PREFIX_VAR: vllm_server.EPOCH_PREFIX}),
    ({vllm_server.PREFIX_VAR: "[node-a] "},
     {vllm_server.PREFIX_VAR: vllm_server.EPOCH_PREFIX + "[node-a] "}),  # the user's kept
    ({vllm_server.PREFIX_VAR: vllm_server.EPOCH_PREFIX + "x "}, {}),  # already there: once
])
def test_epoch_log_env_puts_the_prefix_first_once(environ, wanted):
    assert vllm_server.epoch_log_env(environ) == wanted


def test_no_logging_config_file_is_written_or_pointed_at(monkeypatch, tmp_path):
    """No file a worker on another node lacks, and none another user could plant (#32, #33)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(vllm_server.PREFIX_VAR, raising=False)
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    vllm_server.use_epoch_log()
    vllm_server.use_epoch_log()
    assert os.environ[vllm_server.PREFIX_VAR] == vllm_server.EPOCH_PREFIX
    assert "VLLM_LOGGING_CONFIG_PATH" not in os.environ
    assert list(tmp_path.iterdir()) == []


def test_a_line_without_the_prefix_is_read_by_its_local_time():
    """A user's own logging config: vLLM's default head, local time to the second."""
    line = "(Worker pid=1) INFO 01-01 00:16:42 [cpu_model_runner.py:68] Starting to load model m...\n"
    assert read_marks(MARK + line).imports_end == pytest.approx(1002.0)
    assert read_marks(MARK + "t=1003.250 " + line).imports_end == pytest.approx(1003.25)


def test_the_columns_are_named_after_the_phases_in_order():
    assert [name for name, _ in STARTUP_PHASE_COLUMNS] == [
        "startup_placement_s", "startup_imports_s", "startup_weights_s", "startup_profile_kv_s",
        "startup_compile_s", "startup_api_s"]


def test_process_starts_gives_each_process_its_first_line_of_the_last_start():
    got = process_starts(REAL)
    base = 1795705730.850 + OFFSET  # the mark's local time in epoch seconds
    assert got["serve_mark"] == pytest.approx(1795705730.851)
    assert got["APIServer"] - base == pytest.approx(6.545, abs=1e-6)  # 15:08:57.395
    assert got["EngineCore"] - base == pytest.approx(25.936, abs=1e-6)  # 15:09:16.786
    assert got["Worker"] - base == pytest.approx(35.748, abs=1e-6)  # not the older start's


def test_process_starts_drops_a_numbered_name_and_needs_a_mark():
    line = "(VllmWorker-0 pid=7) INFO 2026-01-01 00:16:41.500 [x.py:1] hello\n"
    assert process_starts(MARK + line) == {"serve_mark": 1000.0, "VllmWorker": 1001.5}
    assert process_starts(line) == {}
