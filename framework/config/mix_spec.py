"""A workload's `mix:` section: named request classes sent together over the workload's one
arrival process (framework.load.mix draws them). Unknown keys are errors.

    workload:
      request_rate: 4
      mix:
        - {name: chat, weight: 0.7, input_len: 128, output_len: 64}
        - {name: summarize, weight: 0.3, input_len: 1024, output_len: 128}

A class's share of the requests is its weight / the sum of the weights. Each dataset key a
class leaves out is the workload's (dataset, input_len, output_len, range_ratio,
dataset_path, min/max_prompt_tokens, prefix_len, prefix_groups). Its metrics and SLA keys carry
its name as a prefix: `summarize.p99_ttft_ms` (base.vocabulary.class_key).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import Literal

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import ValidationError
from pydantic import field_validator

from framework.base.vocabulary import CLASS_NAME
from framework.config.yaml_io import EntryError

# The dataset keys a class may set; the rest of the workload (rate, seed, ...) is shared.
CLASS_DATASET_KEYS: tuple[str, ...] = (
    "dataset", "input_len", "output_len", "range_ratio", "dataset_path", "min_prompt_tokens",
    "max_prompt_tokens", "prefix_len", "prefix_groups",
)


class RequestClassSpec(BaseModel):
    """One request class of a mix: its name, weight and the dataset keys it sets itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    weight: float = Field(gt=0)
    dataset: Literal["random", "sharegpt", "prefix-shared"] | None = None
    input_len: int | None = Field(default=None, gt=0)
    output_len: int | None = Field(default=None, gt=0)
    range_ratio: float | None = Field(default=None, ge=0, lt=1)
    dataset_path: Path | None = None
    min_prompt_tokens: int | None = Field(default=None, gt=0)
    max_prompt_tokens: int | None = Field(default=None, gt=0)
    prefix_len: int | None = Field(default=None, gt=0)
    prefix_groups: int | None = Field(default=None, gt=0)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not CLASS_NAME.fullmatch(name):
            raise ValueError("use letters, digits, '_' or '-' (at most 32), starting with a "
                             "letter, not a percentile word like p99: the name prefixes the "
                             "class's metric columns")
        return name

    @field_validator("dataset_path")
    @classmethod
    def _file(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError("file not found (a ShareGPT JSON or JSONL file)")
        return path


def mix_problem(workload: Mapping[str, Any], mix: Sequence[RequestClassSpec],
                validate: Callable[[dict[str, Any]], object]) -> EntryError | None:
    """What is wrong with the mix of the workload whose set fields are `workload` (None:
    nothing): repeated class names, a single class, or a class whose workload (class_workload)
    `validate` (WorkloadSpec.model_validate) rejects."""
    names = [c.name for c in mix]
    if len(set(names)) != len(names):
        return EntryError("mix", names, "repeats a class name")
    if len(mix) == 1:
        return EntryError("mix", names, "a mix needs at least two classes (one class is the "
                          "workload itself)")
    for index, c in enumerate(mix):
        try:
            validate(class_workload(workload, c))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            return EntryError(f"mix.{index}{'.' + where if where else ''}",
                              err.get("input") if where else c.model_dump(exclude_none=True),
                              f"class {c.name}: {err['msg'].removeprefix('Value error, ')}")
    return None


DATASET_ONLY_KEYS: tuple[str, ...] = (
    "dataset_path", "min_prompt_tokens", "max_prompt_tokens", "prefix_len", "prefix_groups",
)


def class_workload(workload: Mapping[str, Any], request_class: RequestClassSpec) -> dict[str, Any]:
    """The workload's fields set in the file (`workload`), as `request_class` sees them: the
    class's own dataset keys over the workload's; a class naming another dataset than the
    workload's drops the workload's dataset-only keys it does not set itself. Without a mix
    (validate it as a WorkloadSpec). Pure."""
    own = {k: getattr(request_class, k) for k in CLASS_DATASET_KEYS
           if getattr(request_class, k) is not None}
    merged = {k: v for k, v in workload.items() if k != "mix"}
    if own.get("dataset", merged.get("dataset", "random")) != merged.get("dataset", "random"):
        for key in DATASET_ONLY_KEYS:
            merged.pop(key, None)
    return {**merged, **own}


def shares(mix: Sequence[RequestClassSpec]) -> dict[str, float]:
    """Each class's share of the requests: weight / sum of weights."""
    total = sum(c.weight for c in mix)
    return {c.name: c.weight / total for c in mix}
