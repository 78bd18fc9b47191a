"""Trace replay parity (issue #18), the A/A control: how far apart are the server's medians
in two back-to-back runs of the SAME client? trace_parity.py compares the server under
vllm bench with the server under ours pair by pair; a pair difference only says something
about the client if it is larger than this.

    .venv/bin/python benchmarks/trace_parity_aa.py [--pairs 6] [--speed-up 3]
        [--clients ours,vllm] [--pin] [--no-doc]

One server as trace_parity.py's (pinned with --pin, warmed up alike); per client in
`--clients`, `--pairs` pairs of two runs of that client, each run exactly trace_parity.py's
run_client (ours with its own --seed, never reused: no run replays an earlier run's blocks).
Reports each pair's second run vs its first (server's median TPOT and TTFT) and their
absolute values' median [min-max] per client. Appends to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
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
    from record import append_section
    from record import uptime
    from trace_parity import CLIENT_CPUS
    from trace_parity import CLIENTS
    from trace_parity import SERVER_CPUS
    from trace_parity import TRACE
    from trace_parity import run_client
except ModuleNotFoundError:  # imported as benchmarks.trace_parity_aa
    from benchmarks.loadgen_parity import MODEL
    from benchmarks.loadgen_parity import VllmServer
    from benchmarks.loadgen_parity import run_timed
    from benchmarks.record import append_section
    from benchmarks.record import uptime
    from benchmarks.trace_parity import CLIENT_CPUS
    from benchmarks.trace_parity import CLIENTS
    from benchmarks.trace_parity import SERVER_CPUS
    from benchmarks.trace_parity import TRACE
    from benchmarks.trace_parity import run_client
from framework.engine.server_histograms import fine_buckets_flag

SHORT = {"vllm": CLIENTS[0], "ours": CLIENTS[1]}
KEYS = (("server_median_tpot_ms", "server's median TPOT"),
        ("server_median_ttft_ms", "server's median TTFT"),
        ("median_tpot_ms", "client's median TPOT"))


def pair_diffs(rows: list[dict[str, Any]], key: str) -> list[float]:
    """Per pair (rows in run order, two per pair): (second - first) / first, in %."""
    return [100 * (b[key] - a[key]) / a[key] for a, b in zip(rows[::2], rows[1::2])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--speed-up", type=float, default=3.0)
    parser.add_argument("--clients", default="ours,vllm")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--num-prompts", type=int, default=150)
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    args.client_nice = None
    clients = [SHORT[c] for c in args.clients.split(",")]
    command = "benchmarks/trace_parity_aa.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    started, load_before = datetime.now(UTC), uptime()
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in clients}
    with tempfile.TemporaryDirectory(prefix="trace-parity-aa-") as tmp:
        out = Path(tmp)
        with VllmServer(MODEL, out / "server.log", tuple(fine_buckets_flag()),
                        cpus=SERVER_CPUS if args.pin else None) as server:
            run_timed([sys.executable, "-m", "framework.cli", "bench", "--base-url",
                       server.base_url, "--model", str(MODEL), "--num-prompts", "30",
                       "--random-input-len", "256", "--random-output-len", "32",
                       "--max-concurrency", "8", "--seed", "999"],
                      cpus=CLIENT_CPUS if args.pin else None)
            seed = 1000  # above trace_parity.py's seeds
            for client in clients:
                for i in range(2 * args.pairs):
                    seed += 1
                    r = run_client(client, server.base_url, args, args.speed_up, seed,
                                   out / f"{client.split()[0]}-{i}.json")
                    runs[client].append(r)
                    print(f"{client} run {i}: server TPOT {r['server_median_tpot_ms']:.2f} ms, "
                          f"TTFT {r['server_median_ttft_ms']:.2f} ms", flush=True)
    lines = ["| client, pair: 2nd run vs 1st | " + " | ".join(label for _, label in KEYS) + " |",
             "| --- |" + " --- |" * len(KEYS)]
    for client, rows in runs.items():
        diffs = [pair_diffs(rows, key) for key, _ in KEYS]
        for i, pair in enumerate(zip(*diffs)):
            lines.append(f"| {client}, pair {i} | " + " | ".join(f"{d:+.1f}%" for d in pair) + " |")
        cells = []
        for size in ([abs(d) for d in of_key] for of_key in diffs):
            cells.append(f"{statistics.median(size):.1f} [{min(size):.1f}-{max(size):.1f}]")
        lines.append(f"| {client}, size of the difference, % | " + " | ".join(cells) + " |")
    preamble = (f"Command: `.venv/bin/python {command.strip()}` ({args.pairs} pairs of two runs "
                f"of one client at {args.speed_up:g}x, per client in order "
                f"{', '.join(clients)}; trace_parity.py's runs, server, warm-up"
                + (", pinned" if args.pin else "") + f").\n\nMachine load: before "
                f"`{load_before}`; after `{uptime()}`.")
    text = "\n".join(lines)
    print(preamble + "\n\n" + text)
    if not args.no_doc:
        append_section("Trace replay parity: the same client twice (A/A)", preamble, text,
                       started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
