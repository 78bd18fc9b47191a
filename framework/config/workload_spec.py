"""The sweep file's `workload:` section (and each of `workloads:`): what to send and how fast,
validated as one frozen `WorkloadSpec`; its sub-sections have models of their own (sampling,
timed_trace, multi_turn, mix)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any
from typing import Literal

from pydantic import Field
from pydantic import field_validator
from pydantic import model_validator

from framework.config.mix_spec import RequestClassSpec
from framework.config.mix_spec import class_workload
from framework.config.mix_spec import mix_problem
from framework.config.multi_turn_spec import MultiTurnSpec
from framework.config.multi_turn_spec import workload_problem
from framework.config.sampling_spec import SamplingSpec
from framework.config.spec_base import NAME as _NAME
from framework.config.spec_base import Spec as _Spec
from framework.config.trace_spec import TimedTraceSpec


class WorkloadSpec(_Spec):
    """What the load generator sends. Mirrors `vllm bench serve` flags of the same names.

    dataset: `random` (input_len, output_len, range_ratio), `sharegpt` (dataset_path, a
    ShareGPT JSON/JSONL file; optional min/max_prompt_tokens, inclusive) or `prefix-shared`
    (prefix_groups groups of prompts of input_len tokens sharing their first prefix_len),
    `timed_trace` (dataset_path, a JSONL or Azure-style CSV trace read as the `timed_trace:`
    section says, config.trace_spec; its first num_prompts rows are sent at their timestamps
    divided by `speed_up`, which a search space may vary as `speed-up`, kind: run; the
    completions endpoint only, and no request_rate or burstiness: the trace times requests)
    or `multi_turn` (chat sessions, the `multi_turn:` section; dataset_path: optional ShareGPT
    conversations, else synthetic).
    endpoint: `completions` (/v1/completions) or `chat` (/v1/chat/completions).
    duration_s: stop sending new requests after this many seconds (requests in flight
    finish); the run also ends when num_prompts have been sent.
    mix: request classes sent together over this one arrival process (config.mix_spec).
    """

    dataset: Literal["random", "sharegpt", "prefix-shared", "timed_trace", "multi_turn"] = "random"
    tokenizer: Path | None = None  # folder with tokenizer.json; default: the model folder
    dataset_path: Path | None = None
    min_prompt_tokens: int | None = Field(default=None, gt=0)
    max_prompt_tokens: int | None = Field(default=None, gt=0)
    prefix_groups: int = Field(default=4, gt=0)
    prefix_len: int = Field(default=64, gt=0)
    endpoint: Literal["completions", "chat"] = "completions"
    duration_s: float | None = Field(default=None, gt=0)
    num_prompts: int = Field(default=200, gt=0)
    input_len: int = Field(default=128, gt=0)
    output_len: int = Field(default=64, gt=0)
    range_ratio: float = Field(default=0.0, ge=0, lt=1)
    request_rate: float = Field(default=math.inf, gt=0)
    burstiness: float = Field(default=1.0, gt=0)
    max_concurrency: int | None = Field(default=None, gt=0)
    warmup_requests: int = Field(default=16, ge=0)
    ignore_eos: bool = True
    seed: int = 0
    request_timeout_s: float = Field(default=300.0, gt=0)
    percentiles: tuple[float, ...] = (25, 50, 75, 90, 95, 99)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)  # vllm bench's sampling flags
    timed_trace: TimedTraceSpec | None = None  # dataset timed_trace: how its file is read
    speed_up: float = Field(default=1.0, gt=0)  # dataset timed_trace: replay this many times faster
    multi_turn: MultiTurnSpec | None = None  # dataset multi_turn's sessions (config.multi_turn_spec)
    mix: tuple[RequestClassSpec, ...] = ()

    @field_validator("percentiles")
    @classmethod
    def _percentiles_in_range(cls, values: tuple[float, ...]) -> tuple[float, ...]:
        for p in values:
            if not 0 < p <= 100:
                raise ValueError(f"percentile {p} is outside (0, 100]")
        return values

    @field_validator("dataset_path", "min_prompt_tokens", "max_prompt_tokens", "prefix_groups",
                     "prefix_len")
    @classmethod
    def _for_its_dataset(cls, value: Any, info: Any) -> Any:  # info: pydantic.ValidationInfo
        dataset = info.data.get("dataset")
        wanted = "prefix-shared" if info.field_name.startswith("prefix") else "sharegpt"
        if info.field_name == "dataset_path" and dataset in ("timed_trace", "multi_turn"):
            wanted = dataset  # a trace file; ShareGPT conversations as sessions
        if dataset is not None and dataset != wanted:
            raise ValueError(f"applies to dataset {wanted} only, not to dataset {dataset}")
        if info.field_name == "dataset_path" and not Path(value).is_file():
            kind = "a JSONL or CSV trace" if wanted == "timed_trace" else "a ShareGPT JSON or JSONL file"
            raise ValueError(f"file not found ({kind})")
        low = info.data.get("min_prompt_tokens")
        if info.field_name == "max_prompt_tokens" and low is not None and value < low:
            raise ValueError(f"max_prompt_tokens {value} < min_prompt_tokens {low}")
        return value

    @model_validator(mode="after")
    def _dataset_complete(self) -> WorkloadSpec:
        if self.dataset == "sharegpt" and self.dataset_path is None:
            raise ValueError("dataset sharegpt needs dataset_path (a ShareGPT JSON or JSONL file)")
        if self.dataset == "timed_trace":
            self._trace_complete()
        elif self.timed_trace is not None or self.speed_up != 1.0:
            raise ValueError("timed_trace and speed_up apply to dataset timed_trace only")
        if self.dataset == "prefix-shared" and self.prefix_len >= self.input_len:
            raise ValueError(f"prefix_len {self.prefix_len} must be < input_len {self.input_len} "
                             "(each prompt needs a suffix of its own)")
        if problem := workload_problem(self.dataset, self.dataset_path is not None,
                                       self.multi_turn, self.model_fields_set):
            raise ValueError(problem)
        return self

    def _trace_complete(self) -> None:
        if self.dataset_path is None:
            raise ValueError("dataset timed_trace needs dataset_path (a JSONL or CSV trace)")
        if self.endpoint != "completions":
            raise ValueError("dataset timed_trace sends token-id prompts: endpoint completions "
                             "only (as vllm bench)")
        if not math.isinf(self.request_rate) or self.burstiness != 1.0:
            raise ValueError("dataset timed_trace sends each request at its timestamp: "
                             "request_rate and burstiness do not apply (speed_up scales the "
                             "trace's time)")

    @property
    def sessions(self) -> MultiTurnSpec:
        """The multi-turn settings (defaults when the section is left out)."""
        return self.multi_turn or MultiTurnSpec()

    @model_validator(mode="after")
    def _mix_classes(self) -> WorkloadSpec:
        """Each class of the mix, with the workload's keys it does not set, is a valid workload."""
        if self.mix and self.dataset in ("timed_trace", "multi_turn"):
            raise ValueError(f"mix: classes of single requests share one arrival process; "
                             f"dataset {self.dataset} brings its own schedule and does not mix")
        if problem := mix_problem(self._set_fields(), self.mix, WorkloadSpec.model_validate):
            raise problem
        return self

    def for_class(self, name: str) -> WorkloadSpec:
        """The workload request class `name` of the mix sees (its dataset keys over ours)."""
        c = next(c for c in self.mix if c.name == name)
        return WorkloadSpec.model_validate(class_workload(self._set_fields(), c))

    def _set_fields(self) -> dict[str, Any]:
        """The workload fields given in the file (a named workload's name and weight left out)."""
        return {k: getattr(self, k) for k in self.model_fields_set if k in WorkloadSpec.model_fields}


class NamedWorkloadSpec(WorkloadSpec):
    """One of several workloads (`workloads:`, config.workloads_spec): a workload with a name
    (its rows in `results/<sweep>/workloads/`) and a weight (for `objective.aggregate: mean`)."""

    name: str = Field(pattern=_NAME.pattern)
    weight: float = Field(default=1.0, gt=0)
