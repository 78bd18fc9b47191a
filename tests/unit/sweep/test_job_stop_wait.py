"""`vllm-sweep submit` gives `ray job stop` time for the driver's clean stop (#33 item 6): Ray's
job supervisor SIGKILLs the job 3 s after its SIGTERM unless the job's runtime_env sets
RAY_JOB_STOP_WAIT_TIME_S; submit sets 15 s + 20 s per server the sweep may hold."""

from __future__ import annotations

import argparse

import pytest
import yaml

from framework.cluster import jobs
from framework.config.specs import SweepSpec
from framework.sweep.job_cli import cmd_submit
from framework.sweep.job_cli import job_servers
from tests.paths import ROOT


@pytest.mark.parametrize(("servers", "wait"), [(1, 35), (2, 55), (8, 175), (0, 35)])
def test_stop_wait_is_vllms_shutdown_then_each_servers_workers(servers, wait) -> None:
    assert jobs.stop_wait_s(servers) == wait


def _spec(engine: str = "cpu", cluster: dict | None = None, server: dict | None = None,
          n_trials: int = 20) -> SweepSpec:
    doc = yaml.safe_load((ROOT / "sweeps" / "quickstart.yaml").read_text())
    doc["engine"] = engine
    doc["cluster"] = {**doc.get("cluster", {}), **(cluster or {})}
    doc["server"] = {**doc["server"], **(server or {})}
    doc["search"] = {**doc["search"], "n_trials": n_trials}
    return SweepSpec.model_validate(doc)


@pytest.mark.parametrize(("spec", "add_trials", "servers"), [
    (_spec(cluster={"start_ahead": 0}), 0, 2),                   # one trial + one parked server
    (_spec(cluster={"start_ahead": 0}, server={"reuse": False}), 0, 1),
    (_spec(cluster={"start_ahead": 1}, server={"reuse": False}), 0, 2),
    (_spec("gpu", {"max_concurrent_trials": 4}), 0, 8),
    (_spec("gpu"), 0, 20),                                       # as many as fit: the trials
    (_spec("gpu", server={"reuse": False}), 3, 3),               # --add-trials 3
    (_spec(cluster={"start_ahead": 0}, n_trials=1), 0, 1),
])
def test_servers_a_job_may_hold(spec, add_trials, servers) -> None:
    assert job_servers(spec, add_trials) == servers


class RecordingJobClient:
    """Stands in for Ray's job API (a dashboard, which unit tests do not start): records
    what `submit_job` was given."""

    def __init__(self) -> None:
        self.submitted: dict = {}

    def submit_job(self, **kwargs: object) -> str:
        self.submitted = kwargs
        return "raysubmit_test"


def test_submit_sets_the_job_stop_wait_in_the_jobs_runtime_env(monkeypatch, capsys) -> None:
    client = RecordingJobClient()
    monkeypatch.setattr(jobs, "_client", lambda address: client)
    monkeypatch.chdir(ROOT)
    args = argparse.Namespace(sweep="sweeps/quickstart.yaml", address=None, submission_id=None,
                              add_trials=0, no_api_key=False, no_wait=True)
    assert cmd_submit(args) == 0
    spec = _spec(n_trials=yaml.safe_load(
        (ROOT / "sweeps" / "quickstart.yaml").read_text())["search"]["n_trials"])
    wait = str(jobs.stop_wait_s(job_servers(spec, 0)))
    assert client.submitted["runtime_env"] == {
        "working_dir": f"local://{ROOT}", "env_vars": {jobs.STOP_WAIT_VAR: wait}}
    assert f"`ray job stop` waits {wait} s" in capsys.readouterr().out
