"""How a sweep searches (`SearchSpec`) and capacity mode's rate steps (`CapacitySpec`): the
`search:` and `capacity:` sections of a sweep file. Unknown keys are errors."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import field_validator
from pydantic import model_validator

from framework.config.saturation_spec import SaturationSpec
from framework.config.yaml_io import SecretInSweep


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Sampler = Literal["tpe", "random", "grid", "nsga2", "gp"]
# SQLAlchemy database URLs Optuna's RDBStorage takes: dialect[+driver]://[user[:password]@]...
DATABASE_URL = re.compile(r"^(?P<dialect>[a-z]+)(\+[a-z0-9_]+)?://"
                          r"(?:(?P<user>[^:@/]*)(?::(?P<password>[^@/]*))?@)?")
DATABASES = ("postgresql", "mysql", "sqlite")


class SearchSpec(_Spec):
    """How Optuna searches. `sampler`: tpe (default; on the GPU engine gp, or tpe with a
    `prior`: SweepSpec._gpu_sampler; multivariate, constraint-aware), random,
    grid (every combination of a small discrete space, then stops), nsga2 (multi-objective
    evolutionary), gp (Optuna's Gaussian-process sampler, constraint-aware).
    `learn_from_failures`: configuration failures (infeasible, invalid_args, oom_at_startup,
    startup_crash, unplaceable) are told to Optuna as violated constraints so
    it leaves their region (off: plain FAIL, which TPE ignores).
    `trial_timeout_s`: deadline of one trial from the moment its
    placement group is placed (start-up, warm-up and load; queueing for placement excluded),
    FAIL(trial_timeout) past it. `requeue_interrupted`: a trial interrupted by a stopped or
    killed driver runs again, as a new trial, when the sweep resumes. `stop_early`: end a
    measured run (or a capacity step) as soon as its SLA is surely broken, i.e. broken even
    if every remaining request took 0 ms (objective.surely_broken): the verdict is the one
    the full run would give, at a fraction of its time. `repeats`: measured runs per trial
    on the same server (fresh prompts each); the objective is their mean, with a 95%
    confidence interval in the row; `sla_on: ci_upper` judges each SLA metric by the upper
    end of its interval instead of its mean. A run whose SLA is surely broken ends the trial.
    `confirm_top: k` (default 1): once the trials are done, the k best feasible configurations
    run once more on fresh servers (confirmation runs); the winner is chosen among the
    confirmed ones by their confirmation runs (results.verdict), dropping any whose
    re-measurement broke the SLA. `baseline_repeats: r` (default 2): the baseline is measured
    r more times on fresh servers, interleaved with the search (evenly spaced; the last one
    among the confirmation runs), so drift shows and the server-to-server spread is measured;
    the gain's 95% interval rests on it. They count toward n_trials, except on the grid
    sampler, where they come on top (every grid point still runs once).
    `precision: p`: a trial stays under load, one run after another (fresh prompts each),
    until its objective's 95% interval, server-to-server spread included, is within +-p of its
    mean (trial.precision), or until it is clearly worse than the best, or runs into
    `precision_max_runs` runs or `precision_max_load_s` seconds under load; `repeats` is then
    the minimum number of runs.
    `screen: f`: before its measured run, each trial sends a short screening run of
    ceil(f x num_prompts) fresh requests; the trial stops there as PRUNED when the screen
    breaks an SLA limit by more than `screen_margin` (relative) or when Optuna's pruner
    (tuner.FarFromBestPruner) finds its screen objective worse than the best feasible trial's
    screen by more than `screen_margin`; the rest get the full run. Single objective only.
    `saturation`: when a run is over-saturated and ends early (config.saturation_spec).
    `prior`: a predictor (engine/predictor.py, e.g. `aiconfigurator`) whose predicted top
    `prior_top_k` feasible configurations run first, after the baseline (Optuna's
    enqueue_trial); every row then carries the prediction beside the measurement. A prediction
    never decides a verdict: only measurements do. `prior_refit_every: n` (default 2, the
    best strategy of benchmarks/search_quality.py; 0: never): after every n measured trials,
    the predictions are corrected by what this cluster measured so
    far (engine/correction.py) and the best untried configuration under the corrected
    prediction runs next.
    `storage`: where the Optuna study lives: by default a journal file beside the results
    (mirrored to an object store results_dir); a database URL (`postgresql://user@host/db`,
    `mysql+pymysql://...`, `sqlite:////path/study.db`) uses Optuna's RDBStorage, which
    optuna-dashboard can watch live. No password in the URL (a secret in a sweep file): the
    driver's libpq reads PGPASSWORD or ~/.pgpass (search/storages.py).
    """

    sampler: Sampler = "tpe"
    n_trials: int = Field(default=10, gt=0)
    seed: int = 0
    baseline: bool = True
    startup_trials: int | None = Field(default=None, ge=0)
    trial_timeout_s: float | None = Field(default=None, gt=0)
    requeue_interrupted: bool = False
    stop_early: bool = True
    learn_from_failures: bool = True
    repeats: int = Field(default=1, ge=1, le=20)
    confirm_top: int = Field(default=1, ge=0, le=10)
    baseline_repeats: int = Field(default=2, ge=0, le=10)
    precision: float | None = Field(default=None, gt=0, lt=1)
    precision_max_runs: int = Field(default=5, ge=2, le=50)
    precision_max_load_s: float = Field(default=60.0, gt=0)
    sla_on: Literal["mean", "ci_upper"] = "mean"
    screen: float | None = Field(default=None, gt=0, lt=1)
    screen_margin: float = Field(default=0.3, gt=0, le=10)
    saturation: SaturationSpec = Field(default_factory=SaturationSpec)
    storage: str | None = None
    prior: str | None = None  # a predictor's name (engine.predictor.PREDICTORS), checked at load
    prior_top_k: int = Field(default=3, ge=1, le=50)
    prior_refit_every: int = Field(default=2, ge=0, le=100)

    @field_validator("storage")
    @classmethod
    def _database_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        m = DATABASE_URL.match(url)
        if m is None or m["dialect"] not in DATABASES:
            raise ValueError(f"not a database URL; use one of {', '.join(DATABASES)} "
                             "(e.g. postgresql://user@127.0.0.1:5432/optuna)")
        if m["password"]:
            raise SecretInSweep("password", "a password in a sweep file is a secret in plain "
                                "text: drop it from the URL and set PGPASSWORD (or ~/.pgpass) in "
                                "the driver's environment")
        return url

    @model_validator(mode="after")
    def _runs(self) -> SearchSpec:
        if self.precision is not None and self.repeats > self.precision_max_runs:
            raise ValueError(f"repeats {self.repeats} > precision_max_runs "
                             f"{self.precision_max_runs}")
        return self

    @property
    def interleaved_runs(self) -> int:
        """Baseline re-measurements queued during the search (sweep.remeasure): r - 1 for
        r = baseline_repeats >= 2 (the last one runs among the confirmations); none without a
        baseline."""
        return max(0, self.baseline_repeats - 1) if self.baseline else 0

    @property
    def max_runs(self) -> int:
        """Measured runs a trial may need: precision_max_runs with `precision`, else repeats."""
        return self.precision_max_runs if self.precision is not None else self.repeats

    @property
    def effective_startup_trials(self) -> int:
        """Random trials before TPE models the space: given, else n_trials // 3 clamped to [2, 10]
        (Optuna's fixed 10 would leave a 10-trial sweep with no model-guided trial at all)."""
        if self.startup_trials is not None:
            return self.startup_trials
        return max(2, min(10, self.n_trials // 3))


class CapacitySpec(_Spec):
    """Capacity mode: each trial finds the highest request rate (requests/s) at which the SLA
    holds on its running server (framework.trial.capacity: bracket from `start_rate` by doubling,
    then bisect until the bracket is within `tolerance`), and that rate, `capacity_rps`, is
    the objective. Each step sends round(rate x step_duration_s) requests (at least
    `min_requests`, at most workload.num_prompts) with workload.burstiness arrivals."""

    start_rate: float = Field(default=1.0, gt=0)
    max_rate: float = Field(default=256.0, gt=0)
    tolerance: float = Field(default=0.1, gt=0, lt=1)
    max_steps: int = Field(default=8, ge=2, le=30)
    step_duration_s: float = Field(default=15.0, gt=0)
    min_requests: int = Field(default=20, gt=0)

    @model_validator(mode="after")
    def _rates(self) -> CapacitySpec:
        if self.max_rate < self.start_rate:
            raise ValueError(f"max_rate {self.max_rate} < start_rate {self.start_rate}")
        return self
