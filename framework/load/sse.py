"""The streaming parser of the load generator: one SSE stream of vLLM's OpenAI completions or
chat API, fed with body bytes as they arrive, timing each content chunk (``SSEState``).

Counts what `vllm bench serve` counts (``vllm/benchmarks/lib/endpoint_request_func.py``): every
message with non-empty ``choices`` is a content chunk, ``usage`` gives the token counts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Clock = Callable[[], float]


def error_text(error: Any) -> str:
    """Readable text of an ``error`` object from an SSE event."""
    if isinstance(error, dict):
        message = error.get("message") or json.dumps(error)
        kind = error.get("type") or error.get("code")
        if kind:
            return f"server error in stream ({kind}): {message}"
        return f"server error in stream: {message}"
    return f"server error in stream: {error}"


# Byte patterns that cannot occur inside a JSON string value (its quotes are escaped), so a
# message holding CONTENT_MARK but neither other mark is a content chunk without usage or
# error: it is timed without being parsed (parsing was half of the client's CPU per chunk).
# Servers that format JSON with spaces or send "usage": null simply take the parsing path.
CONTENT_MARK, USAGE_MARK, ERROR_MARK = b'"choices":[{', b'"usage"', b'"error"'


class SSEState:
    """What one SSE stream has said so far; fed with body bytes as they arrive.

    Only ``data:`` lines count (blank lines, ``:`` comments and other fields are skipped).
    A message with non-empty ``choices`` is a content chunk (its time is ``clock()`` when
    its line is fed); ``usage`` gives the token counts; ``[DONE]`` or an ``error`` object
    sets ``done`` (the latter also ``error``); later lines are ignored. A message that is
    not valid JSON raises ValueError, unless it is recognized as a plain content chunk by
    CONTENT_MARK (then it is not parsed). With ``keep_text`` every message is parsed and the
    text each content chunk carries (``choices[0].text``, or ``choices[0].delta.content`` for
    chat) is kept: ``text`` is the answer so far.
    """

    __slots__ = ("clock", "chunks", "prompt_tokens", "output_tokens", "usage_seen", "error",
                 "done", "_tail", "keep_text", "texts")

    def __init__(self, clock: Clock, keep_text: bool = False) -> None:
        self.clock = clock
        self.keep_text = keep_text
        self.texts: list[str] = []
        self.chunks: list[float] = []
        self.prompt_tokens = self.output_tokens = 0
        self.usage_seen = self.done = False
        self.error = ""
        self._tail = b""

    def feed(self, block: bytes) -> None:
        """Body bytes, split anywhere; complete lines are handled now, the rest kept."""
        lines = (self._tail + block).split(b"\n") if self._tail else block.split(b"\n")
        self._tail = lines.pop()
        for line in lines:
            if self.done:
                return
            self.line(line)

    def end(self) -> None:
        """The body ended: handle a last line without a newline."""
        if self._tail and not self.done:
            self.line(self._tail)
        self._tail = b""

    def line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if not data:
            return
        if data == b"[DONE]":
            self.done = True
            return
        if (not self.keep_text and CONTENT_MARK in data and USAGE_MARK not in data
                and ERROR_MARK not in data):
            self.chunks.append(self.clock())  # a plain content chunk: nothing else to read
            return
        message = json.loads(data)
        if not isinstance(message, dict):
            return
        if message.get("error"):
            self.error = error_text(message["error"])
            self.done = True
            return
        if message.get("choices"):
            self.chunks.append(self.clock())
            if self.keep_text:
                self.texts.append(chunk_text(message["choices"][0]))
        usage = message.get("usage")
        if usage:
            self.usage_seen = True
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.output_tokens = int(usage.get("completion_tokens") or 0)

    @property
    def text(self) -> str:
        """The answer's text so far ("" unless ``keep_text``)."""
        return "".join(self.texts)


def chunk_text(choice: Any) -> str:
    """The text one streamed choice carries: ``text`` (completions) or ``delta.content``
    (chat); "" when it has none (e.g. chat's first, role-only delta)."""
    if not isinstance(choice, dict):
        return ""
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return text if isinstance(text, str) else ""
