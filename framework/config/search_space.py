"""Search-space YAML -> typed parameters. Knows nothing of Optuna.

A parameter's name is the vLLM flag without dashes (`max-num-seqs`). `default` is vLLM's own
default for the flag on the target engine: the baseline trial passes no flag at all and records
these values, so they must be true for the installed vLLM.

    parameters:
      max-num-seqs: {type: int, low: 2, high: 128, log: true, default: 128}
      max-num-batched-tokens: {type: categorical, choices: [512, 1024, 2048], default: 2048}
      enable-prefix-caching: {type: bool, default: true}

A parameter with `kind: run` is a run setting, not a vLLM flag: one of RUN_SETTINGS (the
load's request rate, concurrency or burstiness, or a timed trace's speed-up), applied by the
load generator (its
`default` is the setting the baseline trial runs with). Trials whose
server flags are equal and whose run settings differ can share one running server.

A parameter with `lossy: true` may change the model's outputs at values other than its default
(vLLM already knows kv-cache-dtype, quantization, dtype and speculative decoding:
framework.engine.output_flags): trials that set it run the quality probe against the baseline
(framework.trial.quality).

A parameter with `when: {other-flag: value, ...}` is conditional: it is searched (and passed
to vLLM) only in trials where each named earlier parameter took that value, e.g.
`num-speculative-tokens: {type: int, low: 1, high: 8, when: {speculative-method: ngram}}`.

A parameter with `kind: shape` is a deployment-shape setting, not a vLLM flag: one of
SHAPE_SETTINGS. `replicas: {type: int, low: 1, high: 4, kind: shape, default: 1}` runs each
trial as that many identical servers behind a router (framework/trial/replicas.py), measured
as one deployment; its default is the single server. `prefill-servers: {type: categorical,
choices: [0, 1], kind: shape, default: 0}` puts that many prefill servers in front of them
(prefill/decode: the `replicas` then decode, with a KV connector); 0 is no prefill server.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated
from typing import Any
from typing import Literal
from typing import TypeVar

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import model_validator

from framework.base.vocabulary import Scalar
from framework.config import secret_names
from framework.config.yaml_io import EntryError
from framework.config.yaml_io import SecretInSweep
from framework.config.yaml_io import load_validated

_V = TypeVar("_V")  # what server_params filters: parameters, or their values

# Run settings a search space may vary (kind: run), and the workload field each one sets.
RUN_SETTINGS: dict[str, str] = {"request-rate": "request_rate",
                                "max-concurrency": "max_concurrency",
                                "burstiness": "burstiness",
                                "speed-up": "speed_up"}
# Deployment-shape settings a search space may vary (kind: shape), with their least value:
# `replicas`, the identical servers a trial runs behind one router (framework/trial/replicas.py);
# `prefill-servers`, prefill servers in front of them (0: none; more: prefill/decode, the
# `replicas` then decode, the KV cache handed over by a KV connector).
SHAPE_MINIMUM: dict[str, int] = {"replicas": 1, "prefill-servers": 0}
SHAPE_SETTINGS: tuple[str, ...] = tuple(SHAPE_MINIMUM)


def shape_setting(params: Mapping[str, Scalar], name: str) -> int:
    """Shape setting `name` of a trial's parameters; its least value (the single server's)
    where the trial leaves it out."""
    value = params.get(name)
    return SHAPE_MINIMUM[name] if value is None else int(value)


class _Param(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = ""
    help: str = ""
    kind: Literal["server", "run", "shape"] = "server"
    when: dict[str, Scalar] = Field(default_factory=dict)
    lossy: bool = False


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


def _can_take(param: _Param, value: Scalar) -> bool:
    if isinstance(param, BoolParam):
        return isinstance(value, bool)
    if isinstance(param, CategoricalParam):
        return value in param.choices
    if isinstance(param, (IntParam, FloatParam)) and not isinstance(value, bool) \
            and isinstance(value, (int, float)):
        return param.low <= value <= param.high
    return False


# SearchSpace.siblings enumerates run settings of at most this many values each.
SIBLING_VALUES = 16


def discrete_values(param: _Param, max_values: int | None = None) -> list[Scalar] | None:
    """Every value of a discrete parameter: both booleans, the choices, or each step of an int
    range; None for a float range, or an int range of more than `max_values` steps."""
    if isinstance(param, BoolParam):
        return [False, True]
    if isinstance(param, CategoricalParam):
        return list(param.choices)
    if isinstance(param, IntParam) and (max_values is None
                                        or (param.high - param.low) // param.step < max_values):
        return list(range(param.low, param.high + 1, param.step))
    return None


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

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        """A parameter named like a credential (config.secret_names) is SecretInSweep, checked
        before any other rule so that no error shows its values."""
        params = data.get("parameters") if isinstance(data, dict) else None
        for name in map(str, params if isinstance(params, dict) else ()):
            if secret_names.is_api_key(name):
                raise SecretInSweep(f"parameters.{name}", "an API key is not a parameter; name "
                                    "its variable in server.api_key_env")
            if secret_names.looks_secret(name):
                raise SecretInSweep(f"parameters.{name}", secret_names.safe_way(name, flag=True))
        return data

    @model_validator(mode="after")
    def _named(self) -> SearchSpace:
        """Each parameter's rules; an error names the parameter and shows its own entry
        (yaml_io.EntryError), not the whole file."""
        if not self.parameters:
            raise ValueError("no parameters")
        seen: list[str] = []
        for name, param in self.parameters.items():
            try:
                self._check(name, param, seen)
            except ValueError as exc:
                shown = param.model_dump(exclude_defaults=True, exclude={"name", "help"})
                raise EntryError(f"parameters.{name}", shown, str(exc)) from None
            seen.append(name)
        return self

    def _check(self, name: str, param: _Param, before: Sequence[str]) -> None:
        if name.startswith("-") or not name.replace("-", "").isalnum():
            raise ValueError(f"parameter {name!r}: use the vLLM flag name without dashes")
        object.__setattr__(param, "name", name)
        if param.kind == "run" and name not in RUN_SETTINGS:
            raise ValueError(f"parameter {name!r}: kind: run is for the load settings "
                             f"{', '.join(RUN_SETTINGS)}; a vLLM flag is kind: server")
        if param.kind == "run" and param.lossy:
            raise ValueError(f"parameter {name!r}: lossy: true is for vLLM flags; a load "
                             "setting does not change the outputs")
        if param.kind == "server" and name in RUN_SETTINGS:
            raise ValueError(f"parameter {name!r} is a load setting, not a vLLM flag: "
                             "mark it kind: run")
        _check_shape_param(name, param)
        for other, value in param.when.items():
            if other not in before:
                raise ValueError(f"parameter {name!r}: when names {other!r}, which is not a "
                                 "parameter listed before it")
            if not _can_take(self.parameters[other], value):
                raise ValueError(f"parameter {name!r}: when {other}: {value!r} is a value "
                                 f"{other!r} never takes")

    @property
    def run_params(self) -> tuple[str, ...]:
        return tuple(n for n, p in self.parameters.items() if p.kind == "run")

    @property
    def shape_params(self) -> tuple[str, ...]:
        return tuple(n for n, p in self.parameters.items() if p.kind == "shape")

    def server_params(self, params: Mapping[str, _V]) -> dict[str, _V]:
        """The entries of `params` that are vLLM flags (kind: server)."""
        return {n: v for n, v in params.items()
                if n not in self.run_params and n not in self.shape_params}

    def shape_settings(self, params: Mapping[str, Scalar]) -> dict[str, Scalar]:
        """The deployment-shape settings in `params` (kind: shape), by name (`replicas`)."""
        return {n: v for n, v in params.items() if n in self.shape_params}

    def run_settings(self, params: Mapping[str, Scalar]) -> dict[str, Scalar]:
        """The run settings in `params`, keyed by workload field (`max_concurrency`)."""
        return {RUN_SETTINGS[n]: v for n, v in params.items() if n in self.run_params}

    def siblings(self, params: Mapping[str, Scalar],
                 max_values: int = SIBLING_VALUES) -> list[dict[str, Scalar]]:
        """`params` with its run settings set to every other combination of their values, for
        run parameters with a small discrete set of values (categorical, bool, int ranges of
        at most `max_values`); [] when there are none."""
        names = [n for n in self.run_params if n in params]
        values = [discrete_values(self.parameters[n], max_values) for n in names]
        discrete = [v for v in values if v is not None]
        if not names or len(discrete) < len(values):
            return []
        current = tuple(params[n] for n in names)
        return [{**params, **dict(zip(names, combo))}
                for combo in itertools.product(*discrete) if combo != current]

    def run_combinations(self, max_values: int | None = SIBLING_VALUES) -> int:
        """How many combinations of values the run settings take (each discrete within
        `max_values` values); 1 when there are none, or when one is not."""
        values = [discrete_values(self.parameters[n], max_values) for n in self.run_params]
        return 1 if any(v is None for v in values) else math.prod(len(v) for v in values if v)

    @property
    def conditional(self) -> bool:
        return any(p.when for p in self.parameters.values())

    def active(self, name: str, chosen: dict[str, Scalar]) -> bool:
        """Whether parameter `name` applies given the values chosen for earlier parameters."""
        return all(other in chosen and chosen[other] == value
                   for other, value in self.parameters[name].when.items())

    def defaults(self) -> dict[str, Scalar]:
        """vLLM's default for every parameter active at the defaults (the baseline trial's
        recorded values)."""
        out: dict[str, Scalar] = {}
        for name, p in self.parameters.items():
            if p.default is not None and self.active(name, out):
                out[name] = p.default
        return out

    def missing_defaults(self) -> list[str]:
        return [name for name, p in self.parameters.items() if p.default is None and not p.when]


def _check_shape_param(name: str, param: _Param) -> None:
    """kind: shape only for SHAPE_SETTINGS, whose values are whole numbers of servers >= 1,
    never lossy; a shape setting is never a vLLM flag."""
    if param.kind != "shape":
        if name in SHAPE_SETTINGS:
            raise ValueError(f"parameter {name!r} is a deployment-shape setting, not a vLLM "
                             "flag: mark it kind: shape")
        return
    if name not in SHAPE_SETTINGS:
        raise ValueError(f"parameter {name!r}: kind: shape is for {', '.join(SHAPE_SETTINGS)}; "
                         "a vLLM flag is kind: server")
    if param.lossy:
        raise ValueError(f"parameter {name!r}: a shape setting is never lossy")
    least = SHAPE_MINIMUM[name]
    values = discrete_values(param, 64)
    if values is None or not all(isinstance(v, int) and not isinstance(v, bool) and v >= least
                                 for v in values):
        raise ValueError(f"parameter {name!r}: the number of servers is a whole number >= "
                         f"{least} (an int range or int choices)")


def load_search_space(path: Path) -> SearchSpace:
    """Read and validate a search-space file; every problem is a one-line ConfigError."""
    return load_validated(path, SearchSpace, "search-space")


def coarse_values(param: _Param, steps: int = 5) -> list[Scalar]:
    """A few values standing for a parameter, for predicting over a space: every discrete value
    of a parameter with at most 16; else, for a log range, its powers of 2 and its bounds, for
    a linear one `steps` evenly spaced values (ints on the range's steps)."""
    values = discrete_values(param, max_values=SIBLING_VALUES)
    if values is not None:
        return values
    assert isinstance(param, (IntParam, FloatParam))
    low, high = param.low, param.high
    if param.log:
        powers = [2.0 ** k for k in range(math.ceil(math.log2(low)), math.floor(math.log2(high)) + 1)]
        points: list[float] = sorted({float(low), *powers, float(high)})
    else:
        points = [low + (high - low) * i / (steps - 1) for i in range(steps)]
    if isinstance(param, IntParam):
        return sorted({min(param.high, param.low + round((v - param.low) / param.step) * param.step)
                       for v in points})
    return list(points)


def configurations(space: SearchSpace, values_of: Mapping[str, Sequence[Scalar]] | None = None
                   ) -> Iterator[dict[str, Scalar]]:
    """Every configuration of a discrete space (every parameter's discrete values, or the
    values `values_of` gives it), walked as the define-by-run tree: a conditional parameter
    branches only where its `when` holds, so no configuration repeats. In parameter order; a
    float range is taken as one value (None)."""
    names = list(space.parameters)
    given: Mapping[str, Sequence[Scalar]] = values_of or {}
    one: list[Any] = [None]
    values: list[list[Any]] = [list(given.get(n) or discrete_values(space.parameters[n]) or one)
                               for n in names]

    def walk(i: int, chosen: dict[str, Scalar]) -> Iterator[dict[str, Scalar]]:
        if i == len(names):
            yield dict(chosen)
            return
        if not space.active(names[i], chosen):
            yield from walk(i + 1, chosen)
            return
        for value in values[i]:
            chosen[names[i]] = value
            yield from walk(i + 1, chosen)
        del chosen[names[i]]

    return walk(0, {})


def grid_values(space: SearchSpace) -> dict[str, list[Scalar]]:
    """Every value of every parameter, for the grid sampler: choices, both booleans, or each
    step of an int range. Raises ValueError naming the parameter for a float range."""
    grid: dict[str, list[Scalar]] = {}
    for name, p in space.parameters.items():
        values = discrete_values(p)
        if values is None:
            raise ValueError(f"parameter {name!r} is a float range; the grid sampler needs a "
                             "categorical list of values")
        grid[name] = values
    return grid


def grid_points(space: SearchSpace, max_points: int = 4096) -> list[dict[str, Scalar]]:
    """The grid sampler's configurations: the product of grid_values, a conditional parameter
    only where its `when` holds (configurations). Raises ValueError for a float range or a grid
    of more than `max_points` configurations."""
    grid_values(space)
    points = list(itertools.islice(configurations(space), max_points + 1))
    if len(points) > max_points:
        size = math.prod(len(v) for v in grid_values(space).values())
        raise ValueError(f"the grid has {'up to ' if space.conditional else ''}{size} "
                         f"configurations (more than {max_points}); use categorical choices "
                         "for the large ranges")
    return points


def grid_size(space: SearchSpace) -> int:
    return len(grid_points(space))
