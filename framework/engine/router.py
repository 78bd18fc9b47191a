"""A minimal HTTP router: the entry point of a "replicas" trial (N identical vLLM servers).

The load generator talks to this router only; the router spreads `POST /v1/...` requests over
the backends with a policy and streams each answer back chunk by chunk (SSE is never
buffered). It is a plain aiohttp process, chosen so that the replicas shape has no Ray Serve
dependency in the measured path; its own overhead (one Python event loop copying every byte)
is to be measured against a bare server in docs/BENCHMARKS.md by whoever integrates it.

    python -m framework.engine.router --host 127.0.0.1 --port P \
        --backend http://127.0.0.1:A --backend http://127.0.0.1:B \
        [--policy round_robin|least_outstanding] [--ready-file PATH] [--prefill URL ...]

Once listening it prints one line `vllm-sweep router ready on http://HOST:PORT` (port 0 binds
a free port, shown there) and, with --ready-file, writes that URL to the file (atomic rename),
so a launcher waits on the file's appearance. SIGTERM or SIGINT closes it (exit 0).

Routes:
- `POST /v1/...`: to the backend the policy picks; the answer keeps the backend's status and
  content type and carries `X-Vllm-Sweep-Replica: <index>` (0-based, argv order). A backend
  that cannot be reached gives 502 with a one-line JSON error naming it. Backend connections
  are kept alive for KEEPALIVE_S only (below vLLM's 5 s), and a POST whose kept-alive
  connection the server closed as it went out is sent once more on a new one (`_send`). A
  client that disconnects cancels its forward: the backend connection closes, and vLLM aborts
  the request there, queued or running.
- other `GET /v1/...` (e.g. /v1/models): to backend 0.
- `GET /health`: 200 when every backend's /health answers 200, else 503 naming those that do not.
- `GET /metrics`: every backend's page merged by `merge_metrics` into one exposition: a sample
  with an `engine` label gets `engine="<replica>.<engine>"` (engine "0" of backend 1 is
  "1.0"), one without gets `replica="<index>"`, so no two series collide and
  framework/engine/server_metrics.py counts each replica's engines separately
  (`vllm:request_success_total` per `engine`).

Prefill/decode (disaggregated) mode, with one or more --prefill: the --backend servers decode.
`POST /v1/completions` and `/v1/chat/completions` first go to a prefill server (round robin over
them) as `prefill_body` makes them (max_tokens 1, and max_completion_tokens 1 for chat or when
present; stream false; no stream_options; the rest unchanged; the client's headers), and that
whole answer is read and dropped; then the client's original request goes to the decode server
the policy picks, streamed back as above. Every such answer carries `X-Vllm-Sweep-Prefill:
<prefill index>`; a prefill answer other than 200 comes back as is (an unreachable prefill
server: 502 naming it) and no decode server is contacted. Other routes use the decode servers
only; /health needs every prefill server too; /metrics adds the prefill pages with the prefix
`p` (engine "0" of prefill server 1 is "p1.0", a sample without engine gets replica="p1").
Moving the KV cache is the vLLM servers' business (their --kv-transfer-config, a connector that
saves it at prefill and loads it at decode, e.g. SharedStorageConnector or LMCache), not this
router's: it passes no kv_transfer_params (NixlConnector's handshake) and no request ids.

Policies (POLICIES, by name): `round_robin` cycles 0..N-1 whatever the load;
`least_outstanding` picks the backend with the fewest requests in flight, ties going to the
first index after its last pick (equal loads still alternate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any
from typing import Protocol

import aiohttp
from aiohttp import web
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from framework.base.vocabulary import REPLICA_HEADER

PREFILL_HEADER = "X-Vllm-Sweep-Prefill"
PREFILL_PATHS = ("/v1/completions", "/v1/chat/completions")  # what P/D mode prefills first
READY_PREFIX = "vllm-sweep router ready on "
CONNECT_TIMEOUT_S = 10.0  # to open a backend connection; streams themselves have no bound
PROBE_TIMEOUT_S = 10.0  # one backend's /health or /metrics answer
# An idle backend connection is reused for at most this long: below the server's own keep-alive
# (vLLM's uvicorn closes an idle one after VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s, vllm/envs.py), so
# the router does not send on a connection the server is closing (aiohttp's default is 15 s).
KEEPALIVE_S = 2.0
MAX_BODY_BYTES = 256 * 1024 * 1024  # long prompts and images: far above aiohttp's 1 MiB
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SHUTDOWN_GRACE_S = 1.0  # in-flight streams are not waited for at SIGTERM
# Not forwarded: hop-by-hop (RFC 9110 7.6.1), Host, and what aiohttp sets from the body.
_DROPPED = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                      "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
                      "host", "content-length", "accept-encoding"})


class Policy(Protocol):
    """Picks the backend of the next request from the requests in flight on each."""

    def pick(self, outstanding: Sequence[int]) -> int: ...


class RoundRobin:
    """0, 1, ..., N-1, 0, ... regardless of `outstanding`."""

    def __init__(self, n: int) -> None:
        self.n, self.next = n, 0

    def pick(self, outstanding: Sequence[int]) -> int:
        index, self.next = self.next, (self.next + 1) % self.n
        return index


class LeastOutstanding:
    """Fewest in flight; among ties, the first index after the last pick (cyclically)."""

    def __init__(self, n: int) -> None:
        self.n, self.last = n, n - 1

    def pick(self, outstanding: Sequence[int]) -> int:
        order = [(self.last + 1 + k) % self.n for k in range(self.n)]
        self.last = min(order, key=lambda i: outstanding[i])  # min keeps the first of ties
        return self.last


POLICIES: dict[str, Callable[[int], Policy]] = {
    "round_robin": RoundRobin,
    "least_outstanding": LeastOutstanding,
}


def router_argv(host: str, port: int, backends: Sequence[str], policy: str,
                ready_file: str | None, *, prefill: Sequence[str] = ()) -> list[str]:
    """The command line that runs this router with the current interpreter (`prefill`: P/D
    mode's prefill servers, `backends` then decode). Pure."""
    argv = [sys.executable, "-m", "framework.engine.router", "--host", host, "--port", str(port)]
    for backend in backends:
        argv += ["--backend", backend]
    argv += ["--policy", policy]
    for url in prefill:
        argv += ["--prefill", url]
    return argv + (["--ready-file", ready_file] if ready_file is not None else [])


def prefill_body(body: dict[str, Any], path: str = "/v1/completions") -> dict[str, Any]:
    """The body sent to a prefill server for `body` (a POST to `path`): max_tokens 1, and
    max_completion_tokens 1 when `body` has it or `path` is chat; stream false; no
    stream_options; every other field as in `body`. A new dict; `body` is not changed. Pure."""
    out = {k: v for k, v in body.items() if k != "stream_options"}
    out["max_tokens"] = 1
    if "max_completion_tokens" in body or path.rstrip("/").endswith("/chat/completions"):
        out["max_completion_tokens"] = 1
    out["stream"] = False
    return out


class _Families:
    """A prometheus_client Collector over given families (what generate_latest reads)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def merge_metrics(pages: Sequence[str | None], names: Sequence[str] | None = None) -> str:
    """One Prometheus text exposition from each backend's /metrics page, page i named
    `names[i]` (default: str(i), the replica's index).

    Each family keeps one HELP/TYPE (the first page's) followed by the samples of every page
    in page order; a sample's `engine` label becomes "<name>.<engine>", a sample without one
    gets `replica="<name>"` (replacing any such label). A page that is None (its scrape
    failed) is left out and named in a comment `# backend <name> unreachable`; one that does
    not parse, in `# backend <name> unparsable`. Pure.
    """
    if names is None:
        names = [str(i) for i in range(len(pages))]
    if len(names) != len(pages):
        raise ValueError(f"{len(pages)} pages but {len(names)} names")
    comments: list[str] = []
    merged: dict[str, Metric] = {}
    for replica, page in zip(names, pages):
        if page is None:
            comments.append(f"# backend {replica} unreachable\n")
            continue
        try:
            families = list(text_string_to_metric_families(page))
        except ValueError:
            comments.append(f"# backend {replica} unparsable\n")
            continue
        for family in families:
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation, family.type,
                                                    family.unit)
            for sample in family.samples:
                labels = dict(sample.labels)
                if "engine" in labels:
                    labels["engine"] = f"{replica}.{labels['engine']}"
                else:
                    labels["replica"] = str(replica)
                into.samples.append(sample._replace(labels=labels))
    return "".join(comments) + generate_latest(_Families(merged.values())).decode()


class Router:
    """The aiohttp application's state: backends (decode ones in P/D mode), policy, in-flight
    counts, prefill servers (none outside P/D mode) and their round robin, one session."""

    def __init__(self, backends: Sequence[str], policy: Policy, prefill: Sequence[str] = ()) -> None:
        self.backends = [b.rstrip("/") for b in backends]
        self.prefill = [u.rstrip("/") for u in prefill]
        self.policy = policy
        self.prefill_policy = RoundRobin(max(1, len(self.prefill)))
        self.outstanding = [0] * len(backends)
        self.session: aiohttp.ClientSession | None = None
        self.fresh: aiohttp.ClientSession | None = None  # new connections only: `_send`'s retry

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.add_routes([web.get("/health", self.health), web.get("/metrics", self.metrics),
                        web.post("/v1/{tail:.*}", self.forward),
                        web.get("/v1/{tail:.*}", self.forward)])
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        # No total timeout (generations run for minutes), no connection cap (hundreds of streams).
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
            timeout=timeout)
        self.fresh = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True), timeout=timeout)

    async def _close(self, _: web.Application) -> None:
        for session in (self.session, self.fresh):
            if session is not None:
                await session.close()

    def _client(self) -> aiohttp.ClientSession:
        assert self.session is not None, "the session opens at the application's start-up"
        return self.session

    async def _send(self, method: str, url: str, headers: dict[str, str],
                    data: bytes) -> aiohttp.ClientResponse:
        """The backend's response, its headers read (the body still to read; the caller
        releases it). A kept-alive connection that the server closed as the request went out
        (disconnected or reset before any byte of the answer) is retried once on a new
        connection, as RFC 9112 section 9.3.1 allows and as aiohttp itself does for
        idempotent methods only (client.py, `retry_persistent_connection`); the load generator
        does the same (load/loadgen.py, ClosedWhileIdle). A server that cannot be reached at
        all (ClientConnectorError) is not retried."""
        try:
            return await self._client().request(method, url, headers=headers, data=data)
        except aiohttp.ClientConnectorError:
            raise
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            assert self.fresh is not None, "the session opens at the application's start-up"
            return await self.fresh.request(method, url, headers=headers, data=data)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """POST: to the policy's pick (in P/D mode after a prefill, `_prefill`); GET: to
        backend 0. Streams the answer as it arrives."""
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED}
        extra: dict[str, str] = {}
        if self.prefill and request.method == "POST" and request.path in PREFILL_PATHS:
            prefilled, refusal = await self._prefill(request, body, headers)
            if refusal is not None:
                return refusal
            extra[PREFILL_HEADER] = str(prefilled)
        index = self.policy.pick(self.outstanding) if request.method == "POST" else 0
        backend = self.backends[index]
        response: web.StreamResponse | None = None
        self.outstanding[index] += 1
        try:
            async with await self._send(request.method, backend + str(request.rel_url),
                                        headers, body) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    REPLICA_HEADER: str(index), **extra,
                    "Content-Type": upstream.headers.get("Content-Type", "application/octet-stream")})
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError as exc:
            if response is not None and response.prepared:
                # Mid-stream the client must see a truncated body, not a made-up status; a
                # client that left (its transport closing) is no backend failure.
                if request.transport is not None and not request.transport.is_closing():
                    print(f"router: backend {index} ({backend}) failed mid-stream: {exc!r}",
                          file=sys.stderr, flush=True)
                    request.transport.close()
                return response
            return _error(502, f"backend {index} ({backend}) unreachable: {exc!r}",
                          {REPLICA_HEADER: str(index), **extra})
        finally:
            self.outstanding[index] -= 1

    async def _prefill(self, request: web.Request, body: bytes,
                       headers: dict[str, str]) -> tuple[int, web.Response | None]:
        """P/D mode's first leg: `prefill_body` of the request to the next prefill server, its
        whole answer read (and dropped). (that server's index, None) when it answered 200, else
        the response the client gets instead (the server's own, 502 if unreachable, 400 for a
        body that is no JSON object), and no decode server is contacted."""
        try:
            parsed = json.loads(body)
        except ValueError as exc:
            return -1, _error(400, f"request body is not JSON: {exc}", {})
        if not isinstance(parsed, dict):
            return -1, _error(400, "request body is not a JSON object", {})
        index = self.prefill_policy.pick([0] * len(self.prefill))
        server, tag = self.prefill[index], {PREFILL_HEADER: str(index)}
        send = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        send["Content-Type"] = "application/json"
        try:
            async with await self._send(
                    "POST", server + str(request.rel_url), send,
                    json.dumps(prefill_body(parsed, request.path)).encode()) as answer:
                content = await answer.read()  # to its end, whatever it is (SSE, JSON)
                if answer.status == 200:
                    return index, None
                return index, web.Response(status=answer.status, body=content, headers={
                    **tag, "Content-Type": answer.headers.get("Content-Type", "text/plain")})
        except aiohttp.ClientError as exc:
            return index, _error(502, f"prefill {index} ({server}) unreachable: {exc!r}", tag)

    async def _get(self, url: str, path: str) -> tuple[int, str]:
        """(status, body) of GET url+path; an unreachable server raises OSError/ClientError."""
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        async with self._client().get(url + path, timeout=timeout) as r:
            return r.status, await r.text()

    async def _get_all(self, path: str) -> list[tuple[int, str] | BaseException]:
        """GET path of every backend, then of every prefill server, in that order."""
        return await asyncio.gather(*(self._get(url, path) for url in self.backends + self.prefill),
                                    return_exceptions=True)

    async def health(self, _: web.Request) -> web.Response:
        """200 when every backend's and prefill server's /health is 200; else 503 listing the
        failing ones."""
        names = [f"backend {i} ({u})" for i, u in enumerate(self.backends)] + \
                [f"prefill {i} ({u})" for i, u in enumerate(self.prefill)]
        failing = []
        for name, got in zip(names, await self._get_all("/health")):
            if isinstance(got, BaseException) or got[0] != 200:
                why = f"status {got[0]}" if not isinstance(got, BaseException) else repr(got)
                failing.append(f"{name}: {why}")
        if failing:
            return web.Response(status=503, text="unhealthy: " + "; ".join(failing) + "\n")
        return web.Response(text="")

    async def metrics(self, _: web.Request) -> web.Response:
        """Every backend's and prefill server's /metrics, relabelled and merged (merge_metrics;
        names "0", "1", ... then "p0", "p1", ...)."""
        pages = [got[1] if not isinstance(got, BaseException) and got[0] == 200 else None
                 for got in await self._get_all("/metrics")]
        names = [str(i) for i in range(len(self.backends))] + \
                [f"p{i}" for i in range(len(self.prefill))]
        text = await asyncio.get_running_loop().run_in_executor(None, merge_metrics, pages, names)
        return web.Response(body=text.encode(), headers={"Content-Type": METRICS_CONTENT_TYPE})


def _error(status: int, message: str, headers: dict[str, str]) -> web.Response:
    """A one-line JSON error {"error": message}."""
    return web.Response(status=status, text=json.dumps({"error": message}) + "\n",
                        content_type="application/json", headers=headers)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m framework.engine.router", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True, help="0: any free port")
    p.add_argument("--backend", action="append", required=True, help="base URL; repeat per replica")
    p.add_argument("--policy", choices=sorted(POLICIES), default="round_robin")
    p.add_argument("--ready-file", default=None, help="gets the router's URL once it listens")
    p.add_argument("--prefill", action="append", default=[],
                   help="P/D mode: a prefill server's base URL (repeat); --backend then decodes")
    return p.parse_args(list(argv))


def write_ready_file(path: str, url: str) -> None:
    """Write `url` to `path` so that the file appears complete: a new temporary file beside
    it, then an atomic rename."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "x") as f:
        f.write(url + "\n")
    os.replace(tmp, path)


async def serve(args: argparse.Namespace) -> None:
    """Listen, announce readiness (stdout line, ready file), serve until SIGTERM/SIGINT."""
    router = Router(args.backend, POLICIES[args.policy](len(args.backend)), args.prefill)
    # A client that disconnects cancels its forward (handler_cancellation), which closes the
    # backend connection: vLLM aborts the request there, queued or running, as if the client
    # had been connected to it (vllm/entrypoints/serve/utils/api_utils.py `with_cancellation`).
    runner = web.AppRunner(router.app(), access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S,
                           handler_cancellation=True)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await web.TCPSite(runner, args.host, args.port).start()
        host = f"[{args.host}]" if ":" in args.host else args.host
        url = f"http://{host}:{runner.addresses[0][1]}"
        print(READY_PREFIX + url, flush=True)
        if args.ready_file:
            write_ready_file(args.ready_file, url)
        await stop.wait()
    finally:
        await runner.cleanup()  # closes the site, then the application (its client session)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve on uvloop where installed (vLLM's own dependency: its API server runs on it),
    else on asyncio's loop: the router's CPU per streamed chunk is what it costs a trial."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args))
    else:
        uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
