"""Trial and request rows and their column schemas (pure; docs/RESULTS.md documents them).

Parameters become `param_<flag with underscores>` columns (`max-num-seqs` ->
`param_max_num_seqs`); metrics keep vLLM bench's names; times are seconds unless the name
ends in `_ms`.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from framework import __version__
from framework.base.vocabulary import Scalar
from framework.base.vocabulary import class_key
from framework.base.vocabulary import is_lower_bound
from framework.base.vocabulary import metric_names
from framework.config.search_space import BoolParam
from framework.config.search_space import CategoricalParam
from framework.config.search_space import FloatParam
from framework.config.search_space import IntParam
from framework.config.search_space import Param
from framework.config.search_space import SearchSpace
from framework.engine.feasibility import Feasibility
from framework.engine.prediction import PREDICTION_COLUMNS
from framework.engine.server_metrics import SERVER_METRIC_COLUMNS
from framework.engine.startup_log import STARTUP_PHASE_COLUMNS
from framework.fleet.columns import FLEET_COLUMNS
from framework.load.session_metrics import SESSION_COUNTS
from framework.load.session_metrics import SESSION_METRICS
from framework.results.diagnosis import diagnose
from framework.results.provenance import PROVENANCE_COLUMNS
from framework.trial.objective import Verdict
from framework.trial.objective import error_rate
from framework.trial.run import TrialOutcome
from framework.trial.saturation import SATURATION_COLUMNS
from framework.trial.saturation import saturation_values

SCHEMA_VERSION = 3  # 3: `sampling` (before it, every request was sent with temperature 0)
_INT_METRICS = {"completed", "failed", "total_input_tokens", "total_output_tokens",
                "max_concurrent_requests", *SESSION_COUNTS}

REQUEST_COLUMNS: list[tuple[str, str]] = [
    ("trial_number", "int"), ("step", "int"), ("screening", "bool"), ("rate", "float"),
    ("request_index", "int"),
    ("send_s", "float"), ("ttft_ms", "float"),
    ("tpot_ms", "float"), ("e2el_ms", "float"), ("itl_ms", "list<float>"),
    ("prompt_tokens", "int"), ("output_tokens", "int"), ("success", "bool"), ("error", "str"),
    ("scheduled_s", "float"),
    ("session_id", "int"), ("turn", "int"),  # dataset multi_turn; null for single requests
    ("class", "str"), ("workload", "str"),  # its mix class, its workload (several); else null
    ("replica", "int"),  # the server that answered (replicas shape: its router's header); else null
]


def plain(value: Any) -> Any:
    """numpy / pandas scalars -> Python scalars (for YAML and Optuna)."""
    return value.item() if hasattr(value, "item") else value


def param_column(name: str) -> str:
    return "param_" + name.replace("-", "_")


def _param_kind(param: Param) -> str:
    if isinstance(param, BoolParam):
        return "bool"
    if isinstance(param, IntParam):
        return "int"
    if isinstance(param, FloatParam):
        return "float"
    assert isinstance(param, CategoricalParam)
    kinds = {type(c) for c in param.choices}
    if kinds == {int}:
        return "int"
    if kinds <= {int, float}:
        return "float"
    if kinds == {bool}:
        return "bool"
    return "str"


def class_columns(classes: Sequence[str], percentiles: Sequence[float]) -> list[tuple[str, str]]:
    """Every load metric of each mix class, its name prefixed (`chat.p99_ttft_ms`), with the
    class's request_goodput and error_rate (load.mix.class_metrics)."""
    names = [*metric_names(percentiles), "request_goodput", "error_rate"]
    return [(class_key(c, m), "int" if m in _INT_METRICS else "float")
            for c in classes for m in names]


def trial_columns(space: SearchSpace, percentiles: Sequence[float],
                  sla_keys: Sequence[str] = (), classes: Sequence[str] = ()
                  ) -> list[tuple[str, str]]:
    """The trial table's schema for one sweep: fixed columns, one per parameter, metrics,
    each mix class's metrics (`classes`), and `<sla key>_ci95_high` per SLA key (repeated
    runs)."""
    columns = [
        ("trial_number", "int"), ("state", "str"), ("fail_reason", "str"), ("fail_detail", "str"),
        ("is_baseline", "bool"), ("confirmation_of", "int"),
    ]
    columns += [(param_column(n), _param_kind(p)) for n, p in space.parameters.items()]
    columns += [("vllm_argv", "list<str>"), ("serve_command", "str"), ("shape", "str"),
                ("dummy_weights", "bool"),
                ("startup_levers", "list<str>")]
    columns += [(m, "int" if m in _INT_METRICS else "float") for m in metric_names(percentiles)]
    columns += [(m, "int" if m in _INT_METRICS else "float") for m in SESSION_METRICS]
    columns += class_columns(classes, percentiles)
    columns += [("output_throughput_per_gpu", "float"), ("request_goodput_per_gpu", "float"),
                ("capacity_rps", "float"), ("capacity_steps", "int"),
                ("capacity_speed_up", "float"), ("repeats", "int"),
                ("objective_ci95_low", "float"), ("objective_ci95_high", "float"),
                ("objective_cv", "float"), ("precision_target", "float"),
                ("ci95_halfwidth", "float"), ("ci95_halfwidth_within", "float"),
                ("ci95_halfwidth_server", "float"), ("precision_reached", "bool"),
                ("precision_stop", "str")]
    columns += FLEET_COLUMNS  # the deployment: fleet.columns (target:, pricing:)
    columns += [(f"{key}_ci95_high", "float") for key in sla_keys if not is_lower_bound(key)]
    columns += list(SERVER_METRIC_COLUMNS)
    columns += list(SATURATION_COLUMNS)
    columns += [(name, "float") for name in ESTIMATE_COLUMNS.values()]
    columns += PREDICTION_COLUMNS  # search.prior's predictor: engine.prediction
    columns += [("feasibility_warnings", "str"), ("diagnosis", "str"), ("diagnosis_detail", "str"),
                ("stopped_early", "str")]
    columns += QUALITY_COLUMNS
    columns += PROVENANCE_COLUMNS
    columns += [
        ("request_goodput", "float"), ("error_rate", "float"), ("feasible", "bool"),
        ("sla_violations", "str"), ("objective", "float"), ("vllm_version", "str"),
        ("vllm_sweep_version", "str"), ("schema_version", "int"), ("started_at", "timestamp"),
        ("startup_s", "float"), ("bench_s", "float"), ("trial_s", "float"), ("node_ip", "str"),
        ("placement", "list<str>"), ("node_count", "int"), ("placement_wait_s", "float"),
        ("launch_s", "float"), ("warmup_s", "float"), ("server_pid", "int"),
        ("server_reused", "bool"), ("server_log", "str"), ("log_tail", "str"),
        ("gate_wait_s", "float"),  # start-ahead: waiting at the share gate (trial.share_gate)
    ]
    columns += STARTUP_PHASE_COLUMNS  # startup_<phase>_s: engine.startup_log
    return columns


# Feasibility-model numbers kept in every row (predicted before launch; compare them with
# the measured kv_cache_usage_max and the trial's state).
ESTIMATE_COLUMNS = {
    "weights_gib_per_gpu": "est_weights_gib_per_gpu",
    "kv_budget_gib_per_gpu": "est_kv_budget_gib_per_gpu",
    "kv_tokens_capacity": "est_kv_tokens_capacity",
    "max_resident_seqs": "est_max_resident_seqs",
}


# The quality probe's verdict (framework.trial.quality.QualityVerdict field -> column); null
# for trials that change no output flag (not probed).
QUALITY_FIELDS = {
    "token_agreement": "token_agreement",
    "logprob_mad": "logprob_mad",
    "baseline_agreement": "quality_baseline_agreement",
    "baseline_logprob_mad": "quality_baseline_logprob_mad",
    "required": "quality_required",
    "ok": "quality_ok",
    "note": "quality_note",
}
QUALITY_COLUMNS: list[tuple[str, str]] = [
    ("token_agreement", "float"), ("logprob_mad", "float"), ("quality_baseline_agreement", "float"),
    ("quality_baseline_logprob_mad", "float"), ("quality_required", "float"),
    ("quality_ok", "bool"), ("quality_note", "str"),
]


@dataclass(frozen=True)
class TrialContext:
    """What a row needs besides the outcome."""

    number: int
    params: Mapping[str, Scalar]
    is_baseline: bool
    serve_command: str
    vllm_version: str
    server_log: str
    feasibility: Feasibility | None = None
    sla: Mapping[str, float] | None = None  # for the diagnosis
    provenance: Mapping[str, object] | None = None  # framework.results.provenance
    confirmation_of: int | None = None  # the trial this one re-measures (confirm_top)
    startup_levers: tuple[str, ...] = ()  # framework.engine.startup_levers, used by this trial
    shape: str | None = None  # cluster.placement.Shape.label: TP x PP (x DP)
    fleet: Mapping[str, object] | None = None  # fleet.columns.fleet_values
    prediction: Mapping[str, object] | None = None  # engine.prediction.Prediction.columns()


def trial_state(outcome: TrialOutcome) -> str:
    """COMPLETE (measured), INFEASIBLE (rejected by the feasibility model before launch),
    PRUNED (stopped after its screening run) or FAIL (any other failure)."""
    if outcome.ok:
        return "COMPLETE"
    return {"infeasible": "INFEASIBLE", "pruned": "PRUNED"}.get(outcome.fail_reason or "", "FAIL")


def trial_row(ctx: TrialContext, outcome: TrialOutcome, verdict: Verdict | None,
              columns: Sequence[tuple[str, str]],
              intervals: Mapping[str, float | str | None] | None = None) -> dict[str, object]:
    """One trial table row; absent values are None (null). `intervals`: the repeated-runs
    columns from objective.evaluate_repeated."""
    row: dict[str, object] = {name: None for name, _ in columns}
    row.update({
        "trial_number": ctx.number,
        "state": trial_state(outcome),
        "fail_reason": outcome.fail_reason,
        "fail_detail": outcome.fail_detail or None,
        "is_baseline": ctx.is_baseline,
        "confirmation_of": ctx.confirmation_of,
        "vllm_argv": list(outcome.argv),
        "serve_command": ctx.serve_command,
        "shape": ctx.shape,
        "dummy_weights": _flag_value(outcome.argv, "--load-format") == "dummy",
        "startup_levers": [] if outcome.server_reused else list(ctx.startup_levers),
        "vllm_version": ctx.vllm_version,
        "vllm_sweep_version": __version__,
        "schema_version": SCHEMA_VERSION,
        "started_at": outcome.started_at,
        "startup_s": outcome.startup_s,
        "gate_wait_s": outcome.gate_wait_s,
        "bench_s": outcome.bench_s,
        "trial_s": outcome.trial_s,
        "node_ip": outcome.node_ip or None,
        "placement": list(outcome.placement),
        "node_count": len(set(outcome.placement)) or None,
        "placement_wait_s": outcome.placement_wait_s,
        "launch_s": outcome.launch_s,
        "warmup_s": outcome.warmup_s,
        "server_pid": outcome.server_pid,
        "server_reused": outcome.server_reused,
        "server_log": ctx.server_log,
        "log_tail": outcome.log_tail or None,
    })
    for name, value in ctx.params.items():
        row[param_column(name)] = value
    for key, value in outcome.metrics.items():
        if key in row:
            row[key] = value
    row.update({k: outcome.server_metrics.get(k) for k, _ in SERVER_METRIC_COLUMNS})
    if outcome.startup_phases is not None:
        row.update(outcome.startup_phases.columns())
    if ctx.feasibility is not None:
        for key, column in ESTIMATE_COLUMNS.items():
            row[column] = ctx.feasibility.numbers.get(key)
        row["feasibility_warnings"] = "; ".join(ctx.feasibility.warnings) or None
    if outcome.metrics:
        row["error_rate"] = error_rate(outcome.metrics)
    if verdict is not None:
        row["feasible"] = verdict.feasible
        row["sla_violations"] = "; ".join(verdict.violations)
        row["objective"] = verdict.objective
    for key, interval in (intervals or {}).items():
        if key in row:
            row[key] = int(interval) if key == "repeats" and interval is not None else interval
    row.update(ctx.provenance or {})
    row.update(ctx.fleet or {})
    row.update(ctx.prediction or {})
    row["stopped_early"] = "; ".join(s.stopped for s in outcome.steps if s.stopped) or None
    row.update(saturation_values([s.saturation for s in outcome.steps if not s.screening]))
    if outcome.quality is not None:
        row.update({column: getattr(outcome.quality, name) for name, column in QUALITY_FIELDS.items()})
        row["quality_note"] = outcome.quality.note or None
    found = diagnose(row, ctx.sla)
    row["diagnosis"], row["diagnosis_detail"] = found.verdict, found.text
    return row


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    return next((b for a, b in zip(argv, argv[1:]) if a == flag), None)


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def request_rows(number: int, outcome: TrialOutcome) -> list[dict[str, object]]:
    """One row per measured request; `step` numbers the measured runs of the trial (a
    screening run first, marked `screening`; capacity
    mode's rate steps, else only 0), `rate` is that run's request rate (null: unpaced) and
    send_s is relative to the start of that run; scheduled_s is when the request was due,
    from the same start (the arrival schedule: a timed trace's timestamps / speed-up, or the
    rate's draw; null when the run was unpaced), so send_s - scheduled_s is its lateness."""
    return [{
        "trial_number": number, "step": index, "screening": step.screening, "rate": step.rate,
        "request_index": r.index,
        "send_s": r.send_s - step.start_s,
        "scheduled_s": None if step.arrivals is None else step.arrivals[r.index],
        "ttft_ms": _ms(r.ttft_s), "tpot_ms": _ms(r.tpot_s), "e2el_ms": _ms(r.e2el_s),
        "itl_ms": [g * 1000.0 for g in r.itl_s], "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens, "success": r.success, "error": r.error or None,
        "session_id": r.session_id, "turn": r.turn,
        "class": r.request_class, "workload": step.workload, "replica": r.replica,
    } for index, step in enumerate(outcome.steps) for r in step.records]
