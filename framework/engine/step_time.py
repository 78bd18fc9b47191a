"""One engine step's shape and the time it takes: the seam between a performance model
(engine/predictor.py: AIConfigurator's kernel tables, ...) and the scheduler that composes
steps (engine/step_sim.py, vLLM V1's continuous batching).

A step is one forward pass of vLLM V1's engine (vllm/v1/core/sched/scheduler.py `schedule`):
some prompt tokens being prefilled (whole prompts, or chunks with chunked prefill) and some
sequences decoding one token each, in one batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class StepShape:
    """What one step computes.

    prefill_tokens: prompt tokens computed this step (a chunk counts its own tokens);
    prefill_context: mean prompt length of the sequences being prefilled (their attention
      spans the whole prompt so far), 0 when none;
    decode_seqs: sequences decoding one token this step;
    decode_context: mean tokens already in the KV cache of those sequences, 0 when none.
    """

    prefill_tokens: int
    prefill_context: int
    decode_seqs: int
    decode_context: int

    @property
    def empty(self) -> bool:
        return self.prefill_tokens == 0 and self.decode_seqs == 0


class StepTime(Protocol):
    """Milliseconds one step of `step` takes on one deployment (its model, GPU, TP, PP and
    KV dtype fixed when the callable was made). Must be > 0 for a non-empty step."""

    def __call__(self, step: StepShape) -> float: ...
