"""Trace replay parity (issue #18): `vllm bench serve --dataset-name timed_trace` vs `vllm-sweep
bench --dataset-name timed_trace` on ONE vLLM CPU server and the same trace file.

    .venv/bin/python benchmarks/trace_parity.py [--runs 3] [--speed-ups 1,3]
        [--trace datasets/mooncake_sample.jsonl] [--num-prompts 150] [--no-doc] [--client-nice N]
        [--pin] [--order alternate|random] [--order-seed N]

One `vllm serve models/tiny-llama --enforce-eager --max-model-len 1024` with fine histogram
buckets (loadgen_parity.VllmServer, stopped in a finally), warmed up by 30 requests. Per
speed-up s (the trace's timestamps in ms, so --timed-trace-sec-multiplier 0.001 / s for both
clients: vllm bench has no speed-up flag) the two clients run `--runs` pairs, one run each per
pair. Which goes first in a pair: `--order alternate` (default; parity.py's scheme, pair i
starts with vllm bench when i is even), or `--order random`: a seeded shuffle
(`--order-seed`) of an equal number of pairs in each order (the odd pair's order drawn too),
per speed-up, so that a slot effect does not line up with one client. Every run's slot (its
place among the speed-up's runs, 1-based) is printed and kept. Both with --temperature 0,
--save-detailed and the default chunk hash size 16. vllm bench salts its token blocks per
process (Python's hash()); ours get --seed <the run's number over all speed-ups> so that no
run replays an earlier run's tokens into the server's prefix cache either.

Per run: requests, total input and output tokens (must be equal across clients and runs:
same rows, same block construction), the client's median TTFT and TPOT, the server's medians
from its histogram deltas (server_histograms), its prefix-cache hits / queries delta, and the
send lateness of every request: (start_i - start_0) - (due_i - due_0), where start is the
client's own send stamp (--save-detailed start_times) and due the trace's schedule
(framework.load.trace.send_offsets, vLLM's self-timed rule). Request 0 is taken as on time:
neither JSON holds the run's start. Also per run: the client's whole-process CPU seconds, its
CPU seconds in the benchmark phase (as loadgen_parity.py takes them), its client-side TTFT
overhead, its median TTFT minus the server's, and the split of its TTFT
by parity.py's transport probe (patched into both clients alike: the POST's bytes handed to
the socket, the first content bytes reaching data_received): send lead (the client's start
stamp -> bytes written), wire (-> first content bytes read: server, kernel, the process's
wake-up) and receive lag (-> the client's first-token stamp), means over the matched
requests. Besides each table's median over runs [min-max], the pooled medians: every
request of every run of a client at a speed-up pooled (client TTFT and TPOT per request, TPOT
= sum of its ITLs / (output tokens - 1) as vLLM's; the server's from its histogram deltas
summed over the runs), the paired differences (benchmarks/paired.py: per pair ours / vllm
bench - 1, their median with a 95% CI), and the server's median TPOT by client and by place
in the pair.
Appends the tables to docs/BENCHMARKS.md.

--pin separates client and server on this 2-core machine: the server (API server, engine
core, worker: the affinity is inherited) may run only on CPU 0, every client (the warm-up
too) only on CPU 1, as a client on a machine of its own would. Both clients get the same
treatment. TTFT is defined alike by both clients (checked against vLLM's
benchmarks/lib/endpoint_request_func.py): from just before the request is serialized and
sent to the first SSE message with non-empty `choices`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
    from loadgen_parity import VllmServer
    from loadgen_parity import run_timed
    from paired import paired_table
    from parity import OURS_ENTRY
    from parity import VLLM_ENTRY
    from parity import decompose
    from parity import med
    from parity import pct
    from parity import spread
    from record import ROOT
    from record import append_section
    from record import uptime
except ModuleNotFoundError:  # imported as benchmarks.trace_parity
    from benchmarks.loadgen_parity import MODEL
    from benchmarks.loadgen_parity import VllmServer
    from benchmarks.loadgen_parity import run_timed
    from benchmarks.paired import paired_table
    from benchmarks.parity import OURS_ENTRY
    from benchmarks.parity import VLLM_ENTRY
    from benchmarks.parity import decompose
    from benchmarks.parity import med
    from benchmarks.parity import pct
    from benchmarks.parity import spread
    from benchmarks.record import ROOT
    from benchmarks.record import append_section
    from benchmarks.record import uptime
from framework.config.trace_spec import TimedTraceSpec
from framework.engine.server_histograms import TPOT
from framework.engine.server_histograms import TTFT
from framework.engine.server_histograms import Histogram
from framework.engine.server_histograms import fine_buckets_flag
from framework.engine.server_histograms import run_summary
from framework.engine.server_histograms import scrape
from framework.engine.server_metrics import PREFIX_HITS
from framework.engine.server_metrics import PREFIX_QUERIES
from framework.engine.server_metrics import fetch_text
from framework.engine.server_metrics import parse_metrics
from framework.load.trace import read_trace
from framework.load.trace import send_offsets

CLIENTS = ("vllm bench serve", "vllm-sweep bench")
SERVER_CPUS, CLIENT_CPUS = frozenset({0}), frozenset({1})
TRACE = ROOT / "datasets" / "mooncake_sample.jsonl"
TRACE_MS = 0.001  # the sample's timestamps are milliseconds
PAIRED = (("median_ttft_ms", "client's median TTFT", True),
          ("median_tpot_ms", "client's median TPOT", True),
          ("server_median_ttft_ms", "server's median TTFT", False),
          ("server_median_tpot_ms", "server's median TPOT", False))


def workload(args: argparse.Namespace, speed_up: float) -> list[str]:
    return ["--model", str(MODEL), "--dataset-name", "timed_trace", "--dataset-path",
            str(args.trace), "--timed-trace-sec-multiplier", repr(TRACE_MS / speed_up),
            "--num-prompts", str(args.num_prompts), "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-detailed"]


def run_order(order: str, runs: int, rng: random.Random) -> list[tuple[str, str]]:
    """The clients of each of `runs` pairs in run order. `alternate`: pair i starts with
    vllm bench when i is even. `random`: runs // 2 pairs in each order, shuffled by `rng`,
    and an odd pair's order drawn by `rng` too; either way every client runs once per pair."""
    if order == "alternate":
        return [CLIENTS if i % 2 == 0 else CLIENTS[::-1] for i in range(runs)]
    if order != "random":
        raise ValueError(f"unknown order {order!r}")
    pairs = [CLIENTS, CLIENTS[::-1]] * (runs // 2)
    if runs % 2:
        pairs.append(rng.choice([CLIENTS, CLIENTS[::-1]]))
    rng.shuffle(pairs)
    return pairs


def request_tpots_ms(output_lens: list[int], itls: list[list[float]]) -> list[float]:
    """Per request with more than one output token: sum of its ITLs / (tokens - 1), in ms
    (vLLM's TPOT: last content chunk - first, over the usage token count - 1)."""
    return [1000 * sum(gaps) / (n - 1) for n, gaps in zip(output_lens, itls) if n > 1]


def delta_histogram(before: dict[str, Histogram], after: dict[str, Histogram], name: str
                    ) -> list[list[float]]:
    """The run's delta of one server histogram as [[le, cumulative count], ...] (JSON-able)."""
    return [[le, n] for le, n in after[name].minus(before[name]).buckets]


def pooled_median_ms(hists: list[list[list[float]]]) -> float:
    """The median of several runs' histogram deltas summed (ms, interpolated as run_summary)."""
    total = [[le, sum(h[i][1] for h in hists)] for i, (le, _) in enumerate(hists[0])]
    q = Histogram(tuple((le, n) for le, n in total), 0.0, total[-1][1]).quantile(0.5)
    return 1000 * q if q is not None else float("nan")


def tpot_vs_server_pct(client_ms: float, server_ms: float) -> float:
    """A run's client median TPOT against the server's own (its histogram delta over the same
    run), in %: 100 * (client / server - 1). The server's state that run cancels out: what is
    left is the client's measurement."""
    return 100 * (client_ms / server_ms - 1)


def spread_pct(rows: list[dict[str, Any]]) -> str:
    values = [r["tpot_vs_server_pct"] for r in rows]
    return f"{min(values):+.1f}..{max(values):+.1f}%"


def lateness_ms(starts: list[float], due: list[float]) -> list[float]:
    """Each request's send time minus its due time, both from request 0's (ms)."""
    return [1000 * ((s - starts[0]) - (d - due[0])) for s, d in zip(starts, due)]


def prefix_counters(url: str) -> tuple[float, float]:
    values = parse_metrics(fetch_text(f"{url}/metrics", 10.0))
    return values.get(PREFIX_HITS, 0.0), values.get(PREFIX_QUERIES, 0.0)


def run_client(name: str, url: str, args: argparse.Namespace, speed_up: float, run: int,
               out: Path) -> dict[str, Any]:
    """One replay by one client: its JSON's counts and medians, the server's, the lateness.
    `run` is unique over the whole benchmark: it is our --seed, and a seed reused at another
    speed-up would replay cached blocks and inflate our prefix-cache hits."""
    probe_out = out.with_suffix(".probe.json")
    os.environ["PARITY_PROBE_OUT"] = str(probe_out)  # read by the probe in the client
    if name == CLIENTS[0]:
        argv = [sys.executable, "-c", VLLM_ENTRY, "--backend", "openai", "--base-url", url,
                *workload(args, speed_up), "--save-result", "--result-dir", str(out.parent),
                "--result-filename", out.name, "--disable-tqdm"]
    else:
        argv = [sys.executable, "-c", OURS_ENTRY, "--base-url", url,
                *workload(args, speed_up), "--seed", str(run), "--result-json", str(out)]
    hits0, queries0 = prefix_counters(url)
    before = scrape(url)
    stdout, cpu_s = run_timed(argv, nice=args.client_nice,
                              cpus=CLIENT_CPUS if args.pin else None)
    after = scrape(url)
    hits1, queries1 = prefix_counters(url)
    result = json.loads(out.read_text())
    phase_cpu_s = (next(float(line.split("=", 1)[1]) for line in stdout.splitlines()
                        if line.startswith("BENCHMARK_PHASE_CPU_S=")) if name == CLIENTS[0]
                   else result["benchmark_phase_cpu_s"])
    rows = read_trace(args.trace, TimedTraceSpec(sec_multiplier=TRACE_MS / speed_up),
                      args.num_prompts)
    late = lateness_ms(result["start_times"], send_offsets(rows))
    server = run_summary(before, after)
    return {"client": name, "speed_up": speed_up,
            "ttfts_ms": [1000 * t for t, ok in zip(result["ttfts"], result["output_lens"]) if ok],
            "tpots_ms": request_tpots_ms(result["output_lens"], result["itls"]),
            "server_ttft_hist": delta_histogram(before, after, TTFT),
            "server_tpot_hist": delta_histogram(before, after, TPOT), "completed": result["completed"],
            "failed": result["failed"], "input_tokens": result["total_input_tokens"],
            "output_tokens": result["total_output_tokens"], "input_lens": result["input_lens"],
            "median_ttft_ms": result["median_ttft_ms"], "median_tpot_ms": result["median_tpot_ms"],
            "server_median_ttft_ms": server["median_ttft_ms"],
            "server_median_tpot_ms": server["median_tpot_ms"],
            "ttft_overhead_ms": result["median_ttft_ms"] - server["median_ttft_ms"],
            "tpot_vs_server_pct": tpot_vs_server_pct(result["median_tpot_ms"],
                                                     server["median_tpot_ms"]),
            "client_cpu_s": cpu_s, "phase_cpu_s": phase_cpu_s,
            **decompose(result["start_times"], result["ttfts"],
                        json.loads(probe_out.read_text())),
            "hit_rate": (hits1 - hits0) / (queries1 - queries0) if queries1 > queries0 else 0.0,
            "late_p50_ms": statistics.median(abs(x) for x in late),
            "late_max_ms": max(abs(x) for x in late), "duration": result["duration"]}


def speed_table(rows: list[dict[str, Any]]) -> list[str]:
    v = [r for r in rows if r["client"] == CLIENTS[0]]
    o = [r for r in rows if r["client"] == CLIENTS[1]]
    lines = ["| per run | vllm bench serve | vllm-sweep bench | ours vs vllm |",
             "| --- | ---: | ---: | ---: |"]
    for key, label, digits in (("completed", "requests", 0), ("input_tokens", "input tokens", 0),
                               ("output_tokens", "output tokens", 0),
                               ("median_ttft_ms", "median TTFT ms", 2),
                               ("median_tpot_ms", "median TPOT ms", 2),
                               ("server_median_ttft_ms", "server's median TTFT ms", 2),
                               ("server_median_tpot_ms", "server's median TPOT ms", 2),
                               ("ttft_overhead_ms", "client's median TTFT - server's, ms", 2),
                               ("client_cpu_s", "client process CPU s (start-up included)", 2),
                               ("phase_cpu_s", "client CPU s in the benchmark phase", 2),
                               ("send_lead_ms", "TTFT split, mean: send lead ms", 2),
                               ("wire_ms", "TTFT split, mean: wire ms", 2),
                               ("receive_lag_ms", "TTFT split, mean: receive lag ms", 2),
                               ("matched", "TTFT split: share of requests matched", 3),
                               ("hit_rate", "prefix-cache hit rate (server)", 3),
                               ("late_p50_ms", "send lateness, median ms", 2),
                               ("late_max_ms", "send lateness, max ms", 2),
                               ("duration", "duration s", 2)):
        lines.append(f"| {label} | {spread(v, key, digits)} | {spread(o, key, digits)} | "
                     f"{pct(med(o, key), med(v, key))} |")
    return lines


def pooled_table(rows: list[dict[str, Any]]) -> list[str]:
    """One speed-up's medians over every request of every run of each client pooled, with the
    10% target for the clients' own."""
    v = [r for r in rows if r["client"] == CLIENTS[0]]
    o = [r for r in rows if r["client"] == CLIENTS[1]]
    lines = ["| pooled over runs | vllm bench serve | vllm-sweep bench | ours vs vllm | "
             "within 10% |", "| --- | ---: | ---: | ---: | --- |"]
    for label, of in (("client's median TTFT ms", lambda rs: statistics.median(
                           x for r in rs for x in r["ttfts_ms"])),
                      ("client's median TPOT ms", lambda rs: statistics.median(
                           x for r in rs for x in r["tpots_ms"])),
                      ("server's median TTFT ms", lambda rs: pooled_median_ms(
                           [r["server_ttft_hist"] for r in rs])),
                      ("server's median TPOT ms", lambda rs: pooled_median_ms(
                           [r["server_tpot_hist"] for r in rs]))):
        a, b = of(v), of(o)
        target = (("met" if abs(b - a) <= 0.10 * a else "MISSED") if label.startswith("client")
                  else "(no target)")
        lines.append(f"| {label} | {a:.2f} | {b:.2f} | {pct(b, a)} | {target} |")
    return lines


def slot_table(rows: list[dict[str, Any]]) -> list[str]:
    """One speed-up's server medians by client and by place in the pair (does a gap follow
    the client or the slot?), and each pair's server TPOT, ours vs vllm bench's."""
    lines = ["| server's median, per run | client first in pair | client second in pair |",
             "| --- | --- | --- |"]
    for key, label in (("server_median_tpot_ms", "TPOT ms"),
                       ("server_median_ttft_ms", "TTFT ms")):
        for client in CLIENTS:
            cells = []
            for first in (True, False):
                rs = [r for r in rows if r["client"] == client and r["first"] == first]
                cells.append(f"{spread(rs, key, 2)} (n={len(rs)})" if rs else "-")
            lines.append(f"| {label}, {client} | {cells[0]} | {cells[1]} |")
    pairs = []
    for pair in sorted({r["pair"] for r in rows}):
        v, o = (next(r for r in rows if r["pair"] == pair and r["client"] == c) for c in CLIENTS)
        pairs.append(f"{'ours' if o['first'] else 'vllm'} first "
                     f"{pct(o['server_median_tpot_ms'], v['server_median_tpot_ms'])}")
    return [*lines, "", "Server's median TPOT under ours vs under vllm bench, pair by pair "
            "(slots in run order): " + "; ".join(pairs) + "."]


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for speed in dict.fromkeys(r["speed_up"] for r in rows):
        v = [r for r in rows if r["speed_up"] == speed and r["client"] == CLIENTS[0]]
        o = [r for r in rows if r["speed_up"] == speed and r["client"] == CLIENTS[1]]
        same = {(r["completed"], r["failed"], r["input_tokens"], r["output_tokens"],
                 tuple(r["input_lens"])) for r in v + o}
        out.append(f"- {speed:g}x, requests and total input / output tokens identical in every "
                   f"run of both clients (and every request's input length): "
                   f"{'met' if len(same) == 1 else 'MISSED'}")
        for key, label, target in (("median_ttft_ms", "median TTFT", True),
                                   ("median_tpot_ms", "median TPOT", True),
                                   ("server_median_ttft_ms", "server's median TTFT", False),
                                   ("server_median_tpot_ms", "server's median TPOT", False)):
            diff = (med(o, key) - med(v, key)) / med(v, key)
            verdict = (f" (target within 10%): {'met' if abs(diff) <= 0.10 else 'MISSED'}"
                       if target else " (the server under each client; no target)")
            out.append(f"- {speed:g}x, {label}: ours {100 * diff:+.1f}% vs vllm bench{verdict}")
        own = "; ".join(f"{c} {med(rs, 'tpot_vs_server_pct'):+.1f}% [{spread_pct(rs)}]"
                        for c, rs in zip(CLIENTS, (v, o)))
        out.append(f"- {speed:g}x, each client's median TPOT vs the server's own in the same "
                   f"run, median [min..max] over runs: {own} (what the client adds, the "
                   "server's state cancelled; no target)")
        worst = {c: max(r["late_max_ms"] for r in rs) for c, rs in zip(CLIENTS, (v, o))}
        out.append(f"- {speed:g}x, every request sent within 50 ms of the trace's schedule: "
                   + "; ".join(f"{c} worst {w:.1f} ms: {'met' if w <= 50 else 'MISSED'}"
                               for c, w in worst.items()))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--speed-ups", default="1,3")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--num-prompts", type=int, default=150)
    parser.add_argument("--save-runs", default=None, help="write every run's row to this JSON")
    parser.add_argument("--no-doc", action="store_true", help="print only; leave BENCHMARKS.md")
    parser.add_argument("--client-nice", type=int, default=None,
                        help="both clients' niceness (e.g. -10: ahead of the server on the "
                             "shared cores, as on a client machine of their own)")
    parser.add_argument("--pin", action="store_true",
                        help="the server on CPU 0 only, every client on CPU 1 only")
    parser.add_argument("--order", choices=("alternate", "random"), default="alternate",
                        help="which client goes first in each pair (run_order)")
    parser.add_argument("--order-seed", type=int, default=0, help="the seed of --order random")
    args = parser.parse_args()
    speeds = [float(s) for s in args.speed_ups.split(",")]
    command = "benchmarks/trace_parity.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    started, load_before = datetime.now(UTC), uptime()
    rows: list[dict[str, Any]] = []
    rng = random.Random(args.order_seed)
    orders = {speed: run_order(args.order, args.runs, rng) for speed in speeds}
    with tempfile.TemporaryDirectory(prefix="trace-parity-") as tmp:
        out = Path(tmp)
        with VllmServer(MODEL, out / "server.log", tuple(fine_buckets_flag()),
                        cpus=SERVER_CPUS if args.pin else None) as server:
            print(f"server ready at {server.base_url} (pid {server.pid}); warming up", flush=True)
            run_timed([sys.executable, "-m", "framework.cli", "bench", "--base-url",
                       server.base_url, "--model", str(MODEL), "--num-prompts", "30",
                       "--random-input-len", "256", "--random-output-len", "32",
                       "--max-concurrency", "8", "--seed", "999"],
                      cpus=CLIENT_CPUS if args.pin else None)
            for speed in speeds:
                for i, pair in enumerate(orders[speed]):
                    for place, name in enumerate(pair):
                        tag = f"{speed:g}x-{i}-{'vllm' if name == CLIENTS[0] else 'ours'}"
                        seed = speeds.index(speed) * args.runs + i
                        rows.append({**run_client(name, server.base_url, args, speed, seed,
                                                  out / f"{tag}.json"),
                                     "pair": i, "first": place == 0, "slot": 2 * i + place + 1})
                        r = rows[-1]
                        print(f"{tag} slot {r['slot']}: {r['completed']} req, "
                              f"{r['input_tokens']} in, "
                              f"{r['output_tokens']} out, TTFT {r['median_ttft_ms']:.2f} ms "
                              f"(server {r['server_median_ttft_ms']:.2f}), TPOT "
                              f"{r['median_tpot_ms']:.2f}, late max {r['late_max_ms']:.1f} ms, "
                              f"hits {r['hit_rate']:.3f}, server TPOT "
                              f"{r['server_median_tpot_ms']:.2f}", flush=True)
    if args.save_runs:
        Path(args.save_runs).write_text(json.dumps(rows, indent=1))
    preamble = (
        f"Command: `.venv/bin/python {command.strip()}` ({args.runs} runs per client and "
        f"speed-up, one of each per pair; order in pairs: "
        + (f"random, seed {args.order_seed}: " if args.order == "random" else "alternating: ")
        + "; ".join(f"{s:g}x " + " ".join("vo"[p[0] == CLIENTS[1]] + "vo"[p[1] == CLIENTS[1]]
                                          for p in orders[s]) for s in speeds)
        + " (v = vllm bench, o = ours)"
        + f"; the first {args.num_prompts} rows of `{args.trace.name}` at "
        + ", ".join(f"{s:g}x" for s in speeds) + " (--timed-trace-sec-multiplier 0.001 / "
        "speed-up), --temperature 0; ours with --seed <run>). One `vllm serve models/tiny-llama "
        "--enforce-eager --max-model-len 1024 --custom-histogram-buckets <fine>`. Cells: median "
        "over runs [min-max] of each run's value. Send lateness: (start_i - start_0) - "
        "(due_i - due_0) from the clients' own send stamps. "
        + ("Pinned: the server (all its processes) on CPU 0 only, each client on CPU 1 only."
           if args.pin else "Not pinned: server and clients share both CPUs.")
        + "\n\nMachine load: before "
        f"`{load_before}`; after `{uptime()}`.")
    section = []
    for speed in speeds:
        section += [f"Speed-up {speed:g}x:", "",
                    *speed_table([r for r in rows if r["speed_up"] == speed]), "",
                    *pooled_table([r for r in rows if r["speed_up"] == speed]), "",
                    *paired_table([r for r in rows if r["speed_up"] == speed], CLIENTS, PAIRED),
                    "",
                    *slot_table([r for r in rows if r["speed_up"] == speed]), ""]
    section += ["Targets:", "", *verdicts(rows), ""]
    text = "\n".join(section)
    print(preamble + "\n\n" + text)
    if not args.no_doc:
        append_section("Trace replay parity: vllm bench vs vllm-sweep bench, timed_trace",
                       preamble, text, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
