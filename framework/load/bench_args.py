"""The `vllm-sweep bench` flags and their parsers (names and defaults as `vllm bench serve`'s,
vLLM 0.32 ``vllm/benchmarks/serve.py`` add_cli_args). Imports only the standard library and
framework.base, so that building the CLI parser stays cheap."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from framework.base.errors import ConfigError
from framework.load import sampling as sampling_flags
from framework.load import trace as trace_flags

WHERE = "vllm-sweep bench"
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"
ENDPOINT_NAMES = {"completions": "completions", "/v1/completions": "completions",
                  "chat": "chat", "/v1/chat/completions": "chat"}
BACKEND_OF = {"completions": "openai", "chat": "openai-chat"}
METRIC_TITLES = {"ttft": ("TTFT", "Time to First Token"),
                 "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
                 "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency")}


def add_cli_args(p: argparse.ArgumentParser) -> None:
    """The `bench` flags: names and defaults as `vllm bench serve`'s where the concept is shared."""
    a = p.add_argument
    a("--base-url", help="server URL, e.g. http://127.0.0.1:8000 (default: from --host/--port)")
    a("--host", default="127.0.0.1", help="server host (default: 127.0.0.1)")
    a("--port", type=int, default=8000, help="server port (default: 8000)")
    a("--endpoint", default=None,
      help="completions | chat, or the path /v1/completions | /v1/chat/completions "
           "(default: completions; chat with --backend openai-chat)")
    a("--backend", choices=sorted(BACKEND_OF.values()), default=None,
      help="openai (completions) or openai-chat (chat), as in vllm bench")
    a("--model", required=True, help="local model folder; its tokenizer.json tokenizes prompts")
    a("--served-model-name", help="model name sent in requests (default: --model)")
    a("--tokenizer", help="folder holding tokenizer.json (default: --model)")
    a("--label", help="label stored in the result JSON")
    a("--dataset-name", default="random",
      choices=["random", "sharegpt", "prefix-shared", "timed_trace"],
      help="where prompts come from (default: random)")
    a("--dataset-path", help="ShareGPT JSON or JSONL file; timed_trace: JSONL or CSV trace")
    a("--num-prompts", type=int, default=1000, help="requests to send (default: 1000)")
    a("--seed", type=int, default=0, help="seed of the prompts and arrival times (default: 0)")
    a("--input-len", type=int, default=None, help="sets --random-input-len")
    a("--output-len", type=int, default=None,
      help="sets --random-output-len, --sharegpt-output-len and --prefix-repetition-output-len")
    a("--random-input-len", type=int, default=1024, help="random: prompt tokens (default: 1024)")
    a("--random-output-len", type=int, default=128, help="random: output tokens (default: 128)")
    a("--random-range-ratio", type=float, default=0.0,
      help="input and output lengths uniform in [len*(1-r), len*(1+r)]")
    a("--sharegpt-output-len", type=int, default=None,
      help="output length of every ShareGPT request (default: the reply's length)")
    a("--min-prompt-tokens", type=int, default=None, help="ShareGPT: drop shorter prompts")
    a("--max-prompt-tokens", type=int, default=None, help="ShareGPT: drop longer prompts")
    a("--prefix-repetition-prefix-len", type=int, default=256,
      help="prefix-shared: tokens each group shares")
    a("--prefix-repetition-suffix-len", type=int, default=256,
      help="prefix-shared: tokens of each prompt's own suffix")
    a("--prefix-repetition-num-prefixes", type=int, default=10, help="prefix-shared: groups")
    a("--prefix-repetition-output-len", type=int, default=128,
      help="prefix-shared: output tokens (default: 128)")
    a("--request-rate", type=float, default=math.inf, help="requests/s; inf sends all at once")
    a("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1 = Poisson)")
    a("--max-concurrency", type=int, default=None,
      help="most requests in flight at once (default: no bound)")
    a("--num-warmups", type=int, default=0, help="requests sent first, not measured")
    a("--ignore-eos", action="store_true",
      help="always on for the synthetic datasets (random, prefix-shared), as vllm bench does")
    a("--percentile-metrics", default=None,
      help=f"comma-separated subset of ttft,tpot,itl,e2el (default {DEFAULT_PERCENTILE_METRICS})")
    a("--metric-percentiles", default="99", help="comma-separated percentiles, e.g. 25,50,99")
    a("--goodput", nargs="+", default=None, metavar="KEY:MS",
      help="per-request SLOs in ms, e.g. ttft:500 tpot:50 (keys ttft, tpot, e2el)")
    a("--ready-check-timeout-sec", type=int, default=0,
      help="wait up to this long for GET /health to answer 200 (0: do not wait)")
    a("--duration-s", type=float, default=None,
      help="stop sending new requests after this many seconds (in-flight ones finish)")
    a("--request-timeout-s", type=float, default=300.0, help="bound of each request")
    a("--result-json", default=None, help="write the result JSON to this file")
    a("--save-result", action="store_true", help="write the JSON under vllm bench's file name")
    a("--save-detailed", action="store_true", help="add per-request lists to the JSON")
    a("--result-dir", default=None, help="folder of --save-result's file (default: .)")
    a("--result-filename", default=None,
      help="file name for --save-result (default: vllm bench's pattern)")
    a("--disable-tqdm", action="store_true", help="accepted for compatibility (no progress bar)")
    sampling_flags.add_cli_args(p)
    trace_flags.add_cli_args(p)


def parse_csv(value: str, flag: str) -> list[str]:
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items:
        raise ConfigError(WHERE, flag, value, "expected a comma-separated list")
    return items


def parse_percentiles(value: str) -> list[float]:
    """'25,50,99.9' -> [25.0, 50.0, 99.9]; each in (0, 100]."""
    out = []
    for item in parse_csv(value, "--metric-percentiles"):
        try:
            p = float(item)
        except ValueError:
            raise ConfigError(WHERE, "--metric-percentiles", value,
                              f"{item!r} is not a number") from None
        if not 0 < p <= 100:
            raise ConfigError(WHERE, "--metric-percentiles", value, f"{item} is outside (0, 100]")
        out.append(p)
    return out


def parse_percentile_metrics(value: str | None) -> list[str]:
    from framework.base.vocabulary import LATENCY_METRICS

    names = parse_csv(value or DEFAULT_PERCENTILE_METRICS, "--percentile-metrics")
    unknown = [n for n in names if n not in LATENCY_METRICS]
    if unknown:
        raise ConfigError(WHERE, "--percentile-metrics", value,
                          f"unknown metric(s) {unknown}; use {','.join(LATENCY_METRICS)}")
    return names


def parse_goodput(pairs: Sequence[str] | None) -> dict[str, float]:
    """['ttft:500', 'tpot:50'] -> {'ttft': 500.0, 'tpot': 50.0} (vllm bench's KEY:VALUE, ms)."""
    from framework.base.vocabulary import SLO_METRICS

    slo: dict[str, float] = {}
    for pair in pairs or ():
        name, _, limit = pair.partition(":")
        try:
            value = float(limit)
        except ValueError:
            raise ConfigError(WHERE, "--goodput", pair,
                              "expected KEY:VALUE with VALUE in ms") from None
        if name not in SLO_METRICS:
            raise ConfigError(WHERE, "--goodput", pair, f"key must be one of {list(SLO_METRICS)}")
        if value < 0:
            raise ConfigError(WHERE, "--goodput", pair, "the limit must be >= 0")
        slo[name] = value
    return slo


def resolve_endpoint(endpoint: str | None, backend: str | None) -> str:
    """'completions' or 'chat' from --endpoint and --backend (which must agree if both given)."""
    implied = "chat" if backend == "openai-chat" else "completions"
    if endpoint is None:
        return implied
    if endpoint not in ENDPOINT_NAMES:
        raise ConfigError(WHERE, "--endpoint", endpoint, f"use one of {list(ENDPOINT_NAMES)}")
    name = ENDPOINT_NAMES[endpoint]
    if backend is not None and name != implied:
        raise ConfigError(WHERE, "--endpoint", endpoint, f"does not match --backend {backend}")
    return name
