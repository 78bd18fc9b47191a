"""dataset multi_turn on real parts: sessions against the session's shared vLLM CPU server
(tests/e2e/conftest.py; turn k's prompt, as the server counted it, is turn k-1's prompt + the
server's answer + the new message; the prefix cache hits it), and the example sweep
sweeps/multi_turn_chat.yaml run by the CLI on a private Ray, its trial and request rows read
back with DuckDB."""

from __future__ import annotations

import asyncio
import re

import duckdb
import pytest
import yaml
from transformers import AutoTokenizer

from framework.config.multi_turn_spec import DistributionSpec
from framework.config.multi_turn_spec import MultiTurnSpec
from framework.engine.server_metrics import PREFIX_HITS
from framework.engine.server_metrics import parse_metrics
from framework.load.conversations import chat_messages
from framework.load.conversations import synthetic_sessions
from framework.load.conversations import transcript
from framework.load.http_client import get_sync
from framework.load.prompts import load_tokenizer
from framework.load.sessions import run_sessions
from tests.cli import run_joined
from tests.clusters import join_shared
from tests.engines import SharedServer
from tests.paths import ROOT
from tests.sweeps import read_trials

pytestmark = pytest.mark.server

SESSIONS = 8  # sessions of the example sweep's trials


def prefix_hits(base_url: str) -> float:
    return parse_metrics(get_sync(f"{base_url}/metrics", 10.0).text()).get(PREFIX_HITS, 0.0)


@pytest.mark.timeout(300)
def test_turn_k_prompt_is_turn_k_minus_1_prompt_and_answer_on_vllm(vllm_server: SharedServer):
    tiny_model = vllm_server.model
    spec = MultiTurnSpec(turns=DistributionSpec(distribution="constant", value=3),
                         prompt_tokens=DistributionSpec(distribution="uniform", min=100, max=160),
                         output_tokens=DistributionSpec(distribution="constant", value=24),
                         think_time_s=DistributionSpec(distribution="constant", value=0.1))
    tokenizer = load_tokenizer(tiny_model)
    sessions = synthetic_sessions(tokenizer, spec, 4, seed=11)
    template = AutoTokenizer.from_pretrained(str(tiny_model))
    server = vllm_server
    for endpoint in ("chat", "completions"):
        hits_before = prefix_hits(server.base_url)
        result = asyncio.run(run_sessions(server.base_url, str(tiny_model), sessions,
                                          endpoint=endpoint, max_concurrency=4,
                                          fields={"temperature": 0},
                                          api_key=server.api_key))
        hits = prefix_hits(server.base_url) - hits_before
        assert result.not_sent == 0 and len(result.records) == 12
        assert all(r.success for r in result.records), [r.error for r in result.records]
        for i, session in enumerate(sessions):
            turns = [r for r in result.records if r.session_id == i]
            assert [r.turn for r in turns] == [0, 1, 2]
            answers = [r.text for r in turns]
            assert all(answers)  # the server's own text, streamed
            for k, record in enumerate(turns):
                # the prompt the server counted is exactly the conversation so far
                if endpoint == "chat":
                    messages = chat_messages(session, k, answers[:k])
                    text = template.apply_chat_template(
                        messages, add_generation_prompt=True, tokenize=False)
                    expected = len(tokenizer.encode(text, add_special_tokens=False).ids)
                    if k:
                        assert messages[:-1] == [*chat_messages(session, k - 1,
                                                                answers[:k - 1]),
                                                 {"role": "assistant",
                                                  "content": answers[k - 1]}]
                else:
                    prompt = transcript(session, k, answers[:k])
                    expected = len(tokenizer.encode(prompt).ids)
                    if k:
                        previous = transcript(session, k - 1, answers[:k - 1])
                        assert prompt.startswith(f"{previous} {answers[k - 1]} ")
                assert record.prompt_tokens == expected, (endpoint, i, k)
                assert record.output_tokens == 24
                if k:
                    assert record.prompt_tokens > turns[k - 1].prompt_tokens + 24
        # turns 1 and 2 resend what the server has cached: their prefix hits it (CPU
        # blocks are 128 tokens, vllm/platforms/cpu.py; turn 2 resends 300+ tokens)
        assert hits > 0, endpoint


@pytest.mark.timeout(600)
def test_example_multi_turn_sweep_runs_and_reads_back_with_duckdb(shared_ray, tiny_model,
                                                                   short_tmp):
    spec = yaml.safe_load((ROOT / "sweeps" / "multi_turn_chat.yaml").read_text())
    spec.update(model=str(tiny_model), results_dir=str(short_tmp / "results"),
                search_space=str(ROOT / spec["search_space"]))
    workload = spec["workload"]
    workload["dataset_path"] = str(ROOT / workload["dataset_path"])
    # the example's 30 cut to SESSIONS: its first 8 conversations (seed 0) have 2, 3 and 4
    # turns (at most max_turns), so every turn number the example reaches is still read back
    workload["multi_turn"]["num_sessions"] = SESSIONS
    # stop_early off: the SLA guard (p99 TTFT <= 2 s over ~25 requests) would cut a run at its
    # first slow turn, and the session and request counts below are of whole runs
    spec["search"]["stop_early"] = False
    sweep = short_tmp / "multi_turn_chat.yaml"
    sweep.write_text(yaml.safe_dump(join_shared(spec, shared_ray), sort_keys=False))
    res = run_joined(shared_ray, ["run", str(sweep)], short_tmp)
    results = short_tmp / "results" / "multi_turn_chat"
    # exit 4 is the answer "no trial met the SLA" (p99 TTFT <= 2 s: a speed, which a loaded
    # machine may miss), not a failure: the code must agree with the rows either way
    feasible = read_trials(short_tmp / "results", "multi_turn_chat")["feasible"]
    assert res.returncode == (0 if feasible.any() else 4), res.stdout[-3000:] + res.stderr[-3000:]
    trials = duckdb.sql(f"""
        SELECT trial_number, state, param_enable_prefix_caching AS cache, completed, failed,
               total_input_tokens, sessions, sessions_completed, mean_turns_per_session,
               median_session_duration_s, median_ttft_first_turn_ms, median_ttft_last_turn_ms,
               prefix_cache_hit_rate
        FROM read_parquet('{results}/trials/**/*.parquet', hive_partitioning = true)
        ORDER BY trial_number""").df()
    assert list(trials["state"]) == ["COMPLETE", "COMPLETE"], trials
    assert set(trials["cache"]) == {True, False}
    requests = duckdb.sql(f"""
        SELECT trial_number, session_id, turn, prompt_tokens, success
        FROM read_parquet('{results}/requests/**/*.parquet', hive_partitioning = true)
        ORDER BY trial_number, session_id, turn""").df()
    assert requests["session_id"].notna().all() and requests["turn"].notna().all()
    for _, trial in trials.iterrows():
        rows = requests[requests["trial_number"] == trial["trial_number"]]
        assert len(rows) == trial["completed"] + trial["failed"]
        assert rows[rows["success"]]["prompt_tokens"].sum() == trial["total_input_tokens"]
        assert trial["sessions"] == SESSIONS == rows["session_id"].nunique()
        assert trial["sessions_completed"] == SESSIONS and trial["failed"] == 0
        assert trial["mean_turns_per_session"] == pytest.approx(len(rows) / SESSIONS)
        assert trial["median_session_duration_s"] > 0 and trial["median_ttft_first_turn_ms"] > 0
        assert trial["median_ttft_last_turn_ms"] > 0
        for _, turns in rows.groupby("session_id"):
            assert list(turns["turn"]) == list(range(len(turns)))
            assert turns["prompt_tokens"].is_monotonic_increasing  # the history grows
        # the cache on, later turns hit it; off, nothing does
        assert (trial["prefix_cache_hit_rate"] > 0) == trial["cache"]
    assert requests.groupby(["trial_number", "session_id"])["turn"].max().max() >= 1
    # docs/RESULTS.md's multi-turn query runs on this folder
    query = re.search(r"```python\n# multi-turn-query: duckdb\n(.*?)```",
                      (ROOT / "docs" / "RESULTS.md").read_text(), re.S)
    assert query is not None
    code = query.group(1).replace('RESULTS = "results/multi_turn_chat"', f'RESULTS = "{results}"')
    namespace: dict = {}
    exec(compile(code, "RESULTS.md", "exec"), namespace)  # the doc's own query
    by_turn = namespace["result"]
    assert set(by_turn["turn"]) == set(requests["turn"]) and len(by_turn) >= 4
