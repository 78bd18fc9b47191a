"""Prompts as token ids: the request a load sends (`RequestSpec`), the model's tokenizer, and
fitting a prompt to an exact token length as vLLM's datasets do. ``tokenizers`` is imported
lazily."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer


MAX_LENGTH_ADJUSTMENTS = 64


@dataclass(frozen=True)
class RequestSpec:
    """One request to send.

    ``prompt_len`` is the token count of ``prompt`` as the tokenizer encodes it,
    special tokens included (what the server reports as ``usage.prompt_tokens``
    when it uses the same tokenizer). With ``token_ids`` (a timed trace's prompts), those
    ids are sent instead of ``prompt`` (completions endpoint only) and ``prompt_len`` is
    their count. ``request_class``: its class in a mix
    (framework.load.mix), None outside one.
    """

    prompt: str
    prompt_len: int
    output_len: int
    token_ids: tuple[int, ...] | None = None
    request_class: str | None = None


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
