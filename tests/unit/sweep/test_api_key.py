"""The run's API key (#33 item 5): servers that can be reached from other machines (a joined
cluster, `host` beyond loopback) get a random key of the run unless server.api_key_env names
one or `--no-api-key` opts out (one warning line); the key reaches the load plan, the quality
probe and the servers' secret_env, and is never shown."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import yaml

from framework.sweep import loader as sweep_mod
from framework.sweep.quality_gate import QualityGate
from framework.sweep.trial_load import load_plan
from tests.paths import ROOT

GIVEN = "sk-given-by-the-user-0123"


@pytest.fixture
def sw(monkeypatch):
    monkeypatch.chdir(ROOT)
    return sweep_mod.load(ROOT / "sweeps" / "quickstart.yaml", check_flags=False)


def with_key_env(sw):
    return dataclasses.replace(sw, spec=sw.spec.model_copy(update={
        "server": sw.spec.server.model_copy(update={"api_key_env": "VSWEEP_TEST_KEY"})}))


@pytest.mark.parametrize(("host", "beyond"), [
    ("127.0.0.1", False), ("127.0.0.2", False), ("::1", False), ("localhost", False),
    ("node", True), ("10.0.0.5", True), ("0.0.0.0", True), ("::", True), ("gpu-7.lan", True),
])
def test_beyond_loopback(host, beyond):
    assert sweep_mod.beyond_loopback(host) is beyond


@pytest.mark.parametrize(("local", "host", "no_api_key", "random"), [
    (False, "node", False, True),        # a joined cluster: a key by default
    (False, "127.0.0.1", False, True),   # joined, whatever the host: other users of the nodes
    (True, "node", False, True),         # a private Ray whose servers bind the node's IP
    (True, "0.0.0.0", False, True),
    (True, "127.0.0.1", False, False),   # a private Ray on loopback: no key, as before
    (False, "node", True, False),        # --no-api-key
    (True, "node", True, False),
])
def test_a_random_key_by_default_where_servers_can_be_reached(sw, monkeypatch, local, host,
                                                              no_api_key, random):
    key = sweep_mod.run_api_key(sw.spec, local, host, no_api_key)
    assert (key is not None) is random
    if random:
        other = sweep_mod.run_api_key(sw.spec, local, host, no_api_key)
        assert key != other and len(key) >= 40  # token_urlsafe(32): 43 characters
        assert key.replace("-", "").replace("_", "").isalnum()
    monkeypatch.setenv("VSWEEP_TEST_KEY", GIVEN)  # the user's key wins, --no-api-key or not
    assert sweep_mod.run_api_key(with_key_env(sw).spec, local, host, no_api_key) == GIVEN


@pytest.mark.parametrize(("local", "host", "no_api_key", "warned"), [
    (False, "node", True, True), (True, "node", True, True), (True, "127.0.0.1", True, False),
    (False, "node", False, False),
])
def test_the_run_key_reaches_sweep_and_servers_and_an_opt_out_warns_once(sw, local, host,
                                                                         no_api_key, warned):
    from framework.cli import _run_key

    lines: list[str] = []
    keyed, secret_env = _run_key(sw, local, host, no_api_key, lines.append)
    assert len(lines) == int(warned)
    if warned:
        assert lines[0].startswith("warning: --no-api-key:") and "\n" not in lines[0]
    if keyed.api_key is None:
        assert "VLLM_API_KEY" not in secret_env
    else:
        assert secret_env["VLLM_API_KEY"] == keyed.api_key
        assert keyed.api_key not in repr(keyed) + "".join(lines)


def test_every_request_of_ours_carries_the_run_key(sw):
    keyed = dataclasses.replace(sw, api_key=GIVEN)
    plan = load_plan(keyed.spec, keyed.api_key)
    assert plan.api_key == GIVEN and GIVEN not in repr(plan)
    assert QualityGate(keyed)._api_key == GIVEN  # the quality probe's requests
    assert load_plan(sw.spec).api_key is None


def test_loading_reads_the_users_key_from_the_driver(tmp_path, monkeypatch):
    doc = yaml.safe_load((ROOT / "sweeps" / "quickstart.yaml").read_text())
    doc.update(model=str(ROOT / doc["model"]), search_space=str(ROOT / doc["search_space"]),
               server={**doc.get("server", {}), "api_key_env": "VSWEEP_TEST_KEY"})
    path = tmp_path / "keyed.yaml"
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("VSWEEP_TEST_KEY", GIVEN)
    assert sweep_mod.load(path, check_flags=False).api_key == GIVEN


@pytest.mark.parametrize("command", ["run", "doctor", "submit"])
def test_no_api_key_is_an_option_of_the_commands_that_start_servers(command):
    from framework.cli import parser

    args = parser().parse_args([command, "sweeps/quickstart.yaml", "--no-api-key"])
    assert args.no_api_key is True
    assert parser().parse_args([command, "sweeps/quickstart.yaml"]).no_api_key is False


def test_submit_passes_no_api_key_to_the_jobs_run(monkeypatch):
    from framework.cluster import jobs
    from framework.sweep import job_cli

    monkeypatch.chdir(ROOT)
    sent = []
    monkeypatch.setattr(jobs, "submit", lambda address, entrypoint, *_: sent.append(entrypoint)
                        or "job-1")
    args = argparse.Namespace(sweep="sweeps/quickstart.yaml", address=None, submission_id=None,
                              add_trials=0, no_wait=True, no_api_key=True)
    assert job_cli.cmd_submit(args) == 0
    assert sent == ["vllm-sweep run sweeps/quickstart.yaml --no-api-key"]


def test_the_run_key_copy_keeps_the_opened_results_store(sw):
    """`run` puts the run's key in a copy of the sweep after the driver lock is taken in the
    results: the copy must be the same store (for an object store, one staging copy, downloaded
    once), and a copy made before any opening opens its own."""
    fresh = sw.with_api_key(GIVEN)
    assert "store" not in fresh.__dict__ and fresh.api_key == GIVEN
    opened = sw.store
    keyed = sw.with_api_key(GIVEN)
    assert keyed.store is opened and keyed.api_key == GIVEN and sw.api_key != GIVEN
