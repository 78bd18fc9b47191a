"""Multi-turn sessions: what each one says (`Session`, drawn synthetic or from ShareGPT
conversations, seeded) and each turn's prompt, built from the conversation so far (pure).

A session's turns are its user messages, each a RequestSpec (the message, its token count, the
answer's max tokens); the answers are the server's, known only while the session runs
(load.sessions). Turn k's prompt is the system message if any, then user message 0, answer 0,
..., answer k-1, user message k: as a chat `messages` list (system / user / assistant roles,
like GuideLLM and vLLM's multi-turn benchmark), or for the completions endpoint that
transcript's texts joined by single spaces (GuideLLM's text-completions form).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import TypeGuard

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

from framework.config.multi_turn_spec import MultiTurnSpec
from framework.load.distributions import draw
from framework.load.distributions import draw_counts
from framework.load.prompts import RequestSpec
from framework.load.prompts import allowed_token_ids
from framework.load.prompts import fit_prompt_to_length

TRANSCRIPT_SEPARATOR = " "


@dataclass(frozen=True)
class Session:
    """One conversation to hold: its user turns, the think time before each turn after the
    first (seconds; len(think_s) == len(turns) - 1) and an optional system message."""

    turns: tuple[RequestSpec, ...]
    think_s: tuple[float, ...]
    system: str | None = None

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError("a session needs at least one turn")
        if len(self.think_s) != len(self.turns) - 1:
            raise ValueError(f"{len(self.turns)} turns need {len(self.turns) - 1} think times, "
                             f"got {len(self.think_s)}")


def chat_messages(session: Session, turn: int, answers: Sequence[str]) -> list[dict[str, str]]:
    """Turn `turn`'s chat messages: [system], user 0, assistant answers[0], ..., user `turn`.
    ValueError unless 0 <= turn < len(turns) and len(answers) >= turn."""
    _check_turn(session, turn, answers)
    messages = [{"role": "system", "content": session.system}] if session.system else []
    for k in range(turn):
        messages.append({"role": "user", "content": session.turns[k].prompt})
        messages.append({"role": "assistant", "content": answers[k]})
    messages.append({"role": "user", "content": session.turns[turn].prompt})
    return messages


def transcript(session: Session, turn: int, answers: Sequence[str]) -> str:
    """Turn `turn`'s completions prompt: the contents of chat_messages joined by
    TRANSCRIPT_SEPARATOR, so turn k's prompt starts with turn k-1's prompt + separator +
    answer k-1."""
    return TRANSCRIPT_SEPARATOR.join(m["content"] for m in chat_messages(session, turn, answers))


def _check_turn(session: Session, turn: int, answers: Sequence[str]) -> None:
    if not 0 <= turn < len(session.turns):
        raise ValueError(f"turn {turn} outside the session's {len(session.turns)} turns")
    if len(answers) < turn:
        raise ValueError(f"turn {turn} needs the {turn} earlier answers, got {len(answers)}")


def synthetic_sessions(tokenizer: Tokenizer, spec: MultiTurnSpec, num: int,
                       seed: int) -> list[Session]:
    """`num` sessions from `numpy.random.default_rng(seed)`, drawn in this order: every
    session's turn count (spec.turns, capped at max_turns), then per session its user-message
    token counts, answer token counts and think times; then each message's random tokens.
    Message k of a session is exactly its drawn token count (special tokens excluded,
    `prompt_len`); same arguments, same sessions."""
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    rng = np.random.default_rng(seed)
    counts = [min(n, spec.max_turns or n) for n in draw_counts(spec.synthetic_turns, rng, num)]
    plans = [(draw_counts(spec.synthetic_prompt_tokens, rng, n),
              draw_counts(spec.synthetic_output_tokens, rng, n),
              draw(spec.think_time_s, rng, n - 1)) for n in counts]
    allowed = allowed_token_ids(tokenizer)
    sessions = []
    for prompt_lens, output_lens, think in plans:
        turns = []
        for length, output_len in zip(prompt_lens, output_lens):
            ids = allowed[rng.integers(0, len(allowed), size=length)].tolist()
            text = fit_prompt_to_length(tokenizer, ids, length, allowed, rng)
            turns.append(RequestSpec(prompt=text, prompt_len=length, output_len=output_len))
        sessions.append(Session(turns=tuple(turns), think_s=tuple(float(t) for t in think)))
    return sessions


def sharegpt_sessions(tokenizer: Tokenizer,
                      conversations: Sequence[tuple[str | None, Sequence[tuple[str, str]]]],
                      spec: MultiTurnSpec, num: int, seed: int) -> list[Session]:
    """`num` sessions from ShareGPT conversations (load.sharegpt.read_sharegpt_conversations:
    system message, exchanges; the system message is the session's),
    from `numpy.random.default_rng(seed)`: a seeded permutation of the conversations, cycled
    when `num` exceeds them, then per session (in that order) its answer lengths (only when
    spec.output_tokens is given; else each the token count of the dataset's answer, at least
    1, vLLM's multi-turn default) and think times. At most max_turns exchanges each;
    `prompt_len` = tokens of the user message without special tokens. ValueError if there
    is no conversation."""
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if num and not conversations:
        raise ValueError("no conversation with a user turn answered by an assistant turn")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(conversations)) if conversations else np.array([], dtype=int)
    sessions = []
    for i in range(num):
        system, exchanged = conversations[int(order[i % len(order)])]
        pairs = list(exchanged)[:spec.max_turns]
        if spec.output_tokens is not None:
            output_lens = draw_counts(spec.output_tokens, rng, len(pairs))
        else:
            output_lens = [max(1, len(tokenizer.encode(a, add_special_tokens=False).ids))
                           for _, a in pairs]
        think = draw(spec.think_time_s, rng, len(pairs) - 1)
        turns = tuple(RequestSpec(prompt=u, output_len=out,
                                  prompt_len=len(tokenizer.encode(u, add_special_tokens=False).ids))
                      for (u, _), out in zip(pairs, output_lens))
        sessions.append(Session(turns=turns, think_s=tuple(float(t) for t in think),
                                system=system))
    return sessions


def first_turns(sessions: Sequence[Session]) -> list[RequestSpec]:
    """Each session's first user message as a single request (e.g. a warm-up)."""
    return [s.turns[0] for s in sessions]


def turn_count(items: Sequence[RequestSpec] | Sequence[Session]) -> int:
    """Requests a load sends when every turn is sent: turns of sessions, else one per item."""
    return sum(len(s.turns) if isinstance(s, Session) else 1 for s in items)


def is_sessions(items: Sequence[object]) -> TypeGuard[Sequence[Session]]:
    """True when `items` are Sessions (a multi-turn load), False for requests or nothing."""
    return bool(items) and isinstance(items[0], Session)
