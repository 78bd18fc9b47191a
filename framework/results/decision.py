"""From the sweep's answer to a deployment decision: the configuration to deploy (verdict.py's
`ship`), its gain over vLLM's defaults with its interval, and the fleet that carries the sweep's
`target:` with its cost (framework.fleet, as the trial rows hold it). One place for the
`run --summary-json` file, `best --format json`, the report's Decision section and the
console's fleet line.

The fleet is sized on the configuration's least favourable COMPLETE measurement: the lowest
capacity_rps among its fresh servers (the origin and its confirmation runs) in capacity mode,
the lowest output_throughput otherwise; its row's fleet columns are the answer, so the answer
equals fleet.sizing.fleet_for over that row's capacity_rps. `fleet_answer` is the one builder
of that answer: from the columns the run stored (the Decision, the console), or from
fleet.columns.fleet_values over that row at another target or price (results.deploy: `export`,
`compare --target`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from framework.base.exit_codes import EXIT_NO_FEASIBLE as EXIT_NO_FEASIBLE  # re-exported for run
from framework.base.vocabulary import Scalar
from framework.config.search_space import SearchSpace
from framework.config.specs import SweepSpec
from framework.fleet.columns import FLEET_COLUMNS
from framework.fleet.columns import Sizing
from framework.fleet.columns import fleet_values
from framework.results.rows import plain
from framework.results.status import best_fields
from framework.results.verdict import SweepVerdict
from framework.results.verdict import decide
from framework.results.verdict import origins

EXPORT_FORMATS = ("serve", "ray-serve", "k8s", "json")


@dataclass(frozen=True)
class FleetAnswer:
    """The fleet for the configuration to deploy, from its trial row `trial` (None where the
    row has no answer: no target, no capacity at the SLA, or no price)."""

    trial: int
    measurements: int
    target_rps: float | None
    headroom: float
    capacity_rps: float | None
    replicas: int | None
    gpus: int | None
    cost_per_hour: float | None
    price_per_replica_hour: float | None
    price_source: str | None
    currency: str
    cost_per_mtok_output: float | None
    cost_per_mtok_total: float | None
    device: str = "GPU"  # what gpus counts: GPUs, or the CPU engine's workers


def _value(row: pd.Series, column: str) -> object:
    value = plain(row.get(column)) if column in row else None
    return None if isinstance(value, float) and math.isnan(value) else value


def sizing_row(trials: pd.DataFrame, number: int) -> pd.Series | None:
    """The least favourable COMPLETE measurement of configuration `number` (module docstring)."""
    rows = origins(trials).get(number)
    if rows is None:
        return None
    done = rows[rows["state"] == "COMPLETE"]
    if done.empty:
        return None
    column = "capacity_rps" if "capacity_rps" in done and done["capacity_rps"].notna().any() \
        else "output_throughput"
    if column not in done or done[column].isna().all():
        return done.iloc[0]
    return done.loc[done[column].astype(float).idxmin()]


_MEASURED = ("capacity_rps", "output_throughput", "total_token_throughput")


def fleet_answer(trials: pd.DataFrame, verdict: SweepVerdict, headroom: float = 0.0,
                 currency: str = "USD", device: str = "GPU", *,
                 sizing: Sizing | None = None) -> FleetAnswer | None:
    """The fleet of the configuration to deploy; None when there is none to deploy. Without
    `sizing`, the sizing row's fleet columns as the run stored them; with it, fleet_values over
    that row's measurements (headroom then the sizing target's)."""
    if verdict.ship is None or (row := sizing_row(trials, verdict.ship)) is None:
        return None
    if sizing is None:
        values = {name: _value(row, name) for name, _ in FLEET_COLUMNS}
    else:
        measured = {c: _value(row, c) for c in _MEASURED}
        values = fleet_values(measured, sizing.target, sizing.price,  # type: ignore[arg-type]
                              sizing.tp, sizing.pp, sizing.dp, sizing.servers)
        headroom = sizing.target.headroom if sizing.target else 0.0

    def num(column: str) -> float | None:
        value = values[column] if column in values else _value(row, column)
        return None if value is None else float(value)  # type: ignore[arg-type]

    def whole(column: str) -> int | None:
        value = num(column)
        return None if value is None else int(value)

    return FleetAnswer(
        trial=int(row["trial_number"]), measurements=len(origins(trials)[verdict.ship]),
        target_rps=num("target_rps"), headroom=headroom, capacity_rps=num("capacity_rps"),
        replicas=whole("replicas_for_target"), gpus=whole("gpus_for_target"),
        cost_per_hour=num("cost_per_hour_for_target"),
        price_per_replica_hour=num("price_per_replica_hour"),
        price_source=values["price_source"],  # type: ignore[arg-type]
        currency=currency, cost_per_mtok_output=num("cost_per_mtok_output"),
        cost_per_mtok_total=num("cost_per_mtok_total"), device=device)


def money(value: float | None, currency: str) -> str:
    return "-" if value is None else f"{value:,.2f} {currency}" if value >= 1 \
        else f"{value:.4g} {currency}"


def fleet_text(f: FleetAnswer) -> str:
    """One line: `Fleet for 40 req/s (+20% headroom): 6 replicas x 1 GPU = 6 GPUs at 8.0 req/s
    each (trial 3); 12.00 USD/h; 0.51 USD per million output tokens (source)`."""
    if f.target_rps is None:
        head = "No target: set target.request_rate to size a fleet"
    elif f.replicas is None:
        head = (f"No fleet carries {f.target_rps:.4g} req/s with this configuration: no rate "
                f"held the SLA (trial {f.trial})" if f.capacity_rps is not None
                else f"Fleet for {f.target_rps:.4g} req/s: unknown (no capacity measured; "
                     "use capacity: mode)")
    else:
        per = (f.gpus or 0) // f.replicas
        room = f" (+{f.headroom:.0%} headroom)" if f.headroom else ""
        head = (f"Fleet for {f.target_rps:.4g} req/s{room}: {f.replicas} replica"
                f"{'s' if f.replicas > 1 else ''} x {per} {f.device} = {f.gpus} {f.device}"
                f"{'s' if f.gpus != 1 else ''} at "
                f"{f.capacity_rps:.4g} req/s each (trial {f.trial}, the lowest of its "
                f"{f.measurements} measurement{'s' if f.measurements > 1 else ''})")
    if f.price_per_replica_hour is None:
        return f"{head}; no price (pricing: per_gpu_hour / per_replica_hour), no cost."
    parts = [head]
    if f.cost_per_hour is not None:
        parts.append(f"{money(f.cost_per_hour, f.currency)}/h")
    if f.cost_per_mtok_output is not None:
        parts.append(f"{money(f.cost_per_mtok_output, f.currency)} per million output tokens")
    return "; ".join(parts) + f" (price {money(f.price_per_replica_hour, f.currency)} per " \
        f"replica-hour: {f.price_source})."


def device_of(engine: str) -> str:
    """What a replica's devices are: GPUs (the fake engine pretends to have them), or CPU
    workers."""
    return "CPU worker" if engine == "cpu" else "GPU"


def export_commands(sweep_file: str) -> list[str]:
    return [f"vllm-sweep export {sweep_file} --format {fmt}" for fmt in EXPORT_FORMATS]


@dataclass(frozen=True)
class Decision:
    """What to deploy and what it costs; `feasible`: some configuration meets the SLA."""

    sweep: str
    verdict: SweepVerdict
    best: dict[str, object] | None
    fleet: FleetAnswer | None
    exports: tuple[str, ...]

    @property
    def feasible(self) -> bool:
        return self.verdict.ship is not None

    def as_json(self) -> dict[str, object]:
        """The summary JSON (docs/RESULTS.md, "Decision JSON")."""
        v, g = self.verdict, self.verdict.gain
        return {
            "sweep": self.sweep, "feasible": self.feasible,
            "verdict": {"kind": v.kind, "statement": v.headline, "lines": list(v.lines),
                        "trial": v.number, "ship": v.ship, "confirmed": v.confirmed,
                        "baseline_breaks": v.baseline_breaks},
            "gain": None if g is None else {"value": g.value, "ci95_low": g.low,
                                            "ci95_high": g.high,
                                            "distinguishable": g.distinguishable},
            "best": self.best,
            "fleet": None if self.fleet is None else asdict(self.fleet),
            "exports": list(self.exports),
        }


def decide_deployment(trials: pd.DataFrame, verdict: SweepVerdict, *, sweep: str,
                      sweep_file: str, params: list[str], fixed: dict[str, Scalar], model: str,
                      run_params: Sequence[str] = (), headroom: float = 0.0,
                      currency: str = "USD", device: str = "GPU") -> Decision:
    """The Decision for `verdict` (results.verdict.decide over `trials`)."""
    best = None if verdict.ship is None else best_fields(trials, verdict, params, fixed, model,
                                                         run_params)
    return Decision(sweep, verdict, best, fleet_answer(trials, verdict, headroom, currency, device),
                    tuple(export_commands(sweep_file)) if best is not None else ())


def sweep_decision(trials: pd.DataFrame, spec: SweepSpec, space: SearchSpace,
                   sweep_file: str) -> Decision:
    """decide_deployment for a sweep's stored rows, judged as `best` and the report judge."""
    verdict = decide(trials, spec.objective.metric, spec.objective.direction == "maximize",
                     spec.sla)
    return decide_deployment(
        trials, verdict, sweep=spec.name, sweep_file=sweep_file,
        params=list(space.parameters), fixed=dict(spec.server.args), model=str(spec.model),
        run_params=space.run_params, headroom=spec.target.headroom if spec.target else 0.0,
        currency=spec.pricing.currency, device=device_of(spec.engine))


def summary_json(decision: Decision) -> str:
    """decision.as_json() as JSON text (numpy scalars as Python values)."""
    return json.dumps(decision.as_json(), indent=1, default=plain) + "\n"


def write_summary_json(decision: Decision, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(summary_json(decision))
