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

Neither vllm nor transformers is imported. The flags and their parsers are in
framework.load.bench_args.
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
from framework.load.bench_args import BACKEND_OF
from framework.load.bench_args import METRIC_TITLES
from framework.load.bench_args import WHERE
from framework.load.bench_args import parse_goodput
from framework.load.bench_args import parse_percentile_metrics
from framework.load.bench_args import parse_percentiles
from framework.load.bench_args import resolve_endpoint

if TYPE_CHECKING:
    from framework.load.loadgen import LoadResult
    from framework.load.workload import Dataset
    from framework.load.workload import RequestSpec


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


def per_request_lists(result: LoadResult,
                      requests: Sequence[RequestSpec]) -> dict[str, list[Any]]:
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
                details: Mapping[str, list[Any]] | None, extra: Mapping[str, Any]) -> dict[str, Any]:
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
