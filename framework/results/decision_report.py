"""The report's Decision section, first on the page: the configuration to deploy, its gain over
vLLM's defaults with its 95% interval (results.verdict), the fleet for the sweep's target with
its cost per hour and per million tokens and the price's source (results.decision), and the
commands that export it. Every string taken from the rows or the spec is HTML-escaped."""

from __future__ import annotations

import html

import pandas as pd

from framework.config.specs import SweepSpec
from framework.results.decision import FleetAnswer
from framework.results.decision import device_of
from framework.results.decision import export_commands
from framework.results.decision import fleet_answer
from framework.results.decision import money
from framework.results.verdict import SweepVerdict
from framework.results.verdict import decide


def _esc(text: object) -> str:
    return html.escape(str(text), quote=False)


def _gain(verdict: SweepVerdict) -> str:
    g = verdict.gain
    if g is None:
        return "not measured against a re-measured baseline: " + verdict.headline
    return (f"{g.value:+.1%} (95% interval {g.low:+.1%} to {g.high:+.1%})"
            + ("" if g.distinguishable else ": not distinguishable from vLLM's defaults"))


def _fleet_rows(f: FleetAnswer) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if f.target_rps is not None:
        room = f" with {f.headroom:.0%} headroom" if f.headroom else ""
        rows.append(("Target", f"{f.target_rps:.4g} req/s{room}"))
        capacity = "-" if f.capacity_rps is None else f"{f.capacity_rps:.4g} req/s"
        rows.append(("Capacity per replica", f"{capacity} (trial {f.trial}, the lowest of its "
                     f"{f.measurements} measurement(s))"))
        rows.append(("Replicas", "none carries the target: no rate held the SLA"
                     if f.replicas is None else str(f.replicas)))
        rows.append((f"{f.device}s", "-" if f.gpus is None else str(f.gpus)))
        rows.append(("Cost per hour", f"{money(f.cost_per_hour, f.currency)}"))
    rows.append(("Cost per million output tokens", money(f.cost_per_mtok_output, f.currency)))
    rows.append(("Cost per million tokens (input + output)",
                 money(f.cost_per_mtok_total, f.currency)))
    rows.append(("Price per replica-hour", "none given (pricing: in the sweep file); the tool "
                 "never invents one" if f.price_per_replica_hour is None
                 else f"{money(f.price_per_replica_hour, f.currency)}: {f.price_source}"))
    return rows


def decision_section(trials: pd.DataFrame, spec: SweepSpec, sweep_file: str) -> str:
    """The section's HTML (id 'decision'); a sentence when there is nothing to deploy."""
    head = "<section id='decision'><h2>Decision</h2>"
    if trials.empty:
        return head + "<p class='fail'>No trial yet: nothing to deploy.</p></section>"
    verdict = decide(trials, spec.objective.metric, spec.objective.direction == "maximize",
                     spec.sla)
    if verdict.ship is None:
        return (head + f"<p class='fail' id='decision-none'>Nothing to deploy: "
                f"{_esc(verdict.headline)}</p></section>")
    row = trials[trials["trial_number"] == verdict.ship].iloc[0]
    what = (f"trial {verdict.ship}" if verdict.number is not None
            else f"vLLM's defaults (trial {verdict.ship})")
    rows = [("Deploy", what), ("Gain over vLLM's defaults", _gain(verdict))]
    fleet = fleet_answer(trials, verdict, spec.target.headroom if spec.target else 0.0,
                         spec.pricing.currency, device_of(spec.engine))
    if fleet is not None:
        rows += _fleet_rows(fleet)
    table = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows)
    exports = "\n".join(export_commands(sweep_file))
    return (f"{head}<table id='decision-table'>{table}</table>"
            f"<p>Command:</p><pre id='decision-command'>{_esc(row['serve_command'])}</pre>"
            f"<p>Export it:</p><pre id='decision-exports'>{_esc(exports)}</pre></section>")
