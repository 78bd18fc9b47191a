"""Search-space YAML -> typed parameters. Knows nothing of Optuna.

A parameter's name is the vLLM flag without dashes (`max-num-seqs`). `default` is vLLM's own
default for the flag on the target engine: the baseline trial passes no flag at all and records
these values, so they must be true for the installed vLLM.

    parameters:
      max-num-seqs: {type: int, low: 2, high: 128, log: true, default: 128}
      max-num-batched-tokens: {type: categorical, choices: [512, 1024, 2048], default: 2048}
      enable-prefix-caching: {type: bool, default: true}
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from framework.errors import ConfigError
from framework.specs import Scalar, first_error, read_yaml


class _Param(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = ""
    help: str = ""


class IntParam(_Param):
    type: Literal["int"]
    low: int
    high: int
    step: int = Field(default=1, gt=0)
    log: bool = False
    default: int | None = None

    @model_validator(mode="after")
    def _range(self) -> IntParam:
        _check_range(self.low, self.high, self.log, self.default)
        if self.log and self.step != 1:
            raise ValueError("log: true needs step 1")
        return self


class FloatParam(_Param):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    default: float | None = None

    @model_validator(mode="after")
    def _range(self) -> FloatParam:
        _check_range(self.low, self.high, self.log, self.default)
        return self


class CategoricalParam(_Param):
    type: Literal["categorical"]
    choices: tuple[Scalar, ...]
    default: Scalar | None = None

    @model_validator(mode="after")
    def _choices(self) -> CategoricalParam:
        if not self.choices:
            raise ValueError("choices is empty")
        if len(set(self.choices)) != len(self.choices):
            raise ValueError(f"choices repeat a value: {list(self.choices)}")
        if self.default is not None and self.default not in self.choices:
            raise ValueError(f"default {self.default!r} is not one of the choices")
        return self


class BoolParam(_Param):
    type: Literal["bool"]
    default: bool | None = None


Param = Annotated[IntParam | FloatParam | CategoricalParam | BoolParam, Field(discriminator="type")]


def _check_range(low: float, high: float, log: bool, default: float | None) -> None:
    if low > high:
        raise ValueError(f"low {low} > high {high}")
    if log and low <= 0:
        raise ValueError(f"log: true needs low > 0, got {low}")
    if default is not None and not low <= default <= high:
        raise ValueError(f"default {default} is outside [{low}, {high}]")


class SearchSpace(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    description: str = ""
    parameters: dict[str, Param]

    @model_validator(mode="after")
    def _named(self) -> SearchSpace:
        if not self.parameters:
            raise ValueError("no parameters")
        for name, param in self.parameters.items():
            if name.startswith("-") or not name.replace("-", "").isalnum():
                raise ValueError(f"parameter {name!r}: use the vLLM flag name without dashes")
            object.__setattr__(param, "name", name)
        return self

    def defaults(self) -> dict[str, Scalar]:
        """vLLM's default for every parameter (the baseline trial's recorded values)."""
        return {name: p.default for name, p in self.parameters.items() if p.default is not None}

    def missing_defaults(self) -> list[str]:
        return [name for name, p in self.parameters.items() if p.default is None]


def load_search_space(path: Path) -> SearchSpace:
    """Read and validate a search-space file; every problem is a one-line ConfigError."""
    data = read_yaml(path)
    try:
        return SearchSpace.model_validate(data)
    except ValidationError as exc:
        key, value, msg = first_error(exc)
        raise ConfigError(str(path), key, value, msg) from None
