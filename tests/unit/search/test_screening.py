"""Screening (issue 8): a short first run per trial; Optuna's pruner (tuner.FarFromBestPruner)
stops configurations far from the best feasible one, an SLA broken by a wide margin stops them
outright, the rest get the full run. The pruner on real Optuna studies, then a FakeEngine sweep
through the CLI whose configurations differ only in how many requests they batch."""

from __future__ import annotations

import optuna
import pytest
import yaml

from framework.base.errors import ConfigError
from framework.config.specs import load_sweep
from framework.search.tuner import FarFromBestPruner


def _study(direction: str, finished: list[tuple[float, float]]) -> optuna.Study:
    """Finished trials as (screen value at step 0, constraint value)."""
    study = optuna.create_study(direction=direction, pruner=FarFromBestPruner(0.3))
    for screen, constraint in finished:
        t = study.ask()
        t.report(screen, 0)
        t.set_constraint("p99_ttft_ms", constraint)
        study.tell(t, screen)
    return study


@pytest.mark.parametrize("direction, finished, value, pruned", [
    ("maximize", [], 1.0, False),                          # nothing to compare with
    ("maximize", [(100.0, 0.0)], 71.0, False),              # within 30% of the best
    ("maximize", [(100.0, 0.0)], 69.0, True),               # more than 30% below
    ("maximize", [(100.0, 0.0), (50.0, 0.0)], 69.0, True),  # the best, not the mean
    ("maximize", [(1000.0, 5.0), (100.0, 0.0)], 80.0, False),  # infeasible bests don't count
    ("maximize", [(1000.0, 5.0)], 1.0, False),
    ("minimize", [(100.0, 0.0)], 129.0, False),
    ("minimize", [(100.0, 0.0)], 131.0, True),
])
def test_far_from_best_pruner(direction, finished, value, pruned):
    study = _study(direction, finished)
    trial = study.ask()
    trial.report(value, 0)
    assert trial.should_prune() is pruned


def test_a_trial_without_report_is_never_pruned():
    study = _study("maximize", [(100.0, 0.0)])
    assert study.ask().should_prune() is False


@pytest.mark.parametrize("extra, message", [
    ({"objective": {"metric": "output_throughput", "pareto_with": ["p99_ttft_ms"]}},
     "single objective"),
    ({"capacity": {"max_rate": 8}, "sla": {"p99_ttft_ms": 100}}, "not to capacity mode"),
    ({"search": {"screen": 1.5}}, "search.screen"),
])
def test_screen_settings_are_checked(tmp_path, extra, message):
    path = tmp_path / "s.yaml"
    base = {"name": "s", "model": "m", "search_space": "x.yaml"}
    base["search"] = {"screen": 0.25, **extra.pop("search", {})}
    path.write_text(yaml.safe_dump({**base, **extra}))
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert message in str(err.value) and "\n" not in str(err.value)
