"""`plan`: what a sweep will cost before anything starts. Pure apart from reading results.

- Space size: the product of each parameter's number of values (categorical choices, 2 for a
  bool, the steps of an int range); a float range makes it unbounded. Conditional parameters
  count only where their condition holds.
- Feasible share: the feasibility model applied to every configuration of a discrete space of
  at most ENUMERATE_LIMIT configurations, else to SAMPLE_SIZE random ones (seeded).
- Wall time = (server starts x start-up + trials x (warm-up + load + overhead)) / trials side
  by side, each phase taken from this sweep's finished trials when there are any (start-up:
  of the trials that started their own server, with its phases read from the servers' logs),
  else from DEFAULTS_S. Server starts = trials, or with server.reuse and discrete run settings
  in the space, trials / runs_per_server: every started server is measured at each
  combination of the run settings; a reused server's trial has no start-up.
- Screening (search.screen = f): a trial's load is f x the full run, plus the full run for
  the share of trials that survive the screen (this sweep's COMPLETE / (COMPLETE + PRUNED),
  else SCREEN_SURVIVAL).
- Start-ahead (cluster.start_ahead = k, CPU): 1 + k servers start side by side, each
  1 + 0.31 k times as long (SIDE_BY_SIDE_SLOWDOWN), while nothing is measured; trials are
  measured one at a time: wall = starts x start-up x (1 + 0.31 k) / (1 + k) + trials x
  (warm-up + load + overhead).
- Re-measurements (search.confirm_top, the baseline's last repeat) are trials beyond n_trials,
  each on a fresh server.
- Deployment shapes (`replicas`, `prefill-servers`): a start is a deployment of several
  servers, started together (trial/replicas.py launches them without waiting for each to be
  ready), counted as one start-up; the printout says how many servers that is. Whether a
  shape can be placed on the cluster is not counted here (`run` refuses it without a start).
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING

from framework.engine.feasibility import Feasibility

if TYPE_CHECKING:
    from framework.results.queries import PhaseMeans
from framework.base.vocabulary import Scalar
from framework.config.search_space import SIBLING_VALUES
from framework.config.search_space import FloatParam
from framework.config.search_space import IntParam
from framework.config.search_space import SearchSpace
from framework.config.search_space import configurations
from framework.config.search_space import discrete_values
from framework.config.search_space import shape_setting

ENUMERATE_LIMIT = 20_000
# Start-ahead: each of two CPU start-ups side by side took 1.31x as long as one alone
# (docs/BENCHMARKS.md, "Start-ahead on the CPU engine"); taken as + 0.31 per neighbour.
SIDE_BY_SIDE_SLOWDOWN = 1.31
# Without history: the share of trials taken to survive a screening run.
SCREEN_SURVIVAL = 0.5
SAMPLE_SIZE = 2_000
# Phase times (s) without history: CPU measured here (tiny model, enforce-eager); GPU a
# typical 8B-70B start (weights load + CUDA graph capture).
DEFAULTS_S = {"cpu": {"startup": 30.0, "warmup": 3.0, "bench": 10.0, "overhead": 3.0},
              "gpu": {"startup": 180.0, "warmup": 10.0, "bench": 60.0, "overhead": 5.0},
              "fake": {"startup": 2.0, "warmup": 0.5, "bench": 5.0, "overhead": 2.0}}
# With the warm_start lever (framework/engine/zygote.py), without history: a fresh server's
# start-up, and the zygote's own, paid once per node before the first server (CPU measured
# here, docs/BENCHMARKS.md "warm_start against today"; GPU unmeasured: the imports saved are
# small next to weights and graphs, so its default stays).
WARM_STARTUP_S = {"cpu": 8.0}
ZYGOTE_S = {"cpu": 11.0, "gpu": 11.0}


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


def servers_per_trial(configs: Sequence[Mapping[str, Scalar]]) -> float:
    """The mean servers of a trial over `configs`: `replicas` (default 1) plus `prefill-servers`
    (default 0), the deployment-shape settings; 1.0 for no configuration."""
    if not configs:
        return 1.0
    return sum(shape_setting(c, "replicas") + shape_setting(c, "prefill-servers")
               for c in configs) / len(configs)


def runs_per_server(space: SearchSpace, sampler: str) -> int:
    """Trials one server serves under server.reuse: every combination of the run settings'
    values, which the grid sampler walks server configuration by server configuration; TPE and
    random reach them through SearchSpace.siblings, only for small discrete sets."""
    return space.run_combinations(None if sampler == "grid" else SIBLING_VALUES)


@dataclass(frozen=True)
class TimeEstimate:
    """`per_trial_s`: startup (one fresh server's), warmup, bench (a trial's expected load:
    with screening, the screen plus the surviving share of the full load), overhead."""

    per_trial_s: dict[str, float]
    source: str
    trials: int
    side_by_side: int
    starts: int  # servers started (fewer than trials when trials reuse servers)
    start_ahead: int = 0
    startup_phases: Mapping[str, float] = field(default_factory=dict)  # seconds, by column
    screen: str = ""  # how screening shaped `bench`, for the printout
    zygote_s: float = 0.0  # warm_start: the zygote's start, once, before the first server
    # deployment shapes: a start is one deployment, of this many servers on average
    # (servers_per_trial), started together: its start-up counts once, as one server's
    servers: float = 1.0

    @property
    def startup_wall_s(self) -> float:
        """Wall seconds of all start-ups: with start-ahead, 1 + k start side by side, each
        1 + (SIDE_BY_SIDE_SLOWDOWN - 1) x k times as long, never during a measurement."""
        total = self.starts * self.per_trial_s["startup"]
        if not self.start_ahead:
            return total / max(1, self.side_by_side)
        k = self.start_ahead
        return total * (1 + (SIDE_BY_SIDE_SLOWDOWN - 1) * k) / (1 + k)

    @property
    def total_s(self) -> float:
        per = self.per_trial_s
        rest = self.trials * sum(v for k, v in per.items() if k != "startup")
        # start-ahead measures one trial at a time (trial.share_gate); else trials side by side
        # run on devices of their own
        return (self.zygote_s + self.startup_wall_s
                + rest / (1 if self.start_ahead else max(1, self.side_by_side)))

    def lines(self) -> list[str]:
        """The printout: the formula with its numbers, the start-up by phase, screening."""
        per = self.per_trial_s
        rest = ", ".join(f"{k} {v:.0f} s" for k, v in per.items() if k != "startup")
        if self.start_ahead:
            k = self.start_ahead
            head = (f"{self.starts} server starts x {per['startup']:.0f} s x "
                    f"{1 + (SIDE_BY_SIDE_SLOWDOWN - 1) * k:.2f} / {1 + k} side by side "
                    f"(start-ahead {k}) + {self.trials} trials x ({rest}) one at a time")
        else:
            head = (f"({self.starts} server starts x {per['startup']:.0f} s + {self.trials} "
                    f"trials x ({rest})) / {self.side_by_side} side by side")
        if self.zygote_s:
            head = f"zygote {self.zygote_s:.0f} s + {head}"
        if self.servers != 1.0:
            head += (f"; a start is a deployment of {self.servers:.2g} servers on average "
                     f"(~{round(self.starts * self.servers)} servers), started together")
        out = [f"  time: {head} = ~{self.total_s / 60:.0f} min ({self.source})"]
        if self.startup_phases:
            out.append("    start-up by phase: " + ", ".join(
                f"{c.removeprefix('startup_').removesuffix('_s')} {v:.1f} s"
                for c, v in self.startup_phases.items()))
        if self.screen:
            out.append(f"    screening: {self.screen}")
        return out


def remeasurements(confirm_top: int, baseline: bool, baseline_repeats: int,
                   interleaved: int = 0) -> int:
    """Trials beyond search.n_trials, each on a fresh server (sweep.remeasure): the confirmation
    runs of the top `confirm_top`, the baseline's last re-measurement, and `interleaved`
    mid-search ones where they do not count toward n_trials (the grid sampler's:
    SearchSpec.interleaved_runs); a second confirmation round, when the first meets no SLA,
    is not foreseen."""
    return confirm_top + int(baseline and baseline_repeats >= 1) + interleaved


def time_estimate(history: PhaseMeans | None, engine: str, n_trials: int,
                  side_by_side: int, runs_per_server: int = 1, screen: float | None = None,
                  start_ahead: int = 0, remeasured: int = 0, warm: bool = False,
                  loads: int = 1) -> TimeEstimate:
    """Phase means of the finished trials of this sweep (results.queries.phase_means), else
    DEFAULTS_S for the engine (also for a phase no trial measured).

    `screen` (search.screen = f): a trial's load is the screen (f x the full run) plus the
    full run for the share that survives it (history's screen_survival, else
    SCREEN_SURVIVAL); history's bench mean, of COMPLETE trials, held both: full = bench /
    (1 + f). `start_ahead`: see TimeEstimate.startup_wall_s. `remeasured` (`remeasurements`):
    trials added to n_trials, each starting its own server. `warm` (the warm_start lever
    applies): without history, WARM_STARTUP_S per server and ZYGOTE_S once (a sweep's
    history holds the zygote's start in its first trials' start-ups). `loads`: workloads each
    trial measures one after another (`workloads:`, a load curve's values): without history, the
    default warm-up and load count once per workload (a history's means hold them all)."""
    starts = math.ceil(n_trials / max(1, runs_per_server)) + remeasured
    base = dict(DEFAULTS_S[engine])
    phases: Mapping[str, float] = {}
    survival = SCREEN_SURVIVAL
    zygote = 0.0
    if warm:
        base["startup"] = WARM_STARTUP_S.get(engine, base["startup"])
    if history is None:
        per = {**base, "warmup": base["warmup"] * loads, "bench": base["bench"] * loads}
        source = (f"defaults for the {engine} engine" + (", warm_start" if warm else "")
                  + (f", {loads} workloads a trial" if loads > 1 else ""))
        zygote = ZYGOTE_S.get(engine, 0.0) if warm else 0.0
    else:
        measured = {"startup": history.startup, "warmup": history.warmup,
                    "bench": history.bench, "overhead": history.overhead}
        per = {k: v if v is not None else base[k] for k, v in measured.items()}
        if screen is not None and history.bench is not None:
            per["bench"] = history.bench / (1 + screen)
        survival = history.screen_survival if history.screen_survival is not None else survival
        phases, source = history.startup_phases, f"means of this sweep's {history.trials} measured trials"
    note = ""
    if screen is not None:
        full = per["bench"]
        per = {**per, "bench": full * (screen + survival)}
        note = (f"load {full:.0f} s x ({screen:g} screen + {survival:.0%} surviving) = "
                f"{per['bench']:.0f} s per trial")
    return TimeEstimate(per, source, n_trials + remeasured, side_by_side, starts, start_ahead,
                        phases, note, zygote)
