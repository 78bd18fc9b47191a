"""The workload's `multi_turn:` section (`dataset: multi_turn`): chat sessions whose every turn
resends the conversation so far plus a new user message, after a think time.

Names follow the ecosystem: `turns`, `prompt_tokens`, `output_tokens` are GuideLLM's synthetic
multi-turn keys (user turns per conversation, tokens of each user message, tokens of each
answer); a drawn number is `{distribution: ..., ...}` with the distribution names and keys of
vLLM's multi-turn benchmark (benchmarks/multi_turn/bench_dataset.py in vLLM's repository:
constant `value`; uniform `min`, `max`; lognormal `average`, `median_ratio`, `max`), plus
`exponential` with its `mean` (and an optional `max`) for think times. `max_turns` and
`max_active_sessions` are that benchmark's `--max-turns` and `--max-active-conversations`.
Unknown keys are errors; each key applies to the distributions that use it only.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import model_validator

LOGNORMAL_MEDIAN_RATIO = 0.85  # vLLM's default median/average of its lognormal

_KEYS: dict[str, tuple[set[str], set[str]]] = {  # distribution -> (required, optional) keys
    "constant": ({"value"}, set()),
    "uniform": ({"min", "max"}, set()),
    "exponential": ({"mean"}, {"max"}),
    "lognormal": ({"average"}, {"median_ratio", "max"}),
}


class DistributionSpec(BaseModel):
    """One number drawn per item (a session, a turn). Mean: constant `value`; uniform
    `(min + max) / 2`; exponential `mean`; lognormal `average` (before the `max` cap)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    distribution: Literal["constant", "uniform", "exponential", "lognormal"]
    value: float | None = Field(default=None, ge=0)
    min: float | None = Field(default=None, ge=0)
    max: float | None = Field(default=None, ge=0)
    mean: float | None = Field(default=None, gt=0)
    average: float | None = Field(default=None, gt=0)
    median_ratio: float | None = Field(default=None, gt=0, lt=1)

    @model_validator(mode="after")
    def _keys_of_its_distribution(self) -> DistributionSpec:
        required, optional = _KEYS[self.distribution]
        given = {k for k in ("value", "min", "max", "mean", "average", "median_ratio")
                 if getattr(self, k) is not None}
        if missing := sorted(required - given):
            raise ValueError(f"distribution {self.distribution} needs {', '.join(missing)}")
        if extra := sorted(given - required - optional):
            raise ValueError(f"{', '.join(extra)} does not apply to distribution "
                             f"{self.distribution} (it takes {', '.join(sorted(required | optional))})")
        if self.distribution == "uniform" and self.min is not None and self.max is not None \
                and self.min > self.max:
            raise ValueError(f"min {self.min:g} > max {self.max:g}")
        return self

    @property
    def expected(self) -> float:
        """The distribution's mean, before any `max` cap."""
        if self.distribution == "constant":
            return float(self.value or 0.0)
        if self.distribution == "uniform":
            return (float(self.min or 0.0) + float(self.max or 0.0)) / 2
        if self.distribution == "exponential":
            return float(self.mean or 0.0)
        return float(self.average or 0.0)

    @property
    def upper(self) -> float:
        """The largest value a draw can take (inf when uncapped)."""
        if self.distribution == "constant":
            return float(self.value or 0.0)
        return math.inf if self.max is None else float(self.max)


def constant(value: float) -> DistributionSpec:
    return DistributionSpec(distribution="constant", value=value)


SYNTHETIC_KEYS = ("turns", "prompt_tokens")


class MultiTurnSpec(BaseModel):
    """Sessions of a `dataset: multi_turn` workload.

    `num_sessions` sessions start by the workload's arrival process (`request_rate` is then
    sessions per second, `burstiness` its gamma shape), each sending its turns one after
    another: turn k+1 is sent `think_time_s` after turn k's answer ended. Synthetic (no
    `workload.dataset_path`): `turns` user turns per session, user messages of
    `prompt_tokens` random tokens, answers of `output_tokens` tokens. From a ShareGPT file
    (`workload.dataset_path`): each conversation's user messages in order, answers as long as
    the dataset's answer (vLLM's multi-turn default) unless `output_tokens` is given. Defaults
    when left out: turns 3, prompt_tokens 32, output_tokens 32, think_time_s 0.
    `max_turns`: at most this many user turns per session. `max_active_sessions`: at most this
    many sessions open at once (a session waits to start); `workload.max_concurrency` still
    bounds requests in flight.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_sessions: int = Field(default=20, gt=0)
    turns: DistributionSpec | None = None
    prompt_tokens: DistributionSpec | None = None
    output_tokens: DistributionSpec | None = None
    think_time_s: DistributionSpec = constant(0.0)
    max_turns: int | None = Field(default=None, gt=0)
    max_active_sessions: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _counts_are_positive(self) -> MultiTurnSpec:
        for name in ("turns", "prompt_tokens", "output_tokens"):
            dist = getattr(self, name)
            if dist is not None and dist.distribution == "constant" and (dist.value or 0) < 1:
                raise ValueError(f"{name}: a constant count must be >= 1, got {dist.value:g}")
        return self

    @property
    def synthetic_turns(self) -> DistributionSpec:
        return self.turns or constant(3)

    @property
    def synthetic_prompt_tokens(self) -> DistributionSpec:
        return self.prompt_tokens or constant(32)

    @property
    def synthetic_output_tokens(self) -> DistributionSpec:
        return self.output_tokens or constant(32)


def workload_problem(dataset: str, has_path: bool, multi_turn: MultiTurnSpec | None,
                     fields_set: set[str]) -> str | None:
    """Why a workload's keys do not fit together for multi-turn sessions (None: they do):
    `multi_turn:` belongs to `dataset: multi_turn`; sessions are counted by
    multi_turn.num_sessions, not num_prompts; ShareGPT sessions take their turns and user
    messages from the file, so `turns` and `prompt_tokens` are synthetic-only. Pure."""
    if dataset != "multi_turn":
        return (f"multi_turn: applies to dataset multi_turn only, not to dataset {dataset}"
                if multi_turn is not None else None)
    if "num_prompts" in fields_set:
        return ("num_prompts counts single requests; a multi_turn workload counts sessions: "
                "set multi_turn.num_sessions")
    if has_path and multi_turn is not None:
        given = [k for k in SYNTHETIC_KEYS if getattr(multi_turn, k) is not None]
        if given:
            return (f"multi_turn.{given[0]} applies to synthetic sessions only; with "
                    "dataset_path the turns and user messages come from the file")
    return None
