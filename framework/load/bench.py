"""`vllm-sweep bench`: one benchmark against any OpenAI-compatible server, like `vllm bench serve`.

Flags carry the names `vllm bench serve` (vLLM 0.32, ``vllm/benchmarks/serve.py``
add_cli_args) gives the same concepts, with the same defaults; the JSON written has its keys
(with --save-detailed also its per-request lists, minus ``generated_texts``, which is not
kept). Differences: --model must be a local model folder (its ``tokenizer.json`` tokenizes
the prompts; vllm bench would also accept a Hub id); --endpoint also takes ``completions`` or
``chat``; the sampling flags (--temperature, --top-p, ...: framework.load.sampling) are sent
only when given, as vllm bench does, and are checked against vLLM's ranges first;
--num-warmups sends that many requests drawn with seed + 1 (vllm bench repeats the first
prompt); ``max_concurrent_requests`` is exact (see framework.load.metrics). --dataset-name
timed_trace takes vllm bench's timed-trace flags and --self-timed (framework.load.trace);
its token blocks are reproducible, vllm bench's are salted per process (trace_prompts). Our own flags:
--result-json, --duration-s, --request-timeout-s, --min/--max-prompt-tokens. Extra JSON keys:
``dataset_name``, ``not_sent``, ``setup_cpu_s`` (this process's CPU seconds before the
measured run: interpreter, imports, prompts, warm-up), ``benchmark_phase_cpu_s`` (CPU seconds
of the measured run and its metrics, the scope of vllm bench's ``benchmark()``), ``sampling``
(JSON of the sampling fields sent, "{}" for none) and ``vllm_sweep_version``.

Neither vllm nor transformers is imported. This module's top level imports only the
standard library, so that building the CLI parser stays cheap.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Mapping
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from framework.base.errors import ConfigError
from framework.load import sampling as sampling_flags
from framework.load import trace as trace_flags

if TYPE_CHECKING:
    from framework.load.loadgen import LoadResult
    from framework.load.workload import Dataset
    from framework.load.workload import RequestSpec

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


def dataset_from_args(args: argparse.Namespace) -> Dataset:
    from framework.load.workload import Dataset

    name = args.dataset_name
    if name in ("sharegpt", "timed_trace") and not args.dataset_path:
        raise ConfigError(WHERE, "--dataset-path", None, f"--dataset-name {name} needs a file")
    if name not in ("sharegpt", "timed_trace") and args.dataset_path:
        raise ConfigError(WHERE, "--dataset-path", args.dataset_path,
                          f"--dataset-name {name} takes no file")
    if args.dataset_path and not Path(args.dataset_path).is_file():
        raise ConfigError(WHERE, "--dataset-path", args.dataset_path, "file not found")
    out_len = args.output_len
    if name == "prefix-shared":
        prefix = args.prefix_repetition_prefix_len
        return Dataset(name=name, input_len=prefix + args.prefix_repetition_suffix_len,
                       output_len=out_len or args.prefix_repetition_output_len, prefix_len=prefix,
                       prefix_groups=args.prefix_repetition_num_prefixes)
    if name == "timed_trace":
        return Dataset(name=name, path=Path(args.dataset_path),
                       trace=trace_flags.settings_from_args(args, WHERE))
    return Dataset(name=name, input_len=args.input_len or args.random_input_len,
                   output_len=out_len or args.random_output_len,
                   range_ratio=args.random_range_ratio,
                   path=Path(args.dataset_path) if args.dataset_path else None,
                   min_prompt_tokens=args.min_prompt_tokens,
                   max_prompt_tokens=args.max_prompt_tokens,
                   output_len_override=out_len or args.sharegpt_output_len)


def per_request_lists(result: LoadResult, requests: Sequence[RequestSpec]) -> dict[str, list]:
    """vllm bench's --save-detailed lists, one entry per request sent, in request order.

    A failed request has output length 0, TTFT and latency 0.0 and its planned prompt length
    (vllm bench's conventions); the totals of the result are sums over these lists.
    """
    recs = result.records
    return {
        "input_lens": [r.prompt_tokens if r.success else requests[r.index].prompt_len
                       for r in recs],
        "output_lens": [r.output_tokens if r.success else 0 for r in recs],
        "ttfts": [r.ttft_s or 0.0 for r in recs],
        "itls": [list(r.itl_s) for r in recs],
        "latencies": [r.e2el_s or 0.0 for r in recs],
        "start_times": [r.send_s for r in recs],
        "errors": [r.error for r in recs],
    }


def result_json(meta: Mapping[str, Any], metrics: Mapping[str, Any],
                selected: Sequence[str], percentiles: Sequence[float], goodput: bool,
                details: Mapping[str, list] | None, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The result in vllm bench's key order: run settings, totals and throughputs, per-request
    lists (if ``details``), peaks, then mean/median/std/p{P} of the ``selected`` metrics only,
    then ``extra`` (our own keys). ``request_goodput`` is None without SLOs, as in vllm bench."""
    from framework.base.vocabulary import percentile_key

    out: dict[str, Any] = dict(meta)
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput"):
        out[key] = metrics[key]
    out["request_goodput"] = metrics.get("request_goodput") if goodput else None
    for key in ("output_throughput", "total_token_throughput"):
        out[key] = metrics[key]
    out.update(details or {})
    out["max_output_tokens_per_s"] = metrics["max_output_tokens_per_s"]
    out["max_concurrent_requests"] = metrics["max_concurrent_requests"]
    out["rtfx"] = 0.0  # vllm bench's audio real-time factor; always 0 for text
    for name in selected:
        for stat in ("mean", "median", "std"):
            out[f"{stat}_{name}_ms"] = metrics[f"{stat}_{name}_ms"]
        for p in percentiles:
            out[percentile_key(name, p)] = metrics[percentile_key(name, p)]
    out.update(extra)
    return out


def summary_lines(result: Mapping[str, Any], selected: Sequence[str],
                  percentiles: Sequence[float]) -> list[str]:
    """vllm bench's printed summary of ``result``."""
    from framework.base.vocabulary import percentile_key

    def row(label: str, value: Any) -> str:
        if isinstance(value, float):
            return f"{label:<40} {value:<10.2f}"
        return f"{label:<40} {value:<10}"

    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
             row("Successful requests:", result["completed"]),
             row("Failed requests:", result["failed"])]
    if result["max_concurrency"] is not None:
        lines.append(row("Maximum request concurrency:", result["max_concurrency"]))
    if result["request_rate"] != "inf":
        lines.append(row("Request rate configured (RPS):", float(result["request_rate"])))
    lines += [row("Benchmark duration (s):", result["duration"]),
              row("Total input tokens:", result["total_input_tokens"]),
              row("Total generated tokens:", result["total_output_tokens"]),
              row("Request throughput (req/s):", result["request_throughput"])]
    if result["request_goodput"] is not None:
        lines.append(row("Request goodput (req/s):", result["request_goodput"]))
    lines += [row("Output token throughput (tok/s):", result["output_throughput"]),
              row("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"]),
              row("Peak concurrent requests:", float(result["max_concurrent_requests"])),
              row("Total token throughput (tok/s):", result["total_token_throughput"])]
    for name in selected:
        short, title = METRIC_TITLES[name]
        lines += ["{s:{c}^{n}}".format(s=title, n=50, c="-"),
                  row(f"Mean {short} (ms):", result[f"mean_{name}_ms"]),
                  row(f"Median {short} (ms):", result[f"median_{name}_ms"])]
        for p in percentiles:
            key = percentile_key(name, p)
            lines.append(row(f"P{key.split('_')[0][1:]} {short} (ms):", result[key]))
    lines.append("=" * 50)
    return lines


def result_path(args: argparse.Namespace, backend: str, date: str) -> Path | None:
    """--result-json, else vllm bench's name ({label}-{rate}qps[-concurrency{N}]-{model}-{date}
    .json, or --result-filename) under --result-dir when --save-result is given."""
    if args.result_json:
        return Path(args.result_json)
    if not args.save_result:
        return None
    concurrency = f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None else ""
    name = args.result_filename or (f"{args.label or backend}-{args.request_rate}qps{concurrency}-"
                                    f"{args.model.rstrip('/').split('/')[-1]}-{date}.json")
    return Path(args.result_dir or ".") / name


def run(args: argparse.Namespace) -> int:
    """Run one benchmark; 0 if any request succeeded, 1 if all failed (ConfigError: bad flags).
    Requests carry `Authorization: Bearer $OPENAI_API_KEY` when that is set, as vllm bench's
    do (vllm/benchmarks/lib/endpoint_request_func.py, _get_headers)."""
    import asyncio

    from framework import __version__
    from framework.load.loadgen import run_load
    from framework.load.loadgen import wait_ready
    from framework.load.metrics import compute_metrics
    from framework.load.workload import arrival_offsets
    from framework.load.workload import load_tokenizer

    endpoint = resolve_endpoint(args.endpoint, args.backend)
    backend = BACKEND_OF[endpoint]
    selected = parse_percentile_metrics(args.percentile_metrics)
    percentiles = parse_percentiles(args.metric_percentiles)
    slo = parse_goodput(args.goodput)
    for flag in ("num_prompts", "max_concurrency", "request_rate", "burstiness", "duration_s",
                 "request_timeout_s"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            raise ConfigError(WHERE, "--" + flag.replace("_", "-"), value, "must be > 0")
    if args.num_warmups < 0:
        raise ConfigError(WHERE, "--num-warmups", args.num_warmups, "must be >= 0")
    sampling = sampling_flags.from_args(args, WHERE)
    dataset = dataset_from_args(args)
    timed = trace_flags.self_timed(args, endpoint, WHERE)
    tokenizer_dir = Path(args.tokenizer or args.model)
    try:
        tokenizer = load_tokenizer(tokenizer_dir)
        requests = dataset.requests(tokenizer, args.num_prompts, args.seed)
        warmups = dataset.requests(tokenizer, args.num_warmups, args.seed + 1)
    except FileNotFoundError as exc:
        raise ConfigError(WHERE, "--tokenizer" if args.tokenizer else "--model",
                          str(tokenizer_dir), str(exc)) from None
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(WHERE, "--dataset-name", args.dataset_name, str(exc)) from None
    arrivals = (dataset.trace_offsets(args.num_prompts) if timed
                else None if math.isinf(args.request_rate)
                else arrival_offsets(len(requests), args.request_rate, args.burstiness, args.seed))
    base_url = args.base_url or f"http://{args.host}:{args.port}"
    model = args.served_model_name or args.model
    common = dict(max_concurrency=args.max_concurrency, timeout_s=args.request_timeout_s,
                  endpoint=endpoint, ignore_eos=args.ignore_eos or dataset.name != "sharegpt",
                  api_key=os.environ.get("OPENAI_API_KEY") or None,
                  fields=sampling_flags.request_fields(sampling))
    if sampling.temperature is None:
        print("Note: no --temperature: the server's default sampling applies, as with vllm "
              "bench (vLLM: the model's generation_config, else temperature 1.0); "
              "--temperature 0 is greedy.")

    async def bench() -> tuple[LoadResult, float]:
        if args.ready_check_timeout_sec > 0 and not await wait_ready(
                base_url, args.ready_check_timeout_sec):
            raise ConfigError(WHERE, "--base-url", base_url,
                              f"GET /health not 200 within {args.ready_check_timeout_sec} s")
        if warmups:
            print(f"Warming up with {len(warmups)} requests...")
            await run_load(base_url, model, warmups, **common)
        print(f"Starting main benchmark run: {len(requests)} {dataset.name} prompts to "
              f"{base_url} ({endpoint})")
        cpu0 = time.process_time()
        return await run_load(base_url, model, requests, arrivals=arrivals,
                              duration_s=args.duration_s, **common), cpu0

    result, setup_cpu_s = asyncio.run(bench())
    metrics = compute_metrics(result.records, result.duration_s, percentiles, slo or None)
    cpu_end = time.process_time()
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    meta = {"date": date, "endpoint_type": backend, "backend": backend, "label": args.label,
            "model_id": args.model, "tokenizer_id": str(tokenizer_dir),
            "num_prompts": args.num_prompts,
            "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate,
            "burstiness": args.burstiness, "max_concurrency": args.max_concurrency}
    extra = {"dataset_name": dataset.name, "not_sent": result.not_sent,
             "setup_cpu_s": setup_cpu_s, "benchmark_phase_cpu_s": cpu_end - setup_cpu_s,
             "sampling": sampling_flags.sampling_json(sampling), "vllm_sweep_version": __version__}
    details = per_request_lists(result, requests) if args.save_detailed else None
    out = result_json(meta, metrics, selected, percentiles, bool(slo), details, extra)
    print("\n".join(summary_lines(out, selected, percentiles)))
    path = result_path(args, backend, date)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out) + "\n")
        print(f"Result written to {path}")
    if metrics["failed"]:
        errors = [r.error for r in result.records if not r.success]
        print(f"{len(errors)} request(s) failed; first error: {errors[0]}")
    return 0 if metrics["completed"] else 1
