"""The one HTTP/1.1 client of the project, on asyncio protocols: every request sent to a
server (the load, /health, /metrics) goes through it.

Contract: ``ConnectionPool(base_url)`` keeps keep-alive connections to one ``http`` or
``https`` server; ``Connection.exchange(request, on_body)`` writes one request and returns
a future that resolves to the finished ``ResponseReader`` (status, reason, headers,
``keep_alive``, ``error_body``) or fails (HTTPError-derived ConnectionError, or the
``on_body`` consumer's own exception). A reused keep-alive connection that the server closes
before sending a single byte of the response fails with ``ClosedWhileIdle``: the server
closed it for idleness (uvicorn's keep-alive timeout, 5 s in vLLM) as the request went out,
and never read the request; the caller may send it again on a new connection
(``ConnectionPool.connect``). A 200 response's body goes to ``on_body`` as it
arrives, inside ``data_received``. ``ConnectionPool.exchange`` sends a request on a pooled
connection with that one resend. ``get(url, timeout_s)`` is a one-shot GET returning a
``Response`` (status, reason, body); ``get_sync`` runs it from synchronous code (threads).

Why it exists: parsing and timing inside ``data_received`` means a streamed chunk costs no
task wake-up. On this project's 2-core machine that halved the load generator's CPU per
output token versus aiohttp's client (docs/BENCHMARKS.md), which matters because the
client shares the CPUs with the server it measures. The HTTP/1.1 parsing itself is done by
httptools (llhttp, the parser uvicorn uses); this module only adapts it.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

import httptools


class HTTPError(Exception):
    """The bytes received are not a well-formed HTTP/1.1 response."""


class ClosedWhileIdle(ConnectionError):
    """A reused keep-alive connection closed by the server before any byte of the response."""


class _MessageComplete(Exception):
    """Raised from the parser's on_message_complete to stop it at the end of the response."""


class ResponseReader:
    """Incremental reader of one HTTP/1.1 response, parsed by ``httptools``.

    A 200 response's body goes to ``on_body`` as it arrives (chunked, Content-Length or
    until the connection closes); another status's first MAX_ERROR_BODY bytes are kept in
    ``error_body``. ``feed`` takes bytes split anywhere; ``done`` is set when the body is
    complete; bytes after that are ignored. ``eof()`` is the connection's end: it completes
    a body framed by the close and raises HTTPError if the response was cut short. 1xx
    interim responses are skipped. Malformed bytes raise HTTPError; an exception of
    ``on_body`` propagates unchanged. Pure: no I/O, no clock.
    """

    MAX_HEAD = 65536
    MAX_ERROR_BODY = 4096

    def __init__(self, on_body: Callable[[bytes], None]) -> None:
        self.consumer = on_body
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.keep_alive = True
        self.done = False
        self.error_body = b""
        self._phase = "status"  # status | head | body | chunk-size | chunk-data
        self._close_delimited = False
        self._head_bytes = 0
        self.received = False  # any byte of the response
        self._parser = httptools.HttpResponseParser(self)

    def feed(self, data: bytes) -> None:
        if self.done:
            return
        self.received = self.received or bool(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if self.done:
                return  # stopped on purpose at the end of the response
            if exc.__context__ is not None:
                raise exc.__context__ from None  # the on_body consumer's own error
            raise HTTPError(f"{exc}") from None
        except httptools.HttpParserUpgrade:
            raise HTTPError("unexpected protocol upgrade") from None
        except httptools.HttpParserError as exc:
            raise HTTPError(f"{self._what_failed()} ({exc})") from None
        if self._phase in ("status", "head"):
            self._head_bytes += len(data)
            if self._head_bytes > self.MAX_HEAD:
                raise HTTPError(f"response head longer than {self.MAX_HEAD} bytes")

    def _what_failed(self) -> str:
        return {
            "status": "bad status line",
            "head": "bad response head",
            "chunk-size": "bad chunk size line",
            "chunk-data": "chunk not followed by CRLF, or bad trailer",
        }.get(self._phase, "bad response body")

    # --- httptools callbacks --------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        self.reason += reason.decode("latin-1")
        self._phase = "head"

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").strip().lower()] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # interim response: the real head follows
            self.reason, self.headers, self._phase = "", {}, "status"
            return
        self.status = status
        self.keep_alive = self._parser.should_keep_alive()
        encoding = self.headers.get("transfer-encoding", "").lower()
        if encoding:
            chunked = encoding.rsplit(",", 1)[-1].strip() == "chunked"
            self._close_delimited = not chunked
        else:
            chunked = False
            self._close_delimited = "content-length" not in self.headers and status not in (
                204, 304)
        self._phase = "chunk-size" if chunked else "body"

    def on_chunk_header(self) -> None:
        self._phase = "chunk-data"

    def on_chunk_complete(self) -> None:
        self._phase = "chunk-size"

    def on_body(self, data: bytes) -> None:
        if self.status == 200:
            self.consumer(data)
        elif len(self.error_body) < self.MAX_ERROR_BODY:
            self.error_body += data[:self.MAX_ERROR_BODY - len(self.error_body)]

    def on_message_complete(self) -> None:
        if self.status:  # not the end of an interim response
            self.done = True
            raise _MessageComplete

    def eof(self) -> None:
        if self.done:
            return
        if self._close_delimited:
            self.done = True
            return
        what = "before the response head" if self._phase in ("status", "head") else "mid-body"
        raise HTTPError(f"connection closed {what}")


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; runs one exchange (request -> response) at a time.

    The response is parsed inside ``data_received`` (ResponseReader -> ``on_body``), so a
    streamed chunk costs no task wake-up; only the end of the response wakes the caller.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.exchanges = 0  # finished exchanges: more than 0, the connection is a reused one
        self._reader: ResponseReader | None = None
        self._waiter: asyncio.Future[ResponseReader] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def exchange(self, request: bytes,
                 on_body: Callable[[bytes], None]) -> asyncio.Future[ResponseReader]:
        """Send ``request``; the future resolves to the finished ResponseReader."""
        self._reader = ResponseReader(on_body)
        self._waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(request)
        return self._waiter

    def data_received(self, data: bytes) -> None:
        reader, waiter = self._reader, self._waiter
        if reader is None or waiter is None or waiter.done():
            return
        try:
            reader.feed(data)
        except Exception as exc:  # noqa: BLE001 - raised to the caller, the body consumer's too (bad JSON)
            self._finish(exc)
            return
        if reader.done:
            self._finish(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._reader is None:
            return
        if self.exchanges and not self._reader.received:
            self._finish(ClosedWhileIdle(
                "reused keep-alive connection closed before any byte of the response"))
            return
        try:
            self._reader.eof()
            self._finish(None)
        except HTTPError as err:
            self._finish(ConnectionError(f"{err}{f' ({exc})' if exc else ''}"))

    def _finish(self, exc: BaseException | None) -> None:
        reader, waiter = self._reader, self._waiter
        self._reader = self._waiter = None
        if reader is None or waiter is None or waiter.done():  # set and cleared together
            return
        if exc is None:
            self.exchanges += 1
            waiter.set_result(reader)
        else:
            waiter.set_exception(exc)

    @property
    def reusable(self) -> bool:
        return not self.closed and self._reader is None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class ConnectionPool:
    """Keep-alive connections to one server (``http`` or ``https`` base URL, optional path
    prefix); idle connections are reused, one exchange per connection at a time. Requests
    carry ``Authorization: Bearer <api_key>`` only when a non-empty ``api_key`` is given: no
    credential is ever taken from the environment."""

    def __init__(self, base_url: str, api_key: str | None = None) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base URL must be http(s)://host[:port][/prefix], got {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = url.scheme == "https"
        self.prefix = url.path.rstrip("/")
        self.headers = f"Host: {url.netloc}\r\nUser-Agent: vllm-sweep\r\n"
        if api_key:
            self.headers += f"Authorization: Bearer {api_key}\r\n"
        self._idle: list[Connection] = []

    def request(self, path: str, body: bytes) -> bytes:
        """A streaming POST of a JSON ``body`` to ``path`` (under the prefix), kept alive."""
        return (f"POST {self.prefix}{path} HTTP/1.1\r\n{self.headers}"
                f"Accept: text/event-stream\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body

    def get_request(self, path: str) -> bytes:
        """A GET of ``path`` (under the prefix) asking the server to close afterwards."""
        return (f"GET {self.prefix}{path} HTTP/1.1\r\n{self.headers}"
                "Connection: close\r\n\r\n").encode("latin-1")

    async def get(self) -> Connection:
        """An idle connection if one is open, else a new one."""
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable:
                return conn
            conn.close()
        return await self.connect()

    async def connect(self) -> Connection:
        """A new connection."""
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            Connection, self.host, self.port, ssl=self.ssl or None,
            server_hostname=self.host if self.ssl else None)
        return conn

    async def exchange(self, request: bytes, on_body: Callable[[bytes], None]
                       ) -> tuple[Connection, ResponseReader]:
        """Send ``request`` on an idle connection (else a new one) and return that connection,
        for ``put``, with its finished ResponseReader. A reused connection closed before any
        byte of the response (``ClosedWhileIdle``: the server never read the request) is
        closed and the request sent once more, on a new connection (RFC 9112 9.3.1); once
        only. On any failure the connection is closed and the error raised."""
        conn = await self.get()
        try:
            try:
                return conn, await conn.exchange(request, on_body)
            except ClosedWhileIdle:
                conn.close()
                conn = await self.connect()
                return conn, await conn.exchange(request, on_body)
        except BaseException:
            conn.close()
            raise

    def put(self, conn: Connection, reuse: bool) -> None:
        if reuse and conn.reusable:
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


@dataclass(frozen=True, repr=False)
class Response:
    """A finished GET: the body is whole for a 200, its first ResponseReader.MAX_ERROR_BODY
    bytes for any other status."""

    status: int
    reason: str
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        # Short on purpose: asyncio.run() may format its result's repr (see loadgen.LoadResult).
        return f"Response({self.status} {self.reason}, {len(self.body)} bytes)"


async def get(url: str, timeout_s: float, api_key: str | None = None) -> Response:
    """``GET url`` on a fresh connection, closed afterwards; ``timeout_s`` bounds the whole
    exchange, connecting included. Any status is returned, none raised; ``api_key`` as in
    ConnectionPool. Raises ValueError for a URL not ``http(s)://host[:port]...``, else only
    OSError: TimeoutError after ``timeout_s``, ConnectionError for a refused, reset, cut-short
    or malformed response."""
    split = urllib.parse.urlsplit(url)
    pool = ConnectionPool(f"{split.scheme}://{split.netloc}", api_key)
    target = (split.path or "/") + (f"?{split.query}" if split.query else "")
    body = bytearray()
    conn: Connection | None = None
    try:
        async with asyncio.timeout(timeout_s):
            conn = await pool.get()
            reader: ResponseReader = await conn.exchange(pool.get_request(target), body.extend)
    except HTTPError as exc:
        raise ConnectionError(f"malformed response to GET {url}: {exc}") from None
    finally:
        if conn is not None:
            conn.close()
    return Response(reader.status, reader.reason,
                    bytes(body) if reader.status == 200 else reader.error_body)


def get_sync(url: str, timeout_s: float, api_key: str | None = None) -> Response:
    """``get`` for synchronous code, e.g. a thread (not one running an event loop): each call
    runs on an event loop of its own. Same result and errors as ``get``."""
    return asyncio.run(get(url, timeout_s, api_key))


async def post_json(pool: ConnectionPool, path: str, payload: bytes, timeout_s: float) -> Response:
    """A non-streaming ``POST`` of the JSON bytes ``payload`` to ``path`` (under the pool's
    prefix) on one of the pool's keep-alive connections: the body is sent exactly as given (no
    field added or dropped), the answer read whole. ``timeout_s`` bounds the exchange,
    connecting included. Any status is returned, none raised (the body of a non-200 is its
    first ResponseReader.MAX_ERROR_BODY bytes); errors as ``get``: TimeoutError,
    ConnectionError. The connection goes back to the pool only after a complete keep-alive
    200. A reused connection closed before any byte of the answer is replaced once
    (``ConnectionPool.exchange``), as for the load generator's requests."""
    request = (f"POST {pool.prefix}{path} HTTP/1.1\r\n{pool.headers}"
               f"Accept: application/json\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(payload)}\r\n\r\n").encode("latin-1") + payload
    body = bytearray()
    conn: Connection | None = None
    reuse = False
    try:
        async with asyncio.timeout(timeout_s):
            conn, reader = await pool.exchange(request, body.extend)
        reuse = reader.keep_alive and reader.status == 200
    except HTTPError as exc:
        raise ConnectionError(f"malformed response to POST {path}: {exc}") from None
    finally:
        if conn is not None:
            pool.put(conn, reuse)
    return Response(reader.status, reader.reason,
                    bytes(body) if reader.status == 200 else reader.error_body)
