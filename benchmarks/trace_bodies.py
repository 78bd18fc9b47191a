"""Trace replay parity (issue #18): the HTTP requests `vllm bench serve --dataset-name
timed_trace` and `vllm-sweep bench --dataset-name timed_trace` send for the same trace rows.

    .venv/bin/python benchmarks/trace_bodies.py [--trace datasets/mooncake_sample.jsonl]
        [--num-prompts 150] [--no-doc]

No vLLM server: each client, with trace_parity.py's workload flags at 1x (ours with --seed 0),
runs under `nice -n 19` against a stub on 127.0.0.1 (a thread of this process) that records
every request (method, path, headers, JSON body, arrival time, the client's TCP port) and
answers a minimal valid SSE completion stream (max_tokens content chunks, usage, [DONE]).
The requests are paired by trace row (vllm bench's x-request-id ends in the row's index; ours
are matched by prompt length and max_tokens, unique in the sample) and compared field by
field. A token-id prompt is compared by type and length only: both clients draw each block's
ids from a per-run salt (vLLM: Python's hash(); ours: --seed). Also reported: requests other
than the completions, rows that reached the stub out of file order, each client's TCP
connections (against a stub that answers at once, not a model) and arrival lateness against
the trace's schedule. Appends the result to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    from record import ROOT
    from record import append_section
    from record import uptime
    from trace_parity import TRACE
    from trace_parity import TRACE_MS
    from trace_parity import workload
except ModuleNotFoundError:  # imported as benchmarks.trace_bodies
    from benchmarks.record import ROOT
    from benchmarks.record import append_section
    from benchmarks.record import uptime
    from benchmarks.trace_parity import TRACE
    from benchmarks.trace_parity import TRACE_MS
    from benchmarks.trace_parity import workload
from framework.config.trace_spec import TimedTraceSpec
from framework.load.trace import TraceRow
from framework.load.trace import read_trace
from framework.load.trace import send_offsets

CLIENTS = ("vllm bench serve", "vllm-sweep bench")
SKIPPED_HEADERS = frozenset({"host", "content-length"})  # differ by port and by prompt ids
REQUEST_ID = re.compile(r"^(.*?)[0-9a-f]{8}-(\d+)$")      # vllm bench: bench-<8 hex>-<row>


def prompt_shape(prompt: Any) -> str:
    """How a prompt is sent: ``ids[N]`` (a token-id list of N), ``text[N chars]``, else its
    JSON type. Pure."""
    if isinstance(prompt, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                        for x in prompt):
        return f"ids[{len(prompt)}]"
    if isinstance(prompt, str):
        return f"text[{len(prompt)} chars]"
    return type(prompt).__name__


def field_diffs(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    """Each top-level JSON field whose value differs, in sorted name order, as
    ``name: vllm <value>, ours <value>`` (``absent`` when missing; values as JSON); the prompt
    compares by prompt_shape. Pure."""
    out = []
    for name in sorted(set(theirs) | set(ours)):
        a, b = (theirs.get(name, ...), ours.get(name, ...))
        if name == "prompt":
            a, b = (prompt_shape(v) if v is not ... else v for v in (a, b))
        if a != b or type(a) is not type(b):
            show = ["absent" if v is ... else v if name == "prompt" else json.dumps(v)
                    for v in (a, b)]
            out.append(f"{name}: vllm {show[0]}, ours {show[1]}")
    return out


def header_diffs(theirs: Mapping[str, str], ours: Mapping[str, str]) -> list[str]:
    """Each header (name lower-cased; Host and Content-Length skipped) whose value differs,
    as field_diffs words it; an x-request-id of vllm bench's form shows as
    ``<prefix><run>-<row>``. Pure."""
    a = {k.lower(): v for k, v in theirs.items() if k.lower() not in SKIPPED_HEADERS}
    b = {k.lower(): v for k, v in ours.items() if k.lower() not in SKIPPED_HEADERS}
    out = []
    for name in sorted(set(a) | set(b)):
        x, y = (d.get(name, "absent") for d in (a, b))
        if name == "x-request-id":
            x, y = (REQUEST_ID.sub(r"\1<run>-<row>", v) for v in (x, y))
        if x != y:
            out.append(f"header {name}: vllm {x}, ours {y}")
    return out


def row_of_request_id(value: str) -> int | None:
    """The trace row (0-based) vllm bench's x-request-id names, None for another form."""
    found = REQUEST_ID.match(value)
    return int(found.group(2)) if found else None


def out_of_order(rows: Sequence[int]) -> list[tuple[int, int]]:
    """(arrival position, row) of every request that did not arrive as row = position."""
    return [(pos, row) for pos, row in enumerate(rows) if pos != row]


def tally(diffs: Sequence[Sequence[str]]) -> list[str]:
    """``n/N  line`` for each distinct line over N request pairs, most frequent first."""
    counts = Counter(line for pair in diffs for line in pair)
    return [f"{n}/{len(diffs)}  {line}" for line, n in
            sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


class Stub(http.server.BaseHTTPRequestHandler):
    """Records each request into ``records``; a POST gets max_tokens content chunks, usage and
    [DONE] (chunked, kept alive), any GET an empty 200."""

    protocol_version = "HTTP/1.1"
    records: list[dict[str, Any]] = []

    def _record(self, body: bytes) -> None:
        self.records.append({"t": time.perf_counter(), "method": self.command,
                             "path": self.path, "peer": self.client_address[1],
                             "headers": dict(self.headers.items()), "body": body.decode()})

    def do_GET(self) -> None:
        self._record(b"")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._record(body)
        request = json.loads(body)
        tokens = int(request.get("max_tokens") or 1)
        prompt = request.get("prompt")
        events = [{"id": "cmpl-1", "choices": [{"index": 0, "text": " x"}]}] * tokens + [
            {"id": "cmpl-1", "choices": [], "usage": {
                "prompt_tokens": len(prompt) if isinstance(prompt, list) else 1,
                "completion_tokens": tokens}}, "[DONE]"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in events:
            data = f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def stub() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A Stub on 127.0.0.1 (any free port) in a thread: (base URL, its records)."""
    records: list[dict[str, Any]] = []
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), type("Handler", (Stub,), {"records": records}))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", records
    finally:
        server.shutdown()
        server.server_close()


def capture(name: str, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """Every request one client sends for the trace, as the stub recorded them."""
    with stub() as (url, records):
        if name == CLIENTS[0]:
            argv = [str(Path(sys.executable).with_name("vllm")), "bench", "serve", "--backend",
                    "openai", "--base-url", url, *workload(args, 1.0), "--disable-tqdm"]
        else:
            argv = [sys.executable, "-m", "framework.cli", "bench", "--base-url", url,
                    *workload(args, 1.0), "--seed", "0", "--result-json", str(tmp / "ours.json")]
        subprocess.run(["nice", "-n", "19", *argv], cwd=ROOT, check=True, timeout=600,
                       capture_output=True, text=True)
        return list(records)


def shape(record: Mapping[str, Any]) -> tuple[str, int]:
    body = json.loads(record["body"])
    return prompt_shape(body["prompt"]), body["max_tokens"]


def report(theirs: list[dict[str, Any]], ours: list[dict[str, Any]],
           rows: Sequence[TraceRow]) -> list[str]:
    """The comparison's lines (markdown) for the two clients' recorded requests."""
    posts = {c: [r for r in recs if r["method"] == "POST"] for c, recs in zip(CLIENTS, (theirs,
                                                                                         ours))}
    by_row = {row_of_request_id(r["headers"].get("x-request-id", "")): r
              for r in posts[CLIENTS[0]]}
    row_of_shape = {shape(r): i for i, r in by_row.items()}
    order = {CLIENTS[0]: [row_of_request_id(r["headers"].get("x-request-id", ""))
                          for r in posts[CLIENTS[0]]],
             CLIENTS[1]: [row_of_shape.get(shape(r), -1) for r in posts[CLIENTS[1]]]}
    pairs = [field_diffs(json.loads(by_row[i]["body"]), json.loads(r["body"]))
             + header_diffs(by_row[i]["headers"], r["headers"])
             for i, r in zip(order[CLIENTS[1]], posts[CLIENTS[1]]) if i in by_row]
    example = json.loads(posts[CLIENTS[0]][0]["body"]), json.loads(posts[CLIENTS[1]][0]["body"])
    lines = ["Row 0's bodies (prompt ids trimmed to 3):", ""]
    for client, body in zip(CLIENTS, example):
        trimmed = {**body, "prompt": body["prompt"][:3] + ["..."]}
        lines.append(f"- {client}: `{json.dumps(trimmed)}`")
    lines += ["", f"Differences over the {len(pairs)} row pairs (count/pairs):", "", "```",
              *tally(pairs), "```", ""]
    due = send_offsets(rows)
    for client in CLIENTS:
        recs, rows_seen = posts[client], order[client]
        late = [1000 * ((r["t"] - recs[0]["t"]) - (due[i] - due[rows_seen[0]]))
                for r, i in zip(recs, rows_seen)]
        other = Counter(f"{r['method']} {r['path']}" for r in (theirs if client == CLIENTS[0]
                                                                 else ours) if r["method"] != "POST")
        lines.append(f"- {client}: {len(recs)} completions; other requests "
                     f"{dict(other) or 'none'}; out of file order (position, row) "
                     f"{out_of_order(rows_seen) or 'none'}; {len({r['peer'] for r in recs})} TCP "
                     f"connections; arrival lateness vs the schedule median "
                     f"{statistics.median(late):.2f} ms, max {max(late):.2f} ms")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--num-prompts", type=int, default=150)
    parser.add_argument("--no-doc", action="store_true", help="print only; leave BENCHMARKS.md")
    args = parser.parse_args()
    command = "benchmarks/trace_bodies.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    before = uptime()
    with tempfile.TemporaryDirectory() as tmp:
        theirs, ours = (capture(c, args, Path(tmp)) for c in CLIENTS)
    rows = read_trace(args.trace, TimedTraceSpec(sec_multiplier=TRACE_MS), args.num_prompts)
    lines = report(theirs, ours, rows)
    print("\n".join(lines))
    if not args.no_doc:
        append_section("Trace replay parity: the requests each client sends", (
            f"Command: `.venv/bin/python {command.strip()}` (no vLLM server: each client under "
            f"`nice -n 19` against a recording stub on 127.0.0.1; trace_parity.py's flags at 1x, "
            f"ours with --seed 0; the first {args.num_prompts} rows of "
            f"`{args.trace.name}`). Arrival order, connections and lateness are as the stub "
            f"saw them from niced clients on a shared machine: not a lateness measurement "
            f"(trace_parity.py's is). Machine load: before `{before}`; after `{uptime()}`."),
            "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
