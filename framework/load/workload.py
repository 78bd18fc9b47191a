"""Workloads: what to send (datasets) and when (arrival offsets). Seeded and reproducible.

Datasets, all tokenized with the model's own ``tokenizer.json``:
- ``random``: random-token prompts like vLLM's RandomDataset (``--dataset-name random``);
- ``sharegpt``: ShareGPT-format conversations from a local JSON/JSONL file;
- ``prefix-shared``: G groups of prompts, each group sharing a K-token prefix.
Arrivals follow ``vllm.benchmarks.serve.get_request``. ``tokenizers`` is imported lazily.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MAX_LENGTH_ADJUSTMENTS = 64


@dataclass(frozen=True)
class RequestSpec:
    """One request to send.

    ``prompt_len`` is the token count of ``prompt`` as the tokenizer encodes it,
    special tokens included (what the server reports as ``usage.prompt_tokens``
    when it uses the same tokenizer).
    """

    prompt: str
    prompt_len: int
    output_len: int


def load_tokenizer(model_dir: Path) -> Tokenizer:
    """Load ``model_dir/tokenizer.json``; raise FileNotFoundError naming the path if absent."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def num_special_tokens_to_add(tokenizer: Tokenizer) -> int:
    """Tokens the tokenizer's post-processor adds to a single sequence (e.g. BOS)."""
    processor = tokenizer.post_processor
    return 0 if processor is None else int(processor.num_special_tokens_to_add(False))


def allowed_token_ids(tokenizer: Tokenizer) -> np.ndarray:
    """Token ids usable in random prompts: not special, and decoding alone to valid text.

    Byte-fallback tokens that decode to U+FFFD (a lone byte of a multi-byte character)
    are excluded: with them the decode/re-encode loop can cycle without reaching the
    target length.
    """
    special = {i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}
    ids = [
        i
        for i in range(tokenizer.get_vocab_size(with_added_tokens=True))
        if i not in special and "\ufffd" not in tokenizer.decode([i], skip_special_tokens=False)
    ]
    if not ids:
        raise ValueError("tokenizer has no usable non-special tokens")
    return np.array(ids, dtype=np.int64)


def uniform_length_bounds(length: int, range_ratio: float, minimum: int) -> tuple[int, int]:
    """Integer bounds [floor(length*(1-r)), ceil(length*(1+r))], both at least ``minimum``."""
    low = math.floor(length * (1.0 - range_ratio))
    high = math.ceil(length * (1.0 + range_ratio))
    return max(low, minimum), max(high, minimum)


def fit_prompt_to_length(
    tokenizer: Tokenizer,
    token_ids: list[int],
    target: int,
    allowed: np.ndarray,
    rng: np.random.Generator,
) -> str:
    """Decode ``token_ids`` and re-encode until the text is exactly ``target`` tokens long.

    Each round decodes, re-encodes (without special tokens), then truncates to
    ``target`` or pads with random allowed ids (vLLM's gen_prompt_decode_to_target_len).
    Raises RuntimeError if ``MAX_LENGTH_ADJUSTMENTS`` rounds do not reach the target.
    """
    text = fit_after_prefix(tokenizer, "", [], token_ids, target, allowed, rng)
    if text is not None:
        return text
    raise RuntimeError(
        f"could not build a prompt of exactly {target} tokens "
        f"in {MAX_LENGTH_ADJUSTMENTS} decode/re-encode rounds"
    )


def random_requests(
    tokenizer: Tokenizer,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    range_ratio: float = 0.0,
) -> list[RequestSpec]:
    """Random-token prompts like vLLM's RandomDataset, reproducible from ``seed``.

    With ``s`` = special tokens the tokenizer adds (e.g. BOS) and ``n = input_len - s``:
    text lengths are drawn uniformly from the integers in
    [floor(n*(1-r)), ceil(n*(1+r))], output lengths from
    [max(1, floor(output_len*(1-r))), ceil(output_len*(1+r))], then one vocabulary offset
    per request, all from ``numpy.random.default_rng(seed)`` in vLLM's order. Request i's
    tokens are ``allowed[(offset_i + i + arange(len_i)) % len(allowed)]``.

    Guarantee: each prompt re-encodes to exactly its drawn text length, so
    ``prompt_len == len(tokenizer.encode(prompt).ids) == drawn length + s`` (with r = 0,
    ``prompt_len == input_len``); RuntimeError if that cannot be reached.
    Same arguments and tokenizer give identical requests.
    """
    if num_prompts < 0:
        raise ValueError(f"num_prompts must be >= 0, got {num_prompts}")
    if output_len < 1:
        raise ValueError(f"output_len must be >= 1, got {output_len}")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    num_special = num_special_tokens_to_add(tokenizer)
    text_len = input_len - num_special
    input_low, input_high = uniform_length_bounds(text_len, range_ratio, minimum=0)
    if input_low < 1:
        raise ValueError(
            f"input_len {input_len} too small: with {num_special} special tokens and "
            f"range_ratio {range_ratio} a prompt could have {input_low} text tokens"
        )
    output_low, output_high = uniform_length_bounds(output_len, range_ratio, minimum=1)

    rng = np.random.default_rng(seed)
    input_lens = rng.integers(input_low, input_high + 1, size=num_prompts)
    output_lens = rng.integers(output_low, output_high + 1, size=num_prompts)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    offsets = rng.integers(0, vocab_size, size=num_prompts)
    allowed = allowed_token_ids(tokenizer)

    requests: list[RequestSpec] = []
    for i in range(num_prompts):
        length = int(input_lens[i])
        positions = (int(offsets[i]) + i + np.arange(length)) % len(allowed)
        prompt = fit_prompt_to_length(tokenizer, allowed[positions].tolist(), length, allowed, rng)
        requests.append(
            RequestSpec(
                prompt=prompt,
                prompt_len=len(tokenizer.encode(prompt).ids),
                output_len=int(output_lens[i]),
            )
        )
    return requests


def fit_after_prefix(
    tokenizer: Tokenizer,
    prefix_text: str,
    prefix_ids: list[int],
    suffix_ids: list[int],
    target: int,
    allowed: np.ndarray,
    rng: np.random.Generator,
) -> str | None:
    """Text ``prefix_text + suffix`` that encodes to ``prefix_ids`` + exactly ``target`` ids.

    Each round decodes the suffix ids, re-encodes the whole text (so tokens that merge
    across the prefix/suffix boundary are seen), then truncates the suffix to ``target``
    or pads it with random allowed ids. None if the prefix's ids change (the caller draws
    a new suffix) or the length is not reached in MAX_LENGTH_ADJUSTMENTS rounds. With an
    empty prefix this is fit_prompt_to_length.
    """
    ids = list(suffix_ids)
    k = len(prefix_ids)
    for _ in range(MAX_LENGTH_ADJUSTMENTS):
        text = prefix_text + tokenizer.decode(ids, skip_special_tokens=False)
        full = tokenizer.encode(text, add_special_tokens=False).ids
        if full[:k] != prefix_ids:
            return None
        ids = full[k:]
        if len(ids) == target:
            return text
        if len(ids) > target:
            ids = ids[:target]
        else:
            extra = allowed[rng.integers(0, len(allowed), size=target - len(ids))]
            ids.extend(int(i) for i in extra)
    return None


SUFFIX_DRAWS = 64


def prefix_shared_requests(
    tokenizer: Tokenizer,
    num_prompts: int,
    input_len: int,
    output_len: int,
    prefix_len: int,
    num_groups: int,
    seed: int,
) -> list[RequestSpec]:
    """Prompts in ``num_groups`` groups; the prompts of a group share a ``prefix_len``-token prefix.

    Request i belongs to group ``i % num_groups``. With ``s`` special tokens the tokenizer
    adds, each prompt encodes to ``s`` + ``prefix_len`` group-prefix ids + ``input_len - s -
    prefix_len`` ids of its own random suffix, so ``prompt_len == input_len`` and the first
    ``s + prefix_len`` token ids are identical within a group (checked by re-encoding the
    whole prompt; a suffix whose first token would merge with the prefix is redrawn).
    From ``numpy.random.default_rng(seed)``: the group prefixes, then each suffix in order.
    RuntimeError if no fitting suffix is found in SUFFIX_DRAWS draws.
    """
    if num_prompts < 0:
        raise ValueError(f"num_prompts must be >= 0, got {num_prompts}")
    if output_len < 1:
        raise ValueError(f"output_len must be >= 1, got {output_len}")
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    if prefix_len < 1:
        raise ValueError(f"prefix_len must be >= 1, got {prefix_len}")
    num_special = num_special_tokens_to_add(tokenizer)
    suffix_len = input_len - num_special - prefix_len
    if suffix_len < 1:
        raise ValueError(
            f"input_len {input_len} leaves no suffix: it must exceed prefix_len {prefix_len} "
            f"+ {num_special} special tokens"
        )
    rng = np.random.default_rng(seed)
    allowed = allowed_token_ids(tokenizer)

    def draw(length: int) -> list[int]:
        return [int(i) for i in allowed[rng.integers(0, len(allowed), size=length)]]

    prefixes = []
    for _ in range(min(num_groups, num_prompts)):
        text = fit_prompt_to_length(tokenizer, draw(prefix_len), prefix_len, allowed, rng)
        prefixes.append((text, tokenizer.encode(text, add_special_tokens=False).ids))

    requests: list[RequestSpec] = []
    for i in range(num_prompts):
        prefix_text, prefix_ids = prefixes[i % num_groups]
        for _ in range(SUFFIX_DRAWS):
            prompt = fit_after_prefix(
                tokenizer, prefix_text, prefix_ids, draw(suffix_len), suffix_len, allowed, rng
            )
            if prompt is not None:
                break
        else:
            raise RuntimeError(
                f"no suffix of {suffix_len} tokens keeps the {prefix_len}-token prefix of "
                f"group {i % num_groups} intact in {SUFFIX_DRAWS} draws"
            )
        requests.append(
            RequestSpec(
                prompt=prompt,
                prompt_len=len(tokenizer.encode(prompt).ids),
                output_len=output_len,
            )
        )
    return requests


HUMAN_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "assistant", "chatgpt", "model"})


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
        role = str(turn.get("from", turn.get("role", ""))).lower()
        text = turn.get("value", turn.get("content"))
        if not isinstance(text, str):
            continue
        if prompt is None and role in HUMAN_ROLES:
            prompt = text
        elif prompt is not None and role in ASSISTANT_ROLES:
            return prompt, text
    return None


def read_sharegpt(path: Path) -> list[tuple[str, str]]:
    """(prompt, reply) of each usable conversation of a ShareGPT file, in file order.

    ``.jsonl``: one conversation object per line; otherwise a JSON list of them. A
    conversation object holds its turns under ``conversations`` (or ``messages``); see
    first_exchange. Conversations without a human turn followed by an assistant turn are
    skipped. ValueError naming the file if it is not in this format.
    """
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
    pairs = []
    for entry in entries:
        if isinstance(entry, dict):
            exchange = first_exchange(entry.get("conversations", entry.get("messages")))
            if exchange is not None:
                pairs.append(exchange)
    return pairs


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


DatasetName = Literal["random", "sharegpt", "prefix-shared"]
DATASETS: tuple[str, ...] = ("random", "sharegpt", "prefix-shared")


@dataclass(frozen=True)
class Dataset:
    """Which dataset to draw prompts from, with its settings (unused ones are ignored).

    random: ``input_len``, ``output_len``, ``range_ratio``. sharegpt: ``path``,
    ``min_prompt_tokens``, ``max_prompt_tokens``, ``output_len_override``. prefix-shared:
    ``input_len``, ``output_len``, ``prefix_len``, ``prefix_groups``.
    """

    name: DatasetName = "random"
    input_len: int = 128
    output_len: int = 64
    range_ratio: float = 0.0
    path: Path | None = None
    min_prompt_tokens: int | None = None
    max_prompt_tokens: int | None = None
    output_len_override: int | None = None
    prefix_len: int = 64
    prefix_groups: int = 4

    def requests(self, tokenizer: Tokenizer, num_prompts: int, seed: int) -> list[RequestSpec]:
        """``num_prompts`` requests of this dataset from ``seed`` (same seed, same requests)."""
        if self.name == "random":
            return random_requests(
                tokenizer, num_prompts, self.input_len, self.output_len, seed, self.range_ratio
            )
        if self.name == "prefix-shared":
            return prefix_shared_requests(
                tokenizer, num_prompts, self.input_len, self.output_len, self.prefix_len,
                self.prefix_groups, seed,
            )
        if self.name == "sharegpt":
            if self.path is None:
                raise ValueError("dataset sharegpt needs a path")
            return sharegpt_requests(
                tokenizer, read_sharegpt(self.path), num_prompts, seed,
                self.min_prompt_tokens, self.max_prompt_tokens, self.output_len_override,
            )
        raise ValueError(f"unknown dataset {self.name!r}; expected one of {list(DATASETS)}")


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


def sample_sharegpt_conversations(num: int = 100, seed: int = 0) -> list[dict[str, Any]]:
    """Synthetic ShareGPT-format conversations (what ``datasets/sharegpt_sample.json`` holds).

    English-like sentences from a fixed word list; prompt and reply lengths are log-normal
    (about 3-250 and 1-300 words), every 7th conversation starts with a system turn and
    every 5th has a second exchange. Reproducible from ``seed``.
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

    conversations = []
    for i in range(num):
        turns = []
        if i % 7 == 3:
            turns.append({"from": "system", "value": "You are a helpful assistant."})
        for _ in range(2 if i % 5 == 4 else 1):
            turns.append({"from": "human", "value": text(3, 250, 3.3)})
            turns.append({"from": "gpt", "value": text(1, 300, 3.6)})
        conversations.append({"id": f"sample-{i:03d}", "conversations": turns})
    return conversations


def arrival_offsets(num: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """Send time of each request in seconds from the start (vLLM's get_request).

    ``request_rate = inf``: all 0.0. Otherwise gap_i ~ Gamma(shape=burstiness,
    scale=1/(request_rate*burstiness)) (mean 1/rate; burstiness 1 = Poisson,
    burstiness inf = constant gaps 1/rate), offset_i = gap_0 + ... + gap_i (the first
    request also waits one gap). Like vLLM, offsets are then rescaled so the last one is
    exactly ``num / request_rate``, so the mean gap is exactly 1/rate.
    """
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if not request_rate > 0:
        raise ValueError(f"request_rate must be > 0, got {request_rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if num == 0:
        return []
    if math.isinf(request_rate):
        return [0.0] * num
    if math.isinf(burstiness):
        gaps = np.full(num, 1.0 / request_rate)
    else:
        rng = np.random.default_rng(seed)
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num)
    offsets = np.cumsum(gaps)
    if offsets[-1] > 0:
        offsets = offsets * ((num / request_rate) / offsets[-1])
    return [float(x) for x in offsets]
