"""`vllm-sweep bench`: flag names and JSON keys as vllm bench's, its pure parts, and (marked
`server`) real runs against ONE vLLM server shared by the module: prompts, totals, chat, and
the /metrics sampler."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from framework.base.errors import ConfigError
from framework.load.bench import per_request_lists
from framework.load.bench import result_json
from framework.load.bench import result_path
from framework.load.bench import summary_lines
from framework.load.bench_args import add_cli_args
from framework.load.bench_args import parse_goodput
from framework.load.bench_args import parse_percentile_metrics
from framework.load.bench_args import parse_percentiles
from framework.load.bench_args import resolve_endpoint
from framework.load.loadgen import LoadResult
from framework.load.loadgen import RequestRecord
from framework.load.metrics import compute_metrics
from framework.load.workload import RequestSpec
from tests.cli import cli_in_process
from tests.paths import ROOT
from tests.sweeps import DETAIL_KEYS
from tests.sweeps import SAMPLE
from tests.sweeps import VLLM_KEYS

OUR_OWN_FLAGS = {"--result-json", "--duration-s", "--request-timeout-s", "--min-prompt-tokens",
                 "--max-prompt-tokens", "--help", "-h"}


def bench_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return parser


def vllm_source(*parts: str) -> str:
    """Text of a vLLM source file, found without importing vllm."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    return Path(spec.submodule_search_locations[0], *parts).read_text()


def test_flags_are_named_as_in_vllm_bench_serve() -> None:
    source = vllm_source("benchmarks", "serve.py") + vllm_source("benchmarks", "datasets",
                                                                 "datasets.py")
    ours = {opt for action in bench_parser()._actions for opt in action.option_strings}
    # argparse's BooleanOptionalAction makes --no-X of --X (vllm's --self-timed too)
    missing = sorted(f for f in ours - OUR_OWN_FLAGS if f'"{f}"' not in source
                     and not (f.startswith("--no-") and f'"--{f[5:]}"' in source))
    assert missing == []
    assert {"--dataset-name", "--dataset-path", "--random-input-len", "--random-output-len",
            "--num-prompts", "--request-rate", "--burstiness", "--max-concurrency",
            "--ignore-eos", "--seed", "--percentile-metrics", "--metric-percentiles",
            "--goodput", "--base-url", "--model", "--endpoint"} <= ours


def test_defaults_are_vllm_bench_defaults() -> None:
    args = bench_parser().parse_args(["--model", "m"])
    assert (args.num_prompts, args.random_input_len, args.random_output_len) == (1000, 1024, 128)
    assert (args.request_rate, args.burstiness, args.seed) == (math.inf, 1.0, 0)
    assert (args.metric_percentiles, args.percentile_metrics, args.dataset_name) == (
        "99", None, "random")
    assert parse_percentile_metrics(args.percentile_metrics) == ["ttft", "tpot", "itl"]
    assert (args.max_concurrency, args.goodput, args.ignore_eos) == (None, None, False)


@pytest.mark.parametrize(("pairs", "expected"), [
    (None, {}),
    (["ttft:500", "tpot:50"], {"ttft": 500.0, "tpot": 50.0}),
    (["e2el:0"], {"e2el": 0.0}),
])
def test_parse_goodput(pairs, expected) -> None:
    assert parse_goodput(pairs) == expected


@pytest.mark.parametrize("pairs", [["itl:5"], ["ttft"], ["ttft:x"], ["ttft:-1"]])
def test_parse_goodput_rejects(pairs) -> None:
    with pytest.raises(ConfigError, match="--goodput"):
        parse_goodput(pairs)


def test_parse_percentiles_and_metrics() -> None:
    assert parse_percentiles("25, 50,99.9") == [25.0, 50.0, 99.9]
    for bad in ("0", "101", "x", ","):
        with pytest.raises(ConfigError, match="--metric-percentiles"):
            parse_percentiles(bad)
    assert parse_percentile_metrics("e2el,ttft") == ["e2el", "ttft"]
    with pytest.raises(ConfigError, match="client_queue_time"):
        parse_percentile_metrics("ttft,client_queue_time")


@pytest.mark.parametrize(("endpoint", "backend", "expected"), [
    (None, None, "completions"), (None, "openai-chat", "chat"), ("chat", None, "chat"),
    ("/v1/chat/completions", "openai-chat", "chat"), ("/v1/completions", "openai", "completions"),
])
def test_resolve_endpoint(endpoint, backend, expected) -> None:
    assert resolve_endpoint(endpoint, backend) == expected


@pytest.mark.parametrize(("endpoint", "backend"), [("/v1/embeddings", None), ("chat", "openai")])
def test_resolve_endpoint_rejects(endpoint, backend) -> None:
    with pytest.raises(ConfigError, match="--endpoint"):
        resolve_endpoint(endpoint, backend)


def record(index: int, chunks: tuple[float, ...], out: int, success: bool = True) -> RequestRecord:
    return RequestRecord(index=index, send_s=0.0, ttft_s=chunks[0] if chunks else None,
                         chunk_s=chunks, end_s=chunks[-1] if chunks else 0.5,
                         prompt_tokens=12 if success else 0, output_tokens=out if success else 0,
                         success=success, error="" if success else "HTTP 500")


RESULT = LoadResult(records=(record(0, (0.1, 0.2, 0.3), 3), record(1, (), 0, success=False),
                             record(2, (0.2, 0.4), 2)), start_s=0.0, end_s=1.0)


REQUESTS = [RequestSpec("a", 10, 3), RequestSpec("b", 11, 3), RequestSpec("c", 12, 3)]


META = {"date": "d", "endpoint_type": "openai", "backend": "openai", "label": None,
        "model_id": "m", "tokenizer_id": "m", "num_prompts": 3, "request_rate": "inf",
        "burstiness": 1.0, "max_concurrency": 2}


def test_result_json_has_vllm_bench_keys_in_order() -> None:
    metrics = compute_metrics(RESULT.records, 1.0, [50, 99], {"ttft": 150})
    out = result_json(META, metrics, ["ttft", "e2el"], [50, 99], True, None, {"not_sent": 0})
    assert list(out) == [*VLLM_KEYS, "not_sent"]
    assert out["request_goodput"] == 1.0  # only record 0 has TTFT <= 150 ms
    assert out["completed"] == 2 and out["failed"] == 1
    plain = result_json(META, compute_metrics(RESULT.records, 1.0, [99]), ["tpot"], [99], False,
                        None, {})
    assert plain["request_goodput"] is None
    assert [k for k in plain if k.endswith("_ms")] == ["mean_tpot_ms", "median_tpot_ms",
                                                       "std_tpot_ms", "p99_tpot_ms"]


def test_detailed_lists_sum_to_the_totals() -> None:
    metrics = compute_metrics(RESULT.records, 1.0)
    details = per_request_lists(RESULT, REQUESTS)
    out = result_json(META, metrics, ["ttft"], [99], False, details, {})
    assert list(out)[19:19 + len(DETAIL_KEYS)] == DETAIL_KEYS  # after total_token_throughput
    assert out["input_lens"] == [12, 11, 12]  # a failed request keeps its planned length
    assert out["output_lens"] == [3, 0, 2]
    assert out["total_output_tokens"] == sum(out["output_lens"])
    ok = [n for n, e in zip(out["input_lens"], out["errors"]) if not e]
    assert out["total_input_tokens"] == sum(ok)
    assert out["ttfts"] == [0.1, 0.0, 0.2] and out["errors"] == ["", "HTTP 500", ""]
    assert out["itls"] == [pytest.approx([0.1, 0.1]), [], pytest.approx([0.2])]


def test_summary_lines_look_like_vllm_bench() -> None:
    metrics = compute_metrics(RESULT.records, 1.0, [99])
    out = result_json(META, metrics, ["ttft", "itl"], [99], False, None, {})
    text = "\n".join(summary_lines(out, ["ttft", "itl"], [99]))
    assert "=========== Serving Benchmark Result ============" in text
    assert "Successful requests:                     2" in text
    assert "Maximum request concurrency:             2" in text
    assert "Output token throughput (tok/s):         5.00" in text
    assert "P99 TTFT (ms):" in text and "Median ITL (ms):" in text
    assert "Request goodput" not in text and "TPOT" not in text


def test_result_path(tmp_path: Path) -> None:
    args = bench_parser().parse_args(["--model", "models/tiny-llama/", "--max-concurrency", "4"])
    assert result_path(args, "openai", "D") is None
    args.save_result, args.result_dir = True, str(tmp_path)
    expected = tmp_path / "openai-infqps-concurrency4-tiny-llama-D.json"
    assert result_path(args, "openai", "D") == expected
    args.result_json = "x.json"
    assert result_path(args, "openai", "D") == Path("x.json")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("args", "key"), [
    (["--goodput", "itl:5"], "--goodput"),
    (["--dataset-name", "sharegpt"], "--dataset-path"),
    (["--dataset-name", "sharegpt", "--dataset-path", "nowhere.json"], "--dataset-path"),
    (["--dataset-path", str(SAMPLE)], "--dataset-path"),
    (["--max-concurrency", "0"], "--max-concurrency"),
    (["--tokenizer", "/nonexistent"], "--tokenizer"),
    (["--dataset-name", "sharegpt", "--dataset-path", str(SAMPLE), "--min-prompt-tokens",
      "100000"], "--dataset-name"),
])
def test_bad_flags_are_one_line_exit_2(tiny_model, args: list[str], key: str) -> None:
    res = cli_in_process("bench", "--model", str(tiny_model), "--port", "9", "--num-prompts", "2",
                         *args)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], res.stderr


@pytest.mark.timeout(120)
def test_bench_imports_neither_vllm_nor_transformers(tiny_model, tmp_path: Path) -> None:
    # Against a closed port every request fails: exit code 1, and a result is still written.
    code = ("import sys; from framework.cli import main; rc = main(sys.argv[1:]); "
            "print('MODULES', rc, *[m for m in ('vllm', 'transformers', 'torch') "
            "if m in sys.modules])")
    out = tmp_path / "r.json"
    res = subprocess.run([sys.executable, "-c", code, "bench", "--model", str(tiny_model),
                          "--port", "9", "--num-prompts", "3", "--random-input-len", "16",
                          "--result-json", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert "MODULES 1\n" in res.stdout, res.stdout + res.stderr
    result = json.loads(out.read_text())
    assert (result["completed"], result["failed"]) == (0, 3)
