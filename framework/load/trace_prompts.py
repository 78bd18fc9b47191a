"""A timed trace's prompts, as token ids: equal hash ids give equal token blocks, so the
trace's prefix reuse reaches the server's prefix cache.

vLLM 0.32's construction (``vllm/benchmarks/datasets/datasets.py``, TimedTrace._expand_prompt
and _sample_token), followed step by step: with ``left = input_length``, each hash id h in
order adds a block of ``size = chunk_hash_size if left >= chunk_hash_size else left`` tokens,
``left -= size``, until ``left <= 0``. The block of key ``"{h}:{size}"`` is
``random.Random(seed(key)).choices(vocab, k=size)`` over the tokenizer's vocabulary ids
without its special tokens, sorted. So a prompt has ``min(input_length, len(hash_ids) x
chunk_hash_size)`` tokens (a row with too few hash ids is shorter than its input_length, as
in vLLM), and the same trace gives vLLM's token counts exactly.

Two differences, both on purpose:
- vLLM seeds a block with Python's ``hash(key) & 0xFFFFFFFF``, which is salted per process
  (PYTHONHASHSEED), so its token ids differ from run to run; here the seed is the first 4
  bytes of BLAKE2b over ``"{salt}:{key}"``, reproducible, and ``salt`` (the workload seed)
  gives each measured run fresh blocks with the same reuse (repeats do not hit the previous
  run's cache entries).
- a row without hash ids (an Azure CSV; a JSONL row without the field or with an empty list)
  gets ceil(input_length / chunk_hash_size) hash ids of its own, shared with no other row:
  its prompt has exactly input_length tokens. vLLM would send it an empty prompt.
Prompts go to the server as token ids (the completions endpoint's ``prompt: [ids]``, as
vllm bench sends them), so nothing is re-tokenized and ``prompt_len`` is the count the
server reports.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from framework.load.prompts import RequestSpec
from framework.load.trace import TraceRow

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def vocabulary(tokenizer: Tokenizer) -> list[int]:
    """vLLM's sampling vocabulary: every id of ``get_vocab()`` that is not a special token,
    sorted (TimedTrace._sample_token)."""
    special = {i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}
    return sorted(i for i in tokenizer.get_vocab(with_added_tokens=True).values()
                  if i not in special)


def block_seed(key: str, salt: int) -> int:
    """A 32-bit seed from ``"{salt}:{key}"`` (BLAKE2b, stable across processes)."""
    digest = hashlib.blake2b(f"{salt}:{key}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


class BlockBuilder:
    """Token blocks by key, drawn once each (vLLM's _expanded_generated_prompts cache)."""

    def __init__(self, vocab: Sequence[int], chunk_hash_size: int, salt: int) -> None:
        if chunk_hash_size < 1:
            raise ValueError(f"chunk_hash_size must be >= 1, got {chunk_hash_size}")
        if not vocab:
            raise ValueError("the tokenizer has no non-special token")
        self.vocab, self.chunk, self.salt = list(vocab), chunk_hash_size, salt
        self._blocks: dict[str, list[int]] = {}

    def block(self, key: str) -> list[int]:
        """The tokens of block ``key`` = ``"{hash id}:{size}"``."""
        if key not in self._blocks:
            size = int(key.rsplit(":", 1)[1])
            rng = random.Random(block_seed(key, self.salt))
            self._blocks[key] = rng.choices(self.vocab, k=size)
        return self._blocks[key]

    def prompt(self, hash_ids: Sequence[int | str], input_length: int) -> list[int]:
        """vLLM's _expand_prompt: blocks of ``chunk`` tokens (the last one shorter) until
        input_length tokens or the hash ids run out."""
        ids: list[int] = []
        left = input_length
        for h in hash_ids:
            size = self.chunk if left >= self.chunk else left
            ids.extend(self.block(f"{h}:{size}"))
            left -= size
            if left <= 0:
                break
        return ids


def own_hash_ids(row: TraceRow, chunk_hash_size: int) -> list[str]:
    """Hash ids for a row without any: ``r{line}.{k}``, no other row's (ints never look so)."""
    return [f"r{row.line}.{k}" for k in range(math.ceil(row.input_length / chunk_hash_size))]


def trace_requests(tokenizer: Tokenizer, rows: Sequence[TraceRow], chunk_hash_size: int,
                   salt: int) -> list[RequestSpec]:
    """One request per row, in order: token-id prompts (module docstring), the row's output
    length. Same rows, chunk size, tokenizer and salt give identical requests."""
    builder = BlockBuilder(vocabulary(tokenizer), chunk_hash_size, salt)
    requests = []
    for row in rows:
        hash_ids = row.hash_ids if row.hash_ids else own_hash_ids(row, chunk_hash_size)
        ids = builder.prompt(hash_ids, row.input_length)
        requests.append(RequestSpec(prompt="", prompt_len=len(ids), output_len=row.output_length,
                                    token_ids=tuple(ids)))
    return requests
