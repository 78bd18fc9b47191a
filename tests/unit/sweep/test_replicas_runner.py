"""The replicas shape through the real runner, without Ray: a `replicas: {kind: shape}`
parameter makes a trial N FakeEngine servers behind the router (framework/engine/router.py,
a real process), measured as one deployment (test_runner_contract's launcher and sweep)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from framework.engine.kv_transfer import kv_transfer_args
from framework.trial import replicas
from framework.trial.replicas import replica_log
from tests.unit.sweep.test_runner_contract import FakeLauncher
from tests.unit.sweep.test_runner_contract import _run
from tests.unit.sweep.test_runner_contract import _sweep
from tests.unit.sweep.test_runner_contract import _told_once_with_rows


@pytest.mark.timeout(180)
def test_two_replicas_are_one_trial_measured_through_the_router(tmp_path):
    """Guards the replicas seam: each of a 2-replica trial's servers serves half of its
    requests (round robin; every request row names its server), both servers and the router
    end with the trial, the devices and the shape count both servers, and the one-server
    trial is unchanged (no replica, TP1xPP1)."""
    space = {"replicas": {"type": "categorical", "choices": [1, 2], "kind": "shape",
                          "default": 1}}
    launcher = FakeLauncher(gpus=2)
    runner, counted, out = _run(_sweep(tmp_path, "replicas", space, False, 2), launcher, 2)
    trials = _told_once_with_rows(runner, counted, 2).set_index("trial_number")
    assert list(trials["state"]) == ["COMPLETE", "COMPLETE"], out

    by_replicas = {int(n): number for number, n in trials["param_replicas"].items()}
    one, two = by_replicas[1], by_replicas[2]
    assert trials.loc[one, "shape"] == "TP1xPP1"
    assert trials.loc[two, "shape"] == "2xTP1xPP1"
    # the router relabels each server's engine ("0" -> "0.0", "1.0"): both served
    assert trials.loc[two, "engines_served"] == 2 and trials.loc[one, "engines_served"] == 1

    mine = pd.read_parquet(runner.store.requests_path(two))
    counts = mine["replica"].value_counts().to_dict()
    assert counts == {0: 4, 1: 4}, counts  # 8 measured requests, alternated
    assert pd.read_parquet(runner.store.requests_path(one))["replica"].isna().all()

    # three servers in all, each stopped exactly once; at most both devices held at once
    assert len(launcher.servers) == 3
    assert [s.stops for s in launcher.servers] == [1, 1, 1]
    assert launcher.most_held == 2
    # replica 1 logged beside the trial's log; the router's log says it was ready
    log = runner.store.log_path(two)
    assert replica_log(log, 1).is_file() and replica_log(log, 1) != log
    assert "router ready" in log.with_name(log.stem + ".router.log").read_text()


def _pd_sweep(tmp_path: Path) -> Path:
    """One aggregated server against one prefill + one decode server, 40-token prompts (two
    whole KV blocks of 16 move per request)."""
    space = {"prefill-servers": {"type": "categorical", "choices": [0, 1], "kind": "shape",
                                 "default": 0}}
    path = _sweep(tmp_path, "pd", space, False, 2)
    sweep = yaml.safe_load(path.read_text())
    sweep["workload"]["input_len"] = 40
    path.write_text(yaml.safe_dump(sweep))
    return path


@pytest.mark.timeout(180)
def test_prefill_decode_moves_the_kv_and_a_connector_that_moves_none_fails(tmp_path,
                                                                          monkeypatch):
    """Guards #36's prefill/decode seam on FakeEngine (which fakes ExampleConnector's
    observable contract): a 1P1D trial prefills every request on P and decodes it on D, whose
    loaded tokens (kv_transfer_tokens: 32 a request) reach the row; the KV folder goes with the
    trial; and the same shape with a connector that moves nothing (FakeEngine fakes no NIXL)
    is FAIL(kv_not_transferred), not a faster shape."""
    import os

    launcher = FakeLauncher(gpus=2)
    runner, counted, out = _run(_pd_sweep(tmp_path), launcher, 2)
    trials = _told_once_with_rows(runner, counted, 2).set_index("param_prefill_servers")
    assert list(trials["state"]) == ["COMPLETE", "COMPLETE"], out
    assert list(trials["shape"]) == ["TP1xPP1", "1P1DxTP1xPP1"]
    assert trials.loc[0, "kv_transfer_tokens"] == 0  # FakeEngine reports it; nothing to load
    assert trials.loc[1, "kv_transfer_tokens"] == 8 * 32
    # the P/D trial's argv carries the connector and its (removed) folder
    argv = list(trials.loc[1, "vllm_argv"])
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == "ExampleConnector"
    assert not os.path.exists(config["kv_connector_extra_config"]["shared_storage_path"])
    assert [s.stops for s in launcher.servers] == [1, 1, 1]
    # the decode server was asked to avoid the prefill server's node, nothing else was
    assert launcher.avoided == [frozenset(), frozenset(), frozenset({"127.0.0.1"})]

    monkeypatch.setattr(replicas, "kv_transfer_args",
                        lambda name, folder=None: kv_transfer_args("NixlConnector"))
    launcher = FakeLauncher(gpus=2)
    (tmp_path / "broken").mkdir()
    runner, counted, out = _run(_pd_sweep(tmp_path / "broken"), launcher, 2)
    trials = _told_once_with_rows(runner, counted, 2).set_index("param_prefill_servers")
    assert trials.loc[0, "state"] == "COMPLETE"
    assert trials.loc[1, "fail_reason"] == "kv_not_transferred", out
    assert "moved nothing" in trials.loc[1, "fail_detail"]
