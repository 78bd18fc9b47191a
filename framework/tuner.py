"""The Optuna study: samplers, ask/tell, baseline, resume. The only module importing optuna.

The study lives in a journal file beside the results, so running the same sweep again resumes
it: `n_trials` is the total number of finished trials the study should hold. A trial left
RUNNING by a driver that died is closed as FAIL with reason `interrupted` before new work.
Feasibility uses Optuna's constraint convention (`trial.set_constraint`, feasible iff <= 0).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.trial import TrialState

from framework.search_space import BoolParam, CategoricalParam, FloatParam, IntParam, SearchSpace
from framework.specs import Scalar

BASELINE_ATTR = "baseline"
FAIL_REASON_ATTR = "fail_reason"
RETRY_OF_ATTR = "retry_of"


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


@dataclass(frozen=True)
class Evaluation:
    """What one trial tells the study: a value and constraints, or a failure reason."""

    objective: float | None
    constraints: Mapping[str, float]
    fail_reason: str | None = None


@dataclass(frozen=True)
class Proposal:
    number: int
    params: dict[str, Scalar]
    is_baseline: bool
    trial: optuna.trial.Trial
    retry_of: int | None = None


class Tuner:
    def __init__(self, journal: Path, study_name: str, space: SearchSpace, maximize: bool,
                 sampler: str, seed: int, startup_trials: int) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        journal.parent.mkdir(parents=True, exist_ok=True)
        backend = JournalFileBackend(str(journal), lock_obj=JournalFileOpenLock(str(journal)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            samplers = {"tpe": lambda: optuna.samplers.TPESampler(
                seed=seed, n_startup_trials=startup_trials),
                        "random": lambda: optuna.samplers.RandomSampler(seed=seed)}
            self.study = optuna.create_study(
                study_name=study_name, storage=JournalStorage(backend),
                direction="maximize" if maximize else "minimize",
                sampler=samplers[sampler](), load_if_exists=True)
        self._dists = distributions(space)

    def close_interrupted(self) -> list[int]:
        """Mark trials left RUNNING by a dead driver as FAIL(interrupted); returns their numbers."""
        numbers = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self.study._storage.set_trial_user_attr(t._trial_id, FAIL_REASON_ATTR, "interrupted")
            self.study.tell(t.number, state=TrialState.FAIL)
            numbers.append(t.number)
        return numbers

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

    def waiting_retries(self) -> int:
        """Queued re-runs not started yet (each runs as a trial beyond the target)."""
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        return sum(1 for t in waiting if RETRY_OF_ATTR in t.user_attrs)

    def ask(self) -> Proposal:
        trial = self.study.ask(fixed_distributions=self._dists)
        return Proposal(number=trial.number, params=dict(trial.params),
                        is_baseline=bool(trial.user_attrs.get(BASELINE_ATTR)), trial=trial,
                        retry_of=trial.user_attrs.get(RETRY_OF_ATTR))

    def tell(self, proposal: Proposal, ev: Evaluation) -> None:
        trial = proposal.trial
        if ev.fail_reason is not None or ev.objective is None:
            trial.set_user_attr(FAIL_REASON_ATTR, ev.fail_reason or "internal")
            self.study.tell(trial, state=TrialState.FAIL)
            return
        for key, value in ev.constraints.items():
            trial.set_constraint(key, value)
        self.study.tell(trial, ev.objective)

    def fail(self, proposal: Proposal, reason: str) -> None:
        self.tell(proposal, Evaluation(objective=None, constraints={}, fail_reason=reason))
