"""The streaming parser (`sse.SSEState`): split anywhere, fast path equal to full parsing,
error events."""

from __future__ import annotations

import pytest

from framework.load.sse import SSEState
from tests.streams import DONE
from tests.streams import content
from tests.streams import counter_clock
from tests.streams import sse
from tests.streams import usage


def pieces(data: bytes, cut: int) -> list[bytes]:
    """``data`` cut at ``cut`` and in 7-byte pieces after it (covers splits anywhere)."""
    return [data[:cut]] + [data[i:i + 7] for i in range(cut, len(data), 7)]


SSE_BODY = (b": ping\r\n\r\n" + content("a") + b"event: x\n" + content("b\\nc") +
            b'data: {"choices": [{"text": "spaced"}]}\n\n' + usage(7, 4) + DONE + content("late"))


@pytest.mark.parametrize("cut", range(0, len(SSE_BODY) + 1, 5))
def test_sse_state_is_indifferent_to_splits(cut: int) -> None:
    state = SSEState(counter_clock())
    for piece in pieces(SSE_BODY, cut):
        state.feed(piece)
    state.end()
    # three content chunks (one JSON-parsed: not in vLLM's compact form), then usage, [DONE]
    assert state.chunks == [0.0, 1.0, 2.0]
    assert (state.prompt_tokens, state.output_tokens, state.usage_seen) == (7, 4, True)
    assert state.done and state.error == ""


def test_sse_state_fast_path_matches_parsing() -> None:
    # a content chunk whose text holds the marks' words, and one with usage on it
    tricky = content('say "usage" and "error"') + sse(
        {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    state = SSEState(counter_clock())
    state.feed(tricky + b"data: {bad json")
    assert state.chunks == [0.0, 1.0] and state.output_tokens == 2
    with pytest.raises(ValueError):
        state.end()  # the unterminated, malformed last line is parsed and fails


def test_sse_state_error_event() -> None:
    state = SSEState(counter_clock())
    state.feed(content("a") + sse({"error": {"message": "boom", "type": "BadRequest"}}) +
               content("b"))
    assert state.done and state.chunks == [0.0]
    assert state.error == "server error in stream (BadRequest): boom"
