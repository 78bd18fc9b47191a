"""The workload's `timed_trace:` section: vllm bench serve's timed-trace dataset options.

Each key is one flag of vLLM 0.32's "timed-trace dataset options" group
(``vllm/benchmarks/datasets/datasets.py``, add_dataset_parser; read by class TimedTrace) with
its meaning: `chunk_hash_size` (--timed-trace-chunk-hash-size: tokens each hash id stands
for, 16 by default; Mooncake's traces use 512), `sec_multiplier`
(--timed-trace-sec-multiplier: timestamps are multiplied by it to get seconds, e.g. 0.001 for
milliseconds) and the four `label_*` keys (--timed-trace-label-*: the field holding the
timestamp, input length, output length and hash ids). A label left out is the format's own
name: `timestamp`, `input_length`, `output_length`, `hash_ids` in JSONL (vLLM's defaults),
`TIMESTAMP`, `ContextTokens`, `GeneratedTokens` in an Azure-style CSV (no hash ids there).
framework.load.trace reads the file with these settings. Unknown keys are errors.
"""

from __future__ import annotations

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field


class TimedTraceSpec(BaseModel):
    """How a timed trace is read (None labels: the format's default field names)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    chunk_hash_size: int = Field(default=16, gt=0)
    sec_multiplier: float = Field(default=1.0, gt=0)
    label_timestamp: str | None = Field(default=None, min_length=1)
    label_input_length: str | None = Field(default=None, min_length=1)
    label_output_length: str | None = Field(default=None, min_length=1)
    label_hash_ids: str | None = Field(default=None, min_length=1)
