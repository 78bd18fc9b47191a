"""A server's start-up, phase by phase, read from its own log (pure: text in, seconds out).

`engine.vllm_server.serve` prints a serve mark first (`vllm-sweep serve mark: epoch <s> local
<time>`), and vLLM's lines start with their epoch time to the millisecond (`t=<s> `,
engine.vllm_server.epoch_log_env). A line without it (a user's own logging config) is read by
vLLM's default time, local and to the second, tied to epoch seconds by the mark's two times
whatever the node's time zone. Only lines after the last serve mark count (a log file may hold
several starts). The lines that close each phase, in vLLM 0.32's wording (paths
under vllm/ of the installed package):

- imports, "Starting to load model <model>..." (v1/worker/cpu_model_runner.py `load_model`,
  v1/worker/gpu_model_runner.py `load_model`): the API server's imports and configuration, the
  EngineCore process and its worker process started and imported;
- weights, the last "Loading weights took <s> seconds" (model_executor/model_loader/
  default_loader.py, sharded_state_loader.py) or "Model loading took <GiB> GiB memory and <s>
  seconds" (v1/worker/gpu_model_runner.py, v1/worker/gpu/model_runner.py);
- profiling and KV allocation, and compile and graph capture, together closed by "init engine
  (profile, create kv cache, warmup model) took <s> s" (v1/engine/core.py
  `_initialize_kv_caches`): vLLM compiles inside its profiling run, so the two are split by the
  durations vLLM reports, compile = "(compilation: <s> s)" on that line (torch.compile, timed by
  compilation/monitor.py) + "Graph capturing finished in <s> secs" (CUDA graphs, the two model
  runners above), and profile_kv = the rest of the span;
- API ready: the remainder, from that line to the driver seeing /health answer (FastAPI app
  built, "Starting vLLM server on <url>", entrypoints/launchers/api_server/entry.py; uvicorn up).

Placement comes from the driver (`placement_wait_s`), and imports start when the driver let
the server start (after the placement and any share-gate wait), on the driver's wall clock: the
nodes' clocks are taken to agree. A phase whose closing line is missing is None, and its time
counts in the next phase that closes; every phase is clamped to the start-up's window, so the
phases always add up to `startup_s`.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from dataclasses import fields
from typing import Any

SERVE_MARK = "vllm-sweep serve mark:"  # printed by engine.vllm_server.serve
# The epoch prefix (engine.vllm_server.EPOCH_PREFIX) before vLLM's `(process pid=N)`.
_EPOCH = re.compile(r"\bt=(\d+\.\d{3}) (?=\()")
# vLLM's line head: LEVEL, then `MM-DD HH:MM:SS` (vLLM's default format, vllm/logger.py
# `_DATE_FORMAT`: second resolution, no year; a year and milliseconds are read if present), then
# [file:line].
_LINE = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?:(\d{4})-)?(\d{2})-(\d{2}) "
                   r"(\d{2}):(\d{2}):(\d{2})(?:\.(\d{3}))? \[[^\]]*\] (.*)$")
_MARK = re.compile(re.escape(SERVE_MARK) + r" epoch ([\d.]+) local (\d{4})-(\d{2})-(\d{2}) "
                   r"(\d{2}):(\d{2}):(\d{2})\.(\d{3})")
IMPORTS_END = "Starting to load model"
WEIGHTS_END = ("Loading weights took", "Model loading took")
ENGINE_END = "init engine (profile, create kv cache, warmup model) took"
API_START = "Starting vLLM server on"
_COMPILATION = re.compile(r"\(compilation: ([\d.]+) s")
_GRAPHS = re.compile(r"Graph capturing finished in ([\d.]+) secs")


@dataclass(frozen=True)
class StartupMarks:
    """What one start's log says: epoch seconds of each closing line (None: not logged), and
    the compile and graph-capture seconds vLLM reported."""

    serve_mark: float | None = None
    imports_end: float | None = None
    weights_end: float | None = None
    engine_end: float | None = None
    api_start: float | None = None
    compile_s: float = 0.0


@dataclass(frozen=True)
class StartupPhases:
    """Seconds of each start-up phase (None: not known); they add up to the trial's startup_s."""

    placement: float | None = None
    imports: float | None = None
    weights: float | None = None
    profile_kv: float | None = None
    compile: float | None = None
    api: float | None = None

    def columns(self) -> dict[str, float | None]:
        return {f"startup_{f.name}_s": getattr(self, f.name) for f in fields(self)}


# Trial-row columns (results.rows), in start-up order.
STARTUP_PHASE_COLUMNS: list[tuple[str, str]] = [(name, "float")
                                                for name in StartupPhases().columns()]


def _epoch(groups: tuple[Any, ...], year: int, offset: float) -> float:  # a match's groups
    """A local `year?, month, day, h, m, s, ms?` as epoch seconds (`offset`: epoch - local)."""
    y, mo, d, h, mi, s, ms = groups
    local = calendar.timegm((int(y) if y else year, int(mo), int(d), int(h), int(mi), int(s)))
    return local + (int(ms) / 1000.0 if ms else 0.0) + offset


def _last_start(log: str) -> tuple[float, list[tuple[str, float, str]]] | None:
    """The last serve mark's epoch and every timestamped line after it as (line from vLLM's
    `(process pid=N)` on, epoch seconds, message); None without a serve mark."""
    lines = log.splitlines()
    start = next((i for i in range(len(lines) - 1, -1, -1) if SERVE_MARK in lines[i]), None)
    mark = _MARK.search(lines[start]) if start is not None else None
    if start is None or mark is None:
        return None
    epoch, year = float(mark.group(1)), int(mark.group(2))
    offset = epoch - _epoch(mark.groups()[1:], year, 0.0)
    stamped = []
    for line in lines[start + 1:]:
        prefix = _EPOCH.search(line)
        rest = line[prefix.end():] if prefix else line
        if head := _LINE.search(rest):
            *stamp, message = head.groups()
            at = float(prefix.group(1)) if prefix else _epoch(tuple(stamp), year, offset)
            stamped.append((rest, at, message))
    return epoch, stamped


def read_marks(log: str) -> StartupMarks:
    """The closing lines of the last start in `log` (StartupMarks() without a serve mark)."""
    start = _last_start(log)
    if start is None:
        return StartupMarks()
    epoch, lines = start
    found: dict[str, float] = {}
    compile_s = 0.0
    for _, at, message in lines:
        if IMPORTS_END in message:
            found.setdefault("imports_end", at)
        elif message.startswith(WEIGHTS_END):
            found["weights_end"] = at
        elif ENGINE_END in message:
            found.setdefault("engine_end", at)
            compiled = _COMPILATION.search(message)
            compile_s += float(compiled.group(1)) if compiled else 0.0
        elif API_START in message:
            found.setdefault("api_start", at)
        if graphs := _GRAPHS.search(message):
            compile_s += float(graphs.group(1))
    return StartupMarks(serve_mark=epoch, compile_s=compile_s, **found)


_PROCESS = re.compile(r"^\((\w+)(?:-\d+)? pid=\d+\) ")


def process_starts(log: str) -> dict[str, float]:
    """Epoch seconds of the first line each vLLM process logged in the last start of `log`,
    by process name (vLLM's `(name pid=N)` line head, vllm/logger.py `_FORMAT`; numbered
    names such as VllmWorker-0 without the number), plus "serve_mark"; {} without a serve
    mark."""
    start = _last_start(log)
    if start is None:
        return {}
    found = {"serve_mark": start[0]}
    for line, at, _ in start[1]:
        if name := _PROCESS.match(line):
            found.setdefault(name.group(1), at)
    return found


def phases(marks: StartupMarks, placement_s: float, go_at: float,
           startup_s: float) -> StartupPhases:
    """Each phase's seconds. `go_at`: epoch time the server was let start (after placement and
    the share gate); `startup_s`: placement + (ready - go_at), the trial's ready time.

    Closing times are taken relative to `go_at` and clamped to [previous closing, startup_s -
    placement_s]: imports = imports_end - go_at, weights = weights_end - imports_end, the
    span engine_end - weights_end is compile (min(compile_s, span)) + profile_kv, api = the
    rest. No serve mark: every phase but placement and api is None."""
    window = max(0.0, startup_s - placement_s)
    ends: list[float | None] = []
    done = 0.0
    for at in (marks.imports_end, marks.weights_end, marks.engine_end):
        if at is None:
            ends.append(None)
            continue
        done = min(window, max(done, at - go_at))
        ends.append(done)
    durations: list[float | None] = []
    previous = 0.0
    for end in ends:
        durations.append(None if end is None else end - previous)
        previous = previous if end is None else end
    imports, weights, engine = durations
    compile_s = profile_kv = None
    if engine is not None:
        compile_s = min(marks.compile_s, engine)
        profile_kv = engine - compile_s
    return StartupPhases(placement=placement_s, imports=imports, weights=weights,
                         profile_kv=profile_kv, compile=compile_s, api=window - previous)
