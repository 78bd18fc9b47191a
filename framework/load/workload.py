"""Workloads: what to send (datasets) and when (arrival offsets). Seeded and reproducible.

Datasets, all tokenized with the model's own ``tokenizer.json``:
- ``random``: random-token prompts like vLLM's RandomDataset (``--dataset-name random``);
- ``sharegpt``: ShareGPT-format conversations from a local JSON/JSONL file;
- ``prefix-shared``: G groups of prompts, each group sharing a K-token prefix;
- ``timed_trace``: a trace's rows, sent at its timestamps (framework.load.trace, trace_prompts).
Arrivals follow ``vllm.benchmarks.serve.get_request``. ``tokenizers`` is imported lazily.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Literal

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

from framework.config.trace_spec import TimedTraceSpec
from framework.load.prompts import RequestSpec as RequestSpec  # re-exported
from framework.load.prompts import allowed_token_ids
from framework.load.prompts import fit_after_prefix
from framework.load.prompts import fit_prompt_to_length
from framework.load.prompts import load_tokenizer as load_tokenizer  # re-exported
from framework.load.prompts import num_special_tokens_to_add
from framework.load.prompts import uniform_length_bounds
from framework.load.sharegpt import read_sharegpt
from framework.load.sharegpt import sharegpt_requests
from framework.load.trace import read_trace
from framework.load.trace import send_offsets
from framework.load.trace_prompts import trace_requests


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


# multi_turn: sessions, drawn by sweep.trial_load, not by Dataset.requests
DatasetName = Literal["random", "sharegpt", "prefix-shared", "timed_trace", "multi_turn"]
DATASETS: tuple[str, ...] = ("random", "sharegpt", "prefix-shared", "timed_trace")


@dataclass(frozen=True)
class Dataset:
    """Which dataset to draw prompts from, with its settings (unused ones are ignored).

    random: ``input_len``, ``output_len``, ``range_ratio``. sharegpt: ``path``,
    ``min_prompt_tokens``, ``max_prompt_tokens``, ``output_len_override``. prefix-shared:
    ``input_len``, ``output_len``, ``prefix_len``, ``prefix_groups``. timed_trace: ``path``,
    ``trace`` (its first ``num_prompts`` rows; the seed salts the token blocks).
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
    trace: TimedTraceSpec = TimedTraceSpec()

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
        if self.name == "timed_trace":
            if self.path is None:
                raise ValueError("dataset timed_trace needs a path")
            rows = read_trace(self.path, self.trace, num_prompts)
            return trace_requests(tokenizer, rows, self.trace.chunk_hash_size, seed)
        raise ValueError(f"unknown dataset {self.name!r}; expected one of {list(DATASETS)}")

    def trace_offsets(self, num_prompts: int) -> list[float] | None:
        """A timed trace's send offsets at speed-up 1 for its first ``num_prompts`` rows
        (trace.send_offsets); None for the other datasets (their arrivals come from a rate)."""
        if self.name != "timed_trace" or self.path is None:
            return None
        return send_offsets(read_trace(self.path, self.trace, num_prompts))


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
