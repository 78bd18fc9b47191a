"""Synthetic workloads: random prompts and arrival times, as `vllm bench serve` builds them.

Prompts follow vLLM's RandomDataset (``--dataset-name random``); arrivals follow
``vllm.benchmarks.serve.get_request``. ``tokenizers`` is imported lazily.
"""

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
    ids = list(token_ids)
    for _ in range(MAX_LENGTH_ADJUSTMENTS):
        text = tokenizer.decode(ids, skip_special_tokens=False)
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) == target:
            return text
        if len(ids) > target:
            ids = ids[:target]
        else:
            extra = allowed[rng.integers(0, len(allowed), size=target - len(ids))]
            ids.extend(int(i) for i in extra)
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
