"""Latency truth (issue #17 item 4): `vllm bench serve` vs `vllm-sweep bench` on ONE vLLM CPU
server, judged by the server's own histograms.

    .venv/bin/python benchmarks/parity.py [--runs 5] [--modes unset,greedy] [--no-doc]
        [--client-wrap "nice -n -10"] [--save-runs runs.json]

One `vllm serve models/tiny-llama --enforce-eager --max-model-len 1024` with fine histogram
buckets (framework/engine/server_histograms.py FINE_BUCKETS), warmed up by 100 requests. Per
sampling mode (`unset`: no sampling flag, the server's default; `greedy`: --temperature 0),
the two clients alternate `--runs` times each (the first of each pair alternates too), same
random workload and flags (300 prompts, 256 in / 64 out, --max-concurrency 16, --ignore-eos,
seed 0, --save-detailed). Around every run /metrics is scraped; the deltas of
vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
vllm:request_time_per_output_token_seconds and vllm:e2e_request_latency_seconds give the
server's median (interpolated in the buckets) and mean (sum / count) for that run's requests.

Both clients run with the same transport probe (PROBE, patched into each process before it
starts): the moment a POST's bytes are handed to the socket (`transport.write`) and the moment
the first response bytes holding a content chunk reach the protocol's `data_received`. Matched
to each request's own start time and TTFT (--save-detailed), a client's TTFT splits into
send lead (own clock start -> bytes written), wire (written -> first content bytes read by
the process: server, kernel and the process's wake-up) and receive lag (bytes read -> the
client's timestamp). `--client-wrap` prefixes both clients' command (e.g. nice, taskset) to
measure what client CPU scheduling does. The server is stopped in a finally (loadgen_parity's
VllmServer: SIGTERM to its PID, then SIGKILL to its own process group).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shlex
import statistics
import sys
import tempfile
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any

try:
    from loadgen_parity import MODEL
    from loadgen_parity import VLLM_BENCH_TIMED
    from loadgen_parity import VllmServer
    from loadgen_parity import run_timed
    from record import append_section
    from record import uptime
except ModuleNotFoundError:  # imported as benchmarks.parity
    from benchmarks.loadgen_parity import MODEL
    from benchmarks.loadgen_parity import VLLM_BENCH_TIMED
    from benchmarks.loadgen_parity import VllmServer
    from benchmarks.loadgen_parity import run_timed
    from benchmarks.record import append_section
    from benchmarks.record import uptime
from framework.engine.server_histograms import fine_buckets_flag
from framework.engine.server_histograms import run_summary
from framework.engine.server_histograms import scrape

PROBE = """
import atexit, json, os, time
import asyncio.selector_events as _se
_pending, _pairs = {}, []
_write = _se._SelectorSocketTransport.write
def _probe_write(self, data):
    if bytes(data[:5]) == b"POST ":
        _pending[id(self)] = time.perf_counter()
    return _write(self, data)
_se._SelectorSocketTransport.write = _probe_write
_writelines = _se._SelectorSocketTransport.writelines
def _probe_writelines(self, chunks):
    chunks = list(chunks)
    if chunks and bytes(chunks[0][:5]) == b"POST ":
        _pending[id(self)] = time.perf_counter()
    return _writelines(self, chunks)
_se._SelectorSocketTransport.writelines = _probe_writelines
def _probe(cls):
    inner = cls.data_received
    def data_received(self, data):
        now = time.perf_counter()
        key = id(self.transport)
        if key in _pending and b'"choices":[{' in data:
            _pairs.append((_pending.pop(key), now))
        return inner(self, data)
    cls.data_received = data_received
atexit.register(lambda: open(os.environ["PARITY_PROBE_OUT"], "w").write(json.dumps(_pairs)))
"""
VLLM_ENTRY = (PROBE + "import aiohttp.client_proto\n_probe(aiohttp.client_proto.ResponseHandler)\n"
              + VLLM_BENCH_TIMED)
OURS_ENTRY = (PROBE + "import sys\nfrom framework.load.http_client import Connection\n"
              "_probe(Connection)\nfrom framework.cli import main\n"
              "sys.exit(main(['bench', *sys.argv[1:]]))\n")
MODES = {"unset": [], "greedy": ["--temperature", "0"]}
CLIENTS = ("vllm bench serve", "vllm-sweep bench")
METRICS = ("ttft", "tpot", "itl", "e2el")


def workload(args: argparse.Namespace) -> list[str]:
    return ["--model", str(MODEL), "--dataset-name", "random",
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.max_concurrency),
            "--ignore-eos", "--seed", "0", "--percentile-metrics", ",".join(METRICS),
            "--metric-percentiles", "50", "--save-detailed"]


def decompose(starts: list[float], ttfts: list[float], pairs: list[list[float]]
              ) -> dict[str, float | None]:
    """Each probe pair (write, first content read) matched to the request whose first-token
    stamp is the earliest at or after the read and whose start is at or before the write;
    means (ms) over the matched requests of TTFT = send lead + wire + receive lag (send lead
    = write - start, wire = read - write, receive lag = stamp - read), and the share of
    requests matched."""
    firsts = sorted((s + t, s) for s, t in zip(starts, ttfts) if t > 0)
    used: set[int] = set()
    lead, wire, lag = [], [], []
    for written, read in sorted(pairs, key=lambda p: p[1]):
        i = bisect.bisect_left(firsts, (read, -1e300))
        while i < len(firsts) and (i in used or firsts[i][1] > written):
            i += 1
        if i == len(firsts) or firsts[i][0] - read > 1.0:
            continue
        used.add(i)
        stamp, start = firsts[i]
        lead.append(written - start)
        wire.append(read - written)
        lag.append(stamp - read)

    def ms(values: list[float]) -> float | None:
        return 1000 * statistics.fmean(values) if values else None

    return {"matched_ttft_ms": ms([a + b + c for a, b, c in zip(lead, wire, lag)]),
            "send_lead_ms": ms(lead), "wire_ms": ms(wire), "receive_lag_ms": ms(lag),
            "matched": len(used) / len(firsts) if firsts else 0.0}


def run_client(name: str, url: str, args: argparse.Namespace, mode: str, out: Path
               ) -> dict[str, Any]:
    """One run of one client: its JSON metrics, CPU, the server's histogram deltas and the
    probe's decomposition."""
    probe_out = out.with_suffix(".probe.json")
    os.environ["PARITY_PROBE_OUT"] = str(probe_out)
    wrap = shlex.split(args.client_wrap or "")
    if name == CLIENTS[0]:
        argv = [*wrap, sys.executable, "-c", VLLM_ENTRY, "--backend", "openai", "--base-url", url,
                *workload(args), *MODES[mode], "--save-result", "--result-dir", str(out.parent),
                "--result-filename", out.name, "--disable-tqdm"]
    else:
        argv = [*wrap, sys.executable, "-c", OURS_ENTRY, "--base-url", url, *workload(args),
                *MODES[mode], "--result-json", str(out)]
    load = os.getloadavg()[0]
    before = scrape(url)
    stdout, cpu = run_timed(argv)
    after = scrape(url)
    result = json.loads(out.read_text())
    if (result["completed"], result["failed"]) != (args.num_prompts, 0):
        raise RuntimeError(f"{name}: {result['completed']} of {args.num_prompts} succeeded")
    phase = (next(float(line.split("=", 1)[1]) for line in stdout.splitlines()
                  if line.startswith("BENCHMARK_PHASE_CPU_S=")) if name == CLIENTS[0]
             else result["benchmark_phase_cpu_s"])
    server = run_summary(before, after)
    if server["ttft_count"] != args.num_prompts:
        raise RuntimeError(f"server counted {server['ttft_count']} requests in a {name} run")
    row = {"client": name, "mode": mode, "load1": load, "whole_cpu_s": cpu, "phase_cpu_s": phase,
           "output_throughput": result["output_throughput"], "duration": result["duration"],
           **{f"{s}_{m}_ms": result[f"{s}_{m}_ms"] for s in ("median", "mean") for m in METRICS},
           **{f"server_{k}": v for k, v in server.items()},
           # Little's law: requests inside the server on average = req/s x server mean E2EL
           "in_server": args.num_prompts / result["duration"] * server["mean_e2el_ms"] / 1000,
           **decompose(result["start_times"], result["ttfts"],
                       json.loads(probe_out.read_text()))}
    return row


def med(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def spread(rows: list[dict[str, Any]], key: str, digits: int) -> str:
    """median [min-max] over the runs."""
    values = [r[key] for r in rows]
    return (f"{statistics.median(values):.{digits}f} "
            f"[{min(values):.{digits}f}-{max(values):.{digits}f}]")


def pct(a: float, b: float) -> str:
    return f"{100 * (a - b) / b:+.1f}%" if b else "n/a"


def mode_table(rows: list[dict[str, Any]]) -> list[str]:
    """Client medians vs the server's, per metric, for one sampling mode."""
    v = [r for r in rows if r["client"] == CLIENTS[0]]
    o = [r for r in rows if r["client"] == CLIENTS[1]]
    lines = ["| metric | vllm bench serve | vllm-sweep bench | ours vs vllm | server in vllm's runs "
             "| server in our runs | server: ours vs vllm | vllm - server | ours - server | "
             "server sides with |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for stat in ("median", "mean"):
        for m in METRICS:
            key, skey = f"{stat}_{m}_ms", f"server_{stat}_{m}_ms"
            cv, co, sv, so = med(v, key), med(o, key), med(v, skey), med(o, skey)
            off_v = statistics.median(r[key] - r[skey] for r in v)
            off_o = statistics.median(r[key] - r[skey] for r in o)
            sides = CLIENTS[1] if abs(off_o) < abs(off_v) else CLIENTS[0]
            lines.append(f"| {stat} {m.upper()} ms | {spread(v, key, 2)} | {spread(o, key, 2)} | "
                         f"{pct(co, cv)} | {spread(v, skey, 2)} | {spread(o, skey, 2)} | "
                         f"{pct(so, sv)} | {off_v:+.2f} | {off_o:+.2f} | {sides.split()[0]} |")
    lines.append(f"| output tok/s | {spread(v, 'output_throughput', 0)} | "
                 f"{spread(o, 'output_throughput', 0)} | "
                 f"{pct(med(o, 'output_throughput'), med(v, 'output_throughput'))} | | | | | | |")
    return lines


def ttft_table(rows: list[dict[str, Any]]) -> list[str]:
    """The TTFT split of the probe (means), requests inside the server, and the clients' CPU,
    per client and mode."""
    lines = ["| mode | client | mean TTFT ms | send lead ms | wire ms | receive lag ms | matched "
             "| server mean TTFT ms | requests in server | phase CPU-s | whole CPU-s | load1 |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for mode in dict.fromkeys(r["mode"] for r in rows):
        for client in CLIENTS:
            rs = [r for r in rows if r["mode"] == mode and r["client"] == client]
            lines.append(f"| {mode} | {client} | {spread(rs, 'matched_ttft_ms', 2)} | "
                         f"{spread(rs, 'send_lead_ms', 3)} | {spread(rs, 'wire_ms', 2)} | "
                         f"{spread(rs, 'receive_lag_ms', 3)} | {med(rs, 'matched'):.2f} | "
                         f"{spread(rs, 'server_mean_ttft_ms', 2)} | {spread(rs, 'in_server', 2)} | "
                         f"{spread(rs, 'phase_cpu_s', 2)} | {spread(rs, 'whole_cpu_s', 2)} | "
                         f"{spread(rs, 'load1', 1)} |")
    return lines


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        v = [r for r in rows if r["mode"] == mode and r["client"] == CLIENTS[0]]
        o = [r for r in rows if r["mode"] == mode and r["client"] == CLIENTS[1]]
        for key, label, limit in (("median_ttft_ms", "median TTFT", 0.10),
                                  ("median_tpot_ms", "median TPOT", 0.10),
                                  ("median_itl_ms", "median ITL", 0.10),
                                  ("median_e2el_ms", "median E2EL", 0.10),
                                  ("output_throughput", "output throughput", 0.05)):
            diff = (med(o, key) - med(v, key)) / med(v, key)
            status = "met" if abs(diff) <= limit else "MISSED"
            out.append(f"- {mode}, {label}: ours {100 * diff:+.1f}% vs vllm bench "
                       f"(target within {100 * limit:.0f}%): {status}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", default="unset,greedy")
    parser.add_argument("--num-prompts", type=int, default=300)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--client-wrap", default="", help="prefix of both clients' command")
    parser.add_argument("--save-runs", default=None, help="write every run's row to this JSON")
    parser.add_argument("--no-doc", action="store_true", help="print only; leave BENCHMARKS.md")
    args = parser.parse_args()
    modes = args.modes.split(",")
    command = "benchmarks/parity.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    started, load_before = datetime.now(UTC), uptime()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        out = Path(tmp)
        with VllmServer(MODEL, out / "server.log", tuple(fine_buckets_flag())) as server:
            print(f"server ready at {server.base_url} (pid {server.pid}); warming up", flush=True)
            warm = argparse.Namespace(**{**vars(args), "num_prompts": 100, "client_wrap": ""})
            run_client(CLIENTS[1], server.base_url, warm, "greedy", out / "warmup.json")
            for mode in modes:
                for i in range(args.runs):
                    for name in (CLIENTS if i % 2 == 0 else CLIENTS[::-1]):
                        tag = f"{mode}-{i}-{'vllm' if name == CLIENTS[0] else 'ours'}"
                        rows.append(run_client(name, server.base_url, args, mode,
                                               out / f"{tag}.json"))
                        r = rows[-1]
                        print(f"{tag}: TTFT {r['median_ttft_ms']:.2f} ms (server "
                              f"{r['server_median_ttft_ms']:.2f}), TPOT {r['median_tpot_ms']:.2f}"
                              f", {r['output_throughput']:.0f} tok/s", flush=True)
    if args.save_runs:
        Path(args.save_runs).write_text(json.dumps(rows, indent=1))
    preamble = (
        f"Command: `.venv/bin/python {command.strip()}` ({args.runs} runs per client and mode, "
        f"alternating; {args.num_prompts} random prompts, {args.input_len} in / "
        f"{args.output_len} out, --max-concurrency {args.max_concurrency}, --ignore-eos; modes: "
        + ", ".join(f"`{m}` ({' '.join(MODES[m]) or 'no sampling flag'})" for m in modes)
        + f"; client wrap: `{args.client_wrap or 'none'}`). One `vllm serve models/tiny-llama "
        "--enforce-eager --max-model-len 1024 --custom-histogram-buckets <fine>`. Cells: median "
        "over runs [min-max]; each run's value is that tool's own median (or mean) or the "
        f"server histogram's over that run's requests.\n\nMachine load: before `{load_before}`; "
        f"after `{uptime()}`.")
    section = []
    for mode in modes:
        section += [f"Mode `{mode}`:", "", *mode_table([r for r in rows if r["mode"] == mode]), ""]
    section += ["TTFT split by the transport probe (per run the mean over matched requests, "
                "TTFT = send lead + wire + receive lag; then median [min-max] over runs); "
                "requests in server = completed / duration x the server's mean E2EL "
                f"(Little's law; the client allows {args.max_concurrency}):", "",
                *ttft_table(rows), "",
                "Targets:", "", *verdicts(rows), ""]
    text = "\n".join(section)
    print(preamble + "\n\n" + text)
    variant = ", ".join(([f"--max-concurrency {args.max_concurrency}"]
                         if args.max_concurrency != 16 else [])
                        + ([f"clients under `{args.client_wrap}`"] if args.client_wrap else []))
    if not args.no_doc:
        append_section("Latency truth: clients vs the server's histograms"
                       + (f" ({variant})" if variant else ""), preamble, text, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
