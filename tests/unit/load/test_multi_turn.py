"""dataset multi_turn without a server: the `multi_turn:` section and its one-line errors, the
stated distributions (seeded, their means), sessions drawn synthetic and from ShareGPT, each
turn's prompt built from the conversation so far, and the session metrics (table-tested)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from framework.base.errors import ConfigError
from framework.config.multi_turn_spec import DistributionSpec
from framework.config.multi_turn_spec import MultiTurnSpec
from framework.config.specs import load_sweep
from framework.load.conversations import Session
from framework.load.conversations import chat_messages
from framework.load.conversations import first_turns
from framework.load.conversations import sharegpt_sessions
from framework.load.conversations import synthetic_sessions
from framework.load.conversations import transcript
from framework.load.conversations import turn_count
from framework.load.distributions import draw
from framework.load.distributions import draw_counts
from framework.load.loadgen import RequestRecord
from framework.load.prompts import RequestSpec
from framework.load.prompts import load_tokenizer
from framework.load.session_metrics import SESSION_METRICS
from framework.load.session_metrics import session_metrics
from framework.load.sessions import turn_payload
from framework.load.sharegpt import exchanges
from framework.load.sharegpt import read_sharegpt_conversations
from framework.load.sharegpt import sample_sharegpt_conversations
from framework.load.sharegpt import system_message
from framework.sweep.trial_load import load_plan
from tests.paths import ROOT
from tests.paths import TINY_MODEL

SAMPLE = ROOT / "datasets" / "multi_turn_sample.json"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY_MODEL)


def dist(**keys: Any) -> DistributionSpec:
    return DistributionSpec.model_validate(keys)


# --- distributions -------------------------------------------------------------------------

@pytest.mark.parametrize(("keys", "mean", "low", "high"), [
    ({"distribution": "constant", "value": 2.5}, 2.5, 2.5, 2.5),
    ({"distribution": "uniform", "min": 1, "max": 3}, 2.0, 1.0, 3.0),
    ({"distribution": "exponential", "mean": 0.5}, 0.5, 0.0, np.inf),
    ({"distribution": "lognormal", "average": 40}, 40.0, 0.0, np.inf),
    ({"distribution": "lognormal", "average": 40, "median_ratio": 0.5}, 40.0, 0.0, np.inf),
])
def test_draws_have_the_stated_mean_and_are_seeded(keys, mean, low, high) -> None:
    spec = dist(**keys)
    values = draw(spec, np.random.default_rng(7), 40_000)
    assert spec.expected == mean
    assert abs(values.mean() - mean) <= 0.03 * mean
    assert values.min() >= low and values.max() <= high
    again = draw(spec, np.random.default_rng(7), 40_000)
    assert np.array_equal(values, again)
    if keys["distribution"] != "constant":
        assert not np.array_equal(values, draw(spec, np.random.default_rng(8), 40_000))


def test_lognormal_median_is_the_stated_ratio_of_the_average() -> None:
    values = draw(dist(distribution="lognormal", average=100, median_ratio=0.6),
                  np.random.default_rng(1), 40_000)
    assert abs(np.median(values) - 60) <= 2


@pytest.mark.parametrize(("keys", "cap"), [
    ({"distribution": "exponential", "mean": 1.0, "max": 1.5}, 1.5),
    ({"distribution": "lognormal", "average": 10, "max": 12}, 12),
])
def test_max_caps_every_draw(keys, cap) -> None:
    values = draw(dist(**keys), np.random.default_rng(0), 5000)
    assert values.max() == cap and (values == cap).sum() > 100


@pytest.mark.parametrize(("keys", "allowed"), [
    ({"distribution": "uniform", "min": 2, "max": 5}, {2, 3, 4, 5}),
    ({"distribution": "constant", "value": 3}, {3}),
    ({"distribution": "exponential", "mean": 0.2}, None),  # rounded, then raised to 1
])
def test_counts_are_whole_and_at_least_one(keys, allowed) -> None:
    counts = draw_counts(dist(**keys), np.random.default_rng(3), 4000)
    assert all(isinstance(c, int) and c >= 1 for c in counts)
    if allowed is not None:
        assert set(counts) == allowed
    else:
        assert 1 in counts and max(counts) >= 2


@pytest.mark.parametrize(("keys", "match"), [
    ({"distribution": "uniform", "min": 1}, "needs max"),
    ({"distribution": "uniform", "min": 4, "max": 2}, "min 4 > max 2"),
    ({"distribution": "constant", "value": 1, "mean": 2}, "mean does not apply to distribution constant"),
    ({"distribution": "exponential", "mean": 0}, "greater than 0"),
    ({"distribution": "lognormal", "average": 5, "median_ratio": 1.0}, "less than 1"),
    ({"distribution": "poisson", "mean": 2}, "constant"),
    ({"distribution": "constant", "value": 1, "sigma": 1}, "Extra inputs"),
])
def test_bad_distribution_is_refused(keys, match) -> None:
    with pytest.raises(ValidationError, match=match):
        dist(**keys)


# --- the sweep file ------------------------------------------------------------------------

def sweep_file(tmp_path: Path, workload: dict[str, Any]) -> Path:
    body = {"name": "mt", "model": str(TINY_MODEL), "search_space": "s.yaml",
            "workload": workload}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@pytest.mark.parametrize(("workload", "key", "reason"), [
    ({"dataset": "random", "multi_turn": {"num_sessions": 3}}, "workload",
     "multi_turn: applies to dataset multi_turn only"),
    ({"dataset": "multi_turn", "num_prompts": 40}, "workload", "set multi_turn.num_sessions"),
    ({"dataset": "multi_turn", "dataset_path": str(SAMPLE),
      "multi_turn": {"turns": {"distribution": "constant", "value": 3}}}, "workload",
     "multi_turn.turns applies to synthetic sessions only"),
    ({"dataset": "multi_turn", "multi_turn": {"think_time_s": {"distribution": "exponential"}}},
     "workload.multi_turn.think_time_s", "distribution exponential needs mean"),
    ({"dataset": "multi_turn", "multi_turn": {"turns": {"distribution": "constant", "value": 0}}},
     "workload.multi_turn", "a constant count must be >= 1"),
    ({"dataset": "multi_turn", "multi_turn": {"num_sessions": 0}},
     "workload.multi_turn.num_sessions", "greater than 0"),
    ({"dataset": "multi_turn", "multi_turn": {"sessions": 3}}, "workload.multi_turn.sessions",
     "Extra inputs"),
    ({"dataset": "multi_turn", "dataset_path": "nowhere.json"}, "workload.dataset_path",
     "file not found"),
])
def test_bad_multi_turn_workload_is_one_config_error(tmp_path, workload, key, reason) -> None:
    with pytest.raises(ConfigError) as caught:
        load_sweep(sweep_file(tmp_path, workload))
    assert caught.value.key == key and reason in caught.value.reason
    assert "\n" not in str(caught.value)


def test_capacity_mode_steps_the_session_rate(tmp_path) -> None:
    """#34 item 2: capacity over multi-turn steps the rate sessions start at; each step's set
    is num_sessions sessions of its own seed (a step sends at most that many)."""
    from framework.sweep.trial_load import load_plan

    path = sweep_file(tmp_path, {"dataset": "multi_turn", "multi_turn": {"num_sessions": 6}})
    body = yaml.safe_load(path.read_text())
    body.update(sla={"p99_ttft_ms": 500}, capacity={"start_rate": 1.0, "max_steps": 3,
                                                    "min_requests": 4})
    path.write_text(yaml.safe_dump(body))
    cap = load_plan(load_sweep(path)).capacity
    assert cap is not None and len(cap.step_requests) == 3
    assert all(len(step) == 6 and all(isinstance(s, Session) for s in step)
               for step in cap.step_requests)
    assert (cap.settings.min_requests, cap.settings.max_requests) == (4, 6)
    assert cap.step_requests[0] != cap.step_requests[1]  # each step its own sessions


def test_bad_multi_turn_sweep_exits_2_with_one_line(tmp_path) -> None:
    path = sweep_file(tmp_path, {"dataset": "multi_turn", "num_prompts": 40})
    res = subprocess.run([sys.executable, "-m", "framework.cli", "validate", str(path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "set multi_turn.num_sessions" in res.stderr and str(path) in res.stderr


def test_example_sweep_builds_its_sessions() -> None:
    spec = load_sweep(ROOT / "sweeps" / "multi_turn_chat.yaml")
    assert spec.workload.dataset == "multi_turn" and spec.workload.endpoint == "chat"
    plan = load_plan(spec)
    mt = spec.workload.sessions
    assert len(plan.measured) == mt.num_sessions and len(plan.arrivals) == mt.num_sessions
    assert all(isinstance(s, Session) and 1 <= len(s.turns) <= mt.max_turns
               for s in plan.measured)
    assert turn_count(plan.measured) > 2 * mt.num_sessions  # several turns per session
    assert len(plan.warmup) == spec.workload.warmup_requests
    assert all(isinstance(r, RequestSpec) for r in plan.warmup)
    assert plan.max_active_sessions == mt.max_active_sessions
    assert load_plan(spec).measured == plan.measured  # seeded


# --- sessions and prompts ------------------------------------------------------------------

SESSION = Session(turns=(RequestSpec("hello there", 2, 5), RequestSpec("and then?", 3, 4),
                         RequestSpec("bye", 1, 2)), think_s=(0.5, 1.0), system="be brief")


@pytest.mark.parametrize(("turn", "answers", "expected"), [
    (0, [], [("system", "be brief"), ("user", "hello there")]),
    (1, ["A0"], [("system", "be brief"), ("user", "hello there"), ("assistant", "A0"),
                 ("user", "and then?")]),
    (2, ["A0", "A1"], [("system", "be brief"), ("user", "hello there"), ("assistant", "A0"),
                       ("user", "and then?"), ("assistant", "A1"), ("user", "bye")]),
])
def test_chat_messages_hold_the_conversation_so_far(turn, answers, expected) -> None:
    messages = chat_messages(SESSION, turn, answers)
    assert [(m["role"], m["content"]) for m in messages] == expected
    assert transcript(SESSION, turn, answers) == " ".join(text for _, text in expected)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_turn_k_prompt_contains_turn_k_minus_1_prompt_and_answer(endpoint) -> None:
    answers = ["first answer", "second answer"]
    prompts = [turn_payload(endpoint, "m", SESSION, k, answers[:k], True) for k in range(3)]
    for k in (1, 2):
        before, now = prompts[k - 1], prompts[k]
        if endpoint == "chat":
            assert now["messages"][:len(before["messages"])] == before["messages"]
            assert now["messages"][len(before["messages"])] == {"role": "assistant",
                                                                 "content": answers[k - 1]}
        else:
            assert now["prompt"].startswith(f"{before['prompt']} {answers[k - 1]} ")
    key = "max_completion_tokens" if endpoint == "chat" else "max_tokens"
    assert [p[key] for p in prompts] == [5, 4, 2]  # each turn's own answer length
    assert all(p["stream"] and p["ignore_eos"] for p in prompts)


@pytest.mark.parametrize(("turn", "answers", "match"), [
    (3, ["a", "b", "c"], "outside"), (-1, [], "outside"), (2, ["a"], "needs the 2 earlier"),
])
def test_turn_out_of_range_or_without_its_answers_is_refused(turn, answers, match) -> None:
    with pytest.raises(ValueError, match=match):
        chat_messages(SESSION, turn, answers)


def test_session_needs_one_think_time_per_later_turn() -> None:
    with pytest.raises(ValueError, match="3 turns need 2 think times"):
        Session(turns=SESSION.turns, think_s=(1.0,))
    with pytest.raises(ValueError, match="at least one turn"):
        Session(turns=(), think_s=())


def test_synthetic_sessions_follow_their_distributions(tokenizer) -> None:
    spec = MultiTurnSpec(num_sessions=5,
                         turns=dist(distribution="uniform", min=2, max=4),
                         prompt_tokens=dist(distribution="uniform", min=10, max=30),
                         output_tokens=dist(distribution="constant", value=7),
                         think_time_s=dist(distribution="exponential", mean=0.4), max_turns=3)
    sessions = synthetic_sessions(tokenizer, spec, 40, seed=5)
    assert len(sessions) == 40
    assert {len(s.turns) for s in sessions} == {2, 3}  # uniform 2..4, capped at 3
    for s in sessions:
        for t in s.turns:
            assert len(tokenizer.encode(t.prompt, add_special_tokens=False).ids) == t.prompt_len
            assert 10 <= t.prompt_len <= 30 and t.output_len == 7
        assert len(s.think_s) == len(s.turns) - 1 and all(x >= 0 for x in s.think_s)
    assert synthetic_sessions(tokenizer, spec, 40, seed=5) == sessions
    assert synthetic_sessions(tokenizer, spec, 40, seed=6) != sessions
    defaults = synthetic_sessions(tokenizer, MultiTurnSpec(), 3, seed=0)
    assert all(len(s.turns) == 3 and s.think_s == (0.0, 0.0) for s in defaults)
    assert all(t.prompt_len == 32 and t.output_len == 32 for s in defaults for t in s.turns)


def test_sharegpt_sessions_take_the_user_turns_and_answer_lengths(tokenizer) -> None:
    conversations = read_sharegpt_conversations(SAMPLE)
    sessions = sharegpt_sessions(tokenizer, conversations, MultiTurnSpec(max_turns=3), 60, seed=2)
    assert len(sessions) == 60  # more than the 40 conversations: cycled
    users = {tuple(u for u, _ in c[:3]): (system, c) for system, c in conversations}
    assert {s.system for s in sessions} == {None, "You are a helpful assistant."}
    for s in sessions:
        system, pairs = users[tuple(t.prompt for t in s.turns)]
        pairs = pairs[:3]
        assert s.system == system
        assert [t.output_len for t in s.turns] == [
            len(tokenizer.encode(a, add_special_tokens=False).ids) for _, a in pairs]
    fixed = sharegpt_sessions(tokenizer, conversations, MultiTurnSpec(
        output_tokens=dist(distribution="constant", value=9)), 5, seed=2)
    assert all(t.output_len == 9 for s in fixed for t in s.turns)
    assert first_turns(fixed) == [s.turns[0] for s in fixed]
    with pytest.raises(ValueError, match="no conversation"):
        sharegpt_sessions(tokenizer, [], MultiTurnSpec(), 1, seed=0)


@pytest.mark.parametrize(("turns", "expected", "system"), [
    ([{"from": "system", "value": "s"}, {"from": "human", "value": "q1"},
      {"from": "gpt", "value": "a1"}, {"from": "human", "value": "q2"},
      {"from": "gpt", "value": "a2"}], [("q1", "a1"), ("q2", "a2")], "s"),
    ([{"role": "user", "content": "q1"}, {"role": "user", "content": "q2"},
      {"role": "assistant", "content": "a2"}, {"role": "user", "content": "q3"},
      {"role": "system", "content": "late"}], [("q2", "a2")], "late"),
    ([{"from": "gpt", "value": "a0"}, {"from": "human", "value": "q1"}], [], None),
    ("not a list", [], None),
    ([{"from": "human", "value": "q"}, "junk"], [], None),
])
def test_exchanges_pair_each_user_turn_with_its_answer(turns, expected, system) -> None:
    assert exchanges(turns) == expected
    assert system_message(turns) == system


def test_shipped_sample_is_the_generator_output() -> None:
    assert json.loads(SAMPLE.read_text()) == sample_sharegpt_conversations(40, 0, turns=(2, 6))
    counts = [len(c) for _, c in read_sharegpt_conversations(SAMPLE)]
    assert len(counts) == 40 and min(counts) == 2 and max(counts) == 6


# --- session metrics -----------------------------------------------------------------------

def rec(session: int | None, turn: int | None, send: float, ttft: float, end: float,
        ok: bool = True) -> RequestRecord:
    return RequestRecord(index=0, send_s=send, ttft_s=ttft if ok else None, chunk_s=(),
                         end_s=end, prompt_tokens=1, output_tokens=2, success=ok,
                         session_id=session, turn=turn)


TWO_DONE = [rec(0, 0, 0.0, 0.1, 1.0), rec(0, 1, 2.0, 0.3, 3.0),
            rec(1, 0, 1.0, 0.2, 1.5), rec(1, 1, 2.5, 0.5, 5.0), rec(1, 2, 6.0, 0.7, 7.0)]


@pytest.mark.parametrize(("records", "planned", "expected"), [
    (TWO_DONE, {0: 2, 1: 3},
     {"sessions": 2, "sessions_completed": 2, "mean_turns_per_session": 2.5,
      "mean_session_duration_s": 4.5, "median_session_duration_s": 4.5,
      "p99_session_duration_s": 5.97, "median_ttft_first_turn_ms": 150.0,
      "median_ttft_last_turn_ms": 500.0}),
    # session 1 planned 4 turns but sent 3: not completed; its turn 0 still counts
    (TWO_DONE, {0: 2, 1: 4},
     {"sessions": 2, "sessions_completed": 1, "mean_turns_per_session": 2.5,
      "mean_session_duration_s": 3.0, "median_session_duration_s": 3.0,
      "p99_session_duration_s": 3.0, "median_ttft_first_turn_ms": 150.0,
      "median_ttft_last_turn_ms": 300.0}),
    # a failed last turn: the session did not complete
    ([rec(0, 0, 0.0, 0.1, 1.0), rec(0, 1, 2.0, 0.0, 2.5, ok=False), rec(None, None, 0, 9, 9)],
     None,
     {"sessions": 1, "sessions_completed": 0, "mean_turns_per_session": 2.0,
      "mean_session_duration_s": 0.0, "median_session_duration_s": 0.0,
      "p99_session_duration_s": 0.0, "median_ttft_first_turn_ms": 100.0,
      "median_ttft_last_turn_ms": 0.0}),
    # single-turn sessions: no last turn distinct from the first
    ([rec(3, 0, 0.0, 0.2, 1.0)], {3: 1},
     {"sessions": 1, "sessions_completed": 1, "mean_turns_per_session": 1.0,
      "mean_session_duration_s": 1.0, "median_session_duration_s": 1.0,
      "p99_session_duration_s": 1.0, "median_ttft_first_turn_ms": 200.0,
      "median_ttft_last_turn_ms": 0.0}),
    ([], None, dict.fromkeys(SESSION_METRICS, 0)),
])
def test_session_metrics(records, planned, expected) -> None:
    got = session_metrics(records, planned)
    assert list(got) == list(SESSION_METRICS)
    assert got == pytest.approx(expected)
