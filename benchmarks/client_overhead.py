"""Where a client's TTFT comes from, against a server whose timing is known: `vllm bench serve` vs
`vllm-sweep bench` on a fake streaming server (no model), with and without CPU hogs.

    .venv/bin/python benchmarks/client_overhead.py [--runs 3] [--spin 0,2] [--no-doc]

The fake server (an asyncio thread of this process, HTTP/1.1 keep-alive, chunked SSE) answers
POST /v1/completions like vLLM's stream: the first content chunk at the first tick of a global
clock (--tick-ms, 4) at least --ttft-ms (20) after it has read the whole request, then one
chunk per tick until max_tokens, then usage and [DONE]; every active stream writes on the same
tick, as a batched engine does. Other paths answer 404 (vllm bench then skips its prompt
alignment and spec-decode metrics). For every request it records when it had read the request
and when it wrote the first chunk, on time.perf_counter (CLOCK_MONOTONIC, the clients' clock).

Each client runs with benchmarks/parity.py's transport probe; both splits are printed:
- server view: send lead = request read by the server - client's start; server = first chunk
  written - request read (the same for both clients by construction); receive lag = client's
  first-token stamp - first chunk written;
- probe view (inside the client): send lead = bytes written - start, wire, receive lag.
`--spin N` runs N busy-loop processes (each `python -c "while True: pass"`, stopped by PID
after the runs) while the clients run: the CPU a vLLM engine takes from a client on a 2-core
machine, without a model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any

try:
    from loadgen_parity import MODEL
    from loadgen_parity import run_timed
    from parity import OURS_ENTRY
    from parity import VLLM_ENTRY
    from parity import decompose
    from parity import spread
    from record import append_section
    from record import uptime
except ModuleNotFoundError:  # imported as benchmarks.client_overhead
    from benchmarks.loadgen_parity import MODEL
    from benchmarks.loadgen_parity import run_timed
    from benchmarks.parity import OURS_ENTRY
    from benchmarks.parity import VLLM_ENTRY
    from benchmarks.parity import decompose
    from benchmarks.parity import spread
    from benchmarks.record import append_section
    from benchmarks.record import uptime
from framework.cluster.ports import pick_port

CLIENTS = ("vllm bench serve", "vllm-sweep bench")


def sse(payload: dict[str, Any]) -> bytes:
    data = f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class FakeServer:
    """The fake streaming server on 127.0.0.1 in a thread; `pairs` holds (read, first write)."""

    def __init__(self, ttft_s: float, tick_s: float) -> None:
        self.ttft_s, self.tick_s = ttft_s, tick_s
        self.port = pick_port("127.0.0.1", [])
        self.url = f"http://127.0.0.1:{self.port}"
        self.pairs: list[tuple[float, float]] = []
        self.active: list[dict[str, Any]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self.ticker.cancel()
            self.server.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", self.port)
        self.ticker = self.loop.create_task(self._ticker())

    async def _ticker(self) -> None:
        tick = time.perf_counter()
        while True:
            tick += self.tick_s
            await asyncio.sleep(max(0.0, tick - time.perf_counter()))
            now = time.perf_counter()
            for stream in list(self.active):
                if now < stream["due"]:
                    continue
                if stream["sent"] == 0:
                    self.pairs.append((stream["read"], now))
                stream["writer"].write(sse({"id": "c", "choices": [{"index": 0, "text": "x"}]}))
                stream["sent"] += 1
                if stream["sent"] == stream["n"]:
                    usage = {"prompt_tokens": 1, "completion_tokens": stream["n"]}
                    stream["writer"].write(sse({"id": "c", "choices": [], "usage": usage})
                                           + b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                    self.active.remove(stream)
                    stream["done"].set()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = next((int(h.split(":", 1)[1]) for h in lines
                               if h.lower().startswith("content-length:")), 0)
                body = await reader.readexactly(length)
                read = time.perf_counter()
                if not lines[0].startswith("POST /v1/completions "):
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                n = int(json.loads(body)["max_tokens"])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                done = asyncio.Event()
                self.active.append({"writer": writer, "read": read, "due": read + self.ttft_s,
                                    "n": n, "sent": 0, "done": done})
                await done.wait()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def run_client(name: str, server: FakeServer, args: argparse.Namespace, out: Path
               ) -> dict[str, Any]:
    probe_out = out.with_suffix(".probe.json")
    os.environ["PARITY_PROBE_OUT"] = str(probe_out)
    common = ["--model", str(MODEL), "--dataset-name", "random", "--random-input-len", "256",
              "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
              "--max-concurrency", str(args.max_concurrency), "--ignore-eos", "--seed", "0",
              "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50",
              "--save-detailed", "--temperature", "0", "--base-url", server.url]
    if name == CLIENTS[0]:
        argv = [sys.executable, "-c", VLLM_ENTRY, "--backend", "openai", *common, "--save-result",
                "--result-dir", str(out.parent), "--result-filename", out.name, "--disable-tqdm"]
    else:
        argv = [sys.executable, "-c", OURS_ENTRY, *common, "--result-json", str(out)]
    server.pairs = []
    _, cpu = run_timed(argv)
    result = json.loads(out.read_text())
    if (result["completed"], result["failed"]) != (args.num_prompts, 0):
        raise RuntimeError(f"{name}: {result['completed']} of {args.num_prompts} succeeded")
    seen = decompose(result["start_times"], result["ttfts"], [list(p) for p in server.pairs])
    probe = decompose(result["start_times"], result["ttfts"], json.loads(probe_out.read_text()))
    return {"client": name, "whole_cpu_s": cpu, "median_ttft_ms": result["median_ttft_ms"],
            "output_throughput": result["output_throughput"],
            **{f"server_view_{k}": v for k, v in seen.items()},
            **{f"probe_{k}": v for k, v in probe.items()}}


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| hogs | client | mean TTFT ms | send lead (server view) | server | receive lag "
             "(server view) | send lead (probe) | receive lag (probe) | matched | output tok/s |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for spin in dict.fromkeys(r["spin"] for r in rows):
        for client in CLIENTS:
            rs = [r for r in rows if r["spin"] == spin and r["client"] == client]
            lines.append(
                f"| {spin} | {client} | {spread(rs, 'server_view_matched_ttft_ms', 2)} | "
                f"{spread(rs, 'server_view_send_lead_ms', 3)} | "
                f"{spread(rs, 'server_view_wire_ms', 2)} | "
                f"{spread(rs, 'server_view_receive_lag_ms', 3)} | "
                f"{spread(rs, 'probe_send_lead_ms', 3)} | {spread(rs, 'probe_receive_lag_ms', 3)} | "
                f"{min(r['server_view_matched'] for r in rs):.2f} | "
                f"{spread(rs, 'output_throughput', 0)} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--spin", default="0,2", help="comma-separated numbers of CPU hogs")
    parser.add_argument("--num-prompts", type=int, default=300)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--tick-ms", type=float, default=4.0)
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    started, load_before = datetime.now(UTC), uptime()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="overhead-") as tmp, \
            FakeServer(args.ttft_ms / 1000, args.tick_ms / 1000) as server:
        for spin in (int(s) for s in args.spin.split(",")):
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(spin)]
            try:
                for i in range(args.runs):
                    for name in (CLIENTS if i % 2 == 0 else CLIENTS[::-1]):
                        tag = f"{spin}-{i}-{'vllm' if name == CLIENTS[0] else 'ours'}"
                        row = run_client(name, server, args, Path(tmp) / f"{tag}.json")
                        rows.append({"spin": spin, **row})
                        print(f"{tag}: TTFT {row['server_view_matched_ttft_ms']:.2f} ms, lead "
                              f"{row['server_view_send_lead_ms']:.3f}, lag "
                              f"{row['server_view_receive_lag_ms']:.3f}", flush=True)
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait()
    command = "benchmarks/client_overhead.py " + " ".join(sys.argv[1:])
    preamble = (
        f"Command: `.venv/bin/python {command.strip()}` ({args.runs} runs per client and number "
        f"of CPU hogs, alternating; {args.num_prompts} random prompts, 256 in / "
        f"{args.output_len} out, --max-concurrency {args.max_concurrency}, --temperature 0; "
        f"fake server: first chunk >= {args.ttft_ms:g} ms after the request is read, one chunk "
        f"per {args.tick_ms:g} ms tick). Per run the mean over requests (ms), then median "
        f"[min-max] over runs.\n\nMachine load: before `{load_before}`; after `{uptime()}`.")
    text = "\n".join(table(rows))
    print(preamble + "\n\n" + text)
    if not args.no_doc:
        append_section("Client overhead against a fake server of known timing", preamble, text,
                       started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
