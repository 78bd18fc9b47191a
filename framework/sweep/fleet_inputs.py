"""What framework.fleet needs from a sweep's files, read at load time: the target rate (given,
or a timed trace's mean rate), the price file, and a price for every cost objective. Each
problem is a one-line ConfigError naming the file, the key and the value."""

from __future__ import annotations

from pathlib import Path

from framework.base.errors import ConfigError
from framework.config.specs import SweepSpec
from framework.config.trace_spec import TimedTraceSpec
from framework.fleet.columns import Target
from framework.fleet.prices import read_price_file
from framework.fleet.prices import resolve_price
from framework.load.trace import mean_rate
from framework.load.trace import read_trace

COST_OBJECTIVES = ("cost_per_hour_for_target", "cost_per_mtok_output")


def target_of(path: Path, spec: SweepSpec) -> Target | None:
    """`target.request_rate`, or with `from_trace` the highest mean rate (trace.mean_rate, at
    speed-up 1, over the whole file) of the workloads' traces: the fleet must carry each."""
    t = spec.target
    if t is None:
        return None
    if t.request_rate is not None:
        return Target(t.request_rate, t.headroom)
    rates = []
    for w in spec.workloads or (spec.workload,):
        if w.dataset_path is None:
            raise ConfigError(str(path), "target.from_trace", None,
                              "the workload's timed_trace has no dataset_path to take a rate from")
        try:
            rates.append(mean_rate(read_trace(w.dataset_path, w.timed_trace or TimedTraceSpec())))
        except ValueError as exc:
            raise ConfigError(str(path), "target.from_trace", str(w.dataset_path),
                              f"{exc} (give target.request_rate instead)") from None
    return Target(max(rates), t.headroom)


def file_prices(path: Path, spec: SweepSpec) -> dict[str, float]:
    """The GPU-hour prices of `pricing.file` (relative to the working directory, like the
    sweep's other paths); {} without one."""
    file = spec.pricing.file
    if file is None:
        return {}
    if not file.is_file():
        raise ConfigError(str(path), "pricing.file", str(file), "file not found")
    return read_price_file(file)


def check_prices(path: Path, spec: SweepSpec, prices: dict[str, float]) -> None:
    """A cost objective needs a price for the sweep's replicas (prices.resolve_price; the CPU
    and fake engines only take pricing.per_replica_hour): the tool never invents one."""
    metric = next((m for m in spec.objective.metrics if m in COST_OBJECTIVES), None)
    if metric is None or resolve_price(spec.pricing, engine=spec.engine, gpu=spec.gpu,
                                       file_prices=prices) is not None:
        return
    how = ("set pricing.per_replica_hour (the price of one server-hour)" if spec.engine != "gpu"
           else f"no price for gpu {spec.gpu!r}: set pricing.per_gpu_hour, pricing.gpus, "
                "pricing.file or pricing.per_replica_hour" if spec.gpu
           else "set gpu: (a type with a listed price) or pricing.per_replica_hour")
    raise ConfigError(str(path), "objective.metric", metric, f"a cost needs a price: {how}")
