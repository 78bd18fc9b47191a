"""ShareGPT-format conversations: read from a local JSON/JSONL file, turned into requests of
the model's own token lengths, and generated as a small sample (`sample_sharegpt_conversations`)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

from framework.load.prompts import RequestSpec

HUMAN_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "assistant", "chatgpt", "model"})


def _role_text(turn: dict[str, Any]) -> tuple[str, str | None]:
    """(lower-case role, text or None) of one ShareGPT or OpenAI-messages turn."""
    role = str(turn.get("from", turn.get("role", ""))).lower()
    text = turn.get("value", turn.get("content"))
    return role, text if isinstance(text, str) else None


def first_exchange(turns: Any) -> tuple[str, str] | None:
    """(first human turn, first assistant turn after it) of a ShareGPT conversation, or None.

    A turn is ``{"from": role, "value": text}`` (ShareGPT) or ``{"role": ..., "content":
    ...}`` (OpenAI messages); other turns (e.g. "system") are skipped.
    """
    if not isinstance(turns, list):
        return None
    prompt: str | None = None
    for turn in turns:
        if not isinstance(turn, dict):
            return None
        role, text = _role_text(turn)
        if text is None:
            continue
        if prompt is None and role in HUMAN_ROLES:
            prompt = text
        elif prompt is not None and role in ASSISTANT_ROLES:
            return prompt, text
    return None


def exchanges(turns: Any) -> list[tuple[str, str]]:
    """Every (human turn, the assistant turn answering it) of a conversation, in order: a
    human turn followed by an assistant turn is one exchange; a human turn followed by
    another human turn is dropped, as are other roles (e.g. "system") and text-less turns.
    Malformed turns (not a list of objects) give []."""
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        return []
    pairs: list[tuple[str, str]] = []
    prompt: str | None = None
    for role, text in (_role_text(t) for t in turns):
        if text is None:
            continue
        if role in HUMAN_ROLES:
            prompt = text
        elif role in ASSISTANT_ROLES and prompt is not None:
            pairs.append((prompt, text))
            prompt = None
    return pairs


def _read_entries(path: Path) -> list[Any]:
    """The conversation objects of a ShareGPT file (see read_sharegpt); ValueError naming the
    file if it is not in this format."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".jsonl":
            entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            entries = json.loads(text)
    except json.JSONDecodeError as exc:
        kind = "JSONL" if path.suffix == ".jsonl" else "JSON"
        raise ValueError(f"{path}: not valid {kind}: {exc}") from None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of conversations, got {type(entries).__name__}")
    return entries


def read_sharegpt(path: Path) -> list[tuple[str, str]]:
    """(prompt, reply) of each usable conversation of a ShareGPT file, in file order.

    ``.jsonl``: one conversation object per line; otherwise a JSON list of them. A
    conversation object holds its turns under ``conversations`` (or ``messages``); see
    first_exchange. Conversations without a human turn followed by an assistant turn are
    skipped. ValueError naming the file if it is not in this format.
    """
    pairs = []
    for entry in _read_entries(path):
        if isinstance(entry, dict):
            exchange = first_exchange(entry.get("conversations", entry.get("messages")))
            if exchange is not None:
                pairs.append(exchange)
    return pairs


def system_message(turns: Any) -> str | None:
    """The text of a conversation's first "system" turn, or None."""
    for turn in turns if isinstance(turns, list) else ():
        if isinstance(turn, dict) and (found := _role_text(turn))[0] == "system" and found[1]:
            return found[1]
    return None


def read_sharegpt_conversations(path: Path) -> list[tuple[str | None, list[tuple[str, str]]]]:
    """(system message or None, every exchange (see exchanges)) of each conversation of a
    ShareGPT file, in file order; conversations without an exchange are skipped. Same file
    format and errors as read_sharegpt."""
    found = []
    for entry in _read_entries(path):
        if isinstance(entry, dict):
            turns = entry.get("conversations", entry.get("messages"))
            if pairs := exchanges(turns):
                found.append((system_message(turns), pairs))
    return found


def sharegpt_requests(
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    num_prompts: int,
    seed: int,
    min_prompt_tokens: int | None = None,
    max_prompt_tokens: int | None = None,
    output_len: int | None = None,
) -> list[RequestSpec]:
    """``num_prompts`` requests drawn from (prompt, reply) ``pairs``, reproducible from ``seed``.

    ``prompt_len`` = tokens of the prompt (special tokens included); ``output_len`` = tokens
    of the reply (without special tokens), or the given ``output_len`` for all. A pair is
    usable if min_prompt_tokens <= prompt_len <= max_prompt_tokens (bounds optional,
    inclusive), prompt_len >= 1 and output_len >= 1. Pairs are visited in the order of a
    seeded permutation (``numpy.random.default_rng(seed)``) and tokenized lazily until
    ``num_prompts`` are usable; if fewer are, the rest is drawn from the usable ones with
    replacement by the same generator. ValueError if none is usable.
    """
    if num_prompts < 0:
        raise ValueError(f"num_prompts must be >= 0, got {num_prompts}")
    if output_len is not None and output_len < 1:
        raise ValueError(f"output_len must be >= 1 or None, got {output_len}")
    low = 1 if min_prompt_tokens is None else max(1, min_prompt_tokens)
    high = math.inf if max_prompt_tokens is None else max_prompt_tokens
    rng = np.random.default_rng(seed)
    usable: list[RequestSpec] = []
    for j in rng.permutation(len(pairs)):
        if len(usable) == num_prompts:
            break
        prompt, reply = pairs[int(j)]
        prompt_len = len(tokenizer.encode(prompt).ids)
        if not low <= prompt_len <= high:
            continue
        out = output_len or len(tokenizer.encode(reply, add_special_tokens=False).ids)
        if out >= 1:
            usable.append(RequestSpec(prompt=prompt, prompt_len=prompt_len, output_len=out))
    if num_prompts and not usable:
        raise ValueError(
            f"none of {len(pairs)} conversations has a prompt of {low}..{high} tokens "
            "and a non-empty reply"
        )
    if len(usable) < num_prompts:
        extra = rng.integers(0, len(usable), size=num_prompts - len(usable))
        usable += [usable[int(k)] for k in extra]
    return usable




_SAMPLE_WORDS = (
    "the a an of to and in is it that for on with as was be by this are or from at have not "
    "but what all were when we there can your which their said if do will each about how up "
    "out them then she many some so these would other into has more her two like him see time "
    "could no make than first been its who now people my made over did down only way find use "
    "may water long little very after words called just where most know get through back much "
    "before go good new write our used me man too any day same right look think also around "
    "another came come work three word must because does part even place well such here take "
    "why things help put years different away again off went old number great tell men say "
    "small every found still between name should home big give air line set own under read "
    "last never us left end along while might next sound below saw something thought both few "
    "those always looked show large often together asked house world going want school important "
    "until form food keep children feet land side without boy once animals life enough took "
    "sometimes four head above kind began almost live page got earth need far hand high year "
    "mother light parts country father let night following picture being study second eyes soon "
    "times story boys since white days ever paper hard near sentence better best across during "
    "today others however sure means knew try told young miles sun ways thing whole hear example "
    "heard several change answer room sea against top turned learn point city play toward five "
    "using himself usually server cache token request model queue batch latency memory kernel"
).split()


def sample_sharegpt_conversations(num: int = 100, seed: int = 0,
                                  turns: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Synthetic ShareGPT-format conversations (what ``datasets/sharegpt_sample.json`` holds).

    English-like sentences from a fixed word list; prompt and reply lengths are log-normal
    (about 3-250 and 1-300 words), every 7th conversation starts with a system turn and
    every 5th has a second exchange. Reproducible from ``seed``. ``turns=(low, high)``: each
    conversation has a uniform number of exchanges in [low, high] instead (drawn first, for
    all conversations; ``datasets/multi_turn_sample.json`` is ``(num=40, seed=0,
    turns=(2, 6))``).
    """
    rng = np.random.default_rng(seed)

    def text(low: int, high: int, mean_log: float) -> str:
        n = int(np.clip(rng.lognormal(mean_log, 0.8), low, high))
        words = [_SAMPLE_WORDS[int(k)] for k in rng.integers(0, len(_SAMPLE_WORDS), size=n)]
        out, start = [], 0
        while start < n:
            end = min(n, start + int(rng.integers(5, 15)))
            sentence = " ".join(words[start:end])
            out.append(sentence[0].upper() + sentence[1:] + ("?" if rng.random() < 0.2 else "."))
            start = end
        return " ".join(out)

    counts = ([2 if i % 5 == 4 else 1 for i in range(num)] if turns is None
              else [int(n) for n in rng.integers(turns[0], turns[1] + 1, size=num)])
    conversations = []
    for i in range(num):
        messages = []
        if i % 7 == 3:
            messages.append({"from": "system", "value": "You are a helpful assistant."})
        for _ in range(counts[i]):
            messages.append({"from": "human", "value": text(3, 250, 3.3)})
            messages.append({"from": "gpt", "value": text(1, 300, 3.6)})
        conversations.append({"id": f"sample-{i:03d}", "conversations": messages})
    return conversations
