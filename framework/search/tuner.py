"""The Optuna study: samplers, ask/tell, baseline, resume (with storages.py, the modules
importing optuna).

The study lives in a journal file beside the results (or a database: search/storages.py), so
running the same sweep again resumes it: `n_trials` is the total number of finished trials the
study should hold. A trial left RUNNING by a driver that died is closed as FAIL with reason
`interrupted` before new work.
Feasibility uses Optuna's constraint convention (`trial.set_constraint`, feasible iff <= 0).
A measured trial whose objective has no value (NaN: a fleet objective where no rate held the
SLA, trial.objective) is told like a configuration failure: the worst placeholder value with its
`feasibility` constraint violated, never as 0 GPUs.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Collection
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution
from optuna.trial import TrialState

from framework.base.vocabulary import Scalar
from framework.config.search_space import BoolParam
from framework.config.search_space import CategoricalParam
from framework.config.search_space import FloatParam
from framework.config.search_space import IntParam
from framework.config.search_space import SearchSpace
from framework.config.search_space import grid_points
from framework.config.search_space import grid_values
from framework.search.storages import exists
from framework.search.storages import open_storage

BASELINE_ATTR = "baseline"
FAIL_REASON_ATTR = "fail_reason"
# A trial's Evaluation, stored (`remember`) before its rows are written and told after them: a
# driver killed between the two leaves a RUNNING trial with a row, told from this on resume.
EVALUATION_ATTR = "evaluation"
RETRY_OF_ATTR = "retry_of"
CONFIRM_OF_ATTR = "confirm_of"
INTERLEAVED_ATTR = "interleaved"  # a baseline re-measurement in the middle of the search


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Search-space parameters -> Optuna distributions (bool is a two-way categorical)."""
    out: dict[str, BaseDistribution] = {}
    for name, p in space.parameters.items():
        if isinstance(p, IntParam):
            out[name] = IntDistribution(p.low, p.high, log=p.log, step=p.step)
        elif isinstance(p, FloatParam):
            out[name] = FloatDistribution(p.low, p.high, log=p.log)
        elif isinstance(p, CategoricalParam):
            out[name] = CategoricalDistribution(list(p.choices))
        elif isinstance(p, BoolParam):
            out[name] = CategoricalDistribution([False, True])
    return out


# Failures that say something about the configuration itself. They are told to Optuna as a
# COMPLETE trial with a violated `feasibility` constraint (so constraint-aware samplers steer
# away from their neighbourhood); other failures (node lost, interrupted, timeouts) are FAIL
# and are not held against the configuration.
CONFIG_FAILURES = frozenset({"infeasible", "invalid_args", "oom_at_startup", "startup_crash",
                             "unplaceable"})
FEASIBILITY = "feasibility"
_WORST = {"maximize": 0.0, "minimize": 1e12}  # placeholder values of trials never measured
MAX_GRID = 4096


@dataclass(frozen=True)
class Evaluation:
    """What one trial tells the study: a value (or one per objective) and constraints, or a
    failure reason; `violation` grades a configuration failure (default 1)."""

    objective: float | Sequence[float] | None
    constraints: Mapping[str, float]
    fail_reason: str | None = None
    violation: float = 1.0


@dataclass(frozen=True)
class Configuration:
    """A trial's parameters as the study holds them, and whether it is the baseline."""

    number: int
    params: dict[str, Scalar]
    is_baseline: bool


@dataclass(frozen=True)
class Proposal:
    number: int
    params: dict[str, Scalar]
    is_baseline: bool
    trial: optuna.trial.Trial
    retry_of: int | None = None
    confirm_of: int | None = None


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler without its `study.stop()` once the grid is exhausted, which raises
    outside `study.optimize`; the runner stops at the grid's size instead.

    A conditional space's grid is its `points` (search_space.grid_points: a parameter only
    where its `when` holds), not the product of every value, which would repeat each point
    once per value of a parameter it leaves out: GridSampler's own points are replaced by them
    (None for a parameter a point leaves out, never asked for: the tuner suggests active
    parameters only), shuffled by the seed as GridSampler shuffles its own.

    With run settings (`run_params`), the grid is walked in order, its points grouped by
    server flags (groups in the seed's shuffled order): consecutive trials then differ only
    in run settings and can share a server (server.reuse)."""

    def __init__(self, grid: dict[str, list], seed: int, run_params: Sequence[str] = (),
                 points: Sequence[Mapping[str, Scalar]] | None = None) -> None:
        super().__init__(grid, seed=seed)
        if points is not None:
            self._all_grids = [tuple(p.get(n) for n in self._param_names) for p in points]
            self._n_min_trials = len(self._all_grids)
            self._rng.rng.shuffle(self._all_grids)
        self._ordered = bool(run_params)
        if self._ordered:
            server = [i for i, n in enumerate(self._param_names) if n not in run_params]
            first: dict[tuple, int] = {}
            for point in self._all_grids:
                first.setdefault(tuple(point[i] for i in server), len(first))
            self._all_grids.sort(key=lambda point: first[tuple(point[i] for i in server)])

    def before_trial(self, study, trial) -> None:  # noqa: ANN001
        if not self._ordered or "grid_id" in trial.system_attrs \
                or "fixed_params" in trial.system_attrs:
            return super().before_trial(study, trial)
        unvisited = self._get_unvisited_grid_ids(study)
        grid_id = min(unvisited) if unvisited else 0
        # as GridSampler.before_trial does: a sampler has no public way to set system attrs
        study._storage.set_trial_system_attr(trial._trial_id, "search_space", self._search_space)
        study._storage.set_trial_system_attr(trial._trial_id, "grid_id", grid_id)

    def after_trial(self, study, trial, state, values) -> None:  # noqa: ANN001
        return None


def _sampler(name: str, space: SearchSpace, seed: int, startup_trials: int,
             population: int) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return _AskTellGridSampler(grid_values(space), seed, space.run_params,
                                   grid_points(space) if space.conditional else None)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=population)
    if name == "gp":  # Gaussian process; constraint-aware through Trial.set_constraint
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials)
    raise ValueError(f"unknown sampler {name!r}")


def _suggest(trial: optuna.trial.Trial, name: str, dist: BaseDistribution) -> Scalar:
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, log=dist.log)
    assert isinstance(dist, CategoricalDistribution)
    return trial.suggest_categorical(name, dist.choices)


class FarFromBestPruner(optuna.pruners.BasePruner):
    """Prunes a trial whose intermediate value at its last step is worse than the best value
    that finished, feasible trials (every constraint <= 0) reported at that step, by more than
    `margin` relative to it: value < best x (1 - margin) maximizing, value > best x
    (1 + margin) minimizing. No finished feasible trial at that step: no pruning."""

    def __init__(self, margin: float) -> None:
        self.margin = margin

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        value = trial.intermediate_values[step]
        seen = [t.intermediate_values[step]
                for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if step in t.intermediate_values and FAIL_REASON_ATTR not in t.user_attrs
                and all(c <= 0 for c in t.constraints.values())]
        if not seen:
            return False
        if study.direction == optuna.study.StudyDirection.MAXIMIZE:
            return value < max(seen) * (1 - self.margin)
        return value > min(seen) * (1 + self.margin)


class Tuner:
    """`directions`: one per objective ("maximize" / "minimize"); `constraint_keys`: the SLA
    keys, set on every trial (with `feasibility`) so all trials carry the same constraints;
    `learn_from_failures: False` tells every failure as a plain FAIL (Optuna's default, for
    comparison)."""

    def __init__(self, storage: Path | str, study_name: str, space: SearchSpace,
                 directions: Sequence[str], sampler: str, seed: int, startup_trials: int,
                 constraint_keys: Sequence[str] = (), learn_from_failures: bool = True,
                 screen_margin: float | None = None) -> None:
        """`storage`: a journal file, or a database URL (search.storages.open_storage)."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.directions = tuple(directions)
        self._storage = open_storage(storage)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.study = optuna.create_study(
                study_name=study_name, storage=self._storage,
                directions=list(self.directions),
                sampler=_sampler(sampler, space, seed, startup_trials,
                                 population=max(4, min(50, 2 * startup_trials))),
                pruner=(FarFromBestPruner(screen_margin) if screen_margin is not None
                        else optuna.pruners.NopPruner()),
                load_if_exists=True)
        self._study_id = self._storage.get_study_id_from_name(study_name)
        self.space = space
        self.constraint_keys = tuple(constraint_keys)
        self.config_failures = CONFIG_FAILURES if learn_from_failures else frozenset()
        self._dists = distributions(space)
        self._lock = threading.RLock()

    def remember(self, proposal: Proposal, ev: Evaluation) -> None:
        """Store what `proposal` will be told, before the caller writes its rows (tell_recorded)."""
        objective = ev.objective if ev.objective is None or isinstance(ev.objective, (int, float)) \
            else list(ev.objective)
        with self._lock:
            proposal.trial.set_user_attr(EVALUATION_ATTR, {
                "objective": objective, "constraints": dict(ev.constraints),
                "fail_reason": ev.fail_reason, "violation": ev.violation})

    def tell_recorded(self, recorded: Collection[int]) -> list[int]:
        """Tell the trials a dead driver left RUNNING after it recorded them (their number in
        `recorded`, the rows on disk) what it remembered; returns their numbers. A RUNNING
        trial without a row, or without a remembered evaluation, is left to close_interrupted."""
        told = []
        with self._lock:
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                stored = t.user_attrs.get(EVALUATION_ATTR)
                if t.number not in recorded or not isinstance(stored, dict):
                    continue
                trial = optuna.trial.Trial(self.study, self._trial_id(t.number))
                proposal = Proposal(t.number, dict(t.params), bool(t.user_attrs.get(BASELINE_ATTR)),
                                    trial)
                self._tell(proposal, Evaluation(**stored))
                told.append(t.number)
        return told

    def close_interrupted(self) -> list[int]:
        """Mark trials left RUNNING by a dead driver as FAIL(interrupted); returns their numbers."""
        numbers = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self._storage.set_trial_user_attr(self._trial_id(t.number), FAIL_REASON_ATTR,
                                              "interrupted")
            self.study.tell(t.number, state=TrialState.FAIL)
            numbers.append(t.number)
        return numbers

    def configuration(self, number: int) -> Configuration:
        """Trial `number`'s parameters and baseline mark as stored (KeyError if no such trial)."""
        t = self._storage.get_trial(self._trial_id(number))
        return Configuration(number=number, params=dict(t.params),
                             is_baseline=bool(t.user_attrs.get(BASELINE_ATTR)))

    def _trial_id(self, number: int) -> int:
        return self._storage.get_trial_id_from_study_id_trial_number(self._study_id, number)

    def finished(self) -> int:
        states = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
        return len(self.study.get_trials(deepcopy=False, states=states))

    def enqueue_baseline(self, defaults: Mapping[str, Scalar]) -> bool:
        """Queue the vLLM-defaults trial first; only into an empty study. True if queued."""
        if self.study.get_trials(deepcopy=False):
            return False
        self.study.enqueue_trial(dict(defaults), user_attrs={BASELINE_ATTR: True})
        return True

    def enqueue_retry(self, params: Mapping[str, Scalar], is_baseline: bool, number: int) -> None:
        """Queue trial `number`'s configuration again (after an infrastructure failure)."""
        self.study.enqueue_trial(dict(params), user_attrs={
            BASELINE_ATTR: is_baseline, RETRY_OF_ATTR: number})

    def enqueue_confirmation(self, params: Mapping[str, Scalar], is_baseline: bool,
                             number: int, interleaved: bool = False) -> None:
        """Queue trial `number`'s configuration once more, as a confirmation run (`interleaved`:
        a baseline re-measurement during the search, which counts toward its trials)."""
        attrs: dict[str, object] = {BASELINE_ATTR: is_baseline, CONFIRM_OF_ATTR: number}
        if interleaved:
            attrs[INTERLEAVED_ATTR] = True
        self.study.enqueue_trial(dict(params), user_attrs=attrs)

    def baseline_number(self) -> int | None:
        """The number of the study's first baseline trial (None: no baseline)."""
        return next((t.number for t in self.study.get_trials(deepcopy=False)
                     if t.user_attrs.get(BASELINE_ATTR) and CONFIRM_OF_ATTR not in t.user_attrs
                     and RETRY_OF_ATTR not in t.user_attrs), None)

    def interleaved(self) -> int:
        """Baseline re-measurements queued or run during the search."""
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if INTERLEAVED_ATTR in t.user_attrs)

    def tried(self) -> list[dict[str, Scalar]]:
        """The parameters of every trial of the study, run or queued."""
        with self._lock:
            return [dict(t.params or t.system_attrs.get("fixed_params", {}))
                    for t in self.study.get_trials(deepcopy=False)]

    def enqueue_new(self, candidates: Sequence[Mapping[str, Scalar]]) -> int:
        """Queue the candidates no trial of the study has run or queued (same parameters);
        they are asked next, in order. Returns how many were queued."""
        with self._lock:
            seen = self.tried()
            fresh = [dict(c) for c in candidates if dict(c) not in seen]
            for params in fresh:
                self.study.enqueue_trial(params)
            return len(fresh)

    def has_confirmations(self) -> bool:
        """Whether the end-of-search confirmation runs were queued (interleaved baseline
        re-measurements aside)."""
        return any(CONFIRM_OF_ATTR in t.user_attrs and INTERLEAVED_ATTR not in t.user_attrs
                   for t in self.study.get_trials(deepcopy=False))

    def waiting_retries(self) -> int:
        """Queued re-runs not started yet (each runs as a trial beyond the target)."""
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        return sum(1 for t in waiting if INTERLEAVED_ATTR not in t.user_attrs
                   and (RETRY_OF_ATTR in t.user_attrs or CONFIRM_OF_ATTR in t.user_attrs))

    def ask(self) -> Proposal:
        """The next configuration. A conditional space is asked define-by-run: a parameter is
        suggested only when its `when` holds for the values chosen before it."""
        with self._lock:
            return self._ask()

    def _ask(self) -> Proposal:
        if not self.space.conditional:
            trial = self.study.ask(fixed_distributions=self._dists)
            params = dict(trial.params)
        else:
            trial = self.study.ask()
            params = {}
            for name in self.space.parameters:
                if self.space.active(name, params):
                    params[name] = _suggest(trial, name, self._dists[name])
        return Proposal(number=trial.number, params=params,
                        is_baseline=bool(trial.user_attrs.get(BASELINE_ATTR)), trial=trial,
                        retry_of=trial.user_attrs.get(RETRY_OF_ATTR),
                        confirm_of=trial.user_attrs.get(CONFIRM_OF_ATTR))

    def screen(self, proposal: Proposal, value: float) -> bool:
        """Report the screening run's objective (step 0); True if the pruner prunes the trial.
        Called from a trial's thread: serialized with ask and tell."""
        with self._lock:
            proposal.trial.report(value, 0)
            return proposal.trial.should_prune()

    def tell(self, proposal: Proposal, ev: Evaluation) -> None:
        with self._lock:
            self._tell(proposal, ev)

    def _tell(self, proposal: Proposal, ev: Evaluation) -> None:
        trial = proposal.trial
        if ev.fail_reason == "pruned":
            self.study.tell(trial, state=TrialState.PRUNED)
            return
        if ev.fail_reason is not None or ev.objective is None:
            reason = ev.fail_reason or "internal"
            trial.set_user_attr(FAIL_REASON_ATTR, reason)
            if reason not in self.config_failures:
                self.study.tell(trial, state=TrialState.FAIL)
                return
            self._constrain(trial, {}, violation=max(ev.violation, 1e-6))
            self.study.tell(trial, [_WORST[d] for d in self.directions])
            return
        values = [ev.objective] if isinstance(ev.objective, (int, float)) else list(ev.objective)
        if any(math.isnan(v) for v in values):  # measured, but its objective has no value
            self._constrain(trial, ev.constraints, violation=1.0)
            self.study.tell(trial, [_WORST[d] for d in self.directions])
            return
        self._constrain(trial, ev.constraints, violation=0.0)
        self.study.tell(trial, values)

    def _constrain(self, trial: optuna.trial.Trial, sla: Mapping[str, float],
                   violation: float) -> None:
        for key in self.constraint_keys:
            trial.set_constraint(key, float(sla.get(key, 0.0)))
        trial.set_constraint(FEASIBILITY, violation)

    def fail(self, proposal: Proposal, reason: str) -> None:
        self.tell(proposal, Evaluation(objective=None, constraints={}, fail_reason=reason))


def param_importances(storage: Path | str, study_name: str,
                      exclude: Collection[int] = ()) -> dict[str, float]:
    """Optuna's parameter importances (normalized, highest first) for the primary objective,
    over the measured trials of the study in `storage` (COMPLETE without a failure reason:
    configuration failures carry placeholder values; trial numbers in `exclude` left out, e.g.
    loads stopped early), opened without writing to it, for the parameters that differ among
    them; {} when the journal or study is missing, fewer than 2 trials were measured, no
    parameter differs, or Optuna cannot evaluate the study."""
    if not exists(storage):
        return {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=study_name, storage=open_storage(storage))
    except KeyError:
        return {}
    measured = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if FAIL_REASON_ATTR not in t.user_attrs and t.number not in exclude]
    names = sorted({name for t in measured for name in t.params})
    varying = [n for n in names if len({repr(t.params.get(n)) for t in measured}) > 1]
    if len(measured) < 2 or not varying:
        return {}
    copy = optuna.create_study(directions=study.directions)
    copy.add_trials(measured)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return dict(optuna.importance.get_param_importances(
                copy, params=varying, target=lambda t: t.values[0]))
    except (RuntimeError, ValueError, ZeroDivisionError):
        return {}
