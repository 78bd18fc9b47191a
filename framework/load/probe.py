"""The quality probe's requests: a fixed set of prompts sent greedy with logprobs, and what each
answer says (the token ids generated and the log-probability of each).

Each probe request is one non-streaming `/v1/completions` call whose body is exactly
`probe_payload`: `temperature: 0` (greedy), `logprobs: 1` (the chosen token's logprob at each
position, `choices[0].logprobs.token_logprobs`), `return_token_ids: true` (the generated ids,
`choices[0].token_ids`: ids, not decoded text, so two runs compare token for token),
`ignore_eos: true` and `max_tokens` (every answer has exactly `max_tokens` tokens). Field names
and meanings: vllm/entrypoints/openai/completion/protocol.py (CompletionRequest) and
serving.py (request_output_to_completion_response) of the installed vLLM. The prompts are the
workload's random prompts (`workload.random_requests`, the model's tokenizer), drawn with
their own seed, so every trial of a sweep probes with the same prompts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from framework.load.http_client import ConnectionPool
from framework.load.http_client import post_json
from framework.load.workload import random_requests

if TYPE_CHECKING:
    from tokenizers import Tokenizer

PATH = "/v1/completions"


@dataclass(frozen=True)
class ProbeSettings:
    """The probe set: `prompts` random prompts of `input_len` tokens drawn with `seed`, each
    answered with `max_tokens` greedy tokens, sent `concurrency` at a time (so the server
    batches them as it batches load), each request bounded by `timeout_s`."""

    prompts: int = 16
    input_len: int = 64
    max_tokens: int = 32
    concurrency: int = 8
    seed: int = 4000
    timeout_s: float = 120.0


@dataclass(frozen=True)
class ProbeAnswer:
    """One prompt's greedy answer: the ids generated, and the logprob of each (same length)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


class ProbeError(Exception):
    """A probe request failed or its answer lacks what the probe asked for (one line)."""


def probe_prompts(tokenizer: Tokenizer, settings: ProbeSettings) -> list[str]:
    """The probe's prompts: identical for identical settings and tokenizer."""
    return [r.prompt for r in random_requests(tokenizer, settings.prompts, settings.input_len,
                                              settings.max_tokens, settings.seed)]


def probe_payload(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """The body of one probe request (see the module docstring for each field)."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "logprobs": 1, "return_token_ids": True, "ignore_eos": True, "stream": False}


def parse_answer(body: bytes) -> ProbeAnswer:
    """A /v1/completions answer -> ProbeAnswer; ProbeError if it is not JSON or lacks
    `choices[0].token_ids` or `choices[0].logprobs.token_logprobs` of the same length."""
    try:
        choice = json.loads(body)["choices"][0]
        ids = tuple(int(i) for i in choice["token_ids"])
        logprobs = tuple(float(v) for v in choice["logprobs"]["token_logprobs"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ProbeError(f"answer without token ids and logprobs ({type(exc).__name__}: "
                         f"{exc}): {body[:200]!r}") from None
    if len(ids) != len(logprobs):
        raise ProbeError(f"{len(ids)} token ids but {len(logprobs)} logprobs in the answer")
    return ProbeAnswer(ids, logprobs)


async def send_probe(base_url: str, model: str, prompts: Sequence[str], max_tokens: int,
                     concurrency: int, timeout_s: float, api_key: str | None = None
                     ) -> tuple[ProbeAnswer, ...]:
    """Send every prompt, at most `concurrency` at a time, through the project's HTTP client;
    the answers in prompt order. The first failure (status other than 200, timeout, refused
    connection, malformed answer) raises ProbeError naming the prompt."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    pool = ConnectionPool(base_url, api_key)
    slots = asyncio.Semaphore(concurrency)

    async def one(index: int, prompt: str) -> ProbeAnswer:
        payload = json.dumps(probe_payload(model, prompt, max_tokens)).encode()
        async with slots:
            try:
                response = await post_json(pool, PATH, payload, timeout_s)
            except OSError as exc:
                raise ProbeError(f"probe prompt {index}: {type(exc).__name__}: {exc}") from None
        if response.status != 200:
            raise ProbeError(f"probe prompt {index}: HTTP {response.status} {response.reason}: "
                             f"{response.text()[:300]}")
        try:
            return parse_answer(response.body)
        except ProbeError as exc:
            raise ProbeError(f"probe prompt {index}: {exc}") from None

    try:
        return tuple(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    finally:
        pool.close()
