"""ResponseReader (httptools-based HTTP/1.1 response framing), fed in arbitrary pieces."""

from __future__ import annotations

import pytest

from framework.http_client import HTTPError, ResponseReader


def pieces(data: bytes, cut: int) -> list[bytes]:
    """``data`` cut at ``cut`` and in 7-byte pieces after it (covers splits anywhere)."""
    return [data[:cut]] + [data[i:i + 7] for i in range(cut, len(data), 7)]


def read_response(raw: bytes, cut: int, eof: bool = False) -> tuple[ResponseReader, bytes]:
    body = bytearray()
    reader = ResponseReader(body.extend)
    for piece in pieces(raw, cut):
        reader.feed(piece)
    if eof:
        reader.eof()
    return reader, bytes(body)


CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked"
           b"\r\n\r\n5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld!\r\n0\r\nX-Trailer: 1\r\n\r\n")


@pytest.mark.parametrize(("raw", "eof", "body", "keep_alive"), [
    pytest.param(CHUNKED, False, b"hello world!", True, id="chunked-with-extension-and-trailer"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabcde", False, b"abcde", True,
                 id="content-length"),
    pytest.param(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end", True,
                 b"until the end", False, id="close-delimited"),
    pytest.param(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                 False, b"ok", True, id="interim-100-skipped"),
    pytest.param(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", False, b"ok", False,
                 id="http-1.0-no-keep-alive"),
    pytest.param(b"HTTP/1.1 204 No Content\r\n\r\n", False, b"", True, id="no-content"),
])
def test_response_reader_frames_bodies(raw: bytes, eof: bool, body: bytes, keep_alive: bool):
    for cut in range(len(raw) + 1):
        reader, got = read_response(raw, cut, eof)
        assert reader.done and got == body and reader.status in (200, 204), cut
        assert reader.keep_alive == keep_alive


def test_response_reader_ignores_bytes_after_the_body() -> None:
    reader, body = read_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", 0)
    assert reader.done and body == b"ok"


def test_response_reader_keeps_an_error_body() -> None:
    raw = b"HTTP/1.1 404 Not Found\r\nContent-Length: 11\r\n\r\nno such url"
    reader, body = read_response(raw, 20)
    assert (reader.status, reader.reason, reader.error_body, body) == (
        404, "Not Found", b"no such url", b"")


@pytest.mark.parametrize(("raw", "eof", "match"), [
    (b"SSH-2.0-OpenSSH\r\n\r\n", False, "bad status line"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", False, "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n", False, "CRLF"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", True, "closed mid-body"),
    (b"HTTP/1.1 200 O", True, "before the response head"),
])
def test_response_reader_rejects_malformed_responses(raw: bytes, eof: bool, match: str) -> None:
    with pytest.raises(HTTPError, match=match):
        read_response(raw, 3, eof)


def test_response_reader_keeps_only_the_start_of_a_long_error_body() -> None:
    long_body = b"x" * 10000
    raw = b"HTTP/1.1 500 Oops\r\nContent-Length: 10000\r\n\r\n" + long_body
    reader, body = read_response(raw, 50)
    assert reader.done and body == b""
    assert reader.error_body == long_body[:ResponseReader.MAX_ERROR_BODY]


def test_response_reader_passes_the_body_consumers_error_through() -> None:
    def consumer(data: bytes) -> None:
        raise ValueError("bad json")

    reader = ResponseReader(consumer)
    with pytest.raises(ValueError, match="bad json"):
        reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


def test_response_reader_rejects_an_endless_head() -> None:
    reader = ResponseReader(lambda data: None)
    reader.feed(b"HTTP/1.1 200 OK\r\n")
    with pytest.raises(HTTPError, match="longer than"):
        for _ in range(ResponseReader.MAX_HEAD // 1000 + 2):
            reader.feed(b"X-Filler: " + b"a" * 988 + b"\r\n")
