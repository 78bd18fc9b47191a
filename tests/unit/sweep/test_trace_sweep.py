"""A timed trace in a sweep: the workload's keys and their refusals, the load plan (arrivals
from the trace / speed-up, fresh token blocks per run), speed-up as a run setting, and the
request rows' schedule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from framework.base.errors import ConfigError
from framework.config.specs import SweepSpec
from framework.config.specs import load_sweep
from framework.config.trace_spec import TimedTraceSpec
from framework.load.loadgen import RequestRecord
from framework.load.trace import mean_rate
from framework.load.trace import read_trace
from framework.load.trace import send_offsets
from framework.results.rows import request_rows
from framework.sweep import loader
from framework.sweep import trial_load
from framework.trial.measure import LoadStep
from framework.trial.run import TrialOutcome
from tests.paths import ROOT

TRACE = ROOT / "datasets" / "mooncake_sample.jsonl"
MS = {"sec_multiplier": 0.001}


def spec(workload: dict[str, Any], **extra: Any) -> SweepSpec:
    return SweepSpec.model_validate({"name": "t", "model": str(ROOT / "models" / "tiny-llama"),
                                     "search_space": "s.yaml", "workload": workload, **extra})


def trace_workload(**keys: Any) -> dict[str, Any]:
    return {"dataset": "timed_trace", "dataset_path": str(TRACE), "timed_trace": MS,
            "num_prompts": 30, "warmup_requests": 4, **keys}


@pytest.mark.parametrize(("workload", "found"), [
    ({"dataset": "timed_trace"}, "needs dataset_path"),
    (trace_workload(endpoint="chat"), "endpoint completions only"),
    (trace_workload(request_rate=4.0), "request_rate and burstiness do not apply"),
    (trace_workload(burstiness=0.5), "request_rate and burstiness do not apply"),
    (trace_workload(speed_up=0), "greater than 0"),
    (trace_workload(timed_trace={"chunk_hash_size": 0}), "greater than 0"),
    (trace_workload(timed_trace={"chunk": 16}), "Extra inputs"),
    (trace_workload(dataset_path="nowhere.jsonl"), "file not found (a JSONL or CSV trace)"),
    ({"dataset": "random", "timed_trace": MS}, "apply to dataset timed_trace only"),
    ({"dataset": "random", "speed_up": 2}, "apply to dataset timed_trace only"),
    ({"dataset": "random", "dataset_path": str(TRACE)}, "applies to dataset sharegpt only"),
])
def test_workload_keys_of_a_timed_trace(tmp_path: Path, workload: dict[str, Any],
                                        found: str) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "model": "m", "search_space": "s.yaml",
                                    "workload": workload}))
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert found in str(err.value) and "\n" not in str(err.value)


def test_load_plan_replays_the_trace_at_its_speed_up() -> None:
    s = spec(trace_workload(speed_up=2.0), search={"repeats": 2, "screen": 0.2})
    plan = trial_load.load_plan(s)
    rows = read_trace(TRACE, TimedTraceSpec(**MS), 30)
    assert len(plan.measured) == 30 and len(plan.warmup) == 4
    assert [r.prompt_len for r in plan.measured] == [
        min(r.input_length, 16 * len(r.hash_ids or ())) for r in rows]
    assert list(plan.trace_offsets) == send_offsets(rows)
    assert list(plan.arrivals) == pytest.approx(send_offsets(rows, 2.0))
    assert plan.request_rate is None
    assert list(plan.screen_arrivals) == pytest.approx(send_offsets(rows[:6], 2.0))
    # every run: the same lengths and reuse, fresh tokens (no run hits another's cache)
    again = plan.repeat_requests[0]
    assert [r.prompt_len for r in again] == [r.prompt_len for r in plan.measured]
    assert again[0].token_ids != plan.measured[0].token_ids
    assert plan.warmup[0].token_ids != plan.measured[0].token_ids
    assert plan.warmup[0].prompt_len == plan.measured[0].prompt_len


def test_capacity_on_a_trace_steps_its_speed_up_over_its_mean_rate() -> None:
    """Capacity mode on a timed trace (#34 item 2): each step's requests are the trace's rows
    (fresh tokens per step), and the plan carries the trace's offsets at speed-up 1 and its
    mean rate over the whole file, as target.from_trace reads it."""
    s = spec(trace_workload(num_prompts=40), capacity={"max_steps": 3},
             sla={"p99_ttft_ms": 500})
    plan = trial_load.load_plan(s)
    cap = plan.capacity
    assert cap is not None
    all_rows = read_trace(TRACE, TimedTraceSpec(**MS))
    assert cap.trace_rate == pytest.approx(mean_rate(all_rows))
    assert list(cap.trace_offsets) == send_offsets(read_trace(TRACE, TimedTraceSpec(**MS), 40))
    assert len(cap.step_requests) == 3
    lengths = [r.prompt_len for r in plan.measured]
    assert all([r.prompt_len for r in step] == lengths for step in cap.step_requests)
    assert cap.step_requests[0][0].token_ids != cap.step_requests[1][0].token_ids


def test_more_prompts_than_rows_sends_the_whole_trace() -> None:
    plan = trial_load.load_plan(spec(trace_workload(num_prompts=1000, warmup_requests=0)))
    assert len(plan.measured) == len(plan.arrivals) == 150


@pytest.mark.parametrize("speed_up", [1, 3, 0.5])
def test_speed_up_as_a_run_setting_rescales_the_arrivals(speed_up: float) -> None:
    s = spec(trace_workload())
    plan = trial_load.load_plan(s)
    out = trial_load.with_run_settings(plan, s, {"speed_up": speed_up})
    assert out.measured == plan.measured and out.trace_offsets == plan.trace_offsets
    assert list(out.arrivals) == pytest.approx([t / speed_up for t in plan.trace_offsets])


def write_sweep(tmp: Path, workload: dict[str, Any], space: dict[str, Any],
                **extra: Any) -> Path:
    (tmp / "space.yaml").write_text(yaml.safe_dump({"parameters": space}))
    body = {"name": "t", "model": str(ROOT / "models" / "tiny-llama"),
            "search_space": str(tmp / "space.yaml"), "workload": workload,
            "results_dir": str(tmp / "results"), **extra}
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(body))
    return tmp / "sweep.yaml"


SPEED = {"speed-up": {"type": "categorical", "choices": [1, 2], "default": 1, "kind": "run"}}
RATE = {"request-rate": {"type": "categorical", "choices": [1, 2], "default": 1, "kind": "run"}}
SEQS = {"max-num-seqs": {"type": "categorical", "choices": [4, 8], "default": 8}}


@pytest.mark.parametrize(("workload", "space", "extra", "key", "found"), [
    ({"dataset": "random"}, SPEED, {}, "parameters.speed-up", "timed_trace only"),
    (trace_workload(), RATE, {}, "parameters.request-rate", "workload.dataset is timed_trace"),
    # capacity mode searches the speed-up itself (issue #34 item 2), as it does the rate
    (trace_workload(), SPEED, {"capacity": {}, "sla": {"p99_ttft_ms": 100}},
     "parameters.speed-up", "capacity mode searches the speed up itself"),
    (trace_workload(speed_up=2), SEQS, {"capacity": {}, "sla": {"p99_ttft_ms": 100}},
     "workload.speed_up", "capacity mode searches the trace's speed-up itself"),
])
def test_settings_a_trace_refuses(tmp_path: Path, workload: dict[str, Any],
                                  space: dict[str, Any], extra: dict[str, Any], key: str,
                                  found: str) -> None:
    with pytest.raises(ConfigError) as err:
        loader.load(write_sweep(tmp_path, workload, space, **extra), check_flags=True)
    assert err.value.key == key and found in err.value.reason


def test_a_run_setting_must_suit_every_workload_not_only_the_first(tmp_path: Path) -> None:
    """`workloads:` of a timed trace and a random one: a searched speed-up would reach the
    random workload (ignored there), request-rate the trace; each is refused naming the
    workload it cannot apply to (found by a read: only the first workload was checked)."""
    trace = {"name": "replay", **trace_workload()}
    other = {"name": "synthetic", "dataset": "random", "input_len": 32, "output_len": 8,
             "num_prompts": 8}
    for space, wrong in ((SPEED, "workloads.synthetic.dataset is random"),
                         (RATE, "workloads.replay.dataset is timed_trace")):
        sweep = write_sweep(tmp_path, {}, space, workloads=[trace, other])
        body = yaml.safe_load(sweep.read_text())
        del body["workload"]
        sweep.write_text(yaml.safe_dump(body))
        with pytest.raises(ConfigError) as err:
            loader.load(sweep, check_flags=True)
        assert err.value.key == f"parameters.{next(iter(space))}", err.value
        assert wrong in err.value.reason and "timed_trace only" in err.value.reason


def test_speed_up_is_a_load_measured_at_each_value_unless_kept_searched(tmp_path: Path) -> None:
    """A searched speed-up is the replay's pace, not a configuration (#34 item 3,
    sweep.load_curve): every trial replays the trace at each value, one workload per value.
    A throughput of those fixed paces ranks nothing (sweep.load_meaning: refused naming the
    objective); a latency is a curve per configuration; objective.allow_load_bound keeps the
    speed-up searched as before."""
    with pytest.raises(ConfigError) as err:
        loader.load(write_sweep(tmp_path, trace_workload(), SPEED))
    assert (err.value.key, err.value.value) == ("objective.metric", "output_throughput")
    assert err.value.reason.startswith("the speed-up curve's workload speed-up-1 replays")
    curve = loader.load(write_sweep(tmp_path, trace_workload(), SPEED,
                                    objective={"metric": "p99_ttft_ms", "direction": "minimize"}))
    assert curve.space.run_params == () and "speed-up" not in curve.space.parameters
    assert [(w.name, w.speed_up) for w in curve.spec.workloads] == [("speed-up-1", 1.0),
                                                                    ("speed-up-2", 2.0)]
    assert all(w.dataset_path == curve.spec.workload.dataset_path for w in curve.spec.workloads)
    loaded = loader.load(write_sweep(tmp_path, trace_workload(), SPEED,
                                     objective={"allow_load_bound": True}))
    assert loaded.space.run_params == ("speed-up",) and loaded.spec.workloads == ()


def test_a_bad_trace_row_fails_the_plan_naming_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(TRACE.read_text().splitlines()[0] + "\n" +
                   '{"timestamp": 5, "input_length": 10}\n')
    with pytest.raises(ConfigError) as err:
        trial_load.load_plan(spec(trace_workload(dataset_path=str(bad))))
    assert (err.value.file, err.value.key) == (f"{bad}:2", "output_length")


def record(index: int, send_s: float) -> RequestRecord:
    return RequestRecord(index=index, send_s=send_s, ttft_s=0.01, chunk_s=(send_s + 0.01,),
                         end_s=send_s + 0.01, prompt_tokens=5, output_tokens=1, success=True)


def test_request_rows_carry_the_schedule() -> None:
    paced = LoadStep(rate=None, start_s=100.0, records=(record(1, 100.52), record(0, 100.01)),
                     arrivals=(0.0, 0.5))
    unpaced = LoadStep(rate=None, start_s=200.0, records=(record(0, 200.0),))
    outcome = TrialOutcome(started_at=None, argv=(), trial_s=1.0, steps=(paced, unpaced))
    rows = request_rows(3, outcome)
    assert [(r["request_index"], r["scheduled_s"]) for r in rows] == [(1, 0.5), (0, 0.0),
                                                                      (0, None)]
    assert rows[0]["send_s"] - rows[0]["scheduled_s"] == pytest.approx(0.02)
