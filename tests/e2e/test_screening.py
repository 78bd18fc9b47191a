"""Screening (issue 8): a short first run per trial; Optuna's pruner (tuner.FarFromBestPruner)
stops configurations far from the best feasible one, an SLA broken by a wide margin stops them
outright, the rest get the full run. The pruner on real Optuna studies, then a FakeEngine sweep
through the CLI whose configurations differ only in how many requests they batch."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from tests.cli import run_joined
from tests.clusters import join_shared
from tests.paths import TINY_MODEL
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_trials


@pytest.mark.server
@pytest.mark.timeout(300)
def test_fake_sweep_prunes_slow_and_sla_breaking_configurations(shared_ray, short_tmp):
    """A request takes ~0.47 s (20 ms + 15 x 30 ms). max-num-seqs 1 queues the screen's 12
    requests one by one (p99 TTFT ~5 s, the SLA is 1.5 s: pruned on the SLA); 4 runs them in
    three waves (TTFT ~1 s, fine; a third of the throughput: pruned by Optuna's pruner); 64
    matches the baseline (128): full run. The screens last ~0.5 s (4: ~1.4 s) and the margin
    0.4 sits between 1 and a third (1 - 0.4 ~ sqrt(1/3)), so a stall of ~0.3 s in one screen
    neither prunes 64 nor lets 4 through (on 0.1 s screens and margin 0.3, ~50 ms did)."""
    space = short_tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [1, 4, 64, 128], "default": 128}}}))
    sweep = short_tmp / "screen.yaml"
    sweep.write_text(yaml.safe_dump(join_shared({
        "name": "screen", "model": str(TINY_MODEL),
        "search_space": str(space), "engine": "fake",
        "server": {"env": {"FAKE_ENGINE_STARTUP_S": "0.3", "FAKE_ENGINE_TTFT_MS": "20",
                           "FAKE_ENGINE_TPOT_MS": "30"}},
        "workload": {"num_prompts": 48, "input_len": 16, "output_len": 16,
                     "max_concurrency": 16, "warmup_requests": 0},
        "sla": {"p99_ttft_ms": 1500},
        "search": {**NO_REMEASURE, "sampler": "grid", "n_trials": 5, "screen": 0.25,
                   "screen_margin": 0.4, "stop_early": False},
        "results_dir": str(short_tmp / "results")}, shared_ray)))
    res = run_joined(shared_ray, ["run", str(sweep)], short_tmp)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "PRUNED" in res.stdout

    rows = read_trials(short_tmp / "results", "screen")
    assert len(rows) == 5 and bool(rows.iloc[0]["is_baseline"])  # the baseline (128) first
    assert (rows[rows["param_max_num_seqs"] == 128]["state"] == "COMPLETE").all()
    trials = rows[~rows["is_baseline"]].set_index("param_max_num_seqs")
    assert trials.loc[64, "state"] == "COMPLETE"
    assert trials.loc[1, "state"] == "PRUNED" and "p99_ttft_ms" in trials.loc[1, "fail_detail"]
    assert trials.loc[4, "state"] == "PRUNED", trials.loc[4, ["fail_detail", "p99_ttft_ms"]]
    assert "worse than the best feasible" in trials.loc[4, "fail_detail"]
    for seqs in (1, 4):
        assert pd_isnull(trials.loc[seqs, "objective"]) and trials.loc[seqs, "completed"] == 12
    assert trials.loc[64, "completed"] == 48 and trials.loc[128, "completed"] == 48

    requests = pd_read(short_tmp / "results" / "screen" / "requests")
    per = requests.groupby(["trial_number", "screening"]).size().unstack(fill_value=0)
    numbers = rows.set_index("trial_number")["param_max_num_seqs"]
    for number, seqs in numbers.items():
        assert per.loc[number, True] == 12
        assert per.loc[number].get(False, 0) == (48 if seqs in (64, 128) else 0)

    storage = JournalStorage(JournalFileBackend(str(short_tmp / "results" / "screen" /
                                                    "optuna.journal")))
    study = optuna.load_study(study_name="screen", storage=storage)
    states = {t.params["max-num-seqs"]: t.state for t in study.trials[1:]}
    assert states[1] == TrialState.PRUNED and states[4] == TrialState.PRUNED
    assert states[64] == TrialState.COMPLETE and study.trials[0].state == TrialState.COMPLETE


def pd_isnull(value) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def pd_read(path: Path):
    import pandas as pd

    return pd.read_parquet(path)
