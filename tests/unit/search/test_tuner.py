"""The tuner's contract on each study storage (search/storages.py): baseline, constraints,
failures, resume, interruption, alike on a real Optuna journal file and SQLite here, and on a real
PostgreSQL server in tests/e2e/test_study_storages.py, which runs these same tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution
from optuna.distributions import IntDistribution
from optuna.trial import TrialState

from framework.config.search_space import load_search_space
from framework.search.tuner import BASELINE_ATTR
from framework.search.tuner import CONFIG_FAILURES
from framework.search.tuner import FAIL_REASON_ATTR
from framework.search.tuner import Evaluation
from framework.search.tuner import Tuner
from framework.search.tuner import distributions
from tests.paths import ROOT as REPO

SPACE = load_search_space(REPO / "search_spaces" / "tiny_cpu.yaml")


DEFAULTS = {"max-num-seqs": 128, "max-num-batched-tokens": 2048,
            "enable-chunked-prefill": True, "enable-prefix-caching": True}


def make_tuner(storage: Path | str, *, maximize: bool = True, sampler: str = "tpe") -> Tuner:
    return Tuner(storage, "quickstart", SPACE, ["maximize" if maximize else "minimize"],
                 sampler=sampler, seed=0, startup_trials=2,
                 constraint_keys=["p99_ttft_ms", "error_rate"])


@pytest.fixture(params=["journal", "sqlite"])
def journal(request, tmp_path) -> Path | str:
    """Where a test's study lives: a journal file (the default), or a SQLite database."""
    if request.param == "journal":
        return tmp_path / "results" / "quickstart" / "optuna.journal"
    return f"sqlite:///{tmp_path / 'study.db'}"


def ok(value: float, **constraints: float) -> Evaluation:
    return Evaluation(objective=value, constraints=constraints)


def assert_in_space(params: dict) -> None:
    assert set(params) == set(DEFAULTS)
    assert 2 <= params["max-num-seqs"] <= 128 and isinstance(params["max-num-seqs"], int)
    assert params["max-num-batched-tokens"] in (512, 1024, 2048, 4096)
    assert params["enable-chunked-prefill"] in (True, False)
    assert params["enable-prefix-caching"] in (True, False)


def test_distributions_of_tiny_cpu():
    dists = distributions(SPACE)
    assert list(dists) == list(DEFAULTS)
    assert dists["max-num-seqs"] == IntDistribution(2, 128, log=True, step=1)
    assert dists["max-num-batched-tokens"] == CategoricalDistribution([512, 1024, 2048, 4096])
    assert dists["enable-chunked-prefill"] == CategoricalDistribution([False, True])
    assert dists["enable-prefix-caching"] == CategoricalDistribution([False, True])


def test_distributions_int_step_and_float(tmp_path):
    from framework.config.search_space import load_search_space as load

    path = tmp_path / "s.yaml"
    path.write_text("parameters:\n"
                    "  block-size: {type: int, low: 16, high: 64, step: 16}\n"
                    "  gpu-memory-utilization: {type: float, low: 0.5, high: 0.9}\n"
                    "  swap-space: {type: float, low: 0.1, high: 10, log: true}\n")
    dists = distributions(load(path))
    assert dists["block-size"] == IntDistribution(16, 64, step=16)
    assert dists["gpu-memory-utilization"].low == 0.5
    assert dists["gpu-memory-utilization"].high == 0.9
    assert dists["gpu-memory-utilization"].log is False
    assert dists["swap-space"].log is True


def test_journal_created_in_missing_directory(tmp_path):
    journal = tmp_path / "results" / "quickstart" / "optuna.journal"
    assert not journal.parent.exists()
    make_tuner(journal)
    assert journal.parent.is_dir()


def test_enqueue_baseline_is_trial_zero(journal):
    tuner = make_tuner(journal)
    assert tuner.finished() == 0
    assert tuner.enqueue_baseline(DEFAULTS) is True

    first = tuner.ask()
    assert first.number == 0
    assert first.is_baseline is True
    assert first.params == DEFAULTS
    assert first.trial.user_attrs[BASELINE_ATTR] is True
    tuner.tell(first, ok(10.0))

    second = tuner.ask()
    assert second.number == 1
    assert second.is_baseline is False
    assert_in_space(second.params)


def test_enqueue_baseline_refused_on_non_empty_study(journal):
    tuner = make_tuner(journal)
    tuner.tell(tuner.ask(), ok(1.0))
    assert tuner.enqueue_baseline(DEFAULTS) is False
    p = tuner.ask()
    assert p.number == 1 and p.is_baseline is False


def test_enqueue_baseline_only_once(journal):
    tuner = make_tuner(journal)
    assert tuner.enqueue_baseline(DEFAULTS) is True
    assert tuner.enqueue_baseline(DEFAULTS) is False  # a WAITING trial already counts
    assert tuner.ask().is_baseline is True
    assert tuner.ask().is_baseline is False


@pytest.mark.parametrize(("maximize", "feasible_value", "infeasible_value", "worse_value"), [
    (True, 10.0, 20.0, 5.0),     # the infeasible 20 would win a maximize study
    (False, 10.0, 5.0, 20.0),    # the infeasible 5 would win a minimize study
])
def test_best_trial_is_best_feasible(journal, maximize, feasible_value, infeasible_value,
                                     worse_value):
    tuner = make_tuner(journal, maximize=maximize)
    worse = tuner.ask()
    tuner.tell(worse, ok(worse_value, p99_ttft_ms=-0.5, error_rate=-0.01))
    good = tuner.ask()
    tuner.tell(good, ok(feasible_value, p99_ttft_ms=-0.1, error_rate=0.0))
    bad = tuner.ask()
    tuner.tell(bad, ok(infeasible_value, p99_ttft_ms=0.5, error_rate=-0.01))

    best = tuner.study.best_trial
    assert best.number == good.number
    assert best.value == feasible_value
    assert best.constraints == {"p99_ttft_ms": -0.1, "error_rate": 0.0, "feasibility": 0.0}
    stored_bad = tuner.study.trials[bad.number]
    assert stored_bad.state == TrialState.COMPLETE
    assert stored_bad.constraints == {"p99_ttft_ms": 0.5, "error_rate": -0.01, "feasibility": 0.0}


@pytest.mark.parametrize(("evaluation", "reason"), [
    (Evaluation(objective=None, constraints={}, fail_reason="startup_timeout"), "startup_timeout"),
    (Evaluation(objective=None, constraints={}, fail_reason="node_lost"), "node_lost"),
    # a start-up OOM on devices an earlier server still held: not the configuration's (#32)
    (Evaluation(objective=None, constraints={}, fail_reason="devices_held"), "devices_held"),
    # a value with a failure reason is still a failure
    (Evaluation(objective=3.0, constraints={"p99_ttft_ms": -1.0}, fail_reason="server_died"),
     "server_died"),
    # no value and no reason: an internal error, never a silent COMPLETE
    (Evaluation(objective=None, constraints={}), "internal"),
])
def test_failed_evaluation(journal, evaluation, reason):
    tuner = make_tuner(journal)
    p = tuner.ask()
    tuner.tell(p, evaluation)
    t = tuner.study.trials[p.number]
    assert t.state == TrialState.FAIL
    assert t.user_attrs[FAIL_REASON_ATTR] == reason
    assert t.value is None
    assert tuner.finished() == 1


@pytest.mark.parametrize("reason", sorted(CONFIG_FAILURES))
@pytest.mark.parametrize("maximize", [True, False])
def test_configuration_failures_are_violated_constraints(journal, reason, maximize):
    """A configuration's own failure is a COMPLETE trial whose `feasibility` constraint is
    violated by its magnitude (so constraint-aware samplers avoid its neighbourhood); the SLA
    constraints are neutral (0) and the value a placeholder no feasible trial loses to."""
    tuner = make_tuner(journal, maximize=maximize)
    p = tuner.ask()
    tuner.tell(p, Evaluation(objective=None, constraints={}, fail_reason=reason, violation=2.5))
    t = tuner.study.trials[p.number]
    assert t.state == TrialState.COMPLETE and t.user_attrs[FAIL_REASON_ATTR] == reason
    assert t.constraints == {"p99_ttft_ms": 0.0, "error_rate": 0.0, "feasibility": 2.5}
    good = tuner.ask()
    tuner.tell(good, ok(1.0 if maximize else 1e6, p99_ttft_ms=-0.1, error_rate=0.0))
    assert tuner.study.best_trial.number == good.number


def test_fail_helper(journal):
    tuner = make_tuner(journal)
    p = tuner.ask()
    tuner.fail(p, "startup_timeout")
    t = tuner.study.trials[p.number]
    assert (t.state, t.user_attrs[FAIL_REASON_ATTR]) == (TrialState.FAIL, "startup_timeout")


def test_resume_continues_numbering(journal):
    first = make_tuner(journal)
    first.enqueue_baseline(DEFAULTS)
    told = []
    for value in (1.0, 2.0, 3.0):
        p = first.ask()
        first.tell(p, ok(value, p99_ttft_ms=-0.1))
        told.append(p.number)
    failed = first.ask()
    first.fail(failed, "startup_crash")
    assert first.finished() == 4

    second = make_tuner(journal)
    assert second.finished() == 4
    assert second.close_interrupted() == []
    assert second.enqueue_baseline(DEFAULTS) is False
    p = second.ask()
    assert p.number == 4
    assert p.is_baseline is False
    assert_in_space(p.params)
    second.tell(p, ok(4.0, p99_ttft_ms=-0.2))

    numbers = [t.number for t in make_tuner(journal).study.trials]
    assert numbers == [0, 1, 2, 3, 4]
    assert told == [0, 1, 2]
    # the resumed study still knows the old results
    assert second.study.best_trial.number == 4
    assert second.study.trials[0].user_attrs[BASELINE_ATTR] is True


def test_resume_with_random_sampler(journal):
    first = make_tuner(journal, sampler="random")
    first.tell(first.ask(), ok(1.0))
    second = make_tuner(journal, sampler="random")
    assert second.finished() == 1
    assert second.ask().number == 1


def test_close_interrupted_trial_of_killed_driver(journal):
    dead = make_tuner(journal)
    dead.tell(dead.ask(), ok(5.0))
    orphan = dead.ask()  # asked, never told: the driver was killed -9 here
    assert orphan.number == 1
    del dead

    fresh = make_tuner(journal)
    assert fresh.finished() == 1  # a RUNNING trial is not finished
    assert fresh.close_interrupted() == [1]

    t = fresh.study.trials[1]
    assert t.state == TrialState.FAIL
    assert t.user_attrs[FAIL_REASON_ATTR] == "interrupted"
    assert t.params == orphan.params
    assert fresh.finished() == 2
    assert fresh.close_interrupted() == []  # idempotent

    nxt = fresh.ask()
    assert nxt.number == 2
    # a third instance reading the journal sees the same final states
    states = [t.state for t in make_tuner(journal).study.trials]
    assert states == [TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING]


@pytest.mark.parametrize("ev", [
    ok(5.0, p99_ttft_ms=-3.0),
    Evaluation(objective=None, constraints={}, fail_reason="oom_at_startup", violation=0.5),
    Evaluation(objective=None, constraints={}, fail_reason="node_lost"),
])
def test_a_trial_recorded_but_not_told_is_told_on_resume_as_it_would_have_been(journal, ev):
    """Guards the kill -9 between a trial's rows and its tell (the runner's `_record`): the
    resume must tell the study what the dead driver measured, not FAIL(interrupted) over a row
    on disk. The same evaluation told live and told on resume leave equal trials."""
    live = make_tuner(journal)
    told = live.ask()
    live.remember(told, ev)
    live.tell(told, ev)
    dead = live.ask()  # the same evaluation remembered, its rows written, then killed -9
    live.remember(dead, ev)
    del live

    fresh = make_tuner(journal)
    assert fresh.tell_recorded(recorded={0}) == []  # trial 1's rows are not on disk yet
    assert fresh.tell_recorded(recorded={0, 1}) == [1]
    assert fresh.close_interrupted() == []
    a, b = fresh.study.trials[0], fresh.study.trials[1]
    assert (b.state, b.values, b.user_attrs.get(FAIL_REASON_ATTR), b.system_attrs) == (
        a.state, a.values, a.user_attrs.get(FAIL_REASON_ATTR), a.system_attrs)
    assert fresh.tell_recorded(recorded={0, 1}) == []  # told once


def test_a_trial_remembered_without_its_rows_is_interrupted(journal):
    """Killed after `remember`, before its rows: nothing of it is on disk, so it is
    FAIL(interrupted) as any trial a dead driver left running."""
    dead = make_tuner(journal)
    p = dead.ask()
    dead.remember(p, ok(2.0))
    fresh = make_tuner(journal)
    assert fresh.tell_recorded(recorded=set()) == []
    assert fresh.close_interrupted() == [0]
    assert fresh.study.trials[0].user_attrs[FAIL_REASON_ATTR] == "interrupted"


def test_close_interrupted_several_including_baseline(journal):
    dead = make_tuner(journal)
    dead.enqueue_baseline(DEFAULTS)
    a, b = dead.ask(), dead.ask()  # two parallel trials in flight
    assert (a.is_baseline, b.is_baseline) == (True, False)

    fresh = make_tuner(journal)
    assert sorted(fresh.close_interrupted()) == [0, 1]
    assert fresh.finished() == 2
    assert all(t.user_attrs[FAIL_REASON_ATTR] == "interrupted" for t in fresh.study.trials)
    assert fresh.study.trials[0].user_attrs[BASELINE_ATTR] is True


def space_of(parameters: dict):
    from framework.config.search_space import SearchSpace

    return SearchSpace.model_validate({"parameters": parameters})


def test_grid_sampler_visits_every_configuration_exactly_once(tmp_path):
    space = space_of({"max-num-seqs": {"type": "categorical", "choices": [8, 16, 32]},
                      "enable-prefix-caching": {"type": "bool"},
                      "block-size": {"type": "int", "low": 16, "high": 32, "step": 16}})
    tuner = Tuner(tmp_path / "j", "grid", space, ["maximize"], "grid", seed=0, startup_trials=2)
    seen = []
    for i in range(12):
        p = tuner.ask()
        seen.append(tuple(p.params[k] for k in space.parameters))
        tuner.tell(p, ok(float(i)))
    assert sorted(seen) == sorted((s, c, b) for s in (8, 16, 32) for c in (False, True)
                                  for b in (16, 32))


def test_a_conditional_grid_visits_each_of_its_points_once_after_the_baseline(tmp_path):
    """The four shapes of issue #36 (prefill/decode, else replicas, DP only on one server):
    the baseline first, then the 4 grid points (not the product's 8), each once, the study
    reopened from its journal half-way (the runner stops at the grid's size,
    runner._grid_capped)."""
    space = space_of({
        "prefill-servers": {"type": "categorical", "choices": [0, 1], "kind": "shape",
                            "default": 0},
        "replicas": {"type": "categorical", "choices": [1, 2], "kind": "shape", "default": 1,
                     "when": {"prefill-servers": 0}},
        "data-parallel-size": {"type": "categorical", "choices": [1, 2], "default": 1,
                               "when": {"prefill-servers": 0, "replicas": 1}}})
    journal = tmp_path / "j"
    tuner = Tuner(journal, "shapes", space, ["maximize"], "grid", seed=3, startup_trials=2)
    assert tuner.enqueue_baseline(space.defaults())
    first = tuner.ask()
    assert first.is_baseline and first.params == space.defaults()
    tuner.tell(first, ok(1.0))
    seen = []
    for round_ in range(2):
        tuner = Tuner(journal, "shapes", space, ["maximize"], "grid", seed=3, startup_trials=2)
        for i in range(2):
            p = tuner.ask()
            seen.append(p.params)
            tuner.tell(p, ok(float(round_ * 2 + i)))
    key = sorted(tuple(sorted(p.items())) for p in seen)
    assert key == sorted(tuple(sorted(p.items())) for p in [
        {"prefill-servers": 0, "replicas": 1, "data-parallel-size": 1},
        {"prefill-servers": 0, "replicas": 1, "data-parallel-size": 2},
        {"prefill-servers": 0, "replicas": 2}, {"prefill-servers": 1}])


@pytest.mark.parametrize("sampler", ["nsga2", "tpe", "random"])
def test_multi_objective_study_keeps_a_pareto_front(tmp_path, sampler):
    tuner = Tuner(tmp_path / "j", "mo", SPACE, ["maximize", "minimize"], sampler, seed=0,
                  startup_trials=2, constraint_keys=["p99_ttft_ms"])
    points = [(10.0, 100.0), (20.0, 300.0), (15.0, 400.0), (5.0, 50.0)]  # (15, 400) dominated
    for throughput, ttft in points:
        tuner.tell(tuner.ask(), ok((throughput, ttft), p99_ttft_ms=-0.5))
    front = sorted(tuple(t.values) for t in tuner.study.best_trials)
    assert front == [(5.0, 50.0), (10.0, 100.0), (20.0, 300.0)]


def test_conditional_parameter_is_asked_only_when_its_condition_holds(tmp_path):
    space = space_of({
        "speculative": {"type": "bool", "default": False},
        "num-speculative-tokens": {"type": "int", "low": 1, "high": 8,
                                   "when": {"speculative": True}},
        "max-num-seqs": {"type": "int", "low": 2, "high": 64}})
    tuner = Tuner(tmp_path / "j", "cond", space, ["maximize"], "random", seed=1, startup_trials=2)
    flags = []
    for i in range(30):
        p = tuner.ask()
        assert ("num-speculative-tokens" in p.params) == p.params["speculative"], p.params
        assert "max-num-seqs" in p.params
        flags.append(p.params["speculative"])
        tuner.tell(p, ok(float(i)))
    assert set(flags) == {False, True}
    assert space.defaults() == {"speculative": False}


CRASH_SPACE = {"num-gpu-blocks-override": {"type": "int", "low": 1, "high": 100},
               "max-num-seqs": {"type": "int", "low": 1, "high": 100}}


def crash_region_proposals(tmp_path, reason: str, learn: bool, seed: int) -> int:
    """40 trials of TPE on a space whose lower half of num-gpu-blocks-override crashes
    (told as `reason`); the objective rises with max-num-seqs elsewhere. Returns how many of
    the 30 trials after the 10 random start-up ones landed in the crash region."""
    tuner = Tuner(tmp_path / f"{reason}-{learn}-{seed}", "crash", space_of(CRASH_SPACE),
                  ["maximize"], "tpe", seed=seed, startup_trials=10,
                  constraint_keys=["p99_ttft_ms"], learn_from_failures=learn)
    crashes = 0
    for i in range(40):
        p = tuner.ask()
        if p.params["num-gpu-blocks-override"] <= 50:
            crashes += i >= 10
            tuner.tell(p, Evaluation(objective=None, constraints={}, fail_reason=reason))
        else:
            tuner.tell(p, ok(float(p.params["max-num-seqs"]), p99_ttft_ms=-0.1))
    return crashes


def test_configuration_failures_steer_the_search_away_and_infrastructure_ones_do_not(tmp_path):
    seeds = range(3)
    learned = sum(crash_region_proposals(tmp_path, "oom_at_startup", True, s) for s in seeds)
    plain = sum(crash_region_proposals(tmp_path, "oom_at_startup", False, s) for s in seeds)
    infra = sum(crash_region_proposals(tmp_path, "node_lost", True, s) for s in seeds)
    # told as constraints, TPE leaves the crash region; as plain FAIL (or an infrastructure
    # failure, which is not held against the configuration) it keeps sampling it as if new
    assert learned < plain / 2, (learned, plain)
    assert infra > learned, (infra, learned)


def test_the_gp_sampler_is_optunas_and_takes_the_constraints(tmp_path):
    """`sampler: gp` is Optuna's GPSampler, which reads the constraints set on each trial
    (Trial.set_constraint): a study of feasible and infeasible trials asks on, in the space,
    and its best feasible trial is the one Optuna reports."""
    import optuna

    tuner = Tuner(tmp_path / "j", "gp", SPACE, ["maximize"], "gp", seed=0, startup_trials=3,
                  constraint_keys=["p99_ttft_ms"])
    assert isinstance(tuner.study.sampler, optuna.samplers.GPSampler)
    for _ in range(5):  # 3 start-up trials, then 2 of the Gaussian process
        p = tuner.ask()
        assert_in_space(p.params)
        seqs = int(p.params["max-num-seqs"])
        tuner.tell(p, ok(float(seqs), p99_ttft_ms=1.0 if seqs > 64 else -0.5))
    feasible = [t for t in tuner.study.trials if t.params["max-num-seqs"] <= 64]
    assert [p for p in tuner.tried()] == [t.params for t in tuner.study.trials]
    assert feasible and all(t.constraints == {"p99_ttft_ms": -0.5, "feasibility": 0.0}
                            for t in feasible)
