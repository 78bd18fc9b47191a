"""A node dies during a trial: that trial ends as FAIL(node_lost) and the sweep goes on with the
remaining nodes (emulated cluster, FakeEngine servers so the trial is long enough to kill).

The sweep runs in this process (tests.cli.cli_joined) on a cluster of its own, since the test
is about a node's failure; the node dies from inside the run, as the trial's load starts (the load
generator's entry, wrapped here), so no output line or time is waited for."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
import yaml

from framework.trial import measure
from tests.cli import cli_joined
from tests.clusters import emulated_cluster
from tests.sweeps import NO_REMEASURE
from tests.sweeps import read_trials

pytestmark = pytest.mark.server

WORKERS = ("127.0.0.2", "127.0.0.3")


@pytest.mark.timeout(600)
def test_node_lost_mid_trial_fails_that_trial_and_the_sweep_completes(tiny_model, short_tmp,
                                                                      monkeypatch):
    """Guards: a trial whose node dies under load must end as FAIL(node_lost) naming that node
    (not hang, not crash the driver, not record a measurement), and with retry_node_lost the
    sweep must run that configuration once more, on the node left, to completion. Smallest
    cluster that shows it: a head that holds no GPU (it cannot die: it is the GCS) and two
    one-GPU workers; one trial (plus its retry): its node, whichever Ray picked, is the one
    that dies."""
    nodes = [{"num_cpus": 1, "num_gpus": 0},
             *({"num_cpus": 1, "num_gpus": 1, "node_ip_address": ip} for ip in WORKERS)]
    killed: list[str] = []
    real = measure.run_load
    with emulated_cluster(short_tmp, nodes) as (cluster, address, marker):

        async def load_while_its_node_dies(base_url, model, requests, **kwargs):
            """The first trial's load, while its server's node dies (host: node, so the
            server's address is its node's): the load is under way when the kill lands,
            ~8 s before it could end."""
            if killed:
                return await real(base_url, model, requests, **kwargs)
            ip = urlsplit(base_url).hostname
            doomed = next(n for n in cluster.worker_nodes if n.node_ip_address == ip)
            killed.append(ip)
            load = asyncio.ensure_future(real(base_url, model, requests, **kwargs))
            await asyncio.to_thread(kill_node, cluster, doomed)
            return await load

        monkeypatch.setattr(measure, "run_load", load_while_its_node_dies)
        sweep = write_sweep(short_tmp, tiny_model, address)
        res = cli_joined(["run", str(sweep)], short_tmp, marker, short_tmp)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    (doomed_ip,) = killed
    (survivor,) = set(WORKERS) - {doomed_ip}
    trials = read_trials(short_tmp / "results", "loss")
    assert len(trials) == 2, out[-4000:]  # 1 trial + the lost one's configuration run once more
    lost = trials[trials["fail_reason"] == "node_lost"]
    assert len(lost) == 1, trials[["trial_number", "state", "fail_reason", "fail_detail",
                                   "placement"]].to_string()
    number = int(lost.iloc[0]["trial_number"])
    assert f"trial {number}: under load" in out, out[-4000:]  # it died under load
    assert doomed_ip in lost.iloc[0]["fail_detail"]
    rest = trials[trials["fail_reason"] != "node_lost"]
    assert (rest["state"] == "COMPLETE").all()
    later = rest[rest["trial_number"] > number]
    assert len(later) == 1 and all(list(p) == [survivor] for p in later["placement"])
    retry = trials[trials["trial_number"] == number + 1].iloc[0]
    assert retry["param_max_num_seqs"] == lost.iloc[0]["param_max_num_seqs"]
    assert retry["state"] == "COMPLETE"


def write_sweep(tmp: Path, model: Path, address: str) -> Path:
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": {
        "max-num-seqs": {"type": "categorical", "choices": [2, 4]}}}))
    sweep = tmp / "loss.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "loss", "model": str(model), "search_space": str(space), "engine": "fake",
        "server": {"host": "node", "env": {"FAKE_ENGINE_STARTUP_S": "0",
                                            "FAKE_ENGINE_TPOT_MS": "40"}},
        # ~8 s of load a trial (4 waves of 2 s): the node dies as the first trial's load
        # starts, long before that load could end
        "workload": {"num_prompts": 8, "input_len": 8, "output_len": 50,
                     "max_concurrency": 2, "warmup_requests": 0, "request_timeout_s": 30},
        "sla": {"p99_ttft_ms": 60000},
        "search": {**NO_REMEASURE, "sampler": "random", "n_trials": 1, "baseline": False},
        "cluster": {"address": address, "max_concurrent_trials": 1, "retry_node_lost": True},
        "results_dir": str(tmp / "results"),
    }))
    return sweep


def kill_node(cluster, node) -> None:
    """What a machine failure does: the node's raylet and every process under it vanish at
    once (remove_node alone leaves the node's worker processes running for a while)."""
    doomed = []
    for infos in node.all_processes.values():
        for info in infos:
            try:
                root = psutil.Process(info.process.pid)
                doomed += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
    cluster.remove_node(node, allow_graceful=False)
    for proc in doomed:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
