"""`plan`: what a sweep will cost before anything starts. Pure apart from reading results.

- Space size: the product of each parameter's number of values (categorical choices, 2 for a
  bool, the steps of an int range); a float range makes it unbounded. Conditional parameters
  count only where their condition holds.
- Feasible share: the feasibility model applied to every configuration of a discrete space of
  at most ENUMERATE_LIMIT configurations, else to SAMPLE_SIZE random ones (seeded).
- Wall time = (server starts x start-up + trials x (warm-up + load + overhead)) / trials side
  by side, each phase taken from this sweep's finished trials when there are any (start-up:
  of the trials that started their own server), else from DEFAULTS_S. Server starts = trials,
  or with server.reuse and discrete run settings in the space, trials / runs_per_server: every
  started server is measured at each combination of the run settings.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections import Counter
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from framework.engine.feasibility import Feasibility

if TYPE_CHECKING:
    from framework.results.queries import PhaseMeans
from framework.base.vocabulary import Scalar
from framework.config.search_space import SIBLING_VALUES
from framework.config.search_space import FloatParam
from framework.config.search_space import IntParam
from framework.config.search_space import SearchSpace
from framework.config.search_space import discrete_values

ENUMERATE_LIMIT = 20_000
SAMPLE_SIZE = 2_000
# Phase times (s) without history: CPU measured here (tiny model, enforce-eager); GPU a
# typical 8B-70B start (weights load + CUDA graph capture).
DEFAULTS_S = {"cpu": {"startup": 30.0, "warmup": 3.0, "bench": 10.0, "overhead": 3.0},
              "gpu": {"startup": 180.0, "warmup": 10.0, "bench": 60.0, "overhead": 5.0},
              "fake": {"startup": 2.0, "warmup": 0.5, "bench": 5.0, "overhead": 2.0}}


def configurations(space: SearchSpace) -> Iterator[dict[str, Scalar]]:
    """Every configuration of a discrete space, conditional parameters only where active."""
    names = list(space.parameters)
    seen: set[tuple] = set()
    values = [discrete_values(space.parameters[n]) or [None] for n in names]
    for combo in itertools.product(*values):
        config: dict[str, Scalar] = {}
        for name, value in zip(names, combo):
            if space.active(name, config):
                config[name] = value
        key = tuple(sorted(config.items()))
        if key not in seen:
            seen.add(key)
            yield config


def space_size(space: SearchSpace) -> int | None:
    """Distinct configurations, None when a float range makes the space unbounded."""
    if any(isinstance(p, FloatParam) for p in space.parameters.values()):
        return None
    if not space.conditional:
        return math.prod(len(discrete_values(p) or ()) for p in space.parameters.values())
    return sum(1 for _ in configurations(space))


def sample(space: SearchSpace, n: int, seed: int) -> list[dict[str, Scalar]]:
    """n random configurations (uniform per parameter; log ranges log-uniform)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        config: dict[str, Scalar] = {}
        for name, p in space.parameters.items():
            if not space.active(name, config):
                continue
            values = discrete_values(p)
            if values is not None and not (isinstance(p, IntParam) and p.log):
                config[name] = rng.choice(values)
            elif isinstance(p, IntParam):
                config[name] = int(round(math.exp(rng.uniform(math.log(p.low), math.log(p.high)))))
            else:
                assert isinstance(p, FloatParam)
                config[name] = (math.exp(rng.uniform(math.log(p.low), math.log(p.high)))
                                if p.log else rng.uniform(p.low, p.high))
        out.append(config)
    return out


@dataclass(frozen=True)
class FeasibleShare:
    checked: int
    feasible: int
    exhaustive: bool
    top_reasons: tuple[tuple[str, int], ...]


def feasible_share(configs: Sequence[Mapping[str, Scalar]], exhaustive: bool,
                   check: Callable[[Mapping[str, Scalar]], Feasibility | None]) -> FeasibleShare | None:
    """Apply `check(config) -> Feasibility | None` to each; None when no model applies."""
    reasons: Counter[str] = Counter()
    feasible = checked = 0
    for config in configs:
        result: Feasibility | None = check(config)
        if result is None:
            return None
        checked += 1
        feasible += result.ok
        reasons.update(_kind(r) for r in result.reasons)
    return FeasibleShare(checked, feasible, exhaustive, tuple(reasons.most_common(3)))


def _kind(reason: str) -> str:
    """A reason with its numbers as N, so alike reasons count together."""
    head = re.split(r" \(|: ", reason)[0]
    return re.sub(r"\d+(\.\d+)?", "N", head)[:140]


def runs_per_server(space: SearchSpace, sampler: str) -> int:
    """Trials one server serves under server.reuse: every combination of the run settings'
    values, which the grid sampler walks server configuration by server configuration; TPE and
    random reach them through SearchSpace.siblings, only for small discrete sets."""
    return space.run_combinations(None if sampler == "grid" else SIBLING_VALUES)


@dataclass(frozen=True)
class TimeEstimate:
    per_trial_s: dict[str, float]
    source: str
    trials: int
    side_by_side: int
    starts: int  # servers started (fewer than trials when trials reuse servers)

    @property
    def total_s(self) -> float:
        per = self.per_trial_s
        rest = sum(v for k, v in per.items() if k != "startup")
        return (self.starts * per["startup"] + self.trials * rest) / max(1, self.side_by_side)


def time_estimate(history: PhaseMeans | None, engine: str, n_trials: int,
                  side_by_side: int, runs_per_server: int = 1) -> TimeEstimate:
    """Phase means of the finished trials of this sweep (results.queries.phase_means), else
    DEFAULTS_S for the engine (also for a phase no trial measured)."""
    starts = math.ceil(n_trials / max(1, runs_per_server))
    base = dict(DEFAULTS_S[engine])
    if history is None:
        return TimeEstimate(base, f"defaults for the {engine} engine", n_trials, side_by_side,
                            starts)
    measured = {"startup": history.startup, "warmup": history.warmup, "bench": history.bench,
                "overhead": history.overhead}
    per = {k: v if v is not None else base[k] for k, v in measured.items()}
    return TimeEstimate(per, f"means of this sweep's {history.trials} measured trials", n_trials,
                        side_by_side, starts)
