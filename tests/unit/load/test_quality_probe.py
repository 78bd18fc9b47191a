"""The quality probe's requests and the sweep's quality gate, against a real HTTP server on
127.0.0.1 that answers /v1/completions in vLLM's format (token ids and logprobs computed from
the prompt, so two runs agree unless the server is told to diverge): the body sent, answers in
prompt order, the concurrency bound, failures as one line; the baseline's two runs stored as
Parquet and read back on resume; which trials probe; verdicts; waiting for the baseline."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from framework.base.errors import TrialError
from framework.load.probe import ProbeAnswer
from framework.load.probe import ProbeError
from framework.load.probe import ProbeSettings
from framework.load.probe import parse_answer
from framework.load.probe import probe_payload
from framework.load.probe import probe_prompts
from framework.load.probe import send_probe
from framework.load.workload import load_tokenizer
from framework.results.probe_rows import stored_reference
from framework.search.tuner import Proposal
from framework.sweep.loader import load
from framework.sweep.quality_gate import QualityGate
from framework.sweep.trial_load import load_plan
from framework.sweep.trial_plan import plan_trial
from framework.trial.run import TrialOutcome

WAIT_S = 30.0  # ends a wait for what must happen; reached only when it never does


class Completions(http.server.BaseHTTPRequestHandler):
    """POST /v1/completions -> vLLM's non-streaming answer with `token_ids` and logprobs: ids
    from the prompt's bytes; with `server.diverge_at = k`, position k onwards differs;
    `server.status` other than 200 answers that status. Keeps every body and the peak number
    of requests in flight. With `server.overlap = n`, each request waits (an event, not a
    delay) until the peak reached 2 or all n requests came (a single last one)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.bodies.append(body)
            server.in_flight += 1
            server.peak = max(server.peak, server.in_flight)
            server.lock.notify_all()
            if server.overlap:
                server.lock.wait_for(lambda: server.peak >= 2
                                     or len(server.bodies) >= server.overlap, timeout=WAIT_S)
        seed = sum(body["prompt"].encode())
        ids = [(seed + 7 * i) % 4096 for i in range(body["max_tokens"])]
        if server.diverge_at is not None:
            ids[server.diverge_at:] = [(i + 1) % 4096 for i in ids[server.diverge_at:]]
        logprobs = [-1.0 - 0.01 * i for i in range(len(ids))]
        answer = {"choices": [{"index": 0, "text": "x", "token_ids": ids,
                               "logprobs": {"tokens": ["x"] * len(ids),
                                            "token_logprobs": logprobs}}]}
        data = json.dumps(answer).encode() if server.status == 200 else b'{"error": "boom"}'
        with server.lock:
            server.in_flight -= 1
        self.send_response(server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    srv.lock, srv.bodies, srv.in_flight, srv.peak = threading.Condition(), [], 0, 0
    srv.diverge_at, srv.status, srv.overlap = None, 200, 0
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_the_probe_body_is_greedy_with_logprobs_and_nothing_else():
    assert probe_payload("m", "hello", 32) == {
        "model": "m", "prompt": "hello", "max_tokens": 32, "temperature": 0, "logprobs": 1,
        "return_token_ids": True, "ignore_eos": True, "stream": False}


@pytest.mark.parametrize(("body", "match"), [
    (b"not json", "answer without token ids"),
    (b'{"choices": []}', "IndexError"),
    (b'{"choices": [{"token_ids": [1, 2]}]}', "KeyError"),
    (b'{"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}}]}',
     "2 token ids but 1 logprobs"),
])
def test_an_answer_without_what_the_probe_asked_for_is_one_line(body, match):
    with pytest.raises(ProbeError, match=match) as info:
        parse_answer(body)
    assert "\n" not in str(info.value)


def test_parse_answer_reads_ids_and_logprobs():
    body = json.dumps({"choices": [{"token_ids": [5, 6], "logprobs": {
        "token_logprobs": [-0.5, -1.5], "tokens": ["a", "b"]}}]}).encode()
    assert parse_answer(body) == ProbeAnswer((5, 6), (-0.5, -1.5))


def test_probe_prompts_are_fixed_by_their_settings(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    settings = ProbeSettings(prompts=5, input_len=24, seed=11)
    prompts = probe_prompts(tokenizer, settings)
    assert prompts == probe_prompts(tokenizer, settings) and len(set(prompts)) == 5
    assert all(len(tokenizer.encode(p).ids) == 24 for p in prompts)
    assert prompts != probe_prompts(tokenizer, ProbeSettings(prompts=5, input_len=24, seed=12))


@pytest.mark.timeout(30)
def test_send_probe_sends_each_prompt_once_in_order_within_the_concurrency(server):
    prompts = [f"prompt number {i}" for i in range(10)]
    server.overlap = len(prompts)  # held until two overlap: > 1 whatever the machine's speed
    answers = asyncio.run(send_probe(server.url, "m", prompts, 6, 3, WAIT_S))
    assert sorted(b["prompt"] for b in server.bodies) == sorted(prompts)
    assert all(b == probe_payload("m", b["prompt"], 6) for b in server.bodies)
    assert [a.token_ids[0] for a in answers] == [sum(p.encode()) % 4096 for p in prompts]
    assert all(len(a.token_ids) == len(a.logprobs) == 6 for a in answers)
    assert 1 < server.peak <= 3


@pytest.mark.timeout(30)
def test_a_failed_probe_request_names_its_prompt(server):
    server.status = 500
    with pytest.raises(ProbeError, match=r"probe prompt \d: HTTP 500"):
        asyncio.run(send_probe(server.url, "m", ["a", "b"], 4, 2, WAIT_S))


SETTINGS = ProbeSettings(prompts=4, input_len=16, max_tokens=8, concurrency=2, timeout_s=WAIT_S)


def write_sweep(tmp_path: Path, model: Path, baseline: bool = True, engine: str = "cpu") -> Path:
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [4, 128], "default": 128},
        "kv-cache-dtype": {"type": "categorical", "choices": ["auto", "fp8"], "default": "auto"},
    }}))
    sweep = tmp_path / "sweep.yaml"
    sla = {"p99_ttft_ms": 1000, **({"min_token_agreement": 0.95} if baseline else {})}
    sweep.write_text(yaml.safe_dump({
        "name": "quality", "model": str(model), "search_space": str(space), "engine": engine,
        "workload": {"num_prompts": 4, "input_len": 16, "output_len": 4, "warmup_requests": 0},
        "sla": sla, "search": {"baseline": baseline}, "results_dir": str(tmp_path / "results")}))
    return sweep


def plans(sweep_path: Path):
    sweep = load(sweep_path, check_flags=False)
    plan_load = load_plan(sweep.spec)

    def plan(number: int, params: dict, is_baseline: bool = False):
        return plan_trial(sweep, Proposal(number, params, is_baseline, trial=None), plan_load)

    return sweep, plan


@pytest.mark.timeout(60)
def test_the_gate_probes_the_baseline_twice_and_judges_lossy_trials(tmp_path, tiny_model, server):
    sweep, plan = plans(write_sweep(tmp_path, tiny_model))
    gate = QualityGate(sweep, SETTINGS)
    base = gate.probe_for(plan(0, {"max-num-seqs": 128, "kv-cache-dtype": "auto"}, True))
    verdict = base(server.url)
    assert (verdict.token_agreement, verdict.baseline_agreement, verdict.ok) == (1.0, 1.0, True)
    assert len(server.bodies) == 2 * SETTINGS.prompts
    number, first, second = stored_reference(sweep.store.read_probes())
    assert number == 0 and first == second and len(first) == SETTINGS.prompts

    assert gate.probe_for(plan(1, {"max-num-seqs": 4, "kv-cache-dtype": "auto"})) is None
    server.diverge_at = 2
    fp8 = gate.probe_for(plan(2, {"max-num-seqs": 4, "kv-cache-dtype": "fp8"}))
    verdict = fp8(server.url)
    assert verdict.token_agreement == pytest.approx(2 / 8) and verdict.logprob_mad == 0.0
    assert (verdict.required, verdict.ok) == (0.95, False)
    assert verdict.note == "changes kv-cache-dtype"
    ok = plan(3, {"max-num-seqs": 4, "kv-cache-dtype": "fp8"})
    outcome = TrialOutcome(started_at=None, argv=(), quality=verdict)
    assert gate.recorded(ok.proposal, outcome) == (
        {"p99_ttft_ms": 1000, "min_token_agreement": 0.95}, {"min_token_agreement": 0.25})

    # a resumed sweep compares with the stored reference, without probing the baseline again
    server.diverge_at, before = None, len(server.bodies)
    again = QualityGate(sweep, SETTINGS).probe_for(plan(4, {"max-num-seqs": 128,
                                                            "kv-cache-dtype": "fp8"}))
    assert again(server.url).token_agreement == 1.0
    assert len(server.bodies) == before + SETTINGS.prompts


class WaitSeen(threading.Condition):
    """A QualityGate's condition that tells when a trial began to wait on it for the
    reference (the test waits on that event, not for a while)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()  # the lock is still held: a notify cannot come before the wait
        return super().wait(timeout)


def waited_on(gate: QualityGate) -> threading.Event:
    cond = WaitSeen()
    gate._cond = cond
    return cond.waiting


@pytest.mark.timeout(60)
def test_a_trial_waits_for_the_running_baseline_and_is_unknown_without_one(tmp_path, tiny_model,
                                                                             server):
    sweep, plan = plans(write_sweep(tmp_path, tiny_model))
    gate = QualityGate(sweep, SETTINGS)
    waiting = waited_on(gate)
    baseline = plan(0, {"max-num-seqs": 128, "kv-cache-dtype": "auto"}, True)
    base = gate.probe_for(baseline)  # the baseline runs from here on
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(
        gate.probe_for(plan(1, {"max-num-seqs": 128, "kv-cache-dtype": "fp8"}))(server.url)))
    waiter.start()
    assert waiting.wait(WAIT_S), "the trial never waited for the reference"
    assert not got  # probed, now waiting for the reference
    base(server.url)
    waiter.join(WAIT_S)
    assert got[0].token_agreement == 1.0 and got[0].ok

    # the baseline failed before its probe: recorded, waiting trials stop waiting
    tmp = tmp_path / "second"
    tmp.mkdir()
    sweep, plan = plans(write_sweep(tmp, tiny_model))
    gate = QualityGate(sweep, SETTINGS)
    waiting = waited_on(gate)
    gate.probe_for(baseline)
    waiter = threading.Thread(target=lambda: got.append(
        gate.probe_for(plan(1, {"max-num-seqs": 128, "kv-cache-dtype": "fp8"}))(server.url)))
    waiter.start()
    assert waiting.wait(WAIT_S), "the trial never waited for the reference"
    gate.recorded(baseline.proposal, TrialOutcome(started_at=None, argv=(),
                                                  fail_reason="startup_crash"))
    waiter.join(WAIT_S)
    assert got[1].ok is None and got[1].token_agreement is None
    assert "quality unknown: the baseline trial stored no probe" in got[1].note


@pytest.mark.timeout(60)
def test_no_baseline_means_quality_unknown_and_the_fake_engine_is_never_probed(
        tmp_path, tiny_model, server):
    sweep, plan = plans(write_sweep(tmp_path, tiny_model, baseline=False))
    verdict = QualityGate(sweep, SETTINGS).probe_for(
        plan(0, {"max-num-seqs": 4, "kv-cache-dtype": "fp8"}))(server.url)
    assert verdict.ok is None and "search.baseline: false" in verdict.note
    fake = tmp_path / "fake"
    fake.mkdir()
    sweep, plan = plans(write_sweep(fake, tiny_model, engine="fake"))
    gate = QualityGate(sweep, SETTINGS)
    assert gate.probe_for(plan(0, {}, True)) is None
    assert gate.probe_for(plan(1, {"max-num-seqs": 4, "kv-cache-dtype": "fp8"})) is None


@pytest.mark.timeout(30)
def test_a_failed_probe_fails_the_trial_as_load_failed(tmp_path, tiny_model, server):
    sweep, plan = plans(write_sweep(tmp_path, tiny_model))
    hook = QualityGate(sweep, SETTINGS).probe_for(plan(0, {}, True))
    server.status = 503
    with pytest.raises(TrialError) as info:
        hook(server.url)
    assert info.value.reason == "load_failed"
    assert info.value.detail.startswith("quality probe: probe prompt")
