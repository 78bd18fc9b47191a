"""Sampling parity with `vllm bench serve`: the flags (names, types, default None, read from
vLLM's source), the request fields they make, the sweep's `workload.sampling` key, and the
JSON bodies actually sent (captured by a real HTTP server on 127.0.0.1) through run_load,
through a trial's run_once and through the `vllm-sweep bench` CLI: an unset field is absent,
a set one present."""

from __future__ import annotations

import argparse
import ast
import asyncio
import http.server
import importlib.util
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from framework.base.errors import ConfigError
from framework.config.sampling_spec import SamplingSpec
from framework.config.specs import SweepSpec
from framework.load.bench_args import add_cli_args
from framework.load.loadgen import run_load
from framework.load.sampling import GREEDY
from framework.load.sampling import SAMPLING_FLAGS
from framework.load.sampling import Sampling
from framework.load.sampling import from_args
from framework.load.sampling import request_fields
from framework.load.sampling import sampling_from
from framework.load.sampling import sampling_json
from framework.load.workload import RequestSpec
from framework.results.provenance import provenance
from framework.results.provenance import workload_sha256
from framework.sweep.trial_load import load_plan
from framework.trial.measure import Deadline
from framework.trial.measure import run_once
from tests.paths import CLI
from tests.paths import ROOT
from tests.streams import DONE
from tests.streams import content
from tests.streams import usage

NAMES = [name for name, _ in SAMPLING_FLAGS]


@pytest.mark.parametrize(("sampling", "fields", "text"), [
    (Sampling(), {}, "{}"),
    (GREEDY, {"temperature": 0.0}, '{"temperature":0.0}'),
    # falsy values are set values: top_k 0 and penalty 0.0 are sent
    (Sampling(top_k=0, presence_penalty=0.0), {"top_k": 0, "presence_penalty": 0.0},
     '{"presence_penalty":0.0,"top_k":0}'),
    (Sampling(repetition_penalty=1.1, top_p=0.9, temperature=0.7),
     {"top_p": 0.9, "temperature": 0.7, "repetition_penalty": 1.1},
     '{"repetition_penalty":1.1,"temperature":0.7,"top_p":0.9}'),
    (Sampling(*range(1, 8)), dict(zip(NAMES, range(1, 8))),
     json.dumps(dict(zip(NAMES, range(1, 8))), sort_keys=True, separators=(",", ":"))),
])
def test_request_fields_hold_only_the_set_fields(sampling, fields, text) -> None:
    assert request_fields(sampling) == fields
    assert list(request_fields(sampling)) == [n for n in NAMES if n in fields]  # vllm's order
    assert sampling_json(sampling) == text
    assert sampling_from(fields) == sampling


def test_sampling_from_rejects_unknown_names() -> None:
    with pytest.raises(KeyError, match="seed"):
        sampling_from({"temperature": 0.0, "seed": 1})


def vllm_sampling_group() -> list[tuple[str, str, object]]:
    """(flag, type name, default) of every `sampling_group.add_argument` call in the installed
    vllm/benchmarks/serve.py, read without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    source = Path(spec.submodule_search_locations[0], "benchmarks", "serve.py").read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "sampling_group"):
            kw = {k.arg: k.value for k in node.keywords}
            found.append((node.args[0].value, kw["type"].id, ast.literal_eval(kw["default"])))
    return found


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(["--model", "m", *argv])


def test_flags_are_vllm_bench_serves_sampling_group() -> None:
    ours = [("--" + name.replace("_", "-"), kind.__name__, None) for name, kind in SAMPLING_FLAGS]
    assert ours == vllm_sampling_group()
    assert from_args(bench_args(), "bench") == Sampling()  # unset: nothing sent


@pytest.mark.parametrize(("argv", "expected"), [
    (["--temperature", "0"], GREEDY),
    (["--top-k", "-1", "--min-p", "0.05"], Sampling(top_k=-1, min_p=0.05)),
    (["--top-p", "1", "--frequency-penalty", "-2", "--presence-penalty", "2",
      "--repetition-penalty", "1.2"],
     Sampling(top_p=1.0, frequency_penalty=-2.0, presence_penalty=2.0, repetition_penalty=1.2)),
])
def test_bench_flags_parse_to_sampling(argv, expected) -> None:
    assert from_args(bench_args(*argv), "bench") == expected


@pytest.mark.parametrize(("argv", "flag"), [
    (["--temperature", "-0.1"], "--temperature"), (["--temperature", "2.5"], "--temperature"),
    (["--top-p", "0"], "--top-p"), (["--top-k", "-2"], "--top-k"), (["--min-p", "1.5"], "--min-p"),
    (["--frequency-penalty", "3"], "--frequency-penalty"),
    (["--repetition-penalty", "0"], "--repetition-penalty"),
    (["--temperature", "nan"], "--temperature"),
])
def test_bench_flags_outside_vllms_ranges_name_the_flag(argv, flag) -> None:
    with pytest.raises(ConfigError, match=f"^bench: {flag}: ") as err:
        from_args(bench_args(*argv), "bench")
    assert "\n" not in str(err.value)


def test_bench_flag_types_are_vllms(capsys) -> None:
    with pytest.raises(SystemExit):
        bench_args("--top-k", "1.5")  # int, as in vllm bench
    assert "--top-k" in capsys.readouterr().err


@pytest.mark.parametrize(("values", "ok"), [
    ({}, True), ({"temperature": 0}, True), ({"temperature": 2}, True),
    ({"temperature": 2.01}, False), ({"temperature": True}, False), ({"temperature": "0"}, False),
    ({"top_p": 1}, True), ({"top_p": 0}, False), ({"top_k": 0}, True), ({"top_k": 1.0}, False),
    ({"min_p": 0}, True), ({"min_p": -0.1}, False), ({"presence_penalty": -2}, True),
    ({"presence_penalty": 2.5}, False), ({"repetition_penalty": 0.5}, True),
    ({"repetition_penalty": float("inf")}, False), ({"seed": 1}, False),
])
def test_sampling_spec_accepts_what_vllm_accepts(values, ok) -> None:
    if ok:
        assert SamplingSpec(**values).set_fields() == {k: float(v) if k != "top_k" else v
                                                       for k, v in values.items()}
    else:
        with pytest.raises(ValidationError):
            SamplingSpec(**values)


class Capture(http.server.BaseHTTPRequestHandler):
    """Keeps each POST's JSON body; answers with one content chunk, usage and [DONE] (an
    HTTP/1.0 response framed by the close)."""

    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        self.bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(content("a") + usage(3, 1) + DONE)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def capture() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A real HTTP server on 127.0.0.1 in a thread: (base URL, the JSON bodies it received)."""
    bodies: list[dict[str, Any]] = []
    handler = type("Handler", (Capture,), {"bodies": bodies})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()
        server.server_close()


def sent_sampling(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k in NAMES}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("sampling", [Sampling(), GREEDY, Sampling(top_k=0, top_p=0.5)])
def test_request_bodies_carry_exactly_the_set_fields(capture, endpoint, sampling) -> None:
    url, bodies = capture
    result = asyncio.run(run_load(url, "tiny", [RequestSpec("p", 1, 1)] * 2, endpoint=endpoint,
                                  fields=request_fields(sampling)))
    assert all(r.success for r in result.records), result.records
    assert [sent_sampling(b) for b in bodies] == [request_fields(sampling)] * 2
    assert all(b["stream"] is True and b["ignore_eos"] is True for b in bodies)


def sweep_spec(tiny_model: Path, sampling: dict[str, Any] | None) -> SweepSpec:
    workload = {"num_prompts": 2, "input_len": 8, "output_len": 2, "warmup_requests": 1}
    if sampling is not None:
        workload["sampling"] = sampling
    return SweepSpec.model_validate({"name": "s", "model": str(tiny_model),
                                     "search_space": "s.yaml", "workload": workload})


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("sampling", "column"), [
    (None, "{}"), ({}, "{}"), ({"temperature": 0}, '{"temperature":0.0}'),
    ({"top_k": 20, "min_p": 0.1}, '{"min_p":0.1,"top_k":20}'),
])
def test_sweep_sampling_reaches_the_requests_and_the_row(capture, tiny_model, sampling,
                                                         column) -> None:
    url, bodies = capture
    spec = sweep_spec(tiny_model, sampling)
    plan = load_plan(spec)
    deadline = Deadline(None, time.monotonic)
    run_once(url, plan, plan.warmup, None, lambda _: None, deadline, "warming up")
    run_once(url, plan, plan.measured, None, lambda _: None, deadline, "under load")
    assert [sent_sampling(b) for b in bodies] == [dict(sampling or {})] * 3
    assert provenance(spec, [{"CPU": 2.0}])["sampling"] == column


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("flags", "sent"), [
    ([], {}), (["--temperature", "0", "--top-k", "5"], {"temperature": 0.0, "top_k": 5}),
])
def test_bench_cli_sends_only_the_given_flags(capture, tiny_model, tmp_path, flags,
                                              sent) -> None:
    url, bodies = capture
    out = tmp_path / "r.json"
    res = subprocess.run([*CLI, "bench", "--base-url", url, "--model", str(tiny_model),
                          "--num-prompts", "3", "--random-input-len", "8",
                          "--random-output-len", "1", "--result-json", str(out), *flags],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [sent_sampling(b) for b in bodies] == [sent] * 3
    assert json.loads(out.read_text())["sampling"] == json.dumps(sent, sort_keys=True,
                                                                 separators=(",", ":"))
    assert ("no --temperature" in res.stdout) == ("temperature" not in sent)


def test_the_workload_digest_follows_sampling(tiny_model) -> None:
    digests = {workload_sha256(sweep_spec(tiny_model, s))
               for s in (None, {"temperature": 0}, {"temperature": 0.5})}
    assert len(digests) == 3
    assert workload_sha256(sweep_spec(tiny_model, None)) == workload_sha256(
        sweep_spec(tiny_model, {}))
