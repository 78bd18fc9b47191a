"""Objectives that rank configurations, not traffic (issue #34 item 1).

Two ways a sweep's objective measures the load it was sent rather than the flags it tried:
- a throughput that follows the offered load (LOAD_FOLLOWING) on an open-loop workload whose
  load is fixed: a request rate, a timed trace replayed at its own times, sessions started at
  a rate. Every configuration that keeps up carries exactly what is sent (sweeps/chat_mix.yaml
  once measured 127.3 tok/s in all three trials), so the search ranks noise;
- a load setting searched as a run parameter (`kind: run`: request-rate, max-concurrency,
  burstiness, speed-up): trials then ran different offered loads, and any objective compared
  across them (a throughput rises with the load, a latency falls without it) learns to send
  more, or less, load. A 3x trace replay once "beat vLLM's defaults by +199%". The loader
  measures such a setting as a curve of every configuration instead (sweep.load_curve), so
  only the first way is refused here.
What to use instead: a latency percentile or goodput at the fixed traffic, a cost at a
`target:`, or capacity (`capacity:`, which raises the load itself until the SLA breaks). Goodput
counts the requests that met the SLA's per-request limits, so it tells configurations apart at
a fixed load; capacity_rps and the fleet objectives come from capacity mode.

`objective.allow_load_bound: true` accepts the sweep as written (say, a study of the load
itself). The verdict never ranks trials of different offered loads on one scale whatever this
says (results.verdict, `load_columns`). Pure: no I/O.
"""

from __future__ import annotations

import math
from pathlib import Path

from framework.base.errors import ConfigError
from framework.config.specs import SweepSpec
from framework.config.workload_spec import WorkloadSpec

# Throughputs equal to the offered load whenever the server keeps up with it.
LOAD_FOLLOWING = ("request_throughput", "output_throughput", "total_token_throughput",
                  "output_throughput_per_gpu")
INSTEAD = ("use a latency percentile (e.g. objective.metric: p99_ttft_ms) or request_goodput at "
           "this traffic, a cost at a target:, or capacity: (the load each configuration "
           "carries within the SLA); or set objective.allow_load_bound: true to keep it")


def fixed_load(w: WorkloadSpec) -> str | None:
    """How the workload fixes its offered load (an open loop), or None when it sends as fast as
    the server answers (request_rate inf: a closed loop, bounded by max_concurrency or not)."""
    if w.dataset == "timed_trace":
        return "replays a timed trace at its own times" + (
            f" ({w.speed_up:g}x)" if w.speed_up != 1.0 else "")
    if not math.isinf(w.request_rate):
        what = "sessions" if w.dataset == "multi_turn" else "requests"
        return f"starts {w.request_rate:g} {what}/s"
    return None


def named_workloads(spec: SweepSpec) -> list[tuple[str, WorkloadSpec]]:
    """(key in the sweep file, workload) of each of the sweep's workloads."""
    if spec.workloads:
        return [(f"workloads.{w.name}", w) for w in spec.workloads]
    return [("workload", spec.workload)]


def load_bound_problem(path: Path, spec: SweepSpec,
                       curve: str | None = None) -> tuple[str, str, object, str] | None:
    """(file, key, value, why) of a throughput objective on a fixed offered load (module
    docstring), or None. Capacity mode sets the rate itself, so a fixed rate is no objection
    there. A searched load setting reaches here as the workloads of its curve
    (sweep.load_curve), each judged as a workload of its own; `curve` (that setting's name)
    words them as its values rather than as `workloads.` keys the file does not have."""
    if spec.objective.allow_load_bound:
        return None
    if spec.capacity is not None:
        return None
    keyed = [("objective.metric", spec.objective.metric),
             *(("objective.pareto_with", m) for m in spec.objective.pareto_with)]
    following = [(key, m) for key, m in keyed if m in LOAD_FOLLOWING]
    if not following:
        return None
    key, metric = following[0]
    for where, w in named_workloads(spec):
        if curve is not None:  # its workloads are named, workloads.<name>
            where = f"the {curve} curve's workload {where.removeprefix('workloads.')}"
        if why := fixed_load(w):
            return (str(path), key, metric,
                    f"{where} {why}: every configuration that keeps up carries exactly that, "
                    f"so {metric} ranks the traffic, not the flags; {INSTEAD}")
    return None


def check_load_bound(path: Path, spec: SweepSpec, curve: str | None = None) -> None:
    """ConfigError (one line, exit 2) for `load_bound_problem`."""
    if found := load_bound_problem(path, spec, curve):
        raise ConfigError(*found)
