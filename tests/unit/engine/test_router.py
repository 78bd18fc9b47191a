"""framework/engine/router.py: its policies, metrics merge and prefill body (pure, table tests),
and the router process itself in front of two FakeEngines, in P/D mode in front of three (one
prefill, two decode), in front of a stub backend whose stream waits on the test (so
chunk-by-chunk forwarding is checked on an event, not on timing), and in front of stubs that
close a kept-alive connection as the next request arrives (the keep-alive race, made certain)."""

from __future__ import annotations

import asyncio
import copy
import http.server
import json
import os
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client import Counter
from prometheus_client import Gauge
from prometheus_client import Histogram
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from framework.cluster.ports import pick_port
from framework.engine import control
from framework.engine.router import POLICIES
from framework.engine.router import PREFILL_HEADER
from framework.engine.router import READY_PREFIX
from framework.engine.router import REPLICA_HEADER
from framework.engine.router import merge_metrics
from framework.engine.router import prefill_body
from framework.engine.router import router_argv
from framework.engine.server_metrics import parse_metrics
from framework.load.loadgen import wait_ready
from framework.trial.replicas import start_router
from framework.trial.replicas import stop_router
from tests.engines import start_engine
from tests.engines import stop_engine

GUARD_S = 60.0  # failure guard only: every wait below ends on an event
API_KEY = "router-test-key"  # the FakeEngines' VLLM_API_KEY: Authorization must pass the router


@pytest.mark.parametrize(("name", "loads", "picks"), [
    ("round_robin", [[0, 0, 0]] * 4, [0, 1, 2, 0]),
    ("round_robin", [[5, 0, 0], [5, 1, 0], [5, 1, 1], [5, 1, 1]], [0, 1, 2, 0]),  # load ignored
    ("least_outstanding", [[0, 0, 0]] * 4, [0, 1, 2, 0]),  # ties alternate
    ("least_outstanding", [[2, 0, 1], [2, 1, 1], [2, 1, 1], [2, 2, 2]], [1, 2, 1, 2]),
    ("least_outstanding", [[1, 1], [0, 1], [0, 0], [0, 0]], [0, 0, 1, 0]),
])
def test_policies(name, loads, picks):
    policy = POLICIES[name](len(loads[0]))
    assert [policy.pick(load) for load in loads] == picks


def page(values: dict[str, float], engines: tuple[str, ...] = ("0",)) -> str:
    """A vLLM-like /metrics page: a counter and a histogram per engine, an unlabelled gauge."""
    registry = CollectorRegistry()
    success = Counter("vllm:request_success", "Finished requests.", ["engine", "finished_reason"],
                      registry=registry)
    latency = Histogram("vllm:e2e_request_latency_seconds", "Latency.", ["engine"],
                        buckets=[0.1, 1.0], registry=registry)
    cpu = Gauge("process_cpu_seconds", "CPU.", registry=registry)
    for engine in engines:
        success.labels(engine, "length").inc(values["success"])
        latency.labels(engine).observe(values["latency"])
    cpu.set(values["cpu"])
    return generate_latest(registry).decode()


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text)
            for s in f.samples]


def test_merge_metrics_relabels_each_replica_and_keeps_one_header_per_family():
    merged = merge_metrics([page({"success": 3, "latency": 0.5, "cpu": 1.5}),
                            page({"success": 5, "latency": 2.0, "cpu": 2.5})])
    headers = [line for line in merged.splitlines() if line.startswith("# ")]
    assert len(headers) == len(set(headers)), "each HELP/TYPE once"
    assert merged.count("# TYPE vllm:request_success_total counter") == 1
    got = samples(merged)  # parses again
    success = {s[1]["engine"]: s[2] for s in got if s[0] == "vllm:request_success_total"}
    assert success == {"0.0": 3.0, "1.0": 5.0}
    assert {s[1]["engine"] for s in got if s[0] == "vllm:request_success_created"} == {"0.0", "1.0"}
    assert {(s[1]["replica"], s[2]) for s in got if s[0] == "process_cpu_seconds"} == {("0", 1.5),
                                                                                        ("1", 2.5)}
    for suffix in ("_bucket", "_sum", "_count"):
        name = "vllm:e2e_request_latency_seconds" + suffix
        assert {s[1]["engine"] for s in got if s[0] == name} == {"0.0", "1.0"}
    inf = {s[1]["engine"]: s[2] for s in got
           if s[0].endswith("_bucket") and s[1]["le"] == "+Inf"}
    assert inf == {"0.0": 1.0, "1.0": 1.0}
    series = [(s[0], tuple(sorted(s[1].items()))) for s in got]
    assert len(series) == len(set(series)), "no two series collide"
    values = parse_metrics(merged)
    assert values["vllm:request_success_total@engine=1.0"] == 5.0


@pytest.mark.parametrize(("pages", "comments", "engines"), [
    ([page({"success": 2, "latency": 0.5, "cpu": 1.0}, engines=("0", "1"))], [], {"0.0", "0.1"}),
    # 2 replicas of data parallel 2: four engines, none collapsed
    ([page({"success": 2, "latency": 0.5, "cpu": 1.0}, engines=("0", "1")),
      page({"success": 3, "latency": 0.5, "cpu": 1.0}, engines=("0", "1"))], [],
     {"0.0", "0.1", "1.0", "1.1"}),
    ([None, page({"success": 2, "latency": 0.5, "cpu": 1.0})], ["# backend 0 unreachable"], {"1.0"}),
    (["}{ not a page", None], ["# backend 0 unparsable", "# backend 1 unreachable"], set()),
    # FakeEngine's page: no HELP/TYPE at all
    (['vllm:num_requests_running 1\nvllm:request_success_total{engine="0",finished_reason="length"} 4\n',
      'vllm:num_requests_running 2\nvllm:request_success_total{engine="0",finished_reason="length"} 3\n'],
     [], {"0.0", "1.0"}),
])
def test_merge_metrics_single_failed_and_headerless_pages(pages, comments, engines):
    merged = merge_metrics(pages)
    assert [line for line in merged.splitlines()
            if line.startswith("# backend")] == comments
    got = samples(merged)
    assert {s[1]["engine"] for s in got if s[0] == "vllm:request_success_total"} == engines
    assert all(("engine" in s[1]) != ("replica" in s[1]) for s in got)


def test_merge_metrics_with_names_prefixes_prefill_pages():
    pages = [page({"success": 2, "latency": 0.5, "cpu": 1.0}),
             page({"success": 3, "latency": 0.5, "cpu": 2.0}),
             page({"success": 7, "latency": 0.5, "cpu": 3.0}, engines=("0", "1")), None]
    merged = merge_metrics(pages, ["0", "1", "p0", "p1"])
    got = samples(merged)
    success = {s[1]["engine"]: s[2] for s in got if s[0] == "vllm:request_success_total"}
    assert success == {"0.0": 2.0, "1.0": 3.0, "p0.0": 7.0, "p0.1": 7.0}
    assert {s[1]["replica"] for s in got if s[0] == "process_cpu_seconds"} == {"0", "1", "p0"}
    assert [ln for ln in merged.splitlines() if ln.startswith("# backend")] == [
        "# backend p1 unreachable"]
    assert merge_metrics(pages[:2], None) == merge_metrics(pages[:2])
    with pytest.raises(ValueError):
        merge_metrics(pages, ["0"])


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5,
        "seed": 7, "max_completion_tokens": 300, "stream": True,
        "stream_options": {"include_usage": True}}


@pytest.mark.parametrize(("body", "path", "expected"), [
    ({"model": "m", "prompt": "hello", "max_tokens": 64, "stream": True,
      "stream_options": {"include_usage": True}, "temperature": 0.0, "seed": 1},
     "/v1/completions",
     {"model": "m", "prompt": "hello", "max_tokens": 1, "stream": False, "temperature": 0.0,
      "seed": 1}),
    ({"model": "m", "prompt": [1, 2, 3]}, "/v1/completions",  # no max_tokens nor stream given
     {"model": "m", "prompt": [1, 2, 3], "max_tokens": 1, "stream": False}),
    (CHAT, "/v1/chat/completions",
     {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5,
      "seed": 7, "max_tokens": 1, "max_completion_tokens": 1, "stream": False}),
    ({"model": "m", "messages": [], "max_tokens": 9}, "/v1/chat/completions",  # chat: set anyway
     {"model": "m", "messages": [], "max_tokens": 1, "max_completion_tokens": 1, "stream": False}),
    ({"prompt": "p", "max_completion_tokens": 9, "stream": False}, "/v1/completions",  # present
     {"prompt": "p", "max_tokens": 1, "max_completion_tokens": 1, "stream": False}),
])
def test_prefill_body(body, path, expected):
    before = copy.deepcopy(body)
    assert prefill_body(body, path) == expected
    assert body == before, "the input is not mutated"


def test_prefill_body_default_path_is_completions():
    assert prefill_body({"prompt": "p", "stream_options": {}}) == {"prompt": "p", "max_tokens": 1,
                                                                   "stream": False}


def test_router_argv():
    argv = router_argv("127.0.0.1", 8100, ["http://a:1", "http://b:2"], "least_outstanding", None)
    assert argv[1:] == ["-m", "framework.engine.router", "--host", "127.0.0.1", "--port", "8100",
                        "--backend", "http://a:1", "--backend", "http://b:2",
                        "--policy", "least_outstanding"]
    assert router_argv("h", 1, ["u"], "round_robin", "/r")[-2:] == ["--ready-file", "/r"]
    assert "--prefill" not in router_argv("h", 1, ["u"], "round_robin", None)
    argv = router_argv("h", 1, ["http://d:1"], "round_robin", "/r",
                       prefill=["http://p:1", "http://p:2"])
    assert argv[3:] == ["--host", "h", "--port", "1", "--backend", "http://d:1",
                        "--policy", "round_robin", "--prefill", "http://p:1",
                        "--prefill", "http://p:2", "--ready-file", "/r"]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=GUARD_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def complete(url: str, key: str = API_KEY) -> tuple[int, str, str, list[str]]:
    """A streaming completion: (status, replica header, content type, its `data:` lines)."""
    status, headers, lines = complete_with_headers(url, key)
    return status, headers[REPLICA_HEADER], headers["Content-Type"], lines


def complete_with_headers(url: str, key: str = API_KEY):
    """A streaming completion: (status, its response headers, its `data:` lines)."""
    body = {"model": "fake", "prompt": "hello there", "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=GUARD_S) as r:
        lines = [ln.decode().strip() for ln in r if ln.startswith(b"data:")]
        return r.status, r.headers, lines


def start_fake_engines(n: int, tmp_path: Path, engines: list[subprocess.Popen]) -> list[str]:
    """n FakeEngines (fast, VLLM_API_KEY=API_KEY), each appended to `engines` as it starts (the
    caller stops them); their URLs once each answers /health."""
    env = dict(os.environ, FAKE_ENGINE_STARTUP_S="0", FAKE_ENGINE_TTFT_MS="1", FAKE_ENGINE_TPOT_MS="1")
    env.pop(control.SOCKET_VAR, None)
    env["VLLM_API_KEY"] = API_KEY
    ports: list[int] = []
    for _ in range(n):
        ports.append(pick_port("127.0.0.1", ports))
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    for i, port in enumerate(ports):
        argv = ["--model", "fake", "--host", "127.0.0.1", "--port", str(port)]
        engines.append(start_engine("framework.engine.fake_engine", argv, env,
                                    tmp_path / f"engine{i}.log"))
    for proc, url in zip(engines[-n:], urls):
        assert asyncio.run(wait_ready(url, GUARD_S, is_alive=lambda p=proc: p.poll() is None))
    return urls


@pytest.fixture
def engines(tmp_path):
    """`engines(n)`: the URLs of n more FakeEngines (start_fake_engines); their processes in
    `engines.processes`; every one stopped after the test."""
    processes: list[subprocess.Popen] = []

    def start(n: int) -> list[str]:
        return start_fake_engines(n, tmp_path, processes)

    start.processes = processes  # type: ignore[attr-defined]
    yield start
    for proc in processes:
        stop_engine(proc)


@pytest.fixture
def router(tmp_path):
    """`router(backends, prefill=())`: the product's router (trial.replicas.start_router) in
    front of them, as (process, URL) once ready, its log's first line its ready line; stopped
    after the test."""
    started: list[subprocess.Popen] = []
    log = tmp_path / "router.log"

    def start(backends: list[str], prefill: tuple[str, ...] = ()):
        proc, url = start_router("127.0.0.1", backends, "round_robin", log, prefill=prefill)
        started.append(proc)
        assert log.read_text().splitlines()[0] == READY_PREFIX + url
        return proc, url

    yield start
    for proc in started:
        stop_router(proc)


def stopped_cleanly(proc: subprocess.Popen) -> bool:
    """The product's stop (SIGTERM by pid): nothing left, and the router exited 0."""
    return stop_router(proc) == [] and proc.returncode == 0


@pytest.mark.timeout(120)
def test_router_in_front_of_two_fake_engines(engines, router):
    backends = engines(2)
    proc, url = router(backends)

    answers = [complete(url) for _ in range(8)]
    assert [a[1] for a in answers] == ["0", "1"] * 4
    for status, _, content_type, lines in answers:
        assert status == 200 and content_type.startswith("text/event-stream")
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][len("data:"):])["usage"]["completion_tokens"] == 4
    with pytest.raises(urllib.error.HTTPError) as err:
        complete(url, key="wrong")  # the backend's own status comes back (not counted)
    assert err.value.code == 401 and err.value.headers[REPLICA_HEADER] == "0"

    status, text = get(f"{url}/metrics")
    assert status == 200
    values = parse_metrics(text)
    per_replica = {k: v for k, v in values.items() if "@engine=" in k}
    assert per_replica == {"vllm:request_success_total@engine=0.0": 4.0,
                           "vllm:request_success_total@engine=1.0": 4.0}
    assert sum(per_replica.values()) == 8

    assert get(f"{url}/health") == (200, "")
    stop_engine(engines.processes[1])
    status, text = get(f"{url}/health")
    assert status == 503 and "backend 1" in text and backends[1] in text and "backend 0" not in text
    status, text = get(f"{url}/metrics")
    assert status == 200 and "# backend 1 unreachable" in text
    assert stopped_cleanly(proc)


@pytest.mark.timeout(120)
def test_router_in_prefill_decode_mode_in_front_of_three_fake_engines(engines, router):
    prefill, *decode = engines(3)
    proc, url = router(decode, prefill=(prefill,))

    answers = [complete_with_headers(url) for _ in range(4)]
    assert [a[1][REPLICA_HEADER] for a in answers] == ["0", "1", "0", "1"]
    assert [a[1][PREFILL_HEADER] for a in answers] == ["0"] * 4
    for status, headers, lines in answers:
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][len("data:"):])["usage"]["completion_tokens"] == 4

    def direct(server: str) -> dict[str, float]:
        """The server's own /metrics: parse_metrics's values, plus generated tokens."""
        status, text = get(f"{server}/metrics")
        assert status == 200
        tokens = [s[2] for s in samples(text) if s[0] == "vllm:generation_tokens_total"]
        return {**parse_metrics(text), "tokens": sum(tokens)}
    # FakeEngine honours max_tokens: the prefill server generated one token per request
    assert direct(prefill)["vllm:request_success_total@engine=0"] == 4
    assert direct(prefill)["tokens"] == 4
    assert [direct(d)["vllm:request_success_total@engine=0"] for d in decode] == [2, 2]
    assert [direct(d)["tokens"] for d in decode] == [8, 8]

    status, text = get(f"{url}/metrics")
    assert status == 200
    per_engine = {k: v for k, v in parse_metrics(text).items() if "@engine=" in k}
    assert per_engine == {"vllm:request_success_total@engine=0.0": 2.0,
                          "vllm:request_success_total@engine=1.0": 2.0,
                          "vllm:request_success_total@engine=p0.0": 4.0}
    assert 'replica="p0"' in text

    # a prefill refusal comes back as is, and no decode server is asked
    with pytest.raises(urllib.error.HTTPError) as err:
        complete(url, key="wrong")
    assert err.value.code == 401 and err.value.headers[PREFILL_HEADER] == "0"
    assert err.value.headers[REPLICA_HEADER] is None
    assert [direct(d)["vllm:request_success_total@engine=0"] for d in decode] == [2, 2]

    assert get(f"{url}/health") == (200, "")
    stop_engine(engines.processes[0])  # the prefill server
    status, text = get(f"{url}/health")
    assert status == 503 and f"prefill 0 ({prefill})" in text and "backend" not in text
    with pytest.raises(urllib.error.HTTPError) as err:
        complete(url)
    assert err.value.code == 502 and err.value.headers[PREFILL_HEADER] == "0"
    error = json.loads(err.value.read())["error"]
    assert "prefill 0" in error and prefill in error
    assert [direct(d)["vllm:request_success_total@engine=0"] for d in decode] == [2, 2]
    assert stopped_cleanly(proc)


class StubBackend(http.server.BaseHTTPRequestHandler):
    """POST: one SSE event, then (after the test sets `release`) `data: [DONE]`; HTTP/1.0, so
    the body ends when the connection closes. GET /health: 200."""

    release = threading.Event()
    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"first": true}\n\n')
        self.wfile.flush()
        assert self.release.wait(GUARD_S)
        self.wfile.write(b"data: [DONE]\n\n")

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.mark.timeout(120)
def test_router_streams_chunk_by_chunk_and_answers_502_for_a_dead_backend(router):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StubBackend)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dead = f"http://127.0.0.1:{pick_port('127.0.0.1', [server.server_port])}"  # nothing listens
    try:
        proc, url = router([f"http://127.0.0.1:{server.server_port}", dead])
        req = urllib.request.Request(f"{url}/v1/completions", data=b'{"stream": true}',
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=GUARD_S) as r:
            assert r.headers[REPLICA_HEADER] == "0"
            # the first event arrives while the backend still holds the rest
            assert r.readline() == b'data: {"first": true}\n'
            StubBackend.release.set()
            assert r.read() == b"\ndata: [DONE]\n\n"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=GUARD_S)
        assert err.value.code == 502 and err.value.headers[REPLICA_HEADER] == "1"
        error = json.loads(err.value.read())["error"]
        assert "backend 1" in error and dead in error
        status, text = get(f"{url}/health")
        assert status == 503 and dead in text and "backend 0" not in text
        assert stopped_cleanly(proc)
    finally:
        server.shutdown()
        server.server_close()


class OneExchangePerConnection(socketserver.StreamRequestHandler):
    """An HTTP/1.1 backend that answers the first request of each connection (200, a JSON body,
    kept alive) and closes the connection when its next request arrives, before any byte of an
    answer: what vLLM's uvicorn does to a request sent just as its keep-alive timeout fires,
    made certain. Counts, on its server, the requests it answered and those it dropped."""

    def handle(self) -> None:
        if not self._read_request():
            return
        body = b'{"ok": true}'
        # counted before the answer goes out (the drop before the close): once the client
        # holds the answer, the counts hold it too
        self.server.answered += 1  # type: ignore[attr-defined]
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        self.wfile.flush()
        if self.rfile.readline():  # a second request on this connection: closed unanswered
            self.server.dropped += 1  # type: ignore[attr-defined]

    def _read_request(self) -> bool:
        """Read one request (line, headers, Content-Length body); False at end of stream."""
        if not self.rfile.readline():
            return False
        length = 0
        while (line := self.rfile.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        self.rfile.read(length)
        return True


@pytest.mark.timeout(120)
def test_a_kept_alive_connection_closed_as_a_request_goes_out_is_retried_on_a_new_one(router):
    """Guards the CI red of stop 47 (a P/D trial's quality probe got `502 prefill 0
    unreachable: ServerDisconnectedError`): the router resent a POST on a pooled connection the
    server had closed. Each leg (prefill, decode) meets a closed connection from the second
    request on (one kept alive for KEEPALIVE_S at most: requests are sent until both legs met
    one, normally at the second) and retries it once on a new connection; the client sees 200
    every time, and each leg answered each request once."""
    servers = []
    for _ in range(2):
        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), OneExchangePerConnection)
        server.daemon_threads = True
        server.answered = server.dropped = 0  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    prefill, decode = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
    try:
        proc, url = router([decode], prefill=(prefill,))
        req = urllib.request.Request(f"{url}/v1/completions", data=b'{"prompt": "hi"}',
                                     headers={"Content-Type": "application/json"})
        sent = 0
        while sent < 2 or min(s.dropped for s in servers) == 0:
            with urllib.request.urlopen(req, timeout=GUARD_S) as r:
                assert (r.status, r.read()) == (200, b'{"ok": true}')
            sent += 1
        # each leg met a dropped connection, and answered every request anew all the same
        assert [s.answered for s in servers] == [sent, sent]
        assert all(0 < s.dropped < sent for s in servers)
        assert stopped_cleanly(proc)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.mark.timeout(120)
def test_the_routers_standalone_files_run_it_from_a_folder_of_their_own(tmp_path):
    """Guards the k8s P/D export's router (fleet/k8s_pd.py): the files of
    engine/router_source.py, alone on PYTHONPATH, import and run the router (it listens and
    writes its ready file), with nothing else of this project imported."""
    from framework.engine.router_source import standalone_files

    root = tmp_path / "root"
    for path, text in standalone_files().items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(root)}
    probe = subprocess.run([sys.executable, "-c", "import sys, framework.engine.router as r; "
                            "print(r.__file__); print(sorted(m for m in sys.modules "
                            "if m.startswith('framework')))"],
                           cwd=root, env=env, capture_output=True, text=True, timeout=GUARD_S)
    assert probe.returncode == 0, probe.stderr
    where, modules = probe.stdout.splitlines()
    assert where == str(root / "framework/engine/router.py")
    assert eval(modules) == ["framework", "framework.base", "framework.base.exports",
                             "framework.base.vocabulary", "framework.engine",
                             "framework.engine.router"]
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "framework.engine.router", "--host",
                             "127.0.0.1", "--port", "0", "--backend", "http://127.0.0.1:9",
                             "--ready-file", str(ready)], cwd=root, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + GUARD_S
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert get(f"{ready.read_text().strip()}/health")[0] == 503  # its backend is absent
    finally:
        assert stopped_cleanly(proc)
